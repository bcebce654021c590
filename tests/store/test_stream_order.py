"""The stream index's key order (first listing over a view's fragments, in row-id order)
followed across a change from the changed fragments alone equals the order taken over the
new view; and where the change only appends fragments or grows them in place, following
listing nothing new there, following never falls back to the whole view.

Views are real :class:`Fragment` records (only their row ids and stream lists matter to
the order): a slot per row range, each holding no fragment, the old view's, or a new one
whose stream list extends the old one's (a fragment growing in place, compacted from its
start) or is drawn afresh (compacted otherwise); fragments kept as objects may also have
moved their first visible row (eviction: both gone and come).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as hs

from replaystore.store.format.fragment import Fragment
from replaystore.store.read.viewdiff import first_listings, grown_order

KEYS = [0, 1, 2, "a", "b"]
SLOTS = 8
STREAMS = hs.lists(hs.sampled_from(KEYS), max_size=3, unique=True)
# per slot: (old stream list or None, what the change does to it, its new stream list)
SLOT = hs.tuples(hs.one_of(hs.none(), STREAMS),
                 hs.sampled_from(["keep", "keep", "move", "drop", "grow", "redraw"]), STREAMS)


def _fragment(slot: int, version: int, streams: list[Any]) -> Fragment:
    return Fragment(writer=slot // 4, table="records", name=f"f{slot}-{version}", row_start=100 * (slot % 4),
                    rows=10, nnz={}, streams=streams, parts=[])


@settings(max_examples=400, deadline=None)
@given(slots=hs.lists(SLOT, min_size=SLOTS, max_size=SLOTS))
def test_followed_key_order_equals_the_new_views(slots: list[tuple[Any, str, list[Any]]]) -> None:
    old, new, gone, came = [], [], [], []
    in_place = True  # the change only grows fragments in place, listing nothing new, and appends after the end
    last_old = max((i for i, (streams, _, _) in enumerate(slots) if streams is not None), default=-1)
    for i, (streams, change, extra) in enumerate(slots):
        if streams is None:  # no fragment in the old view: the change may add one
            if change in ("grow", "redraw"):
                new.append(f := _fragment(i, 1, extra))
                came.append(f)
                in_place &= i > last_old
            continue
        old.append(f := _fragment(i, 0, streams))
        if change in ("keep", "move"):
            new.append(f)
            if change == "move":
                gone.append(f)
                came.append(f)
        elif change == "drop":
            gone.append(f)
            in_place = False
        else:
            grown = streams + [k for k in extra if k not in streams] if change == "grow" else extra
            in_place &= grown == streams  # (new keys there may come before old ones)
            new.append(g := _fragment(i, 1, grown))
            gone.append(f)
            came.append(g)
    key_at = first_listings(old)
    keys = list(key_at)
    grown_keys = grown_order(key_at, keys, gone, came)
    want = first_listings(new)
    if grown_keys is None:
        assert not in_place, "an in-place change was not followed"
        assert key_at == first_listings(old)  # left as it was
        return
    assert [*keys, *grown_keys] == list(want)
    assert list(key_at.items()) == list(want.items())
