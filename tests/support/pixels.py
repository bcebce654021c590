"""Atari for the pixel journeys: Pong through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4).

Also: the stacked transitions a frames store holds, per stream in step order, through the loaders' public
``EpochSampler(stack=)`` (one pass over the drawable records).
"""

from __future__ import annotations

import math
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np

from replaystore.loaders import EpochSampler, gather
from replaystore.store import Store

gym.register_envs(ale_py)

SIZE = 84


def pong(max_episode_steps: int = 80, channel: bool = False) -> gym.Env[Any, Any]:
    """Pong through gymnasium's ``AtariPreprocessing``: 84x84 grayscale, frame skip 4, no no-ops, short episodes.

    ``channel``: frames of shape ``(84, 84, 1)`` (``grayscale_newaxis``), what SB3's ``VecFrameStack`` stacks.
    ``max_episode_steps`` counts agent steps (the time limit sees the emulator's 4 frames of each).
    """
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, max_episode_steps=4 * max_episode_steps)
    return gym.wrappers.AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=SIZE, grayscale_obs=True,
                                           grayscale_newaxis=channel)


def stored_transitions(st: Store, stack: int, padding: str, field: str = "frame") -> dict[str, dict[str, np.ndarray]]:
    """Per stream key: every drawable record's ``obs``/``next_obs`` stacks and scalars, in step order.

    Read with the loaders' own frame stacking (``EpochSampler(stack=)``, one pass).
    """
    sampler = EpochSampler(st, 64, stack=stack, stack_padding=padding, stack_field=field)
    drawable = len(sampler.drawable_rows())
    parts: list[dict[str, Any]] = []
    for _ in range(math.ceil(drawable / 64)):
        b = gather(st.default, sampler.sample())
        parts.append({k: np.asarray(v) for k, v in b.items() if k in (
            "indices", "obs", "next_obs", "action", "reward", "terminated", "truncated")})
    got = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    assert len(np.unique(got["indices"])) == drawable  # one pass: each drawable record once
    out = {}
    for key in st.streams():
        rows, steps = st.rows(key)
        order = rows[np.argsort(steps)]
        pos = {int(r): i for i, r in enumerate(got["indices"].tolist())}
        sel = np.array([pos[int(r)] for r in order if int(r) in pos], dtype=np.int64)
        out[str(key)] = {k: v[sel] for k, v in got.items()}
    return out


def live_bytes(st: Store) -> int:
    """The store's live data: every column's stored bytes plus the per-record index (stream, step, reset)."""
    info = st.info()
    cols = next(iter(info["tables"].values()))["columns"]
    return int(sum(c["stored"] for c in cols.values())) + 13 * len(st)
