"""Gathering sampled rows into torch minibatches, in the main process or in DataLoader workers."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from replaystore.errors import RowError, StaleReadError, StoreError
from replaystore.loaders.base import Request, StoreSampler
from replaystore.schemas import Schema
from replaystore.store import Store, Table, open_store


def _pad_sequences(schema: Schema, data: dict[str, np.ndarray], real: np.ndarray, shape: tuple[int, int],
                   ) -> dict[str, np.ndarray]:
    """Spread gathered records over ``[batch, window]`` slots; padded slots are zero / empty lists."""
    out: dict[str, np.ndarray] = {}
    slots = real.size
    if real.all():  # nothing padded: the gathered records are the slots, in order
        for f in schema.dense_fields:
            out[f.name] = data[f.name].reshape((*shape, *f.shape))
        for off_name, names in schema.offsets_groups.items():
            out[off_name] = data[off_name]
            for n in names:
                out[n] = data[n]
        return out
    for f in schema.dense_fields:
        full = np.zeros((slots, *f.shape), dtype=f.dtype)
        full[real.reshape(-1)] = data[f.name]
        out[f.name] = full.reshape((*shape, *f.shape))
    for off_name, names in schema.offsets_groups.items():
        counts = np.zeros(slots, dtype=np.int64)
        counts[real.reshape(-1)] = np.diff(data[off_name])
        offsets = np.zeros(slots + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        out[off_name] = offsets
        for n in names:
            out[n] = data[n]
    return out


def to_tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays -> torch tensors (sharing memory); other values pass through."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
            for k, v in arrays.items()}


def pack(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with its tensors copied into views of one block of memory (other values pass through).

    A DataLoader worker hands every tensor storage to the main process as a shared-memory
    segment of its own; one storage per minibatch instead of one per field makes that
    hand-over several times cheaper (docs/PERFORMANCE.md, Loaders). Values, dtypes and
    shapes are unchanged.
    """
    tensors = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    sizes = [v.numel() * v.element_size() for _, v in tensors]
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum([-(-n // _ALIGN) * _ALIGN for n in sizes], out=starts[1:])
    block = torch.empty(int(starts[-1]), dtype=torch.uint8)
    raw = block.numpy()
    out = dict(batch)
    for (k, v), lo, n in zip(tensors, starts.tolist(), sizes, strict=False):
        # a plain numpy byte copy: no torch kernels (and no intra-op threads) run in the worker
        raw[lo:lo + n] = np.ascontiguousarray(v.numpy()).reshape(-1).view(np.uint8)
        out[k] = block[lo:lo + n].view(v.dtype).view(v.shape)
    return out


_ALIGN = 64  # byte alignment of each tensor in a packed block


def gather(table: Table, request: Request) -> dict[str, Any]:
    """The minibatch for ``request``: schema fields, ``indices`` and the sampler's outputs, as tensors.

    Ragged fields come out as CSR of just these rows (values + offsets rebased to 0;
    for sequences, over the flattened ``[batch, window]`` slots).
    """
    rows = np.asarray(request.rows, dtype=np.int64)
    if request.sequence:
        real = rows >= 0  # padding slots (-1) read nothing
        data = _pad_sequences(table.schema, table.read(rows[real]), real, rows.shape)
    else:  # only sequence windows are padded
        data = table.read(rows)
    batch: dict[str, Any] = {**data, "indices": rows, **request.outputs}
    if request.stream_keys is not None:
        batch["stream_keys"] = request.stream_keys
    return to_tensors(batch)


class StoreDataset(Dataset):
    """A map-style dataset whose items are whole :class:`Request` minibatches (``__getitems__``).

    Each process opens the store itself (read-only) on first use, so DataLoader
    workers never share an opened store across fork or spawn. A request naming rows
    this process does not see yet refreshes the store once and retries.
    """

    def __init__(self, url: str, table: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.table_name = table
        self.storage_options = storage_options or {}
        self._pid: int | None = None
        self._store: Store | None = None

    def _table(self) -> Table:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.url, mode="r", storage_options=self.storage_options)
            self._pid = os.getpid()
        return self._store.table(self.table_name)

    def __getitems__(self, request: Request) -> dict[str, Any]:
        table = self._table()
        try:
            batch = gather(table, request)
        except (RowError, StaleReadError):  # this process's view lags the sampler's: catch up once
            assert self._store is not None
            self._store.refresh()
            try:
                batch = gather(table, request)
            except RowError as exc:
                raise StaleReadError(f"{exc}; the sampler's view is newer or older than the store's") from exc
        # in a worker the batch crosses to the main process: one shared-memory segment, not one per field
        return pack(batch) if get_worker_info() is not None else batch

    def __getitem__(self, request: Request) -> dict[str, Any]:
        return self.__getitems__(request)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_pid": None}


def _first(batch: Any) -> Any:
    return batch


def make_loader(store: Store, sampler: StoreSampler, num_workers: int = 0, pin_memory: bool = False,
                **kwargs: Any) -> DataLoader:
    """A torch DataLoader yielding minibatches (mappings of tensors) for ``sampler``.

    Sampling runs in the main process (priority updates reach the next draw, up to
    the ``prefetch_factor * num_workers`` minibatches already in flight); gathering
    runs in ``num_workers`` worker processes that open the store themselves.
    Extra keyword arguments (``multiprocessing_context``, ``prefetch_factor``,
    ``persistent_workers``, ...) go to the DataLoader.
    """
    if num_workers and store.url.startswith("memory://"):
        raise StoreError("memory:// stores live in one process: use num_workers=0 (or a local/S3 store)")
    dataset = StoreDataset(store.url, sampler.table.name, store.storage_options)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory,
                      collate_fn=_first, **kwargs)
