"""The grid's store and reference: interleaved episodes over three streams carrying every feature's fields.

Each row's stream, episode, place and step are known, so stacks, n-step windows and goals can be worked out
by hand (tests/loaders/test_feature_grid.py, tests/loaders/test_feature_resume.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaystore.loaders import (
    HER,
    EpochSampler,
    PrioritizedSampler,
    RateLimiter,
    ReservoirSampler,
    SequenceSampler,
    UniformSampler,
)
from replaystore.schemas import Dense, Schema
from replaystore.store import Store, open_store

FRAME = (2,)
GOAL = (2,)
SCHEMA = Schema("grid", [
    Dense("frame", np.int32, FRAME), Dense("next_obs", np.float32, (3,)), Dense("action", np.int64),
    Dense("reward", np.float32), Dense("terminated", np.bool_), Dense("truncated", np.bool_),
    Dense("achieved_goal", np.float32, GOAL), Dense("desired_goal", np.float32, GOAL),
    Dense("next_achieved_goal", np.float32, GOAL), Dense("next_desired_goal", np.float32, GOAL)])

# (stream, length, end): end is "terminated", "truncated" or None (an open episode); appended in this order
PLAN = [(0, 5, "terminated"), (1, 4, "terminated"), (2, 2, "terminated"), (0, 3, "truncated"),
        (1, 6, "terminated"), (2, 5, None)]
LATER = 2  # with refresh_every, the last LATER episodes are committed by another handle after construction
STACK, N_STEP, GAMMA = 2, 3, 0.9
ALPHA, BETA, EPS = 0.7, 0.5, 1e-6


def goal_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """A dense goal reward: minus the distance (module-level, so it pickles)."""
    return -np.linalg.norm(np.asarray(achieved) - np.asarray(desired), axis=-1).astype(np.float32)


def twice(batch: dict[str, Any]) -> dict[str, Any]:
    """The transform: a field computed from the finished minibatch's reward."""
    batch["twice"] = np.asarray(batch["reward"]) * 2
    return batch


class Ref:
    """The rows as appended: per row its stream, episode, place in it and step; the fields' values."""

    def __init__(self) -> None:
        self.where: dict[int, tuple[int, int]] = {}  # row -> (episode number, t)
        self.episodes: list[list[int]] = []
        self.complete: list[bool] = []
        self.stream: dict[int, int] = {}
        self.step: dict[int, int] = {}
        self.data: dict[str, np.ndarray] = {}
        self.at: dict[int, int] = {}

    def col(self, name: str, rows: Any) -> np.ndarray:
        return self.data[name][[self.at[int(r)] for r in np.asarray(rows).reshape(-1)]]

    def follow(self, url: str) -> None:
        """Key everything by the store's row ids (another writer's rows have its id in their high bits)."""
        table = open_store(url, mode="r").default
        ids = table.rows_at(np.arange(len(table)))
        of = dict(zip((table.read(ids, columns=["frame"])["frame"][:, 0] // 10).tolist(), ids.tolist(), strict=True))
        self.at = {i: r for r, i in of.items()}  # row id -> position in the appended data
        self.where = {of[r]: w for r, w in self.where.items()}
        self.episodes = [[of[r] for r in e] for e in self.episodes]
        self.stream = {of[r]: s for r, s in self.stream.items()}
        self.step = {of[r]: s for r, s in self.step.items()}

    def has_next(self, row: int) -> bool:
        e, t = self.where[row]
        return t + 1 < len(self.episodes[e])

    def stack(self, row: int, shift: int = 0) -> np.ndarray:
        """Frames ``t - STACK + 1 + shift .. t + shift`` of row's episode ("reset" padding)."""
        e, t = self.where[row]
        rows = self.episodes[e]
        return self.col("frame", [rows[max(i, 0)] for i in range(t - STACK + 1 + shift, t + 1 + shift)])

    def window(self, row: int, stacked: bool) -> tuple[float, int, int]:
        """The n-step window of ``row``: (discounted reward, length, last row)."""
        e, t = self.where[row]
        rows = self.episodes[e]
        k = 1
        while k < N_STEP and t + k < len(rows):
            prev = rows[t + k - 1]
            if self.col("terminated", [prev])[0] or self.col("truncated", [prev])[0]:
                break
            if stacked and t + k + 1 >= len(rows):  # the window's last row must have a next frame
                break
            k += 1
        total = sum(GAMMA ** i * float(self.col("reward", [rows[t + i]])[0]) for i in range(k))
        return total, k, rows[t + k - 1]


def build(url: str, later: bool) -> tuple[Store, Ref, Callable[[], None]]:
    """The store (without the last LATER episodes if ``later``), its reference and a function appending the rest
    through another handle."""
    rng = np.random.default_rng(7)
    ref = Ref()
    batches: list[tuple[int, dict[str, np.ndarray]]] = []
    row, steps = 0, {0: 0, 1: 0, 2: 0}
    for stream, n, end in PLAN:
        b = {"frame": (np.arange(row, row + n)[:, None] * 10 + np.arange(2)).astype(np.int32),
             "next_obs": rng.random((n, 3)).astype(np.float32), "action": rng.integers(0, 4, n),
             "reward": rng.random(n).astype(np.float32), "terminated": np.zeros(n, bool),
             "truncated": np.zeros(n, bool), "achieved_goal": rng.random((n, *GOAL)).astype(np.float32),
             "desired_goal": np.full((n, *GOAL), -1, np.float32),
             "next_achieved_goal": rng.random((n, *GOAL)).astype(np.float32),
             "next_desired_goal": np.full((n, *GOAL), -1, np.float32)}
        if end is not None:
            b[end][-1] = True
        e = len(ref.episodes)
        ref.episodes.append(list(range(row, row + n)))
        ref.complete.append(end is not None)
        for t in range(n):
            ref.where[row + t] = (e, t)
            ref.stream[row + t] = stream
            ref.step[row + t] = steps[stream] + t
        steps[stream] += n
        batches.append((stream, b))
        row += n
    ref.data = {k: np.concatenate([b[k] for _, b in batches]) for k in batches[0][1]}
    store = open_store(url, SCHEMA, mode="w+")
    first = batches[:-LATER] if later else batches

    def append(store: Store, part: list[tuple[int, dict[str, np.ndarray]]]) -> None:
        with store.writer() as w:
            for stream, b in part:
                w.append(b, stream=stream, reset=True)
            w.commit()

    append(store, first)

    def rest() -> None:
        other = open_store(url, mode="a")
        append(other, batches[-LATER:])

    return store, ref, rest


SUBSET = np.array([r for r in range(sum(n for _, n, _ in PLAN)) if r % 3 != 1], dtype=np.int64)

MAKERS: dict[str, Callable[..., Any]] = {
    "uniform": lambda st, **kw: UniformSampler(st, batch_size=16, seed=1, num_batches=3, **kw),
    "prioritized": lambda st, **kw: PrioritizedSampler(st, 16, alpha=ALPHA, beta=BETA, eps=EPS, seed=1,
                                                       num_batches=3, **kw),
    "epoch": lambda st, **kw: EpochSampler(st, batch_size=6, seed=1, **kw),
    "sequence": lambda st, **kw: SequenceSampler(st, length=2, burn_in=1, batch_size=8, seed=1, num_batches=3,
                                                 **kw),
    "reservoir": lambda st, **kw: ReservoirSampler(st, capacity=10, batch_size=8, seed=1, num_batches=3, **kw),
}
"""Per sampler kind, how the grid makes one."""


def sampler_kwargs(features: tuple[str, ...]) -> dict[str, Any]:
    """The sampler arguments of ``features`` (``transform`` is the loader's)."""
    kw: dict[str, Any] = {}
    if "stack" in features:
        kw.update(stack=STACK, stack_padding="reset")
    if "n_step" in features:
        kw.update(n_step=N_STEP, gamma=GAMMA)
    if "her" in features:
        kw["her"] = HER("future", 4, compute_reward=goal_reward, seed=3)
    if "rate_limiter" in features:  # admits every draw; counts them
        kw["rate_limiter"] = RateLimiter(1000.0, 1, 1e9, name="grid")
    if "subset" in features:
        kw["subset"] = SUBSET
    if "refresh_every" in features:
        kw["refresh_every"] = 1
    return kw


def priority(rows: np.ndarray) -> np.ndarray:
    """The priorities the grid gives rows before drawing: distinct, from the row id."""
    return 1.0 + (np.asarray(rows) % 7).astype(np.float64)
