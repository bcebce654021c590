"""Uniform, epoch, prioritized and reservoir samplers against small reference models.

Random append plans (int and str stream keys, resets, step gaps, capacity eviction,
several commits) drive a real store on local disk and its reference
(support.loaderref). Each sampler is asked for minibatches between commits; rows must
always be visible (and in the subset, when one is given), gathered data must match
the reference records, and the sampler's own bookkeeping (epoch partitions, priorities,
reservoir members) must match the reference's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import StoreError
from replaystore.loaders import (
    EmptyStoreError,
    EpochSampler,
    PrioritizedSampler,
    Request,
    ReservoirSampler,
    UniformSampler,
    gather,
)
from replaystore.store import open_store
from support.loaderref import (
    PROBE,
    Append,
    Harness,
    RefPrioritized,
    appends,
    csr_rows,
    legal_of,
    plan_size,
    plans,
    probe_arrays,
    to_numpy_batch,
)

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def subsets(data: Any, total: int) -> np.ndarray | None:
    """None (whole table) or a random set of row ids, some evicted or never written."""
    if not data.draw(hs.booleans(), label="use subset"):
        return None
    return np.array(data.draw(hs.lists(hs.integers(0, total + 3), max_size=total + 4), label="subset"),
                    dtype=np.int64)


def allowed(h: Harness, subset: np.ndarray | None) -> set[int]:
    vis = {r.row for r in h.ref.visible()}
    return vis if subset is None else vis & {int(r) for r in subset}


def check_gathered(h: Harness, rows: np.ndarray, batch: dict[str, Any]) -> None:
    """The gathered minibatch holds exactly the reference records of ``rows``; CSR of just them."""
    b = to_numpy_batch(batch)
    tags = [h.ref.rec_of_row(int(r)).tag for r in rows]
    want = probe_arrays(tags)
    assert np.array_equal(b["indices"], rows)
    for f in PROBE.dense_fields:
        assert b[f.name].dtype == f.dtype and np.array_equal(b[f.name], want[f.name]), f.name
    assert b["legal_offsets"][0] == 0 and len(b["legal_offsets"]) == len(rows) + 1
    assert csr_rows(b["legal_ids"], b["legal_offsets"]) == [legal_of(t).tolist() for t in tags]


# -- uniform ------------------------------------------------------------------------------------

@SETTINGS
@given(plan=plans(), batch_size=hs.integers(1, 9), seed=hs.integers(0, 2**16), data=hs.data())
def test_uniform_rows_are_visible_and_in_the_subset(new_url: Any, plan: Any, batch_size: int, seed: int,
                                                    data: Any) -> None:
    h = Harness(new_url(), plan.capacity)
    subset = subsets(data, plan_size(plan))
    sampler = UniformSampler(h.store, batch_size=batch_size, seed=seed, subset=subset)
    with pytest.raises(EmptyStoreError):
        sampler.sample()
    for appends_ in plan.commits:
        for ap in appends_:
            h.append(ap)
        h.commit()
        ok = allowed(h, subset)
        if not ok:
            with pytest.raises(EmptyStoreError):
                sampler.sample()
            continue
        for _ in range(2):
            req = sampler.sample()
            assert req.rows.shape == (batch_size,) and set(req.rows.tolist()) <= ok
            check_gathered(h, req.rows, gather(h.store.default, req))


# -- epoch --------------------------------------------------------------------------------------

@SETTINGS
@given(plan=plans(), batch_size=hs.integers(1, 7), drop_last=hs.booleans(), seed=hs.integers(0, 2**16),
       data=hs.data())
def test_epoch_passes_partition_the_visible_records(new_url: Any, plan: Any, batch_size: int, drop_last: bool,
                                                    seed: int, data: Any) -> None:
    h = Harness(new_url(), plan.capacity).run(plan)
    subset = subsets(data, plan_size(plan))
    ok = allowed(h, subset)
    sampler = EpochSampler(h.store, batch_size=batch_size, seed=seed, drop_last=drop_last, subset=subset)
    n = len(ok)
    if n == 0 or (drop_last and n < batch_size):
        with pytest.raises(EmptyStoreError):
            list(sampler)
        return
    full, rest = divmod(n, batch_size)
    for _ in range(2):
        expected_batches = full if drop_last or not rest else full + 1
        assert len(sampler) == expected_batches
        batches = [req.rows for req in sampler]
        assert len(batches) == expected_batches
        assert all(len(b) == batch_size for b in batches[:full])
        if not drop_last and rest:
            assert len(batches[-1]) == rest
        flat = np.concatenate(batches).tolist()
        assert len(flat) == len(set(flat)), "a record twice in one pass"
        if drop_last:
            assert set(flat) <= ok and len(flat) == full * batch_size
        else:
            assert set(flat) == ok, "a pass must cover every visible record exactly once"
        check_gathered(h, batches[0], gather(h.store.default, Request(batches[0])))


def test_epoch_passes_are_shuffled_differently(new_url: Any) -> None:
    h = Harness(new_url(), None)
    h.append(Append(("a",) * 50, False, (0,) * 50, "first", (False,) * 50))
    h.commit()
    sampler = EpochSampler(h.store, batch_size=8, seed=3)
    passes = [np.concatenate([r.rows for r in sampler]) for _ in range(3)]
    assert [len(b) for b in [r.rows for r in sampler]] == [8] * 6 + [2]
    assert all(sorted(p.tolist()) == list(range(50)) for p in passes)
    assert not np.array_equal(passes[0], passes[1]) and not np.array_equal(passes[1], passes[2])
    assert not np.array_equal(passes[0], np.arange(50)), "not shuffled"
    assert sampler.epoch == 3


def test_epoch_pass_fixed_at_start_and_skips_rows_evicted_mid_pass(new_url: Any) -> None:
    """New records wait for the next pass; records evicted mid-pass are never handed out."""
    h = Harness(new_url(), 12)
    h.append(Append(("a",) * 12, False, (0,) * 12, "first", (False,) * 12))
    h.commit()
    sampler = EpochSampler(h.store, batch_size=3, seed=5)
    it = iter(sampler)
    first = next(it).rows
    h.append(Append(("b",) * 4, False, (0,) * 4, "first", (False,) * 4))  # evicts rows 0-3
    h.commit()
    visible = {r.row for r in h.ref.visible()}
    rest = [req.rows for req in it]
    for rows in rest:
        assert set(rows.tolist()) <= visible
        check_gathered(h, rows, gather(h.store.default, Request(rows)))
    seen = set(first.tolist()) | set(np.concatenate(rest).tolist())
    assert seen == set(first.tolist()) | (set(range(12)) & visible), "the rest of the pass: its surviving rows"
    nxt = np.concatenate([req.rows for req in sampler])
    assert sorted(nxt.tolist()) == sorted(visible), "the next pass sees the new records"


# -- prioritized --------------------------------------------------------------------------------

prio_ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("commit"), hs.lists(appends(5), min_size=1, max_size=2)),
    hs.tuples(hs.just("sample"), hs.integers(1, 8)),
    hs.tuples(hs.just("update"), hs.lists(hs.tuples(hs.integers(0, 10**6), hs.floats(-20, 20)),
                                        min_size=1, max_size=6)),
), min_size=1, max_size=14)


@SETTINGS
@given(ops=prio_ops, capacity=hs.one_of(hs.none(), hs.integers(3, 20)), alpha=hs.sampled_from([0.5, 0.7, 1.0]),
       beta=hs.sampled_from([0.0, 0.4, 1.0]), seed=hs.integers(0, 2**16), use_subset=hs.booleans(),
       data=hs.data())
def test_prioritized_bookkeeping_matches_the_reference(new_url: Any, ops: list[Any], capacity: int | None,
                                                       alpha: float, beta: float, seed: int, use_subset: bool,
                                                       data: Any) -> None:
    h = Harness(new_url(), capacity)
    subset = np.array(data.draw(hs.lists(hs.integers(0, 60), max_size=40)), dtype=np.int64) if use_subset else None
    sampler = PrioritizedSampler(h.store, batch_size=4, alpha=alpha, beta=beta, seed=seed, subset=subset)
    ref = RefPrioritized(alpha, beta)
    for op in ops:
        if op[0] == "commit":
            for ap in op[1]:
                h.append(ap)
            h.commit()
        ref.sync(allowed(h, subset))
        if op[0] == "sample":
            sampler.batch_size = op[1]
            if not ref.prio:
                with pytest.raises(EmptyStoreError):
                    sampler.sample()
                continue
            req = sampler.sample()
            rows = req.rows.tolist()
            assert len(rows) == op[1] and set(rows) <= set(ref.prio)
            w = req.outputs["weights"]
            assert w.dtype == np.float32 and w.max() == 1.0
            np.testing.assert_allclose(w, ref.weights(rows), rtol=1e-6)
            check_gathered(h, req.rows, gather(h.store.default, req))
        elif op[0] == "update":
            committed = [r.row for r in h.ref.committed]
            if not committed:
                continue
            rows = [committed[i % len(committed)] for i, _ in op[1]]  # evicted rows too
            prios = [p for _, p in op[1]]
            if data.draw(hs.booleans(), label="float32 tensors, as a learner passes |TD error|"):
                sampler.update(torch.tensor(rows), torch.tensor(prios, dtype=torch.float32))
                prios = np.asarray(prios, dtype=np.float32).astype(np.float64).tolist()
            else:
                sampler.update(rows, prios)
            ref.update(rows, prios)
        everyone = [r.row for r in h.ref.committed]
        got = sampler.priorities(everyone)
        want = np.array([ref.prio.get(r, np.nan) for r in everyone])
        np.testing.assert_allclose(got, want, rtol=1e-9, equal_nan=True)
        assert sampler.max_priority == pytest.approx(ref.max_priority, rel=1e-12)


def test_prioritized_argument_errors(new_url: Any) -> None:
    h = Harness(new_url(), None)
    h.append(Append(("a",) * 3, False, (0,) * 3, "none", (False,) * 3))
    h.commit()
    with pytest.raises(StoreError):
        PrioritizedSampler(h.store, batch_size=2, alpha=-1)
    s = PrioritizedSampler(h.store, batch_size=2)
    with pytest.raises(StoreError):
        s.update([0, 1], [1.0])
    with pytest.raises(StoreError):
        s.update([0], [float("nan")])


# -- reservoir ----------------------------------------------------------------------------------

res_ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("commit"), hs.lists(appends(6), min_size=1, max_size=2)),
    hs.tuples(hs.just("sample"), hs.integers(1, 6)),
), min_size=1, max_size=12)


@SETTINGS
@given(ops=res_ops, table_capacity=hs.one_of(hs.none(), hs.integers(3, 25)), k=hs.integers(1, 12),
       seed=hs.integers(0, 2**16), use_subset=hs.booleans(), data=hs.data())
def test_reservoir_members_follow_the_stream(new_url: Any, ops: list[Any], table_capacity: int | None, k: int,
                                             seed: int, use_subset: bool, data: Any) -> None:
    h = Harness(new_url(), table_capacity)
    subset = np.array(data.draw(hs.lists(hs.integers(0, 70), max_size=50)), dtype=np.int64) if use_subset else None
    sampler = ReservoirSampler(h.store, capacity=k, batch_size=3, seed=seed, subset=subset)
    offered: list[int] = []
    for op in ops:
        if op[0] == "commit":
            for ap in op[1]:
                h.append(ap)
            h.commit()
            continue
        ok = allowed(h, subset)
        offered += sorted(r for r in ok if r > max(offered, default=-1))
        sampler.batch_size = op[1]
        members = set(sampler.members.tolist())
        try:
            req = sampler.sample()
        except EmptyStoreError:
            # only with nothing to draw from: evicted members' slots are refilled (docstring)
            assert not ok and not len(sampler.members)
            continue
        members = sampler.members.tolist()
        assert len(members) == len(set(members)) and len(members) <= k
        assert set(members) <= ok and set(members) <= set(offered)
        assert sampler.seen == len(offered)
        if table_capacity is None:
            assert len(members) == min(k, len(offered))
        assert set(req.rows.tolist()) <= set(members) and len(req.rows) == op[1]
        check_gathered(h, req.rows, gather(h.store.default, req))


def test_reservoir_argument_errors(new_url: Any) -> None:
    st = open_store(new_url(), PROBE)
    for cap in (0, -3, 2.5):
        with pytest.raises(StoreError):
            ReservoirSampler(st, capacity=cap, batch_size=2)  # type: ignore[arg-type]


# -- every sampler: empty stores, subsets, other writers -----------------------------------------

def all_samplers(st: Any, **kw: Any) -> list[Any]:
    return [UniformSampler(st, batch_size=4, **kw), EpochSampler(st, batch_size=4, **kw),
            PrioritizedSampler(st, batch_size=4, **kw), ReservoirSampler(st, capacity=5, batch_size=4, **kw)]


def test_every_sampler_raises_empty_store_error_on_an_empty_store(new_url: Any) -> None:
    from replaystore.loaders import SequenceSampler
    st = open_store(new_url(), PROBE)
    for sampler in [*all_samplers(st), SequenceSampler(st, length=2, batch_size=4)]:
        with pytest.raises(EmptyStoreError) as err:
            sampler.sample()
        assert not isinstance(err.value, AssertionError)
        assert type(sampler).__name__ in str(err.value)
        with pytest.raises(EmptyStoreError):
            next(iter(sampler))
    with st.writer() as w:  # records, but none in the subset
        w.append(probe_arrays(range(4)), stream="a")
    for sampler in all_samplers(st, subset=[10, 11]):
        with pytest.raises(EmptyStoreError):
            sampler.sample()


def test_every_sampler_respects_a_subset(new_url: Any) -> None:
    h = Harness(new_url(), None)
    for key in ("a", 3, "b"):
        h.append(Append((key,) * 10, False, (0,) * 10, "first", (False,) * 10))
        h.commit()
    subset = np.array([1, 4, 5, 13, 22, 29, 500], dtype=np.int64)  # 500 was never written
    legal = set(subset.tolist()) - {500}
    for sampler in all_samplers(h.store, subset=subset, seed=2):
        drawn: set[int] = set()
        for _ in range(40):
            req = sampler.sample()
            assert set(req.rows.tolist()) <= legal, type(sampler).__name__
            drawn |= set(req.rows.tolist())
        if not isinstance(sampler, ReservoirSampler):
            assert drawn == legal, type(sampler).__name__
        else:
            assert drawn == set(sampler.members.tolist()) and len(drawn) == 5


def test_uniform_sees_another_writers_records_after_refresh(new_url: Any) -> None:
    url = new_url()
    mine = open_store(url, PROBE)
    with mine.writer() as w:
        w.append(probe_arrays(range(5)), stream="mine")
    sampler = UniformSampler(mine, batch_size=400, seed=0)
    assert set(sampler.sample().rows.tolist()) == set(range(5))
    other = open_store(url)  # another process, as far as the store can tell
    with other.writer() as w:
        w.append(probe_arrays(range(100, 105)), stream="theirs")
        theirs = w.id
    assert set(sampler.sample().rows.tolist()) == set(range(5)), "not visible before refresh()"
    assert mine.refresh()
    rows = sampler.sample().rows
    want = set(range(5)) | {(theirs << 40) | i for i in range(5)}
    assert set(rows.tolist()) == want
    assert sorted(set(gather(mine.default, sampler.sample())["tag"].tolist())) == [0, 1, 2, 3, 4, 100, 101, 102,
                                                                                    103, 104]


def test_uniform_on_a_store_that_only_another_writer_filled(new_url: Any) -> None:
    url = new_url()
    mine = open_store(url, PROBE)
    sampler = UniformSampler(mine, batch_size=3, seed=0)
    with open_store(url).writer() as w:
        w.append(probe_arrays(range(3)), stream=1)
    with pytest.raises(EmptyStoreError):
        sampler.sample()
    mine.refresh()
    assert len(sampler.sample().rows) == 3


def test_state_mismatch_and_bad_batch_size(new_url: Any) -> None:
    st = open_store(new_url(), PROBE)
    with pytest.raises(StoreError):
        UniformSampler(st, batch_size=0)
    with pytest.raises(StoreError):
        EpochSampler(st, batch_size=2).load_state_dict(UniformSampler(st, batch_size=2).state_dict())
    with pytest.raises(TypeError):
        len(UniformSampler(st, batch_size=2))
    assert len(UniformSampler(st, batch_size=2, num_batches=7)) == 7
