"""Realistic batches for every built-in schema, as the producers emit them.

Each factory returns a plain dataclass shaped like the producer's batch object
(named attributes, numpy arrays), so tests exercise attribute-object input.
Record counts are floors: ``extra`` records may be added, as a collector that
finishes in-flight episode work returns a larger batch than asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

F32, F64, I64 = np.float32, np.float64, np.int64


def _csr(rng: np.random.Generator, records: int, actions: int, empty: np.ndarray | None = None,
         ) -> tuple[np.ndarray, np.ndarray]:
    """Random sorted legal-id sets per record (empty where ``empty`` is true)."""
    counts = rng.integers(1, actions + 1, size=records)
    if empty is not None:
        counts[empty] = 0
    offsets = np.zeros(records + 1, dtype=I64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.concatenate([np.sort(rng.choice(actions, size=c, replace=False)) for c in counts]
                         ) if records else np.zeros(0, I64)
    return ids.astype(I64), offsets


def _floor(rng: np.random.Generator, records: int, extra: int | None) -> int:
    return records + (int(rng.integers(0, 4)) if extra is None else extra)


@dataclass
class TreeStrapBatch:
    obs: np.ndarray
    players: np.ndarray
    targets: np.ndarray
    masks: np.ndarray
    telemetry: dict[str, Any] = field(default_factory=dict)


@dataclass
class DqnBatch:
    obs: np.ndarray
    next_obs: np.ndarray
    players: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    can_bootstrap: np.ndarray
    discounts: np.ndarray
    masks: np.ndarray
    legal_ids: np.ndarray
    legal_offsets: np.ndarray
    next_legal_ids: np.ndarray
    next_legal_offsets: np.ndarray


@dataclass
class PpoBatch:
    obs: np.ndarray
    players: np.ndarray
    actions: np.ndarray
    behavior_log_probs: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray
    values: np.ndarray
    legal_ids: np.ndarray
    legal_offsets: np.ndarray
    telemetry: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlphaZeroBatch:
    obs: np.ndarray
    players: np.ndarray
    policy_targets: np.ndarray
    value_targets: np.ndarray
    policy_weights: np.ndarray
    legal_ids: np.ndarray
    legal_offsets: np.ndarray


@dataclass
class DeepCfrBatch:
    advantage_obs: np.ndarray
    advantage_iterations: np.ndarray
    advantage_legal_offsets: np.ndarray
    advantage_legal_ids: np.ndarray
    advantage_targets: np.ndarray
    strategy_obs: np.ndarray
    strategy_iterations: np.ndarray
    strategy_players: np.ndarray
    strategy_legal_offsets: np.ndarray
    strategy_legal_ids: np.ndarray
    strategy_probs: np.ndarray
    telemetry: dict[str, Any] = field(default_factory=dict)


def treestrap_batch(rng: np.random.Generator, records: int, observation_size: int = 16, heads: int = 2,
                    actions: int = 9, extra: int | None = None) -> TreeStrapBatch:
    n = _floor(rng, records, extra)
    return TreeStrapBatch(
        obs=rng.standard_normal((n, observation_size), dtype=F32),
        players=rng.integers(0, 2, n).astype(I64),
        targets=rng.standard_normal((n, heads, actions)),
        masks=rng.integers(0, 2, (n, heads)).astype(F32),
        telemetry={"searches": int(n), "seconds": 0.25},
    )


def dqn_batch(rng: np.random.Generator, records: int, observation_size: int = 16, heads: int = 2,
              actions: int = 9, gamma: float = 0.99, n_step: int = 3, extra: int | None = None) -> DqnBatch:
    """n-step DQN records; every ~5th record is an episode tail that cannot bootstrap."""
    n = _floor(rng, records, extra)
    tail = rng.random(n) < 0.2
    dones = tail & (rng.random(n) < 0.7)  # the rest are alternating-game truncation tails
    k = rng.integers(1, n_step + 1, n)
    discounts = np.where(tail, 0.0, gamma ** k)
    legal_ids, legal_offsets = _csr(rng, n, actions)
    next_ids, next_offsets = _csr(rng, n, actions, empty=tail)
    starts = legal_offsets[:-1]
    chosen = legal_ids[starts + rng.integers(0, np.diff(legal_offsets))]
    return DqnBatch(
        obs=rng.standard_normal((n, observation_size), dtype=F32),
        next_obs=rng.standard_normal((n, observation_size), dtype=F32),
        players=rng.integers(0, 2, n).astype(I64),
        actions=chosen.astype(I64),
        rewards=rng.standard_normal(n),
        dones=dones,
        can_bootstrap=~tail,
        discounts=discounts.astype(F64),
        masks=rng.integers(0, 2, (n, heads)).astype(F32),
        legal_ids=legal_ids,
        legal_offsets=legal_offsets,
        next_legal_ids=next_ids,
        next_legal_offsets=next_offsets,
    )


def ppo_batch(rng: np.random.Generator, records: int, observation_size: int = 16, actions: int = 9,
              extra: int | None = None) -> PpoBatch:
    n = _floor(rng, records, extra)
    legal_ids, legal_offsets = _csr(rng, n, actions)
    counts = np.diff(legal_offsets)
    chosen = legal_ids[legal_offsets[:-1] + rng.integers(0, counts)]
    values = rng.standard_normal(n)
    advantages = rng.standard_normal(n)
    return PpoBatch(
        obs=rng.standard_normal((n, observation_size), dtype=F32),
        players=rng.integers(0, 2, n).astype(I64),
        actions=chosen.astype(I64),
        behavior_log_probs=-np.log(counts).astype(F64),
        advantages=advantages,
        returns=advantages + values,
        values=values,
        legal_ids=legal_ids,
        legal_offsets=legal_offsets,
        telemetry={"window": 1, "games": 4},
    )


def alphazero_batch(rng: np.random.Generator, records: int, observation_size: int = 16, actions: int = 9,
                    extra: int | None = None) -> AlphaZeroBatch:
    """Every third record is a value-only row: empty legal slice, zero policy weight and target."""
    n = _floor(rng, records, extra)
    value_only = np.arange(n) % 3 == 2
    legal_ids, legal_offsets = _csr(rng, n, actions, empty=value_only)
    policy = np.zeros((n, actions))
    rows = np.repeat(np.arange(n), np.diff(legal_offsets))
    policy[rows, legal_ids] = rng.random(len(legal_ids)) + 0.01
    policy /= np.maximum(policy.sum(axis=1, keepdims=True), 1e-12)
    return AlphaZeroBatch(
        obs=rng.standard_normal((n, observation_size), dtype=F32),
        players=(np.arange(n) % 3).astype(I64),
        policy_targets=policy,
        value_targets=rng.uniform(-1, 1, n),
        policy_weights=(~value_only).astype(F64),
        legal_ids=legal_ids,
        legal_offsets=legal_offsets,
    )


def deep_cfr_batch(rng: np.random.Generator, advantage_records: int, strategy_records: int,
                   observation_size: int = 16, actions: int = 9, iteration: int = 1) -> DeepCfrBatch:
    """Two independently sized streams, targets/probs aligned with their legal ids."""
    a_ids, a_off = _csr(rng, advantage_records, actions)
    s_ids, s_off = _csr(rng, strategy_records, actions)
    probs = rng.random(len(s_ids)) + 0.01
    sums = np.add.reduceat(probs, s_off[:-1]) if strategy_records else np.zeros(0)
    probs /= np.repeat(sums, np.diff(s_off))
    return DeepCfrBatch(
        advantage_obs=rng.standard_normal((advantage_records, observation_size), dtype=F32),
        advantage_iterations=np.full(advantage_records, iteration, dtype=I64),
        advantage_legal_offsets=a_off,
        advantage_legal_ids=a_ids,
        advantage_targets=rng.standard_normal(len(a_ids)),
        strategy_obs=rng.standard_normal((strategy_records, observation_size), dtype=F32),
        strategy_iterations=np.full(strategy_records, iteration, dtype=I64),
        strategy_players=rng.integers(0, 2, strategy_records).astype(I64),
        strategy_legal_offsets=s_off,
        strategy_legal_ids=s_ids,
        strategy_probs=probs,
        telemetry={"traversals": 8, "iteration": iteration},
    )


def transitions_batch(rng: np.random.Generator, records: int, obs_dim: int = 4, actions: int = 3
                      ) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((records, obs_dim), dtype=F32),
        "action": rng.integers(0, actions, records).astype(I64),
        "reward": rng.standard_normal(records, dtype=F32),
        "next_obs": rng.standard_normal((records, obs_dim), dtype=F32),
        "terminated": rng.random(records) < 0.1,
    }


@dataclass
class Episode:
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    final_obs: np.ndarray
    terminated: bool


@dataclass
class Rollout:
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


def episode_batch(rng: np.random.Generator, steps: int, obs_dim: int = 4, actions: int = 3,
                  terminated: bool = True) -> Episode:
    all_obs = rng.standard_normal((steps + 1, obs_dim), dtype=F32)
    return Episode(all_obs[:-1], rng.integers(0, actions, steps).astype(I64),
                   rng.standard_normal(steps, dtype=F32), all_obs[-1], terminated)


def rollout_batch(rng: np.random.Generator, steps: int, envs: int, obs_dim: int = 4, actions: int = 3,
                  ) -> Rollout:
    obs = rng.standard_normal((steps, envs, obs_dim), dtype=F32)
    done = rng.random((steps, envs)) < 0.15
    terminated = done & (rng.random((steps, envs)) < 0.5)
    return Rollout(obs, rng.integers(0, actions, (steps, envs)).astype(I64),
                   rng.standard_normal((steps, envs), dtype=F32),
                   rng.standard_normal((steps, envs, obs_dim), dtype=F32), terminated, done & ~terminated)


BATCHES = {
    "treestrap": lambda rng, n: treestrap_batch(rng, n),
    "dqn": lambda rng, n: dqn_batch(rng, n),
    "ppo": lambda rng, n: ppo_batch(rng, n),
    "alphazero": lambda rng, n: alphazero_batch(rng, n),
    "deep_cfr_advantage": lambda rng, n: {k: v for k, v in vars(deep_cfr_batch(rng, n, 1)).items()
                                          if k.startswith("advantage_") or k == "telemetry"},
    "deep_cfr_strategy": lambda rng, n: {k: v for k, v in vars(deep_cfr_batch(rng, 1, n)).items()
                                         if k.startswith("strategy_") or k == "telemetry"},
    "transitions": lambda rng, n: transitions_batch(rng, n, obs_dim=16, actions=9),
    "frames": lambda rng, n: {"frame": rng.integers(0, 256, (n, 84, 84), dtype=np.uint8),
                              "action": rng.integers(0, 6, n), "reward": rng.random(n, dtype=np.float32),
                              "terminated": rng.random(n) < 0.1, "truncated": np.zeros(n, bool)},
}
"""Factory per built-in schema (built with ``EXAMPLE_ARGS`` sizes), taking ``(rng, records)``."""
