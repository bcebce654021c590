"""Goal-conditioned helpers for the HER and transform tests: bit flipping, rewards, picklable transforms.

Module-level functions, so spawn workers can unpickle them by reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.schemas import goal_transitions
from replaystore.store import Store, open_store


def bit_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """Bit flipping's sparse reward, vectorised: 0 where every bit matches, else -1."""
    return -(np.asarray(achieved) != np.asarray(desired)).any(axis=-1).astype(np.float32)


def distance_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """A dense reward that identifies its inputs: minus the summed absolute difference."""
    return -np.abs(np.asarray(achieved) - np.asarray(desired)).sum(axis=-1).astype(np.float32)


def double_reward(batch: dict[str, Any]) -> dict[str, Any]:
    """A transform: doubles ``reward`` and adds ``pid`` (the process that ran it)."""
    import os

    return {**batch, "reward": batch["reward"] * 2, "pid": np.full(len(batch["reward"]), os.getpid())}


def failing_transform(batch: dict[str, Any]) -> dict[str, Any]:
    """A transform that raises from a nested frame (its name must show in the traceback)."""
    return _inner_failure(batch)


def _inner_failure(batch: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"bad minibatch of {len(batch['reward'])} records")


class BitFlip:
    """The HER paper's bit-flipping environment: n bits, a goal, action i flips bit i.

    Reward 0 when the state equals the goal, else -1; the episode terminates on
    success and is truncated after n steps.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(n, np.float32)
        self.goal = np.zeros(n, np.float32)
        self.t = 0

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        """A random state and a different random goal; returns (state, goal)."""
        self.state = self.rng.integers(0, 2, self.n).astype(np.float32)
        self.goal = self.state.copy()
        while (self.goal == self.state).all():
            self.goal = self.rng.integers(0, 2, self.n).astype(np.float32)
        self.t = 0
        return self.state.copy(), self.goal.copy()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool]:
        """Flip bit ``action``; returns (state, reward, terminated, truncated)."""
        self.state[action] = 1.0 - self.state[action]
        self.t += 1
        done = bool((self.state == self.goal).all())
        return self.state.copy(), 0.0 if done else -1.0, done, self.t >= self.n and not done


def sb3_goal_env(dim: int, obs_dim: int | None = None) -> Any:
    """A gymnasium goal env with ``dim``-sized goals and :func:`distance_reward`, for SB3's HerReplayBuffer.

    Only its spaces and ``compute_reward`` are used (SB3 calls ``compute_reward`` through ``env_method``).
    """
    import gymnasium as gym

    obs_dim = dim if obs_dim is None else obs_dim

    class GoalEnv(gym.Env):  # type: ignore[misc]
        observation_space = gym.spaces.Dict({
            "observation": gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32),
            "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32),
            "desired_goal": gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)})
        action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

        def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
            return distance_reward(achieved, desired, info)

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
            return self.observation_space.sample(), 0.0, False, False, {}

    return GoalEnv()


def episode_records(stream: int, first_step: int, length: int, end: str) -> dict[str, np.ndarray]:
    """``length`` steps whose goals name themselves: next_achieved_goal = (stream, step), desired = (-1, -1).

    ``end``: "terminated", "truncated" or "open" (no end flag: the stream's visible, unfinished part).
    """
    steps = np.arange(first_step, first_step + length)
    achieved = np.stack([np.full(length, stream), steps - 0.5], axis=1).astype(np.float32)
    next_achieved = np.stack([np.full(length, stream), steps], axis=1).astype(np.float32)
    desired = np.full((length, 2), -1, np.float32)
    term = np.zeros(length, bool)
    trunc = np.zeros(length, bool)
    if end == "terminated":
        term[-1] = True
    elif end == "truncated":
        trunc[-1] = True
    return {"observation": np.zeros((length, 3), np.float32), "achieved_goal": achieved, "desired_goal": desired,
            "action": np.zeros(length, np.int64), "reward": np.full(length, 7.0, np.float32),
            "next_observation": np.zeros((length, 3), np.float32), "next_achieved_goal": next_achieved,
            "next_desired_goal": desired.copy(), "terminated": term, "truncated": trunc}


def goal_store(url: str, seed: int = 0) -> tuple[Store, list[dict[str, Any]]]:
    """Three streams of random episodes, the last of each left open; returns the store and the episodes."""
    rng = np.random.default_rng(seed)
    st = open_store(url, goal_transitions(3, 2), mode="w+")
    episodes: list[dict[str, Any]] = []
    with st.writer() as w:
        for stream in range(3):
            step = 0
            count = int(rng.integers(3, 7))
            for i in range(count):
                length = int(rng.integers(1, 12))
                end = "open" if i == count - 1 else ("terminated" if rng.random() < 0.5 else "truncated")
                w.append(episode_records(stream, step, length, end), stream=stream, reset=True)
                episodes.append({"stream": stream, "first": step, "last": step + length - 1, "complete": end != "open"})
                step += length
        w.commit()
    return st, episodes
