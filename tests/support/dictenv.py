"""A small Gymnasium environment with a Dict observation (an image and a vector) for the nested-field tests."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictObsEnv(gym.Env):
    """Observation ``{"image": Box(uint8, (8, 8, 3)), "vec": Box(float32, (3,))}``, actions Discrete(3).

    Episodes end (terminated) when the vector's first entry passes a seeded threshold, or are
    truncated after ``max_steps``; every value depends on the seed and the actions.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, max_steps: int = 9) -> None:
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "vec": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        })
        self.action_space = spaces.Discrete(3)
        self.max_steps = max_steps

    def _obs(self) -> dict[str, np.ndarray]:
        image = ((self.base + self.t * 7 + np.arange(8 * 8 * 3)) % 256).astype(np.uint8).reshape(8, 8, 3)
        return {"image": image, "vec": self.vec.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.base = int(self.np_random.integers(256))
        self.vec = self.np_random.normal(size=3).astype(np.float32)
        self.limit = float(self.np_random.uniform(1.0, 3.0))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        self.vec = (self.vec + np.float32(int(action) - 0.5) * np.float32(0.5)).astype(np.float32)
        terminated = bool(self.vec[0] > self.limit)
        truncated = not terminated and self.t >= self.max_steps
        return self._obs(), float(self.vec.sum()), terminated, truncated, {}
