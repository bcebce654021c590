"""ReplayBuffer: the familiar add / sample / len front door, backed by a persistent store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replaystore.loaders.dataset import gather
from replaystore.loaders.uniform import UniformSampler
from replaystore.schemas import Schema
from replaystore.store import Writer, open_store


class ReplayBuffer:
    """A fixed-capacity replay buffer that lives in a store and survives its process.

    ``add(batch)`` appends and commits (durable at once); ``sample(batch_size)``
    draws uniformly with replacement and returns a mapping of tensors;
    ``len(buf)`` counts stored records (at most ``capacity``). Reopening the same
    URL resumes the contents and, after :meth:`save`, the sampling RNG.
    """

    def __init__(self, url: str, schema: Schema | None = None, capacity: int | None = None, *, seed: int = 0,
                 stream: int | str = 0, storage_options: Mapping[str, Any] | None = None) -> None:
        self.store = open_store(url, schema, capacity=capacity, storage_options=storage_options)
        self.capacity = self.store.capacity
        self.stream = stream
        self._writer: Writer | None = None
        self._sampler = UniformSampler(self.store, 1, seed, name="replay-buffer", resume=True)

    def add(self, batch: Any) -> None:
        """Append a batch of records (any size) and commit it."""
        if self._writer is None:
            self._writer = self.store.writer()
        self._writer.append(batch, stream=self.stream)
        self._writer.commit()

    def sample(self, batch_size: int) -> dict[str, Any]:
        """``batch_size`` records drawn uniformly with replacement (EmptyStoreError if empty)."""
        self.store.refresh()
        self._sampler.batch_size = batch_size
        return gather(self._sampler.table, self._sampler.sample())

    def __len__(self) -> int:
        return len(self.store)

    def save(self) -> None:
        """Persist the sampling RNG so a reopened buffer continues the same draws."""
        self._sampler.save()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.store.close()
