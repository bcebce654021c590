"""A child process training SB3's DQN on CartPole with a ``ReplayStoreBuffer``, until it is killed.

Run as ``python -m support.sb3train '<json args>'`` (cwd and PYTHONPATH: tests/), with args ``url``
(the store), ``model`` (where the model is saved, before training starts) and ``commit_every``.
Prints ``ready`` once the model is saved, then ``c <transitions>`` after each commit of the buffer
(the committed transitions, read through the buffer's public ``size``/``pending``), flushed, so a
line written before a SIGKILL is still in the pipe for the parent.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

from replaystore.integrations.sb3 import ReplayStoreBuffer

MAX_STEPS = 50
"""Episode time limit: short, so the replay holds truncations as well as terminations."""


def make_model(env: Any, url: str, commit_every: int) -> DQN:
    """The seeded DQN the child trains (and the parent restarts with ``DQN.load``)."""
    return DQN("MlpPolicy", env, buffer_size=50_000, learning_starts=200, train_freq=4, gradient_steps=1,
               batch_size=32, target_update_interval=100, policy_kwargs={"net_arch": [32]}, seed=0, device="cpu",
               replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"url": url, "commit_every": commit_every})


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
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    model = make_model(env, args["url"], args["commit_every"])
    model.save(args["model"])
    print("ready", flush=True)
    model.learn(10**9, callback=Report())


if __name__ == "__main__":
    main()
