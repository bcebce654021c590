"""ReplayBuffer: the familiar add / sample / len front door, backed by a persistent store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replaystore.errors import StoreError
from replaystore.loaders.dataset import gather
from replaystore.loaders.limits import MAX_BATCH_SIZE, check_size
from replaystore.loaders.uniform import UniformSampler
from replaystore.schemas import Schema
from replaystore.store import Writer, open_store


class ReplayBuffer:
    """A fixed-capacity replay buffer that lives in a store and survives its process.

    ``add(batch)`` appends; records are committed (durable, and from then on
    sampled) in groups: once ``commit_every`` are pending, and whenever a
    ``sample`` would otherwise leave out at least as many pending records as it
    could draw from (so a buffer samples its first records at once, and never
    misses more than half of what was added). ``sample(batch_size)`` draws
    uniformly with replacement and returns a mapping of tensors; ``len(buf)``
    counts the records added and kept (at most ``capacity``). :meth:`flush`
    commits what is pending; :meth:`save` also persists the sampling RNG, so a
    reopened buffer continues the same draws. A crash loses the pending records
    only. ``commit_every=1`` commits every ``add`` (a commit syncs files: ~2-15 ms
    on local disk).

    Parameters
    ----------
    url : str
        Where the store lives (a local path, ``memory://...`` or ``s3://...``);
        opened with mode ``"a"`` (created if absent).
    schema : Schema, optional
        Schema of the records; needed when the store is created.
    capacity : int, optional
        Records kept (the oldest are evicted beyond it); None: unbounded.
    seed : int, optional
        Seed of the sampling RNG (a saved RNG state, if any, wins).
    stream : int or str, optional
        Stream key every ``add`` appends to.
    commit_every : int, optional
        Commit once this many records are pending (a positive int).
    storage_options : mapping, optional
        Passed to the storage backend (e.g. S3 credentials).

    Raises
    ------
    StoreError
        ``commit_every`` is not a positive int, or the store cannot be opened
        (see ``open_store``).

    Examples
    --------
    >>> import numpy as np
    >>> from replaystore.loaders import ReplayBuffer
    >>> from replaystore.schemas import transitions
    >>> buf = ReplayBuffer("memory://examples/replay-buffer", transitions(4), capacity=100)
    >>> buf.add({"obs": np.zeros((8, 4), np.float32), "action": np.arange(8), "reward": np.ones(8, np.float32),
    ...          "next_obs": np.zeros((8, 4), np.float32), "terminated": np.zeros(8, bool)})
    >>> len(buf)
    8
    >>> minibatch = buf.sample(4)
    >>> minibatch["obs"].shape, minibatch["indices"].shape
    (torch.Size([4, 4]), torch.Size([4]))
    >>> buf.close()
    """

    def __init__(self, url: str, schema: Schema | None = None, capacity: int | None = None, *, seed: int = 0,
                 stream: int | str = 0, commit_every: int = 1024,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(commit_every, int) or isinstance(commit_every, bool) or commit_every < 1:
            raise StoreError(f"commit_every: expected a positive int, got {commit_every!r}")
        self.store = open_store(url, schema, capacity=capacity, storage_options=storage_options)
        self.capacity = self.store.capacity
        self.stream = stream
        self.commit_every = commit_every
        self._writer: Writer | None = None
        self._pending = 0  # records appended since the last commit
        self._sampler = UniformSampler(self.store, 1, seed, name="replay-buffer")
        saved = self.store.load_state("replay-buffer")  # the saved draws continue, whatever the seed and
        if saved is not None:  # sample sizes given now (no hyperparameter check: sample(n) sets the size)
            self._sampler.load_state_dict({**saved[0], **saved[1]})

    def add(self, batch: Any) -> None:
        """Append a batch of records (any size); committed once ``commit_every`` are pending.

        Cost: the append (validation and a copy into the writer's open segment),
        plus a commit when due.

        Parameters
        ----------
        batch : Any
            A mapping or an object with named fields matching the schema.

        Raises
        ------
        ValidationError
            The batch does not conform to the schema; nothing was appended.
        """
        if self._writer is None:
            self._writer = self.store.writer()
        self._pending += self._writer.append(batch, stream=self.stream)
        if self._pending >= self.commit_every:
            self.flush()

    def flush(self) -> None:
        """Commit the pending records: durable, and sampled from.

        Cost: one commit (file syncs) when records are pending; nothing otherwise.
        """
        if self._writer is not None and self._pending:
            self._writer.commit()
            self._pending = 0

    def sample(self, batch_size: int) -> dict[str, Any]:
        """``batch_size`` records drawn uniformly with replacement from the committed ones.

        Cost: a ``refresh()`` of the store, possibly a commit, and one gathered read.

        Parameters
        ----------
        batch_size : int
            Number of records.

        Returns
        -------
        dict of str to Any
            The schema's fields and ``indices`` (the row ids), as tensors.

        Raises
        ------
        EmptyStoreError
            No record is committed yet.
        SamplerParameterError
            ``batch_size`` is not an int in ``[1, 2**24]``.
        """
        batch_size = check_size("batch_size", batch_size, MAX_BATCH_SIZE)
        self.store.refresh()
        if self._pending and self._pending >= len(self.store):
            self.flush()
        self._sampler.batch_size = batch_size
        return gather(self._sampler.table, self._sampler.sample())

    def __len__(self) -> int:
        """Records added and kept (committed plus pending, at most ``capacity``)."""
        n = len(self.store) + self._pending
        return n if self.capacity is None else min(n, self.capacity)

    def save(self) -> None:
        """Commit the pending records and persist the sampling RNG.

        A reopened buffer then continues the same draws. Cost: a commit and one
        state-slot write.
        """
        self.flush()
        self._sampler.save()

    def close(self) -> None:
        """Commit the pending records and release the store."""
        if self._writer is not None:
            self._writer.close()
        self.store.close()
