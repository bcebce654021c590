"""Sampler arguments checked where they enter: prioritized priorities/alpha/beta ranges (with a
proportional-draw property against a reference), resume with other hyperparameters
(ResumeMismatchError / ``override=True``), and ``refresh_every`` following a second writer."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import ResumeMismatchError, SamplerParameterError
from replaystore.loaders import PrioritizedSampler, ReservoirSampler, SequenceSampler, UniformSampler
from replaystore.loaders.prioritized import MAX_LEAF, MIN_LEAF
from replaystore.schemas import transitions
from replaystore.store import Store, open_store
from support.batches import transitions_batch

N = 16


def _store(url: str, records: int = N, **kwargs: Any) -> Store:
    st = open_store(url, transitions(4), mode="w", **kwargs)
    with st.writer() as w:
        w.append(transitions_batch(np.random.default_rng(0), records), stream="s")
    return st


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One store of N records for every example that only samples."""
    return _store(str(tmp_path_factory.mktemp("inputs") / "st"))


# -- prioritized: valid ranges -------------------------------------------------------------------
@pytest.mark.parametrize(("name", "value"), [("alpha", math.nan), ("alpha", math.inf), ("alpha", -1.0),
                                             ("beta", math.nan), ("beta", -math.inf), ("eps", math.inf),
                                             ("eps", -1e-6), ("alpha", "0.6")])
def test_bad_alpha_beta_eps_are_typed_errors(shared: Store, name: str, value: Any) -> None:
    with pytest.raises(SamplerParameterError) as err:
        PrioritizedSampler(shared, 4, **{name: value})
    assert err.value.field == name and name in str(err.value)


@pytest.mark.parametrize(("alpha", "bad"), [(0.6, math.nan), (0.6, math.inf), (0.6, -math.inf),
                                            (1.0, 1e308), (2.0, 1e200), (1e3, 2.0)])
def test_bad_priorities_are_refused_and_change_nothing(shared: Store, alpha: float, bad: float) -> None:
    s = PrioritizedSampler(shared, 4, alpha=alpha)
    rows = shared.row_ids()
    s.update(rows, np.linspace(0.0, 1.0, len(rows)))
    before, leaves, top = s.priorities(rows), s.tree.leaves().copy(), s.max_priority
    prios = np.full(len(rows), 0.5)
    prios[3] = bad
    with pytest.raises(SamplerParameterError) as err:
        s.update(rows, prios)
    assert err.value.field == "priorities"
    assert np.array_equal(s.tree.leaves(), leaves) and s.max_priority == top
    assert np.array_equal(s.priorities(rows), before, equal_nan=True)
    assert np.isfinite(s.tree.total) and s.tree.total > 0


EXTREME = hs.one_of(hs.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-308, 5e-324, 1e-300, 1e300, 1e150, -3.0, 1.0,
                                     math.inf, -math.inf, math.nan]),
                    hs.floats(-1e10, 1e10, allow_nan=False))


def _reference_mass(prios: np.ndarray, alpha: float, eps: float) -> np.ndarray | None:
    """Each record's share of the draws, or None where the update must be refused."""
    p = np.abs(prios) + eps
    if not np.isfinite(p).all():
        return None
    with np.errstate(over="ignore", under="ignore"):
        v = p ** alpha
    if (v > MAX_LEAF).any():
        return None
    v = np.maximum(v, MIN_LEAF)
    return v / v.sum()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(prios=hs.lists(EXTREME, min_size=N, max_size=N), alpha=hs.sampled_from([0.0, 0.5, 0.6, 1.0, 3.0, 1e3]),
       eps=hs.sampled_from([0.0, 1e-6]), seed=hs.integers(0, 2**32))
def test_prioritized_draws_stay_proportional_under_extreme_priorities(shared: Store, prios: list[float],
                                                                      alpha: float, eps: float, seed: int) -> None:
    s = PrioritizedSampler(shared, 4000, alpha=alpha, eps=eps, seed=seed)
    rows = shared.row_ids()
    want = _reference_mass(np.array(prios), alpha, eps)
    if want is None:
        with pytest.raises(SamplerParameterError):
            s.update(rows, prios)
    else:
        s.update(rows, prios)
    if want is None:  # refused: every record still at the initial priority
        want = np.full(N, 1.0 / N)
    req = s.sample()
    counts = np.bincount(np.searchsorted(rows, req.rows), minlength=N)
    # stratified draws: each record gets its expected count within 2 (one straddled slice per end)
    assert np.all(np.abs(counts - want * 4000) <= 2 + 1e-6 * 4000), (counts, want * 4000)
    w = req.outputs["weights"]
    assert np.isfinite(w).all() and (w >= 0).all() and w.max() == 1.0


# -- resume with other hyperparameters ----------------------------------------------------------
def _saved_prioritized(url: str) -> tuple[Store, np.ndarray]:
    st = _store(url)
    s = PrioritizedSampler(st, 4, alpha=0.6, beta=0.4, seed=3, name="per")
    rows = st.row_ids()
    prios = np.linspace(0.5, 4.0, len(rows))
    s.update(rows, prios)
    s.sample()
    s.save()
    return st, prios


def test_resume_with_other_hyperparameters_is_a_typed_error_naming_them(tmp_path: Any) -> None:
    st, _ = _saved_prioritized(str(tmp_path / "st"))
    slot = st.load_state("per")
    with pytest.raises(ResumeMismatchError) as err:
        PrioritizedSampler(st, 8, alpha=0.7, beta=0.4, seed=3, name="per", resume=True)
    assert set(err.value.parameters) == {"batch_size", "alpha"}
    assert err.value.parameters["alpha"] == (0.6, 0.7) and "batch_size" in str(err.value)
    with pytest.raises(ResumeMismatchError, match="seed"):
        PrioritizedSampler(st, 4, alpha=0.6, beta=0.4, seed=4, name="per", resume=True)
    assert repr(open_store(st.url).load_state("per")) == repr(slot)  # the slot is untouched
    same = PrioritizedSampler(st, 4, alpha=0.6, beta=0.4, seed=3, name="per", resume=True)
    assert same.batches_drawn == 1


def test_resume_override_keeps_priorities_under_the_new_alpha(tmp_path: Any) -> None:
    st, prios = _saved_prioritized(str(tmp_path / "st"))
    rows = st.row_ids()
    s = PrioritizedSampler(st, 8, alpha=1.0, beta=0.9, seed=3, eps=0.0, name="per", resume=True, override=True)
    assert (s.alpha, s.beta, s.eps, s.batch_size) == (1.0, 0.9, 0.0, 8)
    assert s.batches_drawn == 1
    np.testing.assert_allclose(s.priorities(rows), prios + 1e-6, rtol=1e-9)
    np.testing.assert_allclose(s.tree.leaves()[:N], prios + 1e-6, rtol=1e-9)  # p ** 1.0
    assert len(s.sample().rows) == 8
    # a new seed: a fresh RNG from it
    u = UniformSampler(st, 5, seed=1, name="u")
    u.sample()
    u.save()
    again = UniformSampler(st, 5, seed=9, name="u", resume=True, override=True)
    assert again.batches_drawn == 1
    assert np.array_equal(again.sample().rows, UniformSampler(st, 5, seed=9).sample().rows)


def test_resume_override_refuses_what_cannot_change(tmp_path: Any) -> None:
    st = _store(str(tmp_path / "st"))
    r = ReservoirSampler(st, capacity=5, batch_size=2, name="res")
    r.sample()
    r.save()
    with pytest.raises(ResumeMismatchError) as err:
        ReservoirSampler(st, capacity=6, batch_size=3, name="res", resume=True, override=True)
    assert set(err.value.parameters) == {"capacity"}
    # an alpha the saved priorities cannot take is refused too
    s = PrioritizedSampler(st, 2, alpha=0.5, name="huge")
    s.update(st.row_ids()[:1], [1e300])
    s.save()
    with pytest.raises(SamplerParameterError, match="priorities"):
        PrioritizedSampler(st, 2, alpha=2.0, name="huge", resume=True, override=True)


def test_resume_override_sequence_window(tmp_path: Any) -> None:
    st = _store(str(tmp_path / "st"))
    s = SequenceSampler(st, length=2, burn_in=1, batch_size=3, name="seq")
    s.sample()
    s.save()
    with pytest.raises(ResumeMismatchError) as err:
        SequenceSampler(st, length=4, burn_in=0, batch_size=3, name="seq", resume=True)
    assert set(err.value.parameters) == {"length", "burn_in"}
    t = SequenceSampler(st, length=4, burn_in=0, batch_size=3, name="seq", resume=True, override=True)
    assert t.batches_drawn == 1 and t.sample().rows.shape == (3, 4)


# -- refresh_every --------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda st, **kw: UniformSampler(st, 2000, **kw),
    lambda st, **kw: PrioritizedSampler(st, 2000, **kw),
])
def test_refresh_every_follows_another_writers_commits(tmp_path: Any, make: Callable[..., Any]) -> None:
    url = str(tmp_path / "st")
    _store(url, records=4)
    reader = open_store(url, mode="r")
    other = open_store(url)  # a second handle: its writer commits while the sampler iterates
    sampler = make(reader, refresh_every=2, num_batches=7)
    seen: list[set[int]] = []
    rng = np.random.default_rng(1)
    with other.writer() as w:
        for i, req in enumerate(sampler):
            seen.append({int(r) for r in req.rows})
            w.append(transitions_batch(rng, 4), stream=f"new-{i}")
            w.commit()  # committed before the next minibatch is drawn
    sizes = [len(s) for s in seen]
    # a refresh before minibatches 2, 4, 6 (every 2nd): each then sees the commits so far
    assert sizes[0] == sizes[1] == 4 and max(sizes[:2]) == 4
    assert sizes[2] == 12 and sizes[3] == 12 and sizes[4] == 20 and sizes[6] == 28
    with pytest.raises(SamplerParameterError, match="refresh_every"):
        make(reader, refresh_every=0)
    with pytest.raises(SamplerParameterError, match="refresh_every_s"):
        make(reader, refresh_every_s=math.nan)


def test_refresh_every_s_follows_another_writers_commits(tmp_path: Any) -> None:
    url = str(tmp_path / "st")
    _store(url, records=4)
    reader = open_store(url, mode="r")
    sampler = UniformSampler(reader, 2000, refresh_every_s=1e-9, num_batches=3)
    it = iter(sampler)
    assert len({int(r) for r in next(it).rows}) == 4
    with open_store(url).writer() as w:
        w.append(transitions_batch(np.random.default_rng(2), 4), stream="late")
    assert len({int(r) for r in next(it).rows}) == 8  # the interval has passed: refreshed first


# -- size-like parameters: refused before anything is allocated from them ------------------------
@pytest.mark.parametrize(("make", "field"), [
    (lambda st: UniformSampler(st, batch_size=10**12), "batch_size"),
    (lambda st: UniformSampler(st, batch_size=(1 << 24) + 1), "batch_size"),
    (lambda st: PrioritizedSampler(st, 10**12), "batch_size"),
    (lambda st: ReservoirSampler(st, capacity=8, batch_size=10**12), "batch_size"),
    (lambda st: ReservoirSampler(st, capacity=1 << 41, batch_size=4), "capacity"),
    (lambda st: SequenceSampler(st, length=10**12), "length"),
    (lambda st: SequenceSampler(st, length=4, burn_in=10**12), "burn_in"),
    (lambda st: SequenceSampler(st, length=2.5), "length"),
    (lambda st: UniformSampler(st, batch_size=4, stack=10**9, stack_field="obs"), "stack"),
    (lambda st: UniformSampler(st, batch_size=4, n_step=10**9), "n_step"),
])
def test_size_parameters_beyond_their_bound_are_typed_errors(shared: Store, make: Callable[[Store], Any],
                                                             field: str) -> None:
    with pytest.raises(SamplerParameterError) as err:
        make(shared)
    assert err.value.field == field


def test_the_largest_batch_size_is_accepted_and_numpy_ints_too(shared: Store) -> None:
    assert UniformSampler(shared, batch_size=np.int64(1 << 24)).batch_size == 1 << 24
    assert SequenceSampler(shared, length=np.int32(3), burn_in=np.int64(1)).window == 4


def test_replay_buffer_sample_bounds_its_batch_size(tmp_path: Any) -> None:
    from replaystore.loaders import ReplayBuffer

    buf = ReplayBuffer(str(tmp_path / "rb"), transitions(4), capacity=100)
    buf.add(transitions_batch(np.random.default_rng(0), 8))
    with pytest.raises(SamplerParameterError) as err:
        buf.sample(10**12)
    assert err.value.field == "batch_size"
    assert len(buf.sample(4)["indices"]) == 4


def test_prioritized_update_refuses_row_ids_that_are_not_integers(shared: Store) -> None:
    from replaystore.errors import RowIdTypeError

    s = PrioritizedSampler(shared, 4)
    rows = shared.row_ids()
    for bad in (rows.astype(np.float64) + 0.5, np.ones(len(rows), dtype=bool)):
        with pytest.raises(RowIdTypeError):
            s.update(bad, np.ones(len(rows)))
        with pytest.raises(RowIdTypeError):
            s.priorities(bad)
    s.update(rows.astype(np.int32), np.ones(len(rows)))
    assert np.allclose(s.priorities(rows.astype(np.uint16)), 1.0 + s.eps)
