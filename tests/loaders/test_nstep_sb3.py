"""N-step targets equal Stable-Baselines3's ``NStepReplayBuffer`` ones on the same CartPole transitions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.buffers import NStepReplayBuffer

from replaystore.loaders import EpochSampler, PrioritizedSampler, UniformSampler, gather
from replaystore.schemas import episode
from replaystore.store import open_store


def _cartpole(steps: int, seed: int) -> dict[str, np.ndarray]:
    """Random-policy CartPole transitions, episodes cut at 15 steps (so some end truncated)."""
    env = gym.make("CartPole-v1", max_episode_steps=15)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out: dict[str, list[Any]] = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated",
                                                 "reset")}
    first = True
    for _ in range(steps):
        action = int(env.action_space.sample())
        nxt, reward, terminated, truncated, _ = env.step(action)
        for k, v in (("obs", obs), ("action", action), ("reward", reward), ("next_obs", nxt),
                     ("terminated", terminated), ("truncated", truncated), ("reset", first)):
            out[k].append(v)
        first = False
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
            first = True
    return {"obs": np.asarray(out["obs"], np.float32), "action": np.asarray(out["action"], np.int64),
            "reward": np.asarray(out["reward"], np.float32), "next_obs": np.asarray(out["next_obs"], np.float32),
            "terminated": np.asarray(out["terminated"], bool), "truncated": np.asarray(out["truncated"], bool),
            "reset": np.asarray(out["reset"], bool)}


@pytest.mark.parametrize("cls", [UniformSampler, PrioritizedSampler, EpochSampler])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_equals_sb3_nstep_replay_buffer(cls: Any, n: int) -> None:
    gamma = 0.97
    data = _cartpole(400, seed=n)
    assert data["terminated"].any() and data["truncated"].any()
    store = open_store(f"memory://nstep-sb3/{cls.kind}-{n}", episode(4), mode="w+")
    with store.writer() as writer:
        writer.append({k: v for k, v in data.items() if k != "reset"}, stream=0, reset=data["reset"])
        writer.commit()
    env = gym.make("CartPole-v1")
    buffer = NStepReplayBuffer(1000, env.observation_space, env.action_space, device="cpu", n_envs=1,
                               handle_timeout_termination=True, n_steps=n, gamma=gamma)
    for i in range(len(data["obs"])):
        buffer.add(data["obs"][i:i + 1], data["next_obs"][i:i + 1], data["action"][i:i + 1],
                   data["reward"][i:i + 1], (data["terminated"] | data["truncated"])[i:i + 1],
                   [{"TimeLimit.truncated": bool(data["truncated"][i])}])
    sampler = cls(store, batch_size=128, seed=0, n_step=n, gamma=gamma)
    row_ids = store.default.row_ids()
    for _ in range(3):
        batch = gather(store.default, sampler.sample())
        positions = np.searchsorted(row_ids, batch["indices"].numpy())
        theirs = buffer._get_samples(positions)
        np.testing.assert_allclose(batch["reward"].numpy(), theirs.rewards.numpy()[:, 0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(batch["next_obs"].numpy(), theirs.next_observations.numpy())
        # SB3 keeps gamma^k and a separate done flag; the DqnBatch convention folds it into the discount. A step
        # both terminal and truncated (the pole falls on the time limit's step) is a timeout to SB3 (it bootstraps);
        # here it is terminal (discount 0): the one departure, checked as such
        both = batch["terminated"].numpy() & batch["truncated"].numpy()
        expected = theirs.discounts.numpy()[:, 0] * (1.0 - theirs.dones.numpy()[:, 0])
        expected[both] = 0.0
        np.testing.assert_allclose(batch["discount"].numpy(), expected, rtol=1e-6)
        np.testing.assert_array_equal(batch["terminated"].numpy() & ~both, theirs.dones.numpy()[:, 0] > 0)
        assert theirs.discounts.numpy()[both, 0] == pytest.approx(gamma ** batch["n"].numpy()[both])
