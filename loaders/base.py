"""What every sampler shares: the table it draws from, its RNG, subsets, and resumable state."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from replaystore.errors import ReplayStoreError, StoreError
from replaystore.loaders.tracking import ViewTracker, expand, rows_in, visible_intervals
from replaystore.store import Store, Table


class EmptyStoreError(ReplayStoreError):
    """A sampler was asked for a minibatch while it has nothing to draw from."""


@dataclass
class Request:
    """One minibatch to gather: row ids (``-1`` marks padding, in ``sequence`` requests only) and
    per-sample sampler outputs."""

    rows: np.ndarray
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    sequence: bool = False
    stream_keys: list[int | str] | None = None


class StoreSampler(Sampler[Request]):
    """Base class: yields :class:`Request` minibatches (a torch batch sampler) from one table.

    ``subset`` restricts draws to those row ids (e.g. rows a SQL query returned, or
    the latest commit's records). ``num_batches`` bounds iteration (None: endless,
    except for samplers with passes). ``name`` is the state slot; ``resume=True``
    restores the state saved there by :meth:`save`.
    """

    kind = "sampler"

    def __init__(self, store: Store, batch_size: int, seed: int = 0, *, table: str | None = None,
                 subset: Any = None, num_batches: int | None = None, name: str | None = None,
                 resume: bool = False) -> None:
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise StoreError(f"batch_size: expected a positive int, got {batch_size!r}")
        self.store = store
        self.table: Table = store.table(table) if table is not None else store.default
        self.batch_size = batch_size
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.subset = None if subset is None else np.unique(np.asarray(subset, dtype=np.int64))
        self._view_version = -1
        self._spans = np.zeros((0, 2), dtype=np.int64)  # visible subset entries: [lo, hi) into subset
        self._cum = np.zeros(1, dtype=np.int64)  # their cumulative counts
        self.num_batches = num_batches
        self.name = name or f"{self.kind}-{self.table.name}"
        self.batches_drawn = 0
        self.tracker = ViewTracker(self.table.reader)  # changes of the visible rows, for incremental samplers
        if resume:
            self.restore()

    # -- sampling -------------------------------------------------------------------------
    def sample(self) -> Request:
        """Draw one minibatch request."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:
        drawn = 0
        while self.num_batches is None or drawn < self.num_batches:
            yield self.sample()
            drawn += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError(f"{type(self).__name__} is endless; pass num_batches= for a length")
        return self.num_batches

    def _subset_view(self) -> None:
        """Where the visible rows fall in the subset: one span of subset entries per visible
        interval (cost: number of fragments, once per change of the table's view)."""
        reader = self.table.reader
        reader.sync()
        if self._view_version == reader.log.version:
            return
        self._view_version = reader.log.version
        assert self.subset is not None
        iv = visible_intervals(reader)
        self._spans = np.stack((np.searchsorted(self.subset, iv[:, 0]), np.searchsorted(self.subset, iv[:, 1])),
                               axis=1)
        self._cum = np.r_[0, np.cumsum(self._spans[:, 1] - self._spans[:, 0])].astype(np.int64)

    def candidate_count(self) -> int:
        """How many rows the sampler draws from (visible rows, of the subset if any)."""
        if self.subset is None:
            return len(self.table)
        self._subset_view()
        return int(self._cum[-1])

    def candidate_rows(self, positions: np.ndarray) -> np.ndarray:
        """Row ids at positions ``0 <= p < candidate_count()`` in row-id order, vectorised."""
        if self.subset is None:
            return self.table.rows_at(positions)
        self._subset_view()
        span = np.searchsorted(self._cum[1:], positions, side="right")
        return self.subset[self._spans[span, 0] + positions - self._cum[span]]

    def restrict(self, iv: np.ndarray) -> np.ndarray:
        """The rows the sampler draws from among row-id intervals ``iv``, ascending (cost: the result)."""
        return expand(iv) if self.subset is None else rows_in(self.subset, iv)

    def _empty(self, what: str = "records") -> EmptyStoreError:
        return EmptyStoreError(f"{type(self).__name__}: table {self.table.name!r} has no {what} to sample "
                               "(append and commit first, then refresh())")

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue sampling exactly: RNG, counters, sampler data."""
        return {"kind": self.kind, "seed": self.seed, "rng": self.rng.bit_generator.state,
                "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise StoreError(f"state of a {state.get('kind')!r} sampler cannot load into a {self.kind!r} sampler")
        self.rng.bit_generator.state = state["rng"]
        self.batches_drawn = int(state["batches_drawn"])

    def save(self) -> int:
        """Persist :meth:`state_dict` into the store's state slot ``name``; returns its version. The
        slot keeps its newest two versions (``Store.save_state``'s ``keep_last``)."""
        state = self.state_dict()
        arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
        doc = {k: v for k, v in state.items() if k not in arrays}
        return self.store.save_state(self.name, doc, arrays)

    def restore(self) -> bool:
        """Load the state saved in slot ``name``; False if none was saved."""
        saved = self.store.load_state(self.name)
        if saved is None:
            return False
        doc, arrays = saved
        self.load_state_dict({**doc, **arrays})
        return True
