"""What every sampler shares: the table it draws from, its RNG, subsets, and resumable state."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from replaystore.errors import ReplayStoreError, StoreError
from replaystore.store import Store, Table


class EmptyStoreError(ReplayStoreError):
    """A sampler was asked for a minibatch while it has nothing to draw from."""


@dataclass
class Request:
    """One minibatch to gather: row ids (``-1`` marks padding) and per-sample sampler outputs."""

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
        self.num_batches = num_batches
        self.name = name or f"{self.kind}-{self.table.name}"
        self.batches_drawn = 0
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

    def candidates(self) -> np.ndarray | None:
        """The subset's visible row ids (None: the whole table)."""
        if self.subset is None:
            return None
        visible = self.table.row_ids()
        return self.subset[np.isin(self.subset, visible, assume_unique=True)]

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
        """Persist :meth:`state_dict` into the store's state slot ``name``; returns its version."""
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
