"""Stores to build a report of: the demo's tic-tac-toe DQN store and a recorded Pong ``frames`` store.

- :func:`demo_store`: what ``replaystore demo`` leaves (``replaystore.tools.demo``): the same schema and
  metadata, 2 writers x 4 streams of random tic-tac-toe games committed every 25 games a stream with the
  demo's commit metadata, a ``PrioritizedSampler`` named ``demo-per`` that drew minibatches (with
  ``train=True`` real DQN steps write its priorities back; else random ones) and was saved, and the
  network's ``demo-qnet`` state slot. The writers run in this process,
  one after the other (the demo runs them in two processes at once: the records are the same). Smaller
  than the demo's by default (``games`` per stream).
- :func:`pong_store`: Pong through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4, random
  policy) in ``envs`` environments under ``FrameStackObservation(4)``, recorded with
  ``RecordVectorEpisodes(frame_stack=4)`` (one frame per record, the ``frames`` layout), episodes cut at
  ``episode_steps``; optionally with a saved ``PrioritizedSampler`` (``pong-per``, ``stack=4``) whose
  priorities a few rounds of updates moved.

Both are plain functions of a directory, used by tests/report/test_browser.py and by
bench/report_screenshots.py and bench/report_bench.py (which put tests/ on ``sys.path``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

DEMO_STREAMS = 4
DEMO_COLLECTORS = 2
DEMO_COMMIT_EVERY = 25


def demo_store(root: str | os.PathLike[str], games: int = 60, train_steps: int = 60, train: bool = False,
               seed: int = 0) -> str:
    """Build the demo's store under ``root`` (``root/tictactoe-dqn``) and return its url.

    Parameters
    ----------
    root : path-like
        The directory (created if missing).
    games : int, optional
        Games per stream (the demo plays 300).
    train_steps : int, optional
        Minibatches of 256 the prioritized sampler draws before it is saved (the demo saves it after 1,500).
    train : bool, optional
        Train the demo's DQN on them (its |TD errors| become the priorities); otherwise each minibatch gets
        random priorities (exponential, mean 0.3), which skips loading torch's optimizers (seconds).
    seed : int, optional
        Seed of the games and the network.

    Returns
    -------
    str
        The store's url.
    """
    import torch

    from replaystore.loaders import PrioritizedSampler, make_loader
    from replaystore.schemas import dqn
    from replaystore.store import open_store
    from replaystore.tools import tictactoe
    from replaystore.tools.dqn import QNet, train_step

    url = os.path.join(os.fspath(root), "tictactoe-dqn")
    os.makedirs(os.fspath(root), exist_ok=True)
    schema = dqn(tictactoe.OBSERVATION_SIZE, heads=1, actions=tictactoe.ACTIONS,
                 metadata={"env_id": "tictactoe", "action_frame": "board cell 0-8, row-major",
                           "observation": "own marks (9) then opponent marks (9)", "producer": "replaystore demo"})
    st = open_store(url, schema, mode="w+", capacity=200_000)
    for collector in range(DEMO_COLLECTORS):
        rng = np.random.default_rng(100 + seed + collector)
        with st.writer() as w:
            for g in range(games):
                for s in range(DEMO_STREAMS):
                    batch, _ = tictactoe.play(tictactoe.random_policy, rng)
                    w.append(batch, stream=f"collector{collector}/game{s}", reset=True)
                if (g + 1) % DEMO_COMMIT_EVERY == 0 or g + 1 == games:
                    w.commit(metadata={"collector": collector, "games": (g + 1) * DEMO_STREAMS})
    torch.manual_seed(seed)
    online = QNet(tictactoe.OBSERVATION_SIZE, tictactoe.ACTIONS)
    sampler = PrioritizedSampler(st, batch_size=256, alpha=0.6, beta=0.4, seed=seed, name="demo-per",
                                 num_batches=train_steps)
    if train:
        target = QNet(tictactoe.OBSERVATION_SIZE, tictactoe.ACTIONS)
        target.load_state_dict(online.state_dict())
        opt = torch.optim.Adam(online.parameters(), lr=1e-3)
        for i, batch in enumerate(make_loader(st, sampler, num_workers=0)):
            train_step(online, target, opt, batch, sampler)
            if (i + 1) % 100 == 0:
                target.load_state_dict(online.state_dict())
    else:  # |TD errors| of an untrained network are about this spread; no optimizer (torch's compiler) to load
        prng = np.random.default_rng(seed)
        for _ in range(train_steps):
            req = sampler.sample()
            sampler.update(req.rows, prng.exponential(0.3, len(req.rows)))
    sampler.save()
    st.save_state("demo-qnet", {"steps": train_steps},
                  {k.replace(".", "__"): v.detach().numpy().copy() for k, v in online.state_dict().items()})
    st.close()
    return url


def pong(episode_steps: int) -> Any:
    """Pong through ``AtariPreprocessing`` (84x84 grayscale, frame skip 4, no no-ops), at most ``episode_steps``."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, max_episode_steps=4 * episode_steps)
    return gym.wrappers.AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84, grayscale_obs=True)


def pong_store(root: str | os.PathLike[str], envs: int = 2, steps: int = 150, episode_steps: int = 60,
               sampler: bool = True, seed: int = 0, commit_every: int | None = None) -> str:
    """Record random Pong into ``root/pong`` (``frames`` layout, ``frame_stack=4``) and return its url.

    Parameters
    ----------
    root : path-like
        The directory (created if missing).
    envs : int, optional
        Environments of the ``SyncVectorEnv``: one stream each.
    steps : int, optional
        Vector steps recorded (``envs * steps`` transitions, about).
    episode_steps : int, optional
        Agent steps after which an episode is truncated (Pong's own end, 21 points, comes far later).
    sampler : bool, optional
        Also train and save a ``PrioritizedSampler(stack=4)`` named ``pong-per`` (random priorities).
    seed : int, optional
        Seed of the environments and the actions.
    commit_every : int, optional
        The recorder's ``commit_every`` (records; its default, 10,000, if None).

    Returns
    -------
    str
        The store's url.
    """
    import gymnasium as gym
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordVectorEpisodes
    from replaystore.store import open_store

    url = os.path.join(os.fspath(root), "pong")
    os.makedirs(os.fspath(root), exist_ok=True)
    venv = gym.vector.SyncVectorEnv([lambda: FrameStackObservation(pong(episode_steps), 4)] * envs)
    kwargs = {} if commit_every is None else {"commit_every": commit_every}
    rec = RecordVectorEpisodes(venv, url, frame_stack=4, **kwargs)
    rec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rec.step(rng.integers(6, size=envs))
    rec.close()
    if sampler:
        from replaystore.loaders import PrioritizedSampler

        with open_store(url, mode="a") as st:
            per = PrioritizedSampler(st, batch_size=64, stack=4, seed=seed, name="pong-per")
            prng = np.random.default_rng(seed + 1)
            for _ in range(20):
                req = per.sample()
                per.update(req.rows, prng.exponential(1.0, len(req.rows)))
            per.save()
    return url


def dict_pong_store(root: str | os.PathLike[str], steps: int = 80, episode_steps: int = 30, seed: int = 0) -> str:
    """Record Pong with a Dict observation (``screen``: the 84x84 frame, ``clock``: the step) into ``root/dict-pong``.

    ``RecordEpisodes`` stores each leaf of the Dict as a field of its own (``obs`` and ``next_obs`` of both),
    so the report has image fields nested in an observation. Returns the store's url.
    """
    import gymnasium as gym

    from replaystore.gym import RecordEpisodes

    class ScreenAndClock(gym.ObservationWrapper):  # type: ignore[type-arg]
        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.observation_space = gym.spaces.Dict({"screen": env.observation_space,
                                                      "clock": gym.spaces.Box(0, 1e6, (1,), np.float32)})
            self.t = 0

        def reset(self, **kwargs: Any) -> Any:
            self.t = 0
            return super().reset(**kwargs)

        def step(self, action: Any) -> Any:
            self.t += 1
            return super().step(action)

        def observation(self, observation: Any) -> Any:
            return {"screen": observation, "clock": np.array([self.t], np.float32)}

    url = os.path.join(os.fspath(root), "dict-pong")
    os.makedirs(os.fspath(root), exist_ok=True)
    env = RecordEpisodes(ScreenAndClock(pong(episode_steps)), url, commit_every=25)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(int(rng.integers(6)))
        if term or trunc:
            env.reset()
    env.close()
    return url
