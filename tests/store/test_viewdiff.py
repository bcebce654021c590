"""How two views of a table differ (store/read/viewdiff.py), against plain-Python reference models:
which fragments stayed where they were, and which rows one view has and the other lacks. A
reader following real commits is checked against a fresh reader in test_reader_follow.py."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from replaystore.store.format.fragment import Fragment
from replaystore.store.read.viewdiff import intervals, pair, subtract

# a view: distinct fragment identities, each visible from a local row (0-2)
VIEW = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 2)), max_size=14,
                unique_by=lambda t: t[0])


def _pair_reference(a: list[int], va: list[int], b: list[int], vb: list[int],
                    ) -> tuple[int, int, list[int], list[bool], list[bool]]:
    n = min(len(a), len(b))
    head = 0
    while head < n and (a[head], va[head]) == (b[head], vb[head]):
        head += 1
    tail = 0
    while tail < n - head and (a[-1 - tail], va[-1 - tail]) == (b[-1 - tail], vb[-1 - tail]):
        tail += 1
    mid_a, mid_va = a[head:len(a) - tail], va[head:len(a) - tail]
    mid_b, mid_vb = b[head:len(b) - tail], vb[head:len(b) - tail]
    src = [mid_a.index(x) if x in mid_a else -1 for x in mid_b]
    kept = [s >= 0 and mid_va[s] == v for s, v in zip(src, mid_vb, strict=False)]
    stays = [any(s == j and k for s, k in zip(src, kept, strict=False)) for j in range(len(mid_a))]
    return head, tail, src, kept, stays


@given(VIEW, VIEW)
def test_pair_matches_the_reference(was: list[tuple[int, int]], now: list[tuple[int, int]]) -> None:
    a, va = [x for x, _ in was], [v for _, v in was]
    b, vb = [x for x, _ in now], [v for _, v in now]
    head, tail, src, kept, stays = pair(np.array(a, dtype=np.uint64), np.array(va, dtype=np.int64),
                                        np.array(b, dtype=np.uint64), np.array(vb, dtype=np.int64))
    want = _pair_reference(a, va, b, vb)
    assert (head, tail, src.tolist(), kept.tolist(), stays.tolist()) == (want[0], want[1], *want[2:])


@given(VIEW)
def test_pair_of_a_view_with_itself_is_all_prefix(view: list[tuple[int, int]]) -> None:
    ids = np.array([x for x, _ in view], dtype=np.uint64)
    vis = np.array([v for _, v in view], dtype=np.int64)
    head, tail, src, kept, stays = pair(ids, vis, ids, vis)
    assert (head, tail, len(src), len(stays)) == (len(view), 0, 0, 0)


def _fragments(cuts: list[int], writer: int = 1) -> list[Fragment]:
    """Fragments covering ``[cuts[i], cuts[i + 1])`` of one writer's rows."""
    bounds = sorted(set(cuts))
    return [Fragment(writer, "records", f"f{lo}-{hi}", lo, hi - lo, {}, [0], [(0, 0, hi - lo)])
            for lo, hi in pairwise(bounds)]


# a view's fragments: adjacent or apart (every other one may be missing), each visible from a row
SIDE = st.tuples(st.lists(st.integers(0, 60), min_size=2, max_size=10), st.lists(st.booleans(), min_size=10,
                 max_size=10), st.lists(st.integers(0, 4), min_size=10, max_size=10))


def _view(side: tuple[list[int], list[bool], list[int]]) -> tuple[list[Fragment], np.ndarray]:
    cuts, present, vis = side
    frags = [f for f, p in zip(_fragments(cuts), present, strict=False) if p]
    return frags, np.array([min(v, f.rows) for f, v in zip(frags, vis, strict=False)], dtype=np.int64)


def _rows(view: tuple[list[Fragment], np.ndarray]) -> set[int]:
    frags, vis = view
    return {f.first_id + r for f, v in zip(frags, vis, strict=False) for r in range(int(v), f.rows)}


@given(SIDE, SIDE)
def test_subtract_gives_the_rows_of_one_view_the_other_lacks(one: tuple, other: tuple) -> None:
    a, b = _view(one), _view(other)
    got = subtract(intervals(*a), intervals(*b))
    rows = [frag.first_id + r for frag, lo, hi in got for r in range(lo, hi)]
    assert len(rows) == len(set(rows))  # no row twice
    assert set(rows) == _rows(a) - _rows(b)
    for frag, lo, hi in got:  # each piece within the rows its fragment shows
        assert 0 <= lo < hi <= frag.rows
        assert frag in a[0]
