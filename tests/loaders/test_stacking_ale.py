"""Real frames: an ALE Pong recording stored one frame per record, stacked at read time, against gymnasium.

The same seeds and actions are replayed through gymnasium's ``FrameStackObservation``
(both padding types); every sampled transition's ``obs`` / ``next_obs`` must equal
the wrapper's stacks at that step and the next.
"""

from __future__ import annotations

from collections.abc import Callable

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box
from gymnasium.wrappers import FrameStackObservation, TransformObservation

from replaystore.loaders import EpochSampler, UniformSampler, make_loader
from replaystore.schemas import frames
from replaystore.store import open_store

gym.register_envs(ale_py)

EPISODES, STEPS, K = 6, 250, 4  # ~1,500 frames


def _env() -> gym.Env:
    env = gym.make("ALE/Pong-v5", obs_type="grayscale", max_episode_steps=STEPS)
    space = Box(0, 255, (105, 80), np.uint8)
    return TransformObservation(env, lambda o: np.ascontiguousarray(o[::2, ::2]), space)


def _run(env: gym.Env, actions: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Per episode, the observations the env returns for the given actions (reset's first)."""
    out = []
    for e, acts in enumerate(actions):
        obs, _ = env.reset(seed=100 + e)
        seen = [np.asarray(obs)]
        for a in acts:
            obs, _, term, trunc, _ = env.step(int(a))
            seen.append(np.asarray(obs))
            if term or trunc:
                break
        out.append(seen)
    return out


@pytest.fixture(scope="module")
def recording() -> tuple[list[list[np.ndarray]], list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(7)
    actions = [rng.integers(0, 6, STEPS) for _ in range(EPISODES)]
    env = _env()
    raw: list[list[np.ndarray]] = []
    rewards, flags = [], []
    for e, acts in enumerate(actions):  # the raw frames, as a collector stores them
        obs, _ = env.reset(seed=100 + e)
        seen, rew, fl = [obs], [], []
        for a in acts:
            obs, r, term, trunc, _ = env.step(int(a))
            seen.append(obs)
            rew.append(r)
            fl.append((term, trunc))
            if term or trunc:
                break
        raw.append(seen)
        rewards.append(np.array(rew, np.float32))
        flags.append(np.array(fl, bool))
        actions[e] = acts[:len(rew)]
    env.close()
    return raw, actions, [rewards, flags]  # type: ignore[return-value]


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_pong_stacks_equal_frame_stack_observation(recording, padding: str, new_url: Callable[[], str]) -> None:
    raw, actions, (rewards, flags) = recording
    store = open_store(new_url(), frames((105, 80), 6), mode="w+")
    first_row, row = [], 0
    with store.writer() as w:
        for seen, acts, rew, fl in zip(raw, actions, rewards, flags, strict=True):
            n = len(seen)  # steps + the final frame-only record
            w.append({"frame": np.stack(seen), "action": np.r_[acts, 0], "reward": np.r_[rew, 0],
                      "terminated": np.r_[fl[:, 0], False], "truncated": np.r_[fl[:, 1], False]}, reset=True)
            first_row.append(row)
            row += n
        w.commit()
    assert row >= 1_500
    stacked = _run(FrameStackObservation(_env(), K, padding_type=padding), actions)
    where = {first_row[e] + t: (e, t) for e in range(len(raw)) for t in range(len(raw[e]) - 1)}

    def check(batch: dict) -> int:
        for i, r in enumerate(batch["indices"].tolist()):
            e, t = where[r]
            np.testing.assert_array_equal(batch["obs"][i].numpy(), stacked[e][t])
            np.testing.assert_array_equal(batch["next_obs"][i].numpy(), stacked[e][t + 1])
            assert int(batch["action"][i]) == int(actions[e][t])
        return len(batch["indices"])

    seen = sum(check(b) for b in make_loader(store, EpochSampler(store, batch_size=256, stack=K,
                                                                  stack_padding=padding)))
    assert seen == len(where)  # every transition, terminal ones included, once
    for b in make_loader(store, UniformSampler(store, batch_size=32, stack=K, stack_padding=padding, seed=1,
                                               num_batches=4)):
        assert b["obs"].shape == (32, K, 105, 80)
        check(b)
