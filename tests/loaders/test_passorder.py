"""Epoch pass orders: uniformly random permutations made a bucket (or, for passes saved before
buckets, a chunk) at a time, reproducible from a seed.

The bucketed and blocked paths (beyond ``IN_CACHE`` / ``BLOCKS_IN_CACHE`` rows) are exercised
at small sizes by lowering the module's sizes: the same code with the sizes an experiment
can enumerate.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from replaystore.errors import StoreError
from replaystore.loaders import EpochSampler, passorder
from replaystore.loaders.passorder import PassOrder, PassRows
from replaystore.loaders.tracking import merge
from support.loaderref import Append, Harness, chi2_bound, chi2_stat

METHODS = ("buckets", "blocks")


@contextlib.contextmanager
def sizes(in_cache: int, bucket: int, block: int = 4, chunk: int = 8) -> Iterator[None]:
    """``in_cache`` is the threshold of both methods; ``bucket`` for buckets, ``block`` and ``chunk`` for blocks."""
    names = ("IN_CACHE", "BLOCKS_IN_CACHE", "BUCKET", "BLOCK", "CHUNK")
    saved = [getattr(passorder, name) for name in names]
    for name, value in zip(names, (in_cache, in_cache, bucket, block, chunk), strict=True):
        setattr(passorder, name, value)
    try:
        yield
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(passorder, name, value)


def whole(order: PassOrder, takes: Iterator[int]) -> np.ndarray:
    out = []
    while len(order):
        out.append(order.take(next(takes)).copy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def as_intervals(rows: np.ndarray) -> np.ndarray:
    """Ascending distinct row ids as intervals ``[id, id + 1)``, merged into maximal runs."""
    return merge(np.stack((rows, rows + 1), axis=1))


@pytest.mark.parametrize(("method", "bucket", "chunk"), [("buckets", 2, 0), ("buckets", 1, 0), ("blocks", 0, 2),
                                                         ("blocks", 0, 3)])
def test_orders_are_uniform_over_all_permutations(method: str, bucket: int, chunk: int) -> None:
    """5 rows in buckets of about 2 (4 buckets) or 1 (8), or blocks of 2: each of the 120 orders
    equally likely (chi-square, fixed seeds)."""
    rows = np.arange(5, dtype=np.int64) * 7 + 3
    perms = {p: i for i, p in enumerate(itertools.permutations(rows.tolist()))}
    draws = 12_000
    counts = np.zeros(len(perms))
    with sizes(1, bucket, 2, chunk):
        for seed in range(draws):
            order = PassOrder(PassRows(ids=rows.copy()), seed, method)
            counts[perms[tuple(whole(order, itertools.repeat(2)).tolist())]] += 1
    assert chi2_stat(counts, np.full(len(perms), draws / len(perms))) < chi2_bound(len(perms) - 1)


@pytest.mark.parametrize("method", METHODS)
def test_orders_put_every_row_at_every_position_alike(method: str) -> None:
    """40 rows in buckets of about 8 or blocks of 4 (chunks of 8): no bucket or block structure
    shows in where rows land."""
    n, draws = 40, 4_000
    at = np.zeros((n, n))
    with sizes(1, 8):
        for seed in range(draws):
            order = whole(PassOrder(PassRows(intervals=np.array([[0, n]])), seed, method), itertools.repeat(5))
            at[order, np.arange(n)] += 1
    assert (at.sum(axis=0) == draws).all() and (at.sum(axis=1) == draws).all()
    assert chi2_stat(at, np.full((n, n), draws / n)) < chi2_bound((n - 1) ** 2)


@settings(max_examples=150, deadline=None)
@given(n=hs.integers(0, 150), bucket=hs.integers(1, 40), block=hs.integers(1, 12), chunk=hs.integers(1, 40),
       in_cache=hs.integers(0, 160), seed=hs.integers(0, 2**63 - 1), method=hs.sampled_from(METHODS),
       intervals=hs.booleans(), takes=hs.lists(hs.integers(1, 30), min_size=1, max_size=8),
       stop=hs.integers(0, 150), modulus=hs.integers(2, 5))
def test_pass_order_takes_rest_and_keep(n: int, bucket: int, block: int, chunk: int, in_cache: int, seed: int,
                                        method: str, intervals: bool, takes: list[int], stop: int,
                                        modulus: int) -> None:
    rows = np.sort(np.random.default_rng(n).choice(3 * n + 1, n, replace=False)).astype(np.int64)

    def order_of(seed: int) -> PassOrder:
        held = PassRows(intervals=as_intervals(rows)) if intervals else PassRows(ids=rows.copy())
        return PassOrder(held, seed, method)

    with sizes(in_cache, bucket, block, chunk):
        ref = whole(order_of(seed), itertools.repeat(1))
        assert sorted(ref.tolist()) == rows.tolist(), "every row exactly once"
        # the order does not depend on how it is taken, nor on how the rows are held
        assert np.array_equal(whole(order_of(seed), itertools.cycle(takes)), ref)
        assert np.array_equal(whole(PassOrder(PassRows(ids=rows.copy()), seed, method), itertools.repeat(7)), ref)
        order = order_of(seed)
        got = [order.take(k) for k in takes if order.taken < stop]
        k = order.taken
        assert k == sum(len(g) for g in got) and len(order) == n - k
        assert np.array_equal(np.concatenate([*got, order.rest()]), ref), "rest(): the remaining rows, in order"
        order.keep(lambda r: r % modulus != 0)
        assert order.seed is None
        want = ref[k:][ref[k:] % modulus != 0]
        assert len(order) == len(want) and np.array_equal(whole(order, itertools.cycle(takes)), want)
    if n > 1:
        other = whole(order_of(seed + 1), itertools.repeat(3))
        assert sorted(other.tolist()) == rows.tolist()


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(1, 3000), bucket=hs.integers(1, 700), seed=hs.integers(0, 2**63 - 1))
def test_bucket_orders_are_the_same_with_and_without_the_kernel(n: int, bucket: int, seed: int) -> None:
    """The counting sort (loaders/passkernels.py) and numpy's stable argsort group alike, so a pass
    is the same order on every install (and resumes across them)."""
    assert passorder.kernels("replaystore.loaders.passkernels") is not None, "numba is in the test environment"
    iv = np.array([[0, n // 3], [n // 3 + 5, n + 5]], dtype=np.int64)
    orders = []
    with sizes(0, bucket), pytest.MonkeyPatch.context() as mp:
        for flag in ("1", "0"):
            mp.setenv("REPLAYSTORE_NUMBA", flag)
            orders.append(whole(PassOrder(PassRows(intervals=iv), seed), itertools.repeat(64)))
    assert np.array_equal(*orders)


def test_pass_rows_held_as_intervals_or_ids_agree() -> None:
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(10_000, 3_000, replace=False)).astype(np.int64)
    held = PassRows(intervals=as_intervals(rows)), PassRows(ids=rows.copy())
    positions = rng.integers(0, len(rows), 500)
    for one in held:
        assert len(one) == len(rows) and np.array_equal(one.ids(), rows)
        assert np.array_equal(one.at(positions), rows[positions])
        assert one.fingerprint() == [len(rows), int(rows.sum())]
    big = np.array([[2**62, 2**62 + 5]], dtype=np.int64)  # a sum past int64 wraps as numpy's does
    assert PassRows(intervals=big).fingerprint() == PassRows(ids=np.arange(2**62, 2**62 + 5)).fingerprint()
    with pytest.raises(ValueError, match="method"):
        PassOrder(held[0], 1, "spiral")


def _store(h: Harness, commits: int) -> None:
    for _ in range(commits):
        h.append(Append(("a",) * 10, False, (0,) * 10, "first", (False,) * 10))
        h.commit()


def test_epoch_sampler_on_bucketed_orders_partitions_resumes_and_keeps_a_small_state(new_url: Any) -> None:
    h = Harness(new_url(), None)
    _store(h, 5)
    rows = set(h.store.default.row_ids().tolist())
    with sizes(16, 8):
        sampler = EpochSampler(h.store, batch_size=6, seed=1)
        passes = [np.concatenate([r.rows for r in sampler]) for _ in range(2)]
        assert all(sorted(p.tolist()) == sorted(rows) for p in passes) and not np.array_equal(*passes)
        it = iter(sampler)
        first = [next(it).rows for _ in range(3)]
        state = sampler.state_dict()
        assert "rest" not in state and state["taken"] == 18
        assert not any(isinstance(v, np.ndarray) and v.size > 2 * len(state["pass_rows"]) for v in state.values())
        want = [r.rows for r in it]
        resumed = EpochSampler(h.store, batch_size=6, seed=99)
        resumed.load_state_dict(state)
        got = [r.rows for r in resumed]
        assert len(got) == len(want) == 6 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        assert sorted(np.concatenate(first + got).tolist()) == sorted(rows)
        # the state in the store's slot: save() and resume=True
        sampler.save()
        again = EpochSampler(h.store, batch_size=6, seed=1, resume=True)
        assert np.array_equal(again.sample().rows, sampler.sample().rows)


def test_epoch_state_saved_before_buckets_resumes_in_blocks(new_url: Any) -> None:
    """A state that names no pass order method was saved by a version that made blocked passes."""
    h = Harness(new_url(), None)
    _store(h, 5)
    with sizes(16, 8):
        sampler = EpochSampler(h.store, batch_size=6, seed=1)
        sampler.sample()
        state = sampler.state_dict()
        assert state["pass_order"] == "buckets"
        old = {k: v for k, v in state.items() if k != "pass_order"}
        blocks = PassOrder(PassRows(intervals=state["pass_rows"]), state["pass_seed"], "blocks")
        want = whole(blocks, itertools.repeat(6))[state["taken"]:]
        resumed = EpochSampler(h.store, batch_size=6, seed=3)
        resumed.load_state_dict(old)
        got = np.concatenate([r.rows for r in resumed])
        assert np.array_equal(got, want)
        assert not np.array_equal(got, np.concatenate([r.rows for r in sampler])), "the method matters"
        with pytest.raises(StoreError, match="pass_order"):
            EpochSampler(h.store, batch_size=6).load_state_dict({**state, "pass_order": "spiral"})


def test_epoch_pass_with_evictions_saves_its_rest_and_loads_older_states(new_url: Any) -> None:
    h = Harness(new_url(), 40)
    _store(h, 4)
    with sizes(16, 8):
        sampler = EpochSampler(h.store, batch_size=6, seed=1)
        taken = sampler.sample().rows
        _store(h, 1)  # evicts rows 0-9
        nxt = sampler.sample().rows
        assert not set(nxt.tolist()) & set(range(10))
        state = sampler.state_dict()
        assert "pass_seed" not in state and not set(state["rest"].tolist()) & set(range(10))
        want = np.concatenate([r.rows for r in sampler])
        seen = np.concatenate([taken, nxt, want]).tolist()
        assert len(seen) == len(set(seen)) and set(seen) >= set(range(10, 40))
        resumed = EpochSampler(h.store, batch_size=6, seed=7)
        resumed.load_state_dict(state)
        assert np.array_equal(np.concatenate([r.rows for r in resumed]), want)
        # a state saved before pass seeds: the whole order of the pass and a cursor into it
        old = {k: v for k, v in state.items() if k != "rest"}
        old.update(order=np.concatenate([taken, nxt, state["rest"]]), cursor=len(taken) + len(nxt))
        legacy = EpochSampler(h.store, batch_size=6, seed=7)
        legacy.load_state_dict(old)
        assert np.array_equal(np.concatenate([r.rows for r in legacy]), want)


def test_epoch_state_loads_only_into_a_sampler_over_the_same_rows(new_url: Any) -> None:
    h = Harness(new_url(), None)
    _store(h, 3)
    subset = np.arange(0, 30, 2)
    sampler = EpochSampler(h.store, batch_size=4, seed=1, subset=subset)
    sampler.sample()
    state = sampler.state_dict()
    assert state["pass_check"] == [15, int(subset.sum())]
    for other in (np.arange(0, 30, 3), np.r_[subset[:-1], 29]):  # other rows; as many, another sum
        with pytest.raises(StoreError, match="subset it was saved with"):
            EpochSampler(h.store, batch_size=4, subset=other).load_state_dict(state)
    same = EpochSampler(h.store, batch_size=4, subset=subset)
    same.load_state_dict(state)
    assert np.array_equal(same.sample().rows, sampler.sample().rows)
