"""Epoch pass orders: uniformly random permutations made a chunk at a time, reproducible from a seed.

The blocked path (beyond ``IN_CACHE`` rows) is exercised at small sizes by lowering the
module's ``IN_CACHE``, ``BLOCK`` and ``CHUNK``: the same code with the sizes an
experiment can enumerate.
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
from replaystore.loaders.passorder import PassOrder
from support.loaderref import Append, Harness, chi2_bound, chi2_stat


@contextlib.contextmanager
def sizes(in_cache: int, block: int, chunk: int) -> Iterator[None]:
    saved = passorder.IN_CACHE, passorder.BLOCK, passorder.CHUNK
    passorder.IN_CACHE, passorder.BLOCK, passorder.CHUNK = in_cache, block, chunk
    try:
        yield
    finally:
        passorder.IN_CACHE, passorder.BLOCK, passorder.CHUNK = saved


def whole(order: PassOrder, takes: Iterator[int]) -> np.ndarray:
    out = []
    while len(order):
        out.append(order.take(next(takes)).copy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize("chunk", [2, 3])
def test_blocked_orders_are_uniform_over_all_permutations(chunk: int) -> None:
    """5 rows in blocks of 2: each of the 120 orders equally likely (chi-square, fixed seeds)."""
    rows = np.arange(5, dtype=np.int64) * 7 + 3
    perms = {p: i for i, p in enumerate(itertools.permutations(rows.tolist()))}
    draws = 12_000
    counts = np.zeros(len(perms))
    with sizes(1, 2, chunk):
        for seed in range(draws):
            counts[perms[tuple(whole(PassOrder(rows.copy(), seed), itertools.repeat(2)).tolist())]] += 1
    assert chi2_stat(counts, np.full(len(perms), draws / len(perms))) < chi2_bound(len(perms) - 1)


def test_blocked_orders_put_every_row_at_every_position_alike() -> None:
    """40 rows in blocks of 4, chunks of 8: no block structure shows in where rows land."""
    n, draws = 40, 4_000
    at = np.zeros((n, n))
    with sizes(1, 4, 8):
        for seed in range(draws):
            order = whole(PassOrder(np.arange(n, dtype=np.int64), seed), itertools.repeat(5))
            at[order, np.arange(n)] += 1
    assert (at.sum(axis=0) == draws).all() and (at.sum(axis=1) == draws).all()
    assert chi2_stat(at, np.full((n, n), draws / n)) < chi2_bound((n - 1) ** 2)


@settings(max_examples=150, deadline=None)
@given(n=hs.integers(0, 150), block=hs.integers(1, 12), chunk=hs.integers(1, 40), in_cache=hs.integers(0, 160),
       seed=hs.integers(0, 2**63 - 1), takes=hs.lists(hs.integers(1, 30), min_size=1, max_size=8),
       stop=hs.integers(0, 150), modulus=hs.integers(2, 5))
def test_pass_order_takes_rest_and_keep(n: int, block: int, chunk: int, in_cache: int, seed: int, takes: list[int],
                                        stop: int, modulus: int) -> None:
    rows = np.sort(np.random.default_rng(n).choice(10 * n + 1, n, replace=False)).astype(np.int64)
    with sizes(in_cache, block, chunk):
        ref = whole(PassOrder(rows.copy(), seed), itertools.repeat(1))
        assert sorted(ref.tolist()) == rows.tolist(), "every row exactly once"
        # the order does not depend on how it is taken
        assert np.array_equal(whole(PassOrder(rows.copy(), seed), itertools.cycle(takes)), ref)
        order = PassOrder(rows.copy(), seed)
        got = [order.take(k) for k in takes if order.taken < stop]
        k = order.taken
        assert k == sum(len(g) for g in got) and len(order) == n - k
        assert np.array_equal(np.concatenate([*got, order.rest()]), ref), "rest(): the remaining rows, in order"
        order.keep(lambda r: r % modulus != 0)
        assert order.seed is None
        want = ref[k:][ref[k:] % modulus != 0]
        assert len(order) == len(want) and np.array_equal(whole(order, itertools.cycle(takes)), want)
    if n > 1:
        other = whole(PassOrder(rows.copy(), seed + 1), itertools.repeat(3))
        assert sorted(other.tolist()) == rows.tolist()


def _store(h: Harness, commits: int) -> None:
    for _ in range(commits):
        h.append(Append(("a",) * 10, False, (0,) * 10, "first", (False,) * 10))
        h.commit()


def test_epoch_sampler_on_blocked_orders_partitions_resumes_and_keeps_a_small_state(new_url: Any) -> None:
    h = Harness(new_url(), None)
    _store(h, 5)
    rows = set(h.store.default.row_ids().tolist())
    with sizes(16, 4, 8):
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
        again = EpochSampler(h.store, batch_size=6, seed=5, resume=True)
        assert np.array_equal(again.sample().rows, sampler.sample().rows)


def test_epoch_pass_with_evictions_saves_its_rest_and_loads_older_states(new_url: Any) -> None:
    h = Harness(new_url(), 40)
    _store(h, 4)
    with sizes(16, 4, 8):
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
