"""Incremental view tracking: interval algebra, row slots, and samplers following two writers' commits."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from replaystore.loaders import EpochSampler, PrioritizedSampler, ReservoirSampler, UniformSampler
from replaystore.loaders.tracking import RowSlots, ViewTracker, difference, expand, inside, merge, rows_in
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.format.layout import ROW_BITS

SETTINGS = settings(max_examples=40, deadline=None)

points = hs.lists(hs.integers(0, 60), max_size=10).map(sorted)


def intervals(p: list[int]) -> np.ndarray:
    """Sorted disjoint intervals from an ascending point list (pairs; duplicates give empty ones)."""
    p = p[: len(p) // 2 * 2]
    return merge(np.array(p, dtype=np.int64).reshape(-1, 2))


def as_set(iv: np.ndarray) -> set[int]:
    return set(expand(iv).tolist())


@SETTINGS
@given(a=points, b=points, rows=hs.lists(hs.integers(-3, 65), max_size=30))
def test_interval_algebra_matches_sets(a: list[int], b: list[int], rows: list[int]) -> None:
    ia, ib = intervals(a), intervals(b)
    assert np.all(ia[:, 1] > ia[:, 0]) and np.all(ia[1:, 0] > ia[:-1, 1]), "merged: non-empty, disjoint, not touching"
    assert as_set(difference(ia, ib)) == as_set(ia) - as_set(ib)
    arr = np.array(rows, dtype=np.int64)
    assert inside(arr, ia).tolist() == [r in as_set(ia) for r in rows]
    uniq = np.unique(arr)
    assert rows_in(uniq, ia).tolist() == [r for r in uniq.tolist() if r in as_set(ia)]


slot_ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("add"), hs.lists(hs.integers(0, 80), max_size=25)),
    hs.tuples(hs.just("remove"), points),
    hs.tuples(hs.just("sync"), hs.lists(hs.integers(0, 80), max_size=40)),
    hs.just(("reload",)),
), max_size=20)


@SETTINGS
@given(ops=slot_ops)
def test_row_slots_match_a_dict_model(ops: list[Any]) -> None:
    slots, model = RowSlots(), {}  # model: row -> slot
    for op in ops:
        if op[0] == "add":
            new = np.array(sorted(set(op[1]) - set(model)), dtype=np.int64)
            got = slots.add(new)
            assert len(set(got.tolist())) == len(got) and not set(got.tolist()) & set(model.values())
            model.update(zip(new.tolist(), got.tolist(), strict=True))
        elif op[0] == "remove":
            iv = intervals(op[1])
            gone = sorted(r for r in model if r in as_set(iv))
            assert slots.remove(iv).tolist() == [model[r] for r in gone]
            for r in gone:
                del model[r]
        elif op[0] == "sync":
            visible = np.unique(np.array(op[1], dtype=np.int64))
            freed, new = slots.sync(visible)
            gone = sorted(set(model) - set(visible.tolist()))
            assert sorted(freed.tolist()) == sorted(model[r] for r in gone)
            for r in gone:
                del model[r]
            model.update(zip(sorted(set(visible.tolist()) - set(model)), new.tolist(), strict=True))
        else:
            again = RowSlots()
            again.load(slots.state())
            slots = again
        assert len(slots) == len(model) and slots.tracked().tolist() == sorted(model)
        query = np.arange(-2, 84, dtype=np.int64)
        got, found = slots.lookup(query)
        assert found.tolist() == [q in model for q in query.tolist()]
        assert got[found].tolist() == [model[q] for q in query.tolist() if q in model]
        assert {s: r for r, s in model.items()} == {s: int(r) for s, r in enumerate(slots.row_of) if r >= 0}
        # a table's appended rows stay a few segments, not one per row
        assert len(slots.lo) <= max(1, len(model))


def _batch(n: int, start: int) -> dict[str, np.ndarray]:
    return {"obs": np.full((n, 2), start, np.float32), "action": np.zeros(n, np.int64),
            "reward": np.zeros(n, np.float32), "next_obs": np.zeros((n, 2), np.float32),
            "terminated": np.zeros(n, bool)}


@SETTINGS
@given(commits=hs.lists(hs.tuples(hs.integers(0, 1), hs.integers(1, 7)), min_size=1, max_size=12),
       capacity=hs.one_of(hs.none(), hs.integers(4, 25)), subset_every=hs.sampled_from([1, 3]))
def test_samplers_follow_two_writers_commits_and_evictions(new_url: Any, commits: list[tuple[int, int]],
                                                           capacity: int | None, subset_every: int) -> None:
    """After every commit (two writers, interleaved row-id ranges, eviction by capacity), the
    incrementally maintained state equals what a fresh look at the whole table gives."""
    url = new_url()
    st = open_store(url, transitions(2, actions=2), mode="w", capacity=capacity)
    writers = [st.writer(), st.writer()]
    reader = open_store(url, mode="r")
    # every 3rd local row of each writer (as a SQL query might select), or the whole table
    subset = None if subset_every == 1 else np.concatenate([(wr.id << ROW_BITS) + np.arange(0, 100, 3)
                                                            for wr in writers])
    prio = PrioritizedSampler(reader, batch_size=4, subset=subset)
    res = ReservoirSampler(reader, capacity=5, batch_size=4, subset=subset)
    uni = UniformSampler(reader, batch_size=64, subset=subset)
    epoch = EpochSampler(reader, batch_size=3, subset=subset)
    tracker = ViewTracker(reader.default)
    before: set[int] = set()
    offered: set[int] = set()
    for i, (w, n) in enumerate(commits):
        writers[w].append(_batch(n, i), stream=w)
        writers[w].commit()
        reader.refresh()
        visible = reader.default.row_ids()
        allowed = visible if subset is None else np.intersect1d(visible, subset)
        change = tracker.poll()
        assert change is not None
        assert as_set(change.added) == set(visible.tolist()) - before
        if not change.full:
            assert as_set(change.removed) == before - set(visible.tolist())
        before = set(visible.tolist())
        if not len(allowed):
            continue
        prio.sample()
        assert prio.slots.tracked().tolist() == allowed.tolist()
        assert np.all(prio.priorities(allowed) == 1.0)
        res.sample()
        assert set(res.members.tolist()) <= set(allowed.tolist()) and len(res.members) <= 5
        offered |= set(allowed.tolist())
        assert res.seen == len(offered)
        assert set(uni.sample().rows.tolist()) <= set(allowed.tolist())
        assert uni.candidate_count() == len(allowed)
        assert set(epoch.sample().rows.tolist()) <= set(allowed.tolist())
    for wr in writers:
        wr.close()


def test_row_slots_load_the_per_row_state_of_earlier_versions() -> None:
    old = {"slot_rows": np.array([3, 4, 5, 9]), "slot_ids": np.array([0, 1, 2, 3]),
           "slot_row_of": np.array([3, 4, 5, 9, -1]), "slot_free": np.array([4])}
    slots = RowSlots()
    slots.load(old)
    got, found = slots.lookup(np.array([3, 4, 5, 6, 9]))
    assert found.tolist() == [True, True, True, False, True] and got[found].tolist() == [0, 1, 2, 3]
    assert len(slots) == 4 and len(slots.lo) == 2 and slots.add(np.array([10])).tolist() == [4]
