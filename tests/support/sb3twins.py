"""Helpers for the tests of the store-backed SB3 HER and n-step buffers, and a training child to SIGKILL.

``CounterGoalEnv`` is a tiny goal env (a real ``gymnasium.Env``) whose achieved goal is the step
count, so a relabelled goal says which step of its episode it came from. Run as
``python -m support.sb3twins '<json args>'`` (cwd and PYTHONPATH: tests/) with ``kind`` (``"nstep"``:
DQN with n-step returns on CartPole; ``"her"``: SAC with HER on a continuous bit-flipping env),
``url``, ``model`` and ``commit_every``: prints ``ready`` once the model is saved, then
``c <transitions>`` after each commit, flushed, until killed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

CARTPOLE_STEPS = 40
"""CartPole's time limit in the n-step child: short, so its replay holds truncations and terminations."""

BITS = 4
"""Bits of the bit-flipping env of the HER child (episodes of at most ``BITS`` steps)."""


class CounterGoalEnv(gym.Env[dict[str, np.ndarray], np.int64]):
    """A goal env whose achieved goal counts the steps: step ``k`` (from 0) reaches ``k + 1``.

    The desired goal is drawn in ``[2, 12]``; the episode terminates when the count reaches it
    and is truncated after ``max_steps`` steps. ``info["bonus"]`` is ``0.01 * count``, which
    ``compute_reward`` adds, so a test sees whether infos reach it. The action is ignored.
    """

    def __init__(self, max_steps: int = 8) -> None:
        box = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Discrete(2)
        self.max_steps = max_steps
        self._count = 0
        self._goal = 0.0

    def _obs(self) -> dict[str, np.ndarray]:
        count = np.array([self._count], np.float32)
        return {"observation": count, "achieved_goal": count.copy(), "desired_goal": np.array([self._goal], np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Count 0 and a new desired goal."""
        super().reset(seed=seed)
        self._count = 0
        self._goal = float(self.np_random.integers(2, 13))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """One more count."""
        self._count += 1
        obs = self._obs()
        info = {"bonus": 0.01 * self._count}
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], [info])[0])
        terminated = self._count >= self._goal
        return obs, reward, terminated, not terminated and self._count >= self.max_steps, info

    def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        """-1 unless the goal is reached, plus each info's bonus (vectorised over a batch)."""
        achieved, desired = np.asarray(achieved).reshape(-1, 1), np.asarray(desired).reshape(-1, 1)
        bonus = np.array([float(i.get("bonus", 0.0)) for i in info], dtype=np.float64).reshape(-1)
        if len(bonus) != len(achieved):
            bonus = np.zeros(len(achieved))
        return -(np.abs(achieved - desired).sum(axis=-1) > 0.5).astype(np.float64) + bonus


def make_model(kind: str, env: Any, url: str, commit_every: int) -> Any:
    """The seeded model the child trains (and the parent restarts with ``load``)."""
    if kind == "nstep":
        from stable_baselines3 import DQN

        from replaystore.integrations import ReplayStoreNStepBuffer

        return DQN("MlpPolicy", env, buffer_size=50_000, learning_starts=100, train_freq=4, gradient_steps=1,
                   batch_size=32, target_update_interval=100, policy_kwargs={"net_arch": [32]}, seed=0,
                   device="cpu", replay_buffer_class=ReplayStoreNStepBuffer,
                   replay_buffer_kwargs={"url": url, "commit_every": commit_every, "n_steps": 3, "gamma": 0.99})
    from stable_baselines3 import SAC

    from replaystore.integrations import ReplayStoreHerBuffer

    return SAC("MultiInputPolicy", env, buffer_size=50_000, learning_starts=100, train_freq=4, gradient_steps=1,
               batch_size=32, policy_kwargs={"net_arch": [32]}, seed=0, device="cpu",
               replay_buffer_class=ReplayStoreHerBuffer,
               replay_buffer_kwargs={"url": url, "commit_every": commit_every, "n_sampled_goal": 4,
                                     "goal_selection_strategy": "future"})


def make_env(kind: str) -> Any:
    """CartPole with a short time limit (n-step) or a continuous bit-flipping goal env (HER)."""
    if kind == "nstep":
        return gym.make("CartPole-v1", max_episode_steps=CARTPOLE_STEPS)
    from stable_baselines3.common.envs import BitFlippingEnv

    return BitFlippingEnv(n_bits=BITS, continuous=True, max_steps=BITS)


class Report(BaseCallback):
    """Prints ``c <committed transitions>`` whenever the buffer's pending count dropped (a commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.last = 0

    def _on_step(self) -> bool:
        buf = self.model.replay_buffer
        pending = buf.pending  # type: ignore[union-attr]
        if pending < self.last:
            print(f"c {buf.size() * buf.n_envs - pending}", flush=True)  # type: ignore[union-attr]
        self.last = pending
        return True


def main() -> None:
    """Train until killed; see the module docstring."""
    args = json.loads(sys.argv[1])
    model = make_model(args["kind"], make_env(args["kind"]), args["url"], args["commit_every"])
    model.save(args["model"])
    print("ready", flush=True)
    model.learn(10**9, callback=Report())


if __name__ == "__main__":
    main()
