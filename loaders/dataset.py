"""Gathering sampled rows into torch minibatches, in the main process or in DataLoader workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from replaystore.errors import RowError, StaleReadError, StoreError
from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.feature import Carried, Feature, Transform
from replaystore.loaders.lerobotview import to_lerobot
from replaystore.loaders.lerobotwindows import view_parts
from replaystore.loaders.shared import SharedSlots, from_slot
from replaystore.loaders.tdoutput import check_output, to_tensordict
from replaystore.loaders.transform import check_loader_args
from replaystore.schemas import Schema, map_tree
from replaystore.store import ChunkCache, Store, Table, grace, open_store


def _pad_sequences(schema: Schema, data: dict[str, np.ndarray], real: np.ndarray, shape: tuple[int, int],
                   ) -> dict[str, np.ndarray]:
    """Spread gathered records over ``[batch, window]`` slots; padded slots are zero / empty lists."""
    out: dict[str, np.ndarray] = {}
    slots = real.size
    dense = [f for f in schema.dense_fields if f.name in data]  # (fields a feature reads itself are not)
    groups = {o: names for o, names in schema.offsets_groups.items() if o in data}
    if real.all():  # nothing padded: the gathered records are the slots, in order
        for f in dense:
            out[f.name] = data[f.name].reshape((*shape, *f.shape))
        for off_name, names in groups.items():
            out[off_name] = data[off_name]
            for n in names:
                out[n] = data[n]
        return out
    for f in dense:
        full = np.zeros((slots, *f.shape), dtype=f.dtype)
        full[real.reshape(-1)] = data[f.name]
        out[f.name] = full.reshape((*shape, *f.shape))
    for off_name, names in groups.items():
        counts = np.zeros(slots, dtype=np.int64)
        counts[real.reshape(-1)] = np.diff(data[off_name])
        offsets = np.zeros(slots + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        out[off_name] = offsets
        for n in names:
            out[n] = data[n]
    return out


def to_tensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """Convert numpy arrays to torch tensors (sharing memory).

    Other values pass through.

    Non-contiguous arrays are copied to contiguous ones first.

    Parameters
    ----------
    arrays : dict of str to Any
        Name to value.

    Returns
    -------
    dict of str to Any
        The same names, numpy arrays replaced by tensors (also inside nested fields' dicts
        and tuples).
    """
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray)
            else _nested_tensors(v) if isinstance(v, (dict, tuple)) else v
            for k, v in arrays.items()}


def _nested_tensors(value: Any) -> Any:
    """A nested field's dict/tuple of arrays as the same structure of tensors."""
    return map_tree(lambda a: torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a, value)


class WorkerBatch:
    """A minibatch gathered in a DataLoader worker, on its way to the main process as numpy arrays.

    Pickled through the worker's pipe, a 256-record DQN batch costs ~70 µs (dump
    + load); torch tensors would instead each be moved to a new shared-memory
    segment per batch (~600 µs even when packed into one; docs/PERFORMANCE.md,
    "DataLoader workers"). The main process makes the tensors:
    :class:`StoreLoader` does, or the DataLoader's pin-memory thread through
    :meth:`pin_memory`.

    Parameters
    ----------
    arrays : dict of str to Any
        The minibatch as :func:`gather_arrays` returns it.
    slots : SharedSlots, optional
        Shared slots its large arrays go through where one is free (persistent workers of
        :func:`make_loader`; loaders/shared.py): the main process then views
        them without a pipe transfer. Otherwise, and for small arrays, they are pickled.
    """

    __slots__ = ("arrays", "slots")

    def __init__(self, arrays: dict[str, Any], slots: SharedSlots | None = None) -> None:
        self.arrays = arrays
        self.slots = slots

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its large arrays in a shared slot where it has slots and one is free (loaders/shared.py)."""
        info = get_worker_info() if self.slots is not None else None
        placed = self.slots.put(info.id, self.arrays) if self.slots is not None and info is not None else None
        if placed is None:
            return WorkerBatch, (self.arrays,)
        token, slot, layout = placed
        moved = {k for k, _, _, _ in layout}
        rest = {k: None if k in moved else v for k, v in self.arrays.items()}
        return _slot_batch, (token, slot, layout, rest)

    def tensors(self) -> dict[str, Any]:
        """The minibatch as tensors sharing the arrays' memory.

        Returns
        -------
        dict of str to Any
            See :func:`to_tensors`.
        """
        return to_tensors(self.arrays)

    def pin_memory(self) -> dict[str, Any]:
        """The minibatch as tensors in pinned memory (called by the DataLoader's pin-memory thread).

        Cost: one copy of each tensor into page-locked memory.

        Returns
        -------
        dict of str to Any
            Tensors pinned; other values as they are.
        """
        return {k: v.pin_memory() if isinstance(v, torch.Tensor)
                else map_tree(torch.Tensor.pin_memory, v) if isinstance(v, (dict, tuple)) else v
                for k, v in self.tensors().items()}


def _slot_batch(token: tuple[int, int], slot: int, layout: list[Any], rest: dict[str, Any]) -> WorkerBatch:
    return WorkerBatch(from_slot(token, slot, layout, rest))


def gather_arrays(table: Table, request: Request, parts: Sequence[Feature] = ()) -> dict[str, Any]:
    """:func:`gather`'s minibatch as numpy arrays (``stream_keys`` as a list), the features' worker halves applied.

    The rows' record fields are read (but those a feature's worker half reads itself: the frame
    field of stacks), with ``indices``, the sampler's outputs and the stream keys; then every
    feature's worker half runs on it with its payload (``request.parts``), in the request's
    order (the sampler's features: stacking, n-step, HER), then the halves of ``parts`` that
    have no payload (a transform). A payload without its half in ``parts`` applies itself
    (:class:`~replaystore.loaders.feature.Carried`: stacks and n-step windows); HER's goal rows
    need HER's half (the loader's dataset has it).

    Parameters
    ----------
    table : Table
        The table to read.
    request : Request
        The rows, the sampler's outputs and the features' payloads.
    parts : sequence of Feature, optional
        Worker halves (``Feature.worker``) by name, and the transform.

    Returns
    -------
    dict of str to Any
        Schema fields (nested fields as nested dicts/tuples), ``indices``, the sampler's
        outputs, ``stream_keys`` for sequence requests, and what the features add.

    Raises
    ------
    RowError
        A requested row is not visible to this handle.
    StaleReadError
        A requested row was reclaimed since this handle's view.
    TransformError
        From a transform or HER's ``compute_reward``.
    """
    given = {p.name: p for p in parts}
    halves = [(given.get(name) or Carried(name), payload) for name, payload in request.parts.items()]
    halves += [(p, None) for p in parts if p.name not in request.parts]
    skip = {name for half, payload in halves for name in half.reads(payload)}
    columns = [n for n in table.schema.record_names if n not in skip] if skip else None
    rows = np.asarray(request.rows, dtype=np.int64)
    if request.sequence:
        real = rows >= 0  # padding slots (-1) read nothing
        data = table.read(rows[real], columns=columns) if columns != [] else {}
        nesting = table.schema.nesting
        if nesting is None:
            data = _pad_sequences(table.schema, data, real, rows.shape)
        else:  # pad leaf by leaf
            data = nesting.nest(_pad_sequences(table.schema, nesting.unnest(data), real, rows.shape))
    else:  # only sequence windows are padded; a nested field comes out nested (Table.read)
        data = table.read(rows, columns=columns) if columns != [] else {}
    batch: dict[str, Any] = {**data, "indices": rows, **request.outputs}
    if request.stream_keys is not None:
        batch["stream_keys"] = request.stream_keys
    for half, payload in halves:  # (a transform's own errors come out as TransformError)
        batch = half.apply(table, batch, payload)
    return batch


def gather(table: Table, request: Request) -> dict[str, Any]:
    """The minibatch for ``request``: schema fields, ``indices`` and the sampler's outputs, as tensors.

    Ragged fields come out as CSR of just these rows (values + offsets rebased to
    0; for sequences, over the flattened ``[batch, window]`` slots). Padding slots
    of sequence windows read nothing and come out as zeros / empty lists. The
    payloads that apply themselves (stacks, n-step windows) are applied
    (:func:`gather_arrays`; HER's relabelling needs the loader). Cost: one read of
    the rows (see ``Table.read``), plus the payloads' reads.

    Parameters
    ----------
    table : Table
        The table to read.
    request : Request
        The rows, the sampler's outputs and the features' payloads.

    Returns
    -------
    dict of str to Any
        Name to tensor (``stream_keys``, if any, as a list).

    Raises
    ------
    RowError
        A requested row is not visible to this handle.
    StaleReadError
        A requested row was reclaimed since this handle's view.
    """
    return to_tensors(gather_arrays(table, request))


class StoreDataset(Dataset):
    """A map-style dataset whose items are whole :class:`Request` minibatches (``__getitems__``).

    Each process opens the store itself (read-only) on first use, so DataLoader
    workers never share an opened store across fork or spawn. In a capped store
    that handle also shows the records evicted within the grace margin
    (``max(N // 4, 1)`` beyond capacity N): a handle newer than the sampler's
    still reads rows the sampler drew and a writer evicted since. A request
    naming rows this process does not see refreshes the store once and retries.
    In a worker an item is a :class:`WorkerBatch` (numpy arrays);
    :func:`make_loader` turns it into tensors.

    Parameters
    ----------
    url : str
        The store's URL.
    table : str
        The table to read.
    storage_options : dict, optional
        Passed to the storage backend when opening.
    cache : ChunkCache or bool, optional
        ``open_store``'s ``cache``: the opener's, so workers share its directory.
    transform : callable, optional
        ``fn(batch of numpy arrays) -> batch``, applied after gathering (and after the
        features' worker halves), before tensors are made.
    parts : sequence of Feature, optional
        The sampler's features' worker halves (``Feature.worker``; small and picklable),
        applied to each gathered minibatch with the request's payloads (:func:`gather_arrays`).
    """

    def __init__(self, url: str, table: str, storage_options: dict[str, Any] | None = None,
                 cache: ChunkCache | bool | None = None, transform: Callable[[dict[str, Any]], Any] | None = None,
                 parts: Sequence[Feature] = ()) -> None:
        self.transform = transform
        self.parts: list[Feature] = [*parts, *([Transform(transform)] if transform is not None else [])]
        """The worker halves run where a minibatch is gathered, the transform last (loaders/feature.py)."""
        self.url = url
        self.table_name = table
        self.storage_options = storage_options or {}
        self.cache = cache  # open_store's ``cache``: the opener's, so workers share its directory
        self._pid: int | None = None
        self._store: Store | None = None
        self.slots: SharedSlots | None = None
        """Shared slots workers send large arrays through (:func:`make_loader` sets them)."""

    def _table(self) -> Table:
        if self._store is None or self._pid != os.getpid():
            self._store = open_store(self.url, mode="r", storage_options=self.storage_options, cache=self.cache)
            self._pid = os.getpid()
            capacity = self._store.capacity
            if capacity is not None:  # the grace margin of docs/FORMAT.md, "Capacity and reclamation"
                for name in self._store.tables:
                    self._store.table(name).widen(grace(capacity))
        return self._store.table(self.table_name)

    def __getitems__(self, request: Request) -> dict[str, Any] | WorkerBatch:
        """The minibatch as tensors; in a DataLoader worker, as a :class:`WorkerBatch`.

        Parameters
        ----------
        request : Request
            The minibatch to gather.

        Returns
        -------
        dict of str to Any or WorkerBatch
            The gathered minibatch.

        Raises
        ------
        StaleReadError
            The rows are still not readable after one refresh (reclaimed: the
            sampler's view lags by more than the grace margin).
        """
        table = self._table()
        try:
            batch = self._gather(table, request)
        except (RowError, StaleReadError):  # this process's view lags the sampler's: catch up once
            assert self._store is not None
            self._store.refresh()
            try:
                batch = self._gather(table, request)
            except RowError as exc:
                raise StaleReadError(f"{exc}; the sampler's view is newer or older than the store's") from exc
        return WorkerBatch(batch, self.slots) if get_worker_info() is not None else to_tensors(batch)

    def _gather(self, table: Table, request: Request) -> dict[str, Any]:
        return gather_arrays(table, request, self.parts)  # (a TransformError is not retried)

    def __getitem__(self, request: Request) -> dict[str, Any] | WorkerBatch:
        """Same as :meth:`__getitems__`."""
        return self.__getitems__(request)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the opened store: each process opens its own."""
        from multiprocessing.context import get_spawning_popen

        # (the slots travel only to the workers being started: their descriptor goes with them)
        slots = self.slots if get_spawning_popen() is not None else None
        return {**self.__dict__, "_store": None, "_pid": None, "slots": slots}


def _first(batch: Any) -> Any:
    return batch


class StoreLoader(DataLoader):
    """The DataLoader of :func:`make_loader`.

    Batches that workers sent as :class:`WorkerBatch` come out as mappings of
    tensors, like those gathered in the main process; with ``output="tensordict"``
    (:func:`make_loader`), as TensorDicts. Takes DataLoader's arguments.

    Over a capped store each iteration first refreshes the sampler's store, so that
    the first minibatch is drawn from a fresh view. A minibatch whose rows were
    reclaimed before they were gathered (:class:`StaleReadError`, in the main process
    or a worker; eviction, or compaction) is drawn again once, after a refresh of the
    sampler's store, and gathered in the main process; a second
    :class:`StaleReadError` is raised.
    """

    output = "dict"
    schema: Schema | None = None

    # (a generator over DataLoader's iterator; torch types __iter__ as its private iterator class)
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """Yield minibatches as mappings of tensors (or TensorDicts)."""
        store = self.batch_sampler.store if isinstance(self.batch_sampler, StoreSampler) else None
        if store is not None and store.capacity is not None:  # before the DataLoader draws (workers prefetch)
            store.refresh()
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except StaleReadError:  # the rows went between the draw and the gather: once, from a fresh view
                batch = self._redraw()
            out = batch.tensors() if isinstance(batch, WorkerBatch) else batch
            if self.output == "lerobot" and self.schema is not None:
                out = to_lerobot(out, self.schema)
            elif self.output != "dict" and self.schema is not None:
                out = to_tensordict(out, self.schema, torchrl=self.output == "torchrl")
            yield out

    def _redraw(self) -> dict[str, Any]:
        """A minibatch drawn after a refresh of the sampler's store and gathered in this process."""
        sampler = self.batch_sampler
        assert isinstance(sampler, StoreSampler) and isinstance(self.dataset, StoreDataset)
        sampler.store.refresh()
        batch = self.dataset.__getitems__(sampler.sample())  # (main process: tensors)
        assert isinstance(batch, dict)
        if self.pin_memory:
            batch = WorkerBatch(batch).pin_memory()
        return batch


def make_loader(store: Store, sampler: StoreSampler, num_workers: int = 0, pin_memory: bool = False,
                transform: Callable[[dict[str, Any]], Any] | None = None, output: str = "dict",
                delta_timestamps: Mapping[str, Sequence[float]] | None = None, fps: float | None = None,
                **kwargs: Any) -> StoreLoader:
    """A torch DataLoader yielding minibatches (mappings of tensors) for ``sampler``.

    Sampling runs in the main process (priority updates reach the next draw, up
    to the ``prefetch_factor * num_workers`` minibatches already in flight);
    gathering runs in ``num_workers`` worker processes that open the store
    themselves. Workers are persistent by default (``persistent_workers=True``;
    torch's default is False): an epoch sampler's passes reuse them instead of
    starting and opening the store again every pass.

    ``transform`` runs where the minibatch is gathered (each worker, or the main
    process), on the numpy minibatch, before tensors are made; the sampler's
    features' worker halves (stacks, n-step windows, ``her`` relabelling) run
    there too, before it. An exception in ``transform``
    comes out as :class:`~replaystore.errors.TransformError` holding its
    traceback text (from a worker, re-raised by torch in the main process).

    Parameters
    ----------
    store : Store
        The store ``sampler`` draws from.
    sampler : StoreSampler
        The batch sampler.
    num_workers : int, optional
        Worker processes that gather (0: gather in the main process).
    pin_memory : bool, optional
        Pin the minibatches' memory (for fast host-to-GPU copies).
    transform : callable, optional
        ``fn(batch) -> batch`` over a mapping of numpy arrays; picklable when
        workers are started by ``spawn`` or ``forkserver``. Returned numpy arrays
        become tensors; other values pass through.
    output : {"dict", "tensordict", "torchrl", "lerobot"}, optional
        ``"tensordict"``: yield ``tensordict.TensorDict`` batches of batch size ``[B]``
        (nested fields as nested TensorDicts, ragged fields as jagged nested tensors; see
        ``replaystore.loaders.tdoutput.to_tensordict``), made in the main process;
        ``"torchrl"``: the same in TorchRL's key layout (``tdoutput.to_torchrl``);
        ``"lerobot"``: LeRobot's item layout, batched (feature keys with dots, images
        float32 ``(B, C, H, W)`` in [0, 1], ``task`` strings; see
        ``replaystore.loaders.lerobotview.to_lerobot``); an imported video feature's
        frames are decoded where the minibatch is gathered (``loaders/lerobotvideo.py``).
    delta_timestamps : mapping of str to list of float, optional
        With ``output="lerobot"``: LeRobot's windows, key (LeRobot key or field name) to
        offsets in seconds; each such key comes out ``(B, T, ...)`` with ``<key>_is_pad``
        (``replaystore.loaders.lerobotwindows``). Uniform, epoch and prioritized samplers
        without ``stack=``, ``n_step=`` or ``her=`` only.
    fps : float, optional
        The frame rate of ``delta_timestamps`` (default: the schema metadata's ``fps``).
    **kwargs
        Passed to the DataLoader (``multiprocessing_context``,
        ``prefetch_factor``, ``persistent_workers``, ...); not ``collate_fn``,
        ``batch_sampler``, ``sampler``, ``batch_size``, ``shuffle`` or
        ``drop_last``, which the loader sets.

    Returns
    -------
    StoreLoader
        The DataLoader.

    Raises
    ------
    StoreError
        ``num_workers > 0`` with a ``memory://`` store (it lives in one process).
    LoaderArgumentError
        ``collate_fn`` or another argument the loader sets was given.
    TransformError
        ``transform`` is not callable, or not picklable for spawn/forkserver workers.
    LoaderOutputError
        An unknown ``output``.
    MissingDependencyError
        ``output="tensordict"`` without the ``tensordict`` package; ``output="lerobot"``
        over an imported video feature without PyAV (naming the field).
    SamplerParameterError, UnsupportedCombinationError
        A bad ``delta_timestamps`` (``lerobotwindows.view_parts``).

    Notes
    -----
    Over a capped store, each iteration refreshes the sampler's store before its first
    minibatch; a minibatch whose rows were reclaimed before the gather is drawn again
    once from a fresh view (see :class:`StoreLoader`): while iterating, ``StaleReadError``
    comes only from a second failure of the same minibatch.
    """
    check_output(output, sampler.table.schema)
    if num_workers and store.url.startswith("memory://"):
        raise StoreError("memory:// stores live in one process: use num_workers=0 (or a local/S3 store)")
    check_loader_args(kwargs, transform, num_workers)
    view = view_parts(sampler, output, delta_timestamps, fps)
    if num_workers:
        kwargs.setdefault("persistent_workers", True)
    dataset = StoreDataset(store.url, sampler.table.name, store.storage_options,
                           store.cache if store.cache is not None else False, transform=transform,
                           parts=[*(f.worker() for f in sampler.features), *view])
    # torch types a batch sampler as yielding lists of indices; the DataLoader hands whatever it yields (here a
    # Request) to the dataset's __getitems__ unchanged
    loader = StoreLoader(dataset, batch_sampler=sampler,  # type: ignore[arg-type]
                         num_workers=num_workers, pin_memory=pin_memory, collate_fn=_first, **kwargs)
    loader.output, loader.schema = output, sampler.table.schema
    if num_workers and loader.persistent_workers:
        dataset.slots = SharedSlots(num_workers, (loader.prefetch_factor or 2) + 2)
    return loader
