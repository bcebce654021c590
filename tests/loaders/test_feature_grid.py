"""The sampler x feature grid: every supported combination against a plain-Python reference, every refused
one for its error.

One small real store (local disk) of interleaved episodes over three streams carries the fields of every
feature: a ``frame`` to stack, ``reward``/``terminated``/``truncated`` and ``next_obs`` for n-step returns,
goal fields for HER. The reference knows each row's stream, episode and step; it checks the drawn rows
against the eligible set (visible, of the subset, with a next frame for ``stack``), the stacks, the n-step
returns, discounts and successor observations, the relabelled goals and rewards, prioritized weights, the
transform's view of the finished minibatch, the rate limiter's count and that ``refresh_every`` follows
another handle's commits. The table of what is supported is loaders/combinations.py's.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from replaystore.errors import SamplerParameterError, UnsupportedCombinationError
from replaystore.loaders import RateLimiter, Request, UniformSampler, gather, make_loader
from replaystore.loaders import combinations as combos
from support.gridref import (
    ALPHA,
    BETA,
    EPS,
    GAMMA,
    MAKERS,
    N_STEP,
    SUBSET,
    Ref,
    build,
    goal_reward,
    priority,
    sampler_kwargs,
    twice,
)


def combos_of(size: int) -> list[tuple[str, tuple[str, ...]]]:
    return [(kind, feats) for kind in combos.SAMPLERS for feats in itertools.combinations(combos.FEATURES, size)]


SUPPORTED = [(k, f) for size in (0, 1, 2) for k, f in combos_of(size) if combos.supported(k, f)]
REFUSED = ([(k, f) for k, f in combos_of(1) if not combos.supported(k, f)]
           + [(k, f) for k, f in combos_of(2)  # two features the sampler takes, but not together
              if all(combos.supported(k, (g,)) for g in f) and not combos.supported(k, f)])


def eligible(ref: Ref, features: tuple[str, ...], visible: int) -> set[int]:
    rows = set(sorted(ref.where)[:visible]) if visible < len(ref.where) else set(ref.where)
    if "subset" in features:
        rows &= set(SUBSET.tolist())
    if "stack" in features:
        rows = {r for r in rows if ref.has_next(r)}
    return rows


def check_record_batch(ref: Ref, features: tuple[str, ...], b: dict[str, np.ndarray], sampler: Any,
                       allowed: set[int]) -> None:
    """One minibatch of single records (not sequence windows) against the reference."""
    rows = b["indices"].astype(np.int64)
    assert set(rows.tolist()) <= allowed
    stacked = "stack" in features
    if stacked:
        np.testing.assert_array_equal(b["obs"], np.stack([ref.stack(r) for r in rows]))
        assert "frame" not in b
    else:
        np.testing.assert_array_equal(b["frame"], ref.col("frame", rows))
    reward = ref.col("reward", rows).astype(np.float64)
    if "n_step" in features:
        wins = [ref.window(int(r), stacked) for r in rows]
        last = np.array([w[2] for w in wins], dtype=np.int64)
        k = np.array([w[1] for w in wins])
        reward = np.array([w[0] for w in wins])
        terminated = ref.col("terminated", last)
        np.testing.assert_array_equal(b["n"], k)
        np.testing.assert_array_equal(b["terminated"], terminated)
        np.testing.assert_array_equal(b["truncated"], ref.col("truncated", last))
        np.testing.assert_allclose(b["discount"], np.where(terminated, 0.0, GAMMA ** k), rtol=1e-12)
        if stacked:
            np.testing.assert_array_equal(b["next_obs"], np.stack([ref.stack(int(r), 1) for r in last]))
        else:
            np.testing.assert_array_equal(b["next_obs"], ref.col("next_obs", last))
    elif stacked:
        np.testing.assert_array_equal(b["next_obs"], np.stack([ref.stack(int(r), 1) for r in rows]))
    else:
        np.testing.assert_array_equal(b["next_obs"], ref.col("next_obs", rows))
        np.testing.assert_array_equal(b["terminated"], ref.col("terminated", rows))
    if "her" in features:
        goals = b["her_goal_rows"].astype(np.int64)
        relabelled = goals >= 0
        for row, g in zip(rows.tolist(), goals.tolist(), strict=True):
            if g >= 0:  # future: the same complete episode, at or after the drawn step
                (e, t), (ge, gt) = ref.where[row], ref.where[g]
                assert ge == e and gt >= t and ref.complete[e]
        want_goal = np.where(relabelled[:, None], ref.col("next_achieved_goal", np.maximum(goals, 0)),
                             ref.col("desired_goal", rows))
        np.testing.assert_array_equal(b["desired_goal"], want_goal)
        np.testing.assert_array_equal(b["next_desired_goal"], want_goal)
        reward = np.where(relabelled, goal_reward(ref.col("next_achieved_goal", rows), want_goal, {}), reward)
        assert relabelled.any() or not any(ref.complete[ref.where[r][0]] for r in rows.tolist())
    np.testing.assert_allclose(b["reward"], reward.astype(np.float32), rtol=1e-6)
    if "transform" in features:
        np.testing.assert_array_equal(b["twice"], np.asarray(b["reward"]) * 2)
    if sampler.kind == "prioritized":  # rows visible at the update have their priority, later ones the maximum
        known = sampler.known
        top = max(priority(np.array(sorted(known)))) + EPS
        p = np.array([priority(r) + EPS if r in known else top for r in rows.tolist()])
        values = np.maximum(p ** ALPHA, np.finfo(np.float64).tiny)
        np.testing.assert_allclose(b["weights"], ((values.min() / values) ** BETA).astype(np.float32), rtol=1e-6)
    if sampler.kind == "reservoir":
        assert set(rows.tolist()) <= set(sampler.members.tolist())


def check_sequence_batch(ref: Ref, features: tuple[str, ...], b: dict[str, np.ndarray], visible: int) -> None:
    """One minibatch of windows: consecutive steps of one stream, first learning step eligible, stacks."""
    rows = b["indices"].astype(np.int64)
    real = rows >= 0
    np.testing.assert_array_equal(real, b["sequence_valid"])
    learn = rows[:, 1]  # burn_in=1: the first learning step
    assert (learn >= 0).all() and set(learn.tolist()) <= eligible(ref, tuple(f for f in features if f != "stack"),
                                                                     visible)
    for w in rows:
        got = [int(r) for r in w if r >= 0]
        assert len({ref.stream[r] for r in got}) == 1
        assert [ref.step[r] for r in got] == list(range(ref.step[got[0]], ref.step[got[0]] + len(got)))
    if "stack" in features:
        for i, j in zip(*np.nonzero(real), strict=True):
            r = int(rows[i, j])
            np.testing.assert_array_equal(b["obs"][i, j], ref.stack(r))
            assert bool(b["next_valid"][i, j]) == ref.has_next(r)
            if ref.has_next(r):
                np.testing.assert_array_equal(b["next_obs"][i, j], ref.stack(r, 1))
    else:
        np.testing.assert_array_equal(b["frame"][real], ref.col("frame", rows[real]))
        np.testing.assert_array_equal(b["reward"][real], ref.col("reward", rows[real]))
    if "transform" in features:
        np.testing.assert_array_equal(b["twice"], np.asarray(b["reward"]) * 2)


@pytest.mark.parametrize(("kind", "features"), SUPPORTED, ids=[f"{k}-{'+'.join(f) or 'plain'}" for k, f in SUPPORTED])
def test_supported_combination_matches_reference(tmp_path: Any, kind: str, features: tuple[str, ...]) -> None:
    url = str(tmp_path / "st")
    later = "refresh_every" in features
    store, ref, rest = build(url, later)
    total = len(ref.where)
    sampler = MAKERS[kind](store, **sampler_kwargs(features))
    if later:  # another handle commits; the sampler sees the rows at its next minibatch, by itself
        rest()
        assert len(store.default) < total
    ref.follow(url)
    if kind == "prioritized":
        rows = np.array(sorted(ref.where), dtype=np.int64)
        sampler.update(rows, priority(rows))  # rows not yet visible are ignored
        sampler.known = set(sorted(ref.where)[:len(store.default)])
    gate = sampler.rate_limit
    before = gate.own if gate is not None else 0
    loader = make_loader(store, sampler, transform=twice if "transform" in features else None)
    drawn, seen, at_start = 0, [], len(store.default)
    for i, batch in enumerate(loader):
        b = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in batch.items()}
        visible = len(store.default)
        if later and i:  # refresh_every=1: a refresh before every minibatch but the first
            assert visible == total
        drawn += len(b["indices"])
        if kind == "sequence":
            check_sequence_batch(ref, features, b, visible)
        else:
            check_record_batch(ref, features, b, sampler, eligible(ref, features, visible))
            seen.extend(b["indices"].tolist())
    assert drawn
    if kind == "epoch":  # one pass: every record eligible when it started, exactly once
        assert sorted(seen) == sorted(eligible(ref, features, at_start))
    if gate is not None:
        assert gate.own - before == drawn


@pytest.mark.parametrize(("kind", "features"), REFUSED, ids=[f"{k}-{'+'.join(f)}" for k, f in REFUSED])
def test_refused_combination_names_both_sides(tmp_path: Any, kind: str, features: tuple[str, ...]) -> None:
    store, _, _ = build(str(tmp_path / "st"), later=False)
    before = store.default.total_committed(), len(store.default)
    with pytest.raises(UnsupportedCombinationError) as err:
        MAKERS[kind](store, **sampler_kwargs(features))
    e = err.value
    assert isinstance(e, SamplerParameterError)
    if len(features) == 1:
        sides = (combos.SAMPLERS[kind], f"{features[0]}=")
    else:
        sides = (f"{features[0]}=", f"{features[1]}=")
    assert (e.first, e.second) == sides
    assert sides[0] in str(e) and sides[1] in str(e)
    assert (store.default.total_committed(), len(store.default)) == before


def test_grid_covers_every_pair() -> None:
    """Every sampler x feature pair is decided, and what is refused is what the reasons say."""
    grid = combos.grid()
    assert set(grid) == set(combos.SAMPLERS)
    for kind, row in grid.items():
        assert set(row) == set(combos.FEATURES)
        for feature, ok in row.items():
            assert ok == ((kind, feature) not in combos.SAMPLER_REFUSED)
    assert not grid["reservoir"]["stack"] and grid["epoch"]["her"] and not grid["sequence"]["her"]
    for a, b in combos.FEATURE_REFUSED:
        assert combos.feature_reason(b, a) == combos.feature_reason(a, b) is not None


def test_a_sampler_only_draws_rows_and_its_features_and_limiter_do_the_rest(tmp_path: Any) -> None:
    """A sampler kind that overrides only ``draw`` gets stacks, n-step windows, the rate limiter's count and the
    refresh by taking part in ``sample``; ``sample`` is never replaced on the instance."""
    store, ref, _ = build(str(tmp_path / "st"), later=False)
    ref.follow(str(tmp_path / "st"))
    chosen = np.array(sorted(eligible(ref, ("stack",), len(ref.where)))[:5], dtype=np.int64)

    class Fixed(UniformSampler):
        def draw(self) -> Any:
            self.batches_drawn += 1
            return Request(chosen.copy())

    sampler = Fixed(store, batch_size=5, stack=2, n_step=N_STEP, gamma=GAMMA, refresh_every=1,
                    rate_limiter=RateLimiter(1000.0, 1, 1e9, name="fixed"))
    assert "sample" not in vars(sampler)
    assert [f.name for f in sampler.features] == ["stack", "n_step"]
    assert sampler.rate_limit is not None
    before = sampler.rate_limit.own
    for _ in range(2):
        b = {k: v.numpy() for k, v in gather(store.default, sampler.sample()).items() if hasattr(v, "numpy")}
        check_record_batch(ref, ("stack", "n_step"), b, sampler, set(chosen.tolist()))
        np.testing.assert_array_equal(b["indices"], chosen)
    assert sampler.rate_limit.own - before == 10 and sampler.batches_drawn == 2
