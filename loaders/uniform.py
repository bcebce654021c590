"""Uniform sampling with replacement, and epoch minibatches without replacement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.tracking import inside


class UniformSampler(StoreSampler):
    """``batch_size`` visible records drawn uniformly with replacement, every minibatch.

    Sees records committed by other writers once the store was ``refresh()``-ed.
    """

    kind = "uniform"

    def sample(self) -> Request:
        n = self.candidate_count()
        if n == 0:
            raise self._empty()
        # floor(u * n), u uniform on the 2^-53 grid of [0, 1): the bias is below n / 2^53 (no
        # concern under 2^40 rows), at half the cost of Generator.integers at minibatch sizes
        positions = self.rng.random(self.batch_size)
        positions *= n
        picks = positions.astype(np.int64)
        np.minimum(picks, n - 1, out=picks)  # u * n can round up to n for u within 2^-53 of 1
        rows = self.candidate_rows(picks)
        self.batches_drawn += 1
        return Request(rows)


class EpochSampler(StoreSampler):
    """Passes over the visible records: each pass partitions them into shuffled minibatches.

    Every record lands in exactly one minibatch per pass, a different partition each
    pass; the last minibatch may be smaller (``drop_last=True`` drops it). Iterating
    the sampler runs one pass (``num_batches`` bounds it further); the records of a
    pass are fixed when it starts.
    """

    kind = "epoch"

    def __init__(self, store: Any, batch_size: int, seed: int = 0, *, drop_last: bool = False,
                 **kwargs: Any) -> None:
        self.drop_last = drop_last
        self.epoch = 0
        self._order: np.ndarray | None = None
        self._cursor = 0
        super().__init__(store, batch_size, seed, **kwargs)

    def _start_pass(self) -> None:
        cand = self.candidates()
        rows = self.table.row_ids() if cand is None else cand
        if not len(rows):
            raise self._empty()
        # shuffling the rows themselves: the same draws and result as rows[permutation(n)], without
        # a second random-access pass over n entries (half the pass start at 10M records)
        self._order = self.rng.permutation(rows)
        self._cursor = 0
        self.tracker.poll()  # later changes count from this view

    def _prune(self) -> None:
        """Drop the rest of the pass's rows that were evicted since it started (they cannot be read).

        Only when rows stopped being visible (cost: the rest of the pass); appends cost nothing.
        """
        change = self.tracker.poll()
        if self._order is None or change is None or not (change.full or len(change.removed)):
            return
        rest = self._order[self._cursor:]
        alive = inside(rest, self.tracker.view)
        if not alive.all():
            self._order = np.concatenate([self._order[:self._cursor], rest[alive]])

    def _remaining(self) -> int:
        return 0 if self._order is None else len(self._order) - self._cursor

    def _exhausted(self) -> bool:
        self._prune()
        return self._remaining() == 0 or (self.drop_last and self._remaining() < self.batch_size)

    def _next_pass(self) -> None:
        if self._order is not None:
            self.epoch += 1
        self._start_pass()
        if self._exhausted():
            raise self._empty(f"full minibatches of {self.batch_size}")

    def sample(self) -> Request:
        """The next minibatch of the current pass (a new pass starts when one is exhausted)."""
        if self._exhausted():
            self._next_pass()
        assert self._order is not None
        rows = self._order[self._cursor:self._cursor + self.batch_size]
        self._cursor += len(rows)
        self.batches_drawn += 1
        return Request(rows)

    def __iter__(self) -> Iterator[Request]:
        """One pass (continuing the current one after ``load_state_dict``)."""
        if self._exhausted():
            self._next_pass()
        drawn = 0
        while not self._exhausted() and (self.num_batches is None or drawn < self.num_batches):
            yield self.sample()
            drawn += 1

    def __len__(self) -> int:
        """Minibatches the next iteration yields: the rest of a pass in progress, else a whole pass."""
        if not self._exhausted():
            n = self._remaining()
        else:
            n = self.candidate_count()
        full = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return full if self.num_batches is None else min(full, self.num_batches)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(epoch=self.epoch, cursor=self._cursor, drop_last=self.drop_last)
        if self._order is not None:
            state["order"] = self._order
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        order = state.get("order")
        self._order = None if order is None else np.asarray(order, dtype=np.int64)
        self.tracker.reset()
