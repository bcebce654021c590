"""The stream index followed across store changes equals a fresh build, and its segment buffers
equal a list model.

Random sequences of appends by three writers (interleaved streams, int and str keys,
step gaps, resets, commits in any order so steps of a stream arrive out of order),
compactions, and eviction by capacity: after every change, the index a reader keeps
up to date (the same object throughout, never rebuilt) answers exactly as the index
of a reader opened afresh.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.schemas import transitions
from replaystore.segments import Segments
from replaystore.store import StreamIndex, open_store
from support.indexops import KEYS, Scenario, batch, ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_counter = itertools.count()


@pytest.fixture(scope="session")
def new_url(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], str]:
    base = tmp_path_factory.mktemp("index")
    return lambda: str(base / f"st{next(_counter)}")


def assert_same_index(got: StreamIndex, want: StreamIndex) -> None:
    assert got.keys == want.keys
    for name in ("bounds", "rows", "steps", "resets", "stream_ids"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.streams() == want.streams()
    for key in [*KEYS, "never"]:
        assert got.span(key) == want.span(key)
        for a, b in zip(got.stream_rows(key), want.stream_rows(key), strict=True):
            assert np.array_equal(a, b)
        assert np.array_equal(got.runs(key), want.runs(key))
        assert got.last_step(key) == want.last_step(key)
        probe = np.arange(-1, 40)
        assert np.array_equal(got.lookup(key, probe), want.lookup(key, probe))


@SETTINGS
@given(plan=ops, capacity=hs.one_of(hs.none(), hs.integers(3, 30)))
def test_followed_index_equals_fresh_build(new_url: Callable[[], str], plan: list[Any], capacity: int | None) -> None:
    sc = Scenario(new_url(), capacity)
    reader = open_store(sc.url, mode="r")
    tr = reader.default.reader
    index = tr.index  # built once, on the empty store; followed from then on
    for _ in sc.run(plan):
        fresh = sc.same_snapshot(reader)
        tr.sync()
        assert tr.index is index, "the index was rebuilt instead of followed"
        assert_same_index(index, fresh.default.reader.index)


seg_ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("slot"), hs.integers(0, 5)),
    hs.tuples(hs.just("append"), hs.integers(0, 5), hs.integers(0, 9)),
    hs.tuples(hs.just("drop"), hs.integers(0, 5), hs.integers(0, 9)),
    hs.tuples(hs.just("replace"), hs.integers(0, 5), hs.integers(0, 9)),
), max_size=60)


@SETTINGS
@given(ops=seg_ops, initial=hs.lists(hs.integers(0, 5), max_size=4))
def test_segments_match_a_list_model(ops: list[Any], initial: list[int]) -> None:
    """Contents per slot, and relative positions surviving moves, growth and compaction."""
    bounds = np.r_[0, np.cumsum(initial)].astype(np.int64)
    values = np.arange(int(bounds[-1]), dtype=np.int64)
    seg = Segments({"v": np.dtype(np.int64)}, {"v": values}, bounds)
    model = [list(range(int(a), int(b))) for a, b in itertools.pairwise(bounds)]
    first_rel = [0] * len(model)  # relative position of each slot's first entry
    fresh = itertools.count(1000)
    for op in ops:
        if op[0] == "slot":
            seg.add_slots(op[1] % 3)
            model += [[] for _ in range(op[1] % 3)]
            first_rel += [int(r) for r in seg.rel_lo()[len(first_rel):]]
            assert seg.slots == len(model)
            continue
        if not model:
            continue
        s = op[1] % len(model)
        if op[0] == "append":
            new = [next(fresh) for _ in range(op[2])]
            seg.append(s, {"v": np.array(new, dtype=np.int64)})
            model[s] += new
        elif op[0] == "drop":
            k = min(op[2], len(model[s]))
            seg.drop_head(s, k)
            del model[s][:k]
            first_rel[s] += k
        else:
            new = [next(fresh) for _ in range(op[2])]
            seg.replace(s, {"v": np.array(new, dtype=np.int64)})
            model[s], first_rel[s] = new, 0
        for t, want in enumerate(model):
            assert seg.view(t, "v").tolist() == want
            assert int(seg.rel_lo()[t]) == first_rel[t]
            assert int(seg.rel_hi()[t]) == first_rel[t] + len(want)
            # an entry is found at origin + its relative position
            assert seg.cols["v"][seg.origin[t] + first_rel[t]:seg.origin[t] + first_rel[t] + len(want)].tolist() == want
        assert seg.live == sum(map(len, model))
        order = np.arange(len(model))[::-1]
        at, counts = seg.positions(order)
        assert seg.cols["v"][at].tolist() == [v for t in order for v in model[t]]
        assert counts.tolist() == [len(model[t]) for t in order]


def test_large_change_rebuilds_and_small_change_follows(new_url: Callable[[], str]) -> None:
    """Over a quarter of the rows and more than 64k changed: rebuilt (a new index object);
    then a small change is followed again; both answer as a fresh build."""
    url = new_url()
    st = open_store(url, transitions(2, actions=2), mode="w")
    reader = open_store(url, mode="r")
    with st.writer() as w:
        w.append(batch(100, 0), stream=0)
        w.commit()
        reader.refresh()
        first = reader.default.reader.index
        w.append(batch(70_000, 1), stream=[1, 2] * 35_000, step=np.repeat(np.arange(35_000), 2))
        w.commit()
        reader.refresh()
        second = reader.default.reader.index
        assert second is not first
        assert_same_index(second, open_store(url, mode="r").default.reader.index)
        w.append(batch(10, 2), stream=0)
        w.commit()
        reader.refresh()
        assert reader.default.reader.index is second
        assert_same_index(second, open_store(url, mode="r").default.reader.index)


@settings(max_examples=200, deadline=None)
@given(n=hs.integers(0, 300), streams=hs.sampled_from([1, 3, 40, 70_000]), ascending=hs.booleans(),
       dup=hs.booleans(), seed=hs.integers(0, 2**32 - 1))
def test_build_order_is_the_lexsort_order(n: int, streams: int, ascending: bool, dup: bool, seed: int) -> None:
    """The index build's sort (radix by stream id when row order already has each stream's steps
    ascending, else a lexsort) gives exactly ``np.lexsort((step, sid))``, ties in row order."""
    from replaystore.store.read.index import _stream_step_order
    rng = np.random.default_rng(seed)
    sid = rng.integers(0, streams, n).astype(np.int64)
    step = rng.integers(0, 5 if dup else 1000, n).astype(np.int64)
    if ascending:  # one writer's appends: steps ascend per stream in row order (equal ones with dup)
        step = np.zeros(n, dtype=np.int64)
        for s in np.unique(sid):
            at = np.flatnonzero(sid == s)
            step[at] = np.sort(rng.integers(0, 3 if dup else 10**6, len(at)))
    assert np.array_equal(_stream_step_order(sid, step, streams), np.lexsort((step, sid)))
