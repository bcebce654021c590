"""Random store histories for the tests that follow the stream index across changes: three
writers appending to interleaved streams (int and str keys) with step gaps and resets,
committing in any order (so a stream's steps arrive out of order), compacting, and a
capacity evicting the oldest records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from hypothesis import strategies as hs

from replaystore.schemas import transitions
from replaystore.store import open_store

KEYS = [0, 1, "a", "b"]


def batch(n: int, tag: int) -> dict[str, np.ndarray]:
    return {"obs": np.full((n, 2), tag, np.float32), "action": np.zeros(n, np.int64),
            "reward": np.zeros(n, np.float32), "next_obs": np.zeros((n, 2), np.float32),
            "terminated": np.zeros(n, bool)}


ops = hs.lists(hs.one_of(
    hs.tuples(hs.just("append"), hs.integers(0, 2), hs.sampled_from(KEYS), hs.integers(1, 6),
              hs.sampled_from([0, 0, 0, 1, 3]), hs.lists(hs.booleans(), min_size=6, max_size=6)),
    hs.tuples(hs.just("commit"), hs.integers(0, 2)),
    hs.tuples(hs.just("commit"), hs.integers(0, 2)),
    hs.tuples(hs.just("compact"), hs.integers(0, 2)),
), min_size=1, max_size=30)


class Scenario:
    """Three writers on one store; applies ops, yields after each change reaching the log."""

    def __init__(self, url: str, capacity: int | None) -> None:
        self.url = url
        self.st = open_store(url, transitions(2, actions=2), mode="w", capacity=capacity)
        self.writers = [self.st.writer() for _ in range(3)]
        self.next_step = dict.fromkeys(KEYS, 0)
        self.tag = 0

    def run(self, plan: list[Any]) -> Iterator[None]:
        try:
            for op in plan:
                w = self.writers[op[1]]
                if op[0] == "append":
                    _, _, key, n, gap, resets = op
                    steps = self.next_step[key] + gap + np.arange(n)
                    self.next_step[key] = int(steps[-1]) + 1
                    self.tag += 1
                    w.append(batch(n, self.tag), stream=[key] * n, step=steps, reset=np.array(resets[:n]))
                    continue
                if op[0] == "commit" and w.commit() is None:
                    continue
                if op[0] == "compact" and not w.compact():
                    continue
                yield
        finally:
            for w in self.writers:
                w.close()

    def same_snapshot(self, reader: Any) -> Any:
        return fresh_at(self.url, reader)


def fresh_at(url: str, reader: Any) -> Any:
    """The store at ``url`` freshly opened at exactly ``reader``'s log position, ``reader``
    refreshed (background merges may publish in between: then both look again)."""
    for _ in range(100):
        fresh = open_store(url, mode="r")
        reader.refresh()
        if _position(fresh) == _position(reader):
            return fresh
    raise AssertionError("the log kept moving")


def _position(st: Any) -> dict[int, int]:
    return {w: wl.next_seq for w, wl in st.log.writers.items()}
