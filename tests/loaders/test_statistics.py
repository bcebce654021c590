"""Sampling distributions, with fixed seeds and generous chi-square bounds (computed by hand).

Each test also shows it has power: the same counts are far outside the bound under a
plausible wrong hypothesis (e.g. p instead of p^alpha, or "keep the first k").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from replaystore.loaders import (
    PrioritizedSampler,
    ReservoirSampler,
    SequenceSampler,
    UniformSampler,
)
from replaystore.store import open_store
from support.loaderref import (
    PROBE,
    Append,
    Harness,
    chi2_bound,
    chi2_stat,
    probe_arrays,
    ref_windows,
    skey,
)


def counts_of(rows: np.ndarray, universe: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(universe, rows)
    assert np.array_equal(universe[pos], rows), "a row outside the universe was drawn"
    return np.bincount(pos, minlength=len(universe))


def test_uniform_frequencies(new_url: Any) -> None:
    """60 visible records over two writers' fragments (after eviction): each drawn ~1/60 of the time."""
    url = new_url()
    st = open_store(url, PROBE, capacity=60)
    with st.writer() as w:
        for i in range(4):
            w.append(probe_arrays(range(10 * i, 10 * i + 10)), stream="a")
            w.commit()
    with open_store(url).writer() as w:
        w.append(probe_arrays(range(100, 130)), stream="b")
    st.refresh()
    with st.writer() as w:
        w.append(probe_arrays(range(200, 210)), stream="a")  # evicts the 10 oldest
    visible = st.row_ids()
    assert len(visible) == 60
    sampler = UniformSampler(st, batch_size=600, seed=1234)
    counts = sum(counts_of(np.sort(sampler.sample().rows), visible) for _ in range(100))
    expected = np.full(60, counts.sum() / 60)
    assert chi2_stat(counts, expected) < chi2_bound(59)
    skewed = expected * np.r_[np.full(30, 1.1), np.full(30, 0.9)]
    assert chi2_stat(counts, skewed) > chi2_bound(59)


def _prioritized_store(url: str, n: int, capacity: int | None = None) -> Any:
    st = open_store(url, PROBE, capacity=capacity)
    with st.writer() as w:
        w.append(probe_arrays(range(n)), stream=0)
    return st


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_prioritized_frequencies_follow_p_alpha(new_url: Any, alpha: float) -> None:
    st = _prioritized_store(new_url(), 12)
    rows = st.row_ids()
    prios = np.arange(1, 13, dtype=np.float64) * 0.5
    sampler = PrioritizedSampler(st, batch_size=256, alpha=alpha, beta=0.4, seed=7)
    sampler.update(rows, prios)
    p = (prios + sampler.eps) ** alpha
    want = p / p.sum()
    counts = np.zeros(12)
    for _ in range(200):
        req = sampler.sample()
        got_rows = req.rows
        counts += counts_of(np.sort(got_rows), rows)
        # importance weights: (N * P(i))^-beta normalised by the max over this minibatch, exactly
        w = (12 * want[np.searchsorted(rows, got_rows)]) ** -0.4
        np.testing.assert_allclose(req.outputs["weights"], (w / w.max()).astype(np.float32), rtol=1e-6)
    expected = counts.sum() * want
    assert chi2_stat(counts, expected) < chi2_bound(11)
    if alpha != 1.0:
        wrong = prios / prios.sum()
        assert chi2_stat(counts, counts.sum() * wrong) > chi2_bound(11)


def test_new_records_enter_at_the_running_max(new_url: Any) -> None:
    st = _prioritized_store(new_url(), 4)
    sampler = PrioritizedSampler(st, batch_size=4, alpha=0.6, seed=0)
    np.testing.assert_allclose(sampler.priorities(st.row_ids()), 1.0)  # the initial max
    sampler.update([0, 1], [5.0, 0.5])
    sampler.update([0], [0.1])  # the running max stays 5 (+eps) although no record has it now
    with st.writer() as w:
        w.append(probe_arrays([10, 11]), stream=0)
    new = st.row_ids()[-2:]
    np.testing.assert_allclose(sampler.priorities(new), 5.0 + sampler.eps)
    np.testing.assert_allclose(sampler.priorities([0, 1, 2, 3]), [0.1 + 1e-6, 0.5 + 1e-6, 1.0, 1.0])


def test_evicted_records_are_never_sampled_and_lose_their_priority(new_url: Any) -> None:
    st = _prioritized_store(new_url(), 10, capacity=10)
    sampler = PrioritizedSampler(st, batch_size=64, alpha=1.0, beta=1.0, seed=3)
    sampler.update(np.arange(4), [1000.0] * 4)  # rows 0-3 hold almost all of the mass...
    assert np.isin(sampler.sample().rows, np.arange(4)).mean() > 0.9
    with st.writer() as w:
        w.append(probe_arrays(range(10, 14)), stream=0)  # ...and are evicted
    assert np.isnan(sampler.priorities(np.arange(4))).all()
    visible = st.row_ids()
    assert 0 not in visible and len(visible) == 10
    counts = np.zeros(10)
    for _ in range(100):
        req = sampler.sample()
        assert np.isin(req.rows, visible).all()
        counts += counts_of(np.sort(req.rows), visible)
    p = sampler.priorities(visible)
    np.testing.assert_allclose(p[:6], 1.0)  # the old max priority of the survivors is gone from the mass
    np.testing.assert_allclose(p[6:], 1000.0 + 1e-6)  # new rows entered at the running max
    want = p / p.sum()
    assert chi2_stat(counts, counts.sum() * want) < chi2_bound(9)
    # an update naming evicted rows ignores them (and they do not raise the running max)
    sampler.update([0, 1, int(visible[0])], [1e9, 1e9, 2.0])
    assert sampler.max_priority == pytest.approx(1000.0 + 1e-6)
    np.testing.assert_allclose(sampler.priorities([0, 1, int(visible[0])]), [np.nan, np.nan, 2.0 + 1e-6])


def test_reservoir_keeps_each_record_with_probability_k_over_n(new_url: Any) -> None:
    """n = 24 records offered over four commits to 1500 independently seeded reservoirs of k = 5."""
    h = Harness(new_url(), None)
    k, n, seeds = 5, 24, 1500
    samplers = [ReservoirSampler(h.store, capacity=k, batch_size=1, seed=s) for s in range(seeds)]
    for size in (3, 4, 8, 9):  # the first commit does not fill the reservoir; the others replace
        h.append(Append(("s",) * size, False, (0,) * size, "none", (False,) * size))
        h.commit()
        for s in samplers:
            s.sample()
            assert len(s.members) <= k
    rows = h.store.row_ids()
    counts = np.zeros(n)
    for s in samplers:
        assert len(s.members) == k and len(set(s.members.tolist())) == k and s.seen == n
        counts += counts_of(np.sort(s.members), rows)
    q = k / n
    expected = np.full(n, seeds * q)
    # inclusion counts are binomial(seeds, k/n) with a fixed total: chi-square(n - 1) scaled by 1 - k/n
    assert chi2_stat(counts, expected) / (1 - q) < chi2_bound(n - 1)
    # power: "the newest records are kept more often" (each commit's rows equally likely) is rejected
    sizes = np.repeat([3, 4, 8, 9], [3, 4, 8, 9])
    wrong = seeds * k * (1 / sizes) / (1 / sizes).sum()
    assert chi2_stat(counts, wrong) > chi2_bound(n - 1)


def test_reservoir_never_exceeds_its_capacity_while_the_table_evicts(new_url: Any) -> None:
    h = Harness(new_url(), 8)
    sampler = ReservoirSampler(h.store, capacity=6, batch_size=4, seed=0)
    for _ in range(12):
        h.append(Append(("s",) * 3, False, (0,) * 3, "none", (False,) * 3))
        h.commit()
        req = sampler.sample()
        members = sampler.members
        assert 0 < len(members) <= 6 and np.isin(members, h.store.row_ids()).all()
        assert np.isin(req.rows, members).all()
    assert sampler.seen == 36


def test_sequence_windows_are_drawn_uniformly(new_url: Any) -> None:
    h = Harness(new_url(), None)
    h.append(Append(("a",) * 9, False, (0,) * 9, "array", (True,) + (False,) * 3 + (True,) + (False,) * 4))
    h.append(Append((3,) * 7, True, (0, 0, 0, 2, 0, 0, 0), "first", (False,) * 7))
    h.commit()
    windows = ref_windows(h.ref.visible(), 2, 2)
    keys = sorted(windows, key=str)
    sampler = SequenceSampler(h.store, length=2, burn_in=2, batch_size=500, seed=9)
    counts = np.zeros(len(keys))
    index = {k: i for i, k in enumerate(keys)}
    for _ in range(40):
        req = sampler.sample()
        for row in req.rows[:, 2]:
            rec = h.ref.rec_of_row(int(row))
            counts[index[(skey(rec.stream), rec.step)]] += 1
    assert chi2_stat(counts, np.full(len(keys), counts.sum() / len(keys))) < chi2_bound(len(keys) - 1)
