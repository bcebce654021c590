"""Frame-stacking references for the tests: frames appended by hand and the stacks built from them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from replaystore.loaders import EpochSampler, PrioritizedSampler, UniformSampler
from replaystore.store import Store

FRAME = (2, 3)


class Ref:
    """The raw frames as appended: per row, its stream, episode, step in the episode and frame."""

    def __init__(self) -> None:
        self.frames: dict[int, np.ndarray] = {}
        self.where: dict[int, tuple[int, int, int]] = {}  # row -> (stream, episode, t)
        self.episodes: dict[tuple[int, int], list[int]] = {}  # (stream, episode) -> rows in step order
        self.closed: set[tuple[int, int]] = set()  # episodes whose final frame-only record is stored

    def drawable(self) -> set[int]:
        """Rows followed by a record of their episode."""
        return {rows[t] for rows in self.episodes.values() for t in range(len(rows) - 1)}

    def stacks(self, row: int, k: int, padding: str) -> tuple[np.ndarray, np.ndarray]:
        """``obs`` and ``next_obs`` of ``row``, by hand."""
        s, e, t = self.where[row]
        rows = self.episodes[(s, e)]

        def frame_at(i: int) -> np.ndarray:
            if i < 0:
                return self.frames[rows[0]] if padding == "reset" else np.zeros(FRAME, np.int32)
            return self.frames[rows[i]]

        obs = np.stack([frame_at(t - k + 1 + j) for j in range(k)])
        nxt = np.stack([frame_at(t - k + 2 + j) for j in range(k)]) if t + 1 < len(rows) else None
        return obs, nxt


def fill(store: Store, plan: list[tuple[int, int, bool]], seed: int) -> Ref:
    """Append episodes ``(stream, steps, closed)`` in plan order; closed ones end with a frame-only record."""
    rng = np.random.default_rng(seed)
    ref = Ref()
    n_eps: dict[int, int] = {}
    row = 0
    with store.writer() as w:
        for stream, steps, closed in plan:
            n = steps + 1 if closed else steps
            data = rng.integers(1, 1 << 30, size=(n, *FRAME)).astype(np.int32)
            term = np.zeros(n, bool)
            if closed:
                term[steps - 1] = True
            w.append({"frame": data, "action": rng.integers(0, 4, n), "reward": rng.random(n).astype(np.float32),
                      "terminated": term, "truncated": np.zeros(n, bool)}, stream=stream, reset=True)
            e = n_eps.get(stream, 0)
            n_eps[stream] = e + 1
            ref.episodes[(stream, e)] = list(range(row, row + n))
            for t in range(n):
                ref.frames[row + t] = data[t]
                ref.where[row + t] = (stream, e, t)
            if closed:
                ref.closed.add((stream, e))
            row += n
        w.commit()
    return ref


plans = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9), st.booleans()), min_size=1, max_size=7)

SAMPLERS: dict[str, Callable[..., Any]] = {
    "uniform": lambda s, **kw: UniformSampler(s, batch_size=16, **kw),
    "prioritized": lambda s, **kw: PrioritizedSampler(s, batch_size=16, alpha=0.7, **kw),
    "epoch": lambda s, **kw: EpochSampler(s, batch_size=16, **kw),
}
