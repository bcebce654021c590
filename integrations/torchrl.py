"""A TorchRL ``Storage`` backed by a replaystore store (extra ``replaystore[torchrl]``).

:class:`ReplayStoreStorage` puts a store behind TorchRL's composable replay buffers
(``TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler())``):
``extend`` appends and commits, ``sample`` reads the sampled records back as a TensorDict.
The store holds the data, so another process (or a resumed run) opening the same URL
sees the same buffer. Importing this module imports ``torchrl`` and ``tensordict``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replaystore.errors import (
    AppendOnlyError,
    DTypeError,
    MissingDependencyError,
    MissingFieldError,
    ResumeMismatchError,
    ShapeError,
    StoreNotFoundError,
    UnknownFieldError,
    UnsupportedCombinationError,
)
from replaystore.loaders.tdoutput import TORCHRL_KEYS
from replaystore.schemas import Dense, Ragged, Schema, nested
from replaystore.store import Store, Table, TableView, open_store

try:
    from tensordict import TensorDict, TensorDictBase  # type: ignore[import-untyped]
    from torchrl.data.replay_buffers.samplers import SliceSampler  # type: ignore[import-untyped]
    from torchrl.data.replay_buffers.storages import StoreStorage  # type: ignore[import-untyped]
    from torchrl.data.replay_buffers.storages.base import Storage  # type: ignore[import-untyped]
    from torchrl.data.replay_buffers.writers import RoundRobinWriter  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without torchrl
    raise MissingDependencyError('replaystore.integrations.torchrl needs torchrl and tensordict: '
                                 'pip install "replaystore[torchrl]"') from exc

Key = tuple[str, ...]
"""A TensorDict key as a tuple of strings (``("next", "observation")``)."""

SEP = "__"
"""What joins a nested TensorDict key into its column name (``next__observation``)."""

UNBOUNDED = 2**31 - 1
"""``max_size`` of a storage over an unbounded store (TorchRL's writers keep the cursor in an int32)."""

TRANSITION_KEYS: dict[str, Key] = dict(TORCHRL_KEYS)  # (make_loader(output="torchrl") uses the same)
"""The default key mapping for a store with the built-in transition fields (``transitions``,
``episode``, stores recorded by ``replaystore.gym``): field name to TensorDict key."""

TRAJ_KEY = "episode"
"""The trajectory key of a store with episodes: TorchRL's own (``SliceSampler``'s default ``traj_key``).

Over a store with the built-in transition fields, each record gets an int64 ``"episode"``:
one id per trajectory (a stream's run of records up to and including a terminated or
truncated one, or up to the stream's last visible record or a gap in its steps), so that
records of different streams (the sub-envs of a vector env) never share an id."""

_SCALAR_FLAGS = {("next", "reward"), ("next", "terminated"), ("next", "truncated"), ("next", "done")}
_DONE: Key = ("next", "done")
_TERMINATED: Key = ("next", "terminated")
_TRUNCATED: Key = ("next", "truncated")
_INDEX = ("index",)  # what TorchRL's TensorDict writers add to each extended batch
_LAYOUT = "tensordict"  # schema metadata marking a store this storage created from TensorDicts


class _Leaf:
    """One stored column and where it goes in a TensorDict."""

    __slots__ = ("column", "key", "offsets", "unsqueeze")

    def __init__(self, column: str, key: Key, offsets: str | None, unsqueeze: bool) -> None:
        self.column = column
        self.key = key
        self.offsets = offsets  # a ragged field's CSR offsets name; None for a dense field
        self.unsqueeze = unsqueeze  # a scalar field shown as (B, 1), TorchRL's reward/done layout


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def _column_path(name: str, nodes: Mapping[str, str]) -> Key:
    """A flat column name's path through the schema's nested nodes (``obs__image`` -> ``("obs", "image")``)."""
    parts = name.split(SEP)
    out, prefix = [parts[0]], parts[0]
    for p in parts[1:]:
        if prefix in nodes:
            out.append(p)
        else:
            out[-1] = f"{out[-1]}{SEP}{p}"
        prefix = f"{prefix}{SEP}{p}"
    return tuple(out)


def _default_keys(schema: Schema) -> dict[str, Key]:
    if schema.metadata.get("torchrl") == _LAYOUT:
        return {}
    tops = {_column_path(n, _nodes(schema))[0] for n in schema.names}
    if {"obs", "next_obs", "reward", "terminated"} <= tops:
        return {k: v for k, v in TRANSITION_KEYS.items() if k in tops}
    return {}


def _nodes(schema: Schema) -> Mapping[str, str]:
    nesting = schema.nesting
    return {} if nesting is None else nesting.nodes


def _plan(schema: Schema, keys: Mapping[str, Key]) -> list[_Leaf]:
    nodes = _nodes(schema)
    offsets = {f.name: f.offsets for f in schema.ragged_fields}
    scalar = {f.name for f in schema.dense_fields if f.shape == ()}
    leaves = []
    for name in schema.names:
        path = _column_path(name, nodes)
        if path[0] in keys:
            path = keys[path[0]] + path[1:]
        unsqueeze = bool(keys) and path in _SCALAR_FLAGS and name in scalar
        leaves.append(_Leaf(name, path, offsets.get(name), unsqueeze))
    return leaves


def _numpy(key: Key, value: Any) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise DTypeError(SEP.join(key), "a torch.Tensor", type(value).__name__)
    try:
        return value.detach().cpu().numpy()
    except TypeError as exc:  # bfloat16, complex32 ...: no numpy dtype to store it as
        raise DTypeError(SEP.join(key), "a dtype numpy has (bool, integers, float16/32/64)", value.dtype) from exc


def _is_jagged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _jagged_parts(key: Key, value: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    if value.layout != torch.jagged or value.dim() != 2:
        raise ShapeError(SEP.join(key), "a jagged nested tensor (B, j) of one list per record",
                         f"layout {value.layout}, {value.dim()} dims")
    offsets = value.offsets()  # type: ignore[attr-defined]  # a jagged nested tensor's (torch.nested)
    return _numpy(key, value.values()), _numpy(key, offsets).astype(np.int64, copy=False)


def _field(name: str, key: Key, value: Any) -> Dense | Ragged:
    if _is_jagged(value):
        values, _ = _jagged_parts(key, value)
        return Ragged(name, values.dtype, offsets=f"{SEP.join(key)}_offsets", finite=False)
    arr = _numpy(key, value)
    return Dense(name, arr.dtype, arr.shape[1:], finite=False)


def schema_from_tensordict(td: TensorDictBase, name: str = "tensordict") -> Schema:
    """The schema a store gets for TensorDicts shaped like ``td`` (what the first ``extend`` creates).

    Each leaf of ``td`` becomes a field with its dtype and trailing shape (floats are not
    checked for NaN/inf, as TorchRL stores them); a jagged nested tensor becomes a ragged
    field (offsets ``<key>_offsets``); a nested TensorDict becomes a nested field whose
    columns are the key's parts joined with ``__`` (``next__observation``). TorchRL's
    ``"index"`` entry is not stored.

    Parameters
    ----------
    td : TensorDictBase
        A batch with one batch dimension.
    name : str, optional
        The schema's name.

    Returns
    -------
    Schema
        With metadata ``{"torchrl": "tensordict"}``, so a reopened store maps its columns
        back to the same keys.

    Raises
    ------
    ShapeError
        ``td`` does not have exactly one batch dimension, or a nested tensor is not jagged
        ``(B, j)``.
    DTypeError
        A leaf is not a tensor, or has a dtype numpy lacks (``bfloat16``).
    SchemaError
        A key is not an identifier, starts with ``_`` or contains ``__``.

    Notes
    -----
    Cost: one pass over the leaves; copies only tensors on another device.
    """
    if td.batch_dims != 1:
        raise ShapeError("batch_size", "one batch dimension [B]", list(td.batch_size))

    def build(sub: TensorDictBase, prefix: Key) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in sub.keys():
            key = (*prefix, k)
            if key == _INDEX:
                continue
            v = sub.get(k)
            out[k] = build(v, key) if isinstance(v, TensorDictBase) else _field(k, key, v)
        return out

    fields: list[Any] = []
    for k, v in build(td, ()).items():
        fields.append(nested(k, v) if isinstance(v, dict) else v)
    return Schema(name, fields, metadata={"torchrl": _LAYOUT})


class ReplayStoreStorage(StoreStorage):
    """A TorchRL replay-buffer storage whose records live in a replaystore store.

    Use it as any TorchRL storage:
    ``TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler(), batch_size=256)``,
    with ``SliceSampler(traj_key=..., slice_len=...)`` too. Only TensorDict data is
    stored (``TensorDictReplayBuffer``, or ``ReplayBuffer`` extended with TensorDicts).

    - **Writing**: each ``extend`` (``set`` at the writer's cursor) validates the batch
      against the store's schema, appends it through this process's writer and commits:
      the records are durable and visible (to this handle at once; other handles after
      their ``refresh()``) when ``extend`` returns, all or nothing. A new store is created
      at the first ``extend`` with :func:`schema_from_tensordict` of that batch. A batch
      whose keys, shapes or dtypes differ raises a typed error naming the field, and the
      store is left as it was.
    - **Indices**: TorchRL's samplers draw positions ``0 <= i < len(storage)``; position
      ``i`` is the i-th visible record in row-id order (oldest first for one writer); over a
      store with episodes (below), in trajectory order instead. A
      store only appends, and a capped store drops its oldest records itself (``max_size``
      is its capacity). The storage keeps the append cursor a ``RoundRobinWriter`` keeps
      (``state_dict`` saves it): a write whose indices are one consecutive run (modulo
      ``max_size``) starting at the cursor is an append, the cursor wrapping onto the oldest
      record included; so is a first write at 0 through this storage in a process (a new
      writer), and a run the buffer's ``RoundRobinWriter`` has just moved its own cursor past
      (restored, or shared by several processes). Any other write (explicit indices,
      ``storage.set(i, td)`` elsewhere, ``TensorDictMaxValueWriter`` replacing its
      lowest-ranked record) raises :class:`~replaystore.errors.AppendOnlyError` naming the
      index and the cursor, and writes nothing: use TorchRL's default ``RoundRobinWriter``.
    - **Trajectories**: over a store with the built-in transition fields (a recorded
      store; :data:`TRANSITION_KEYS`), positions run stream by stream (streams in the order
      of their oldest visible record, each in step order), so each sub-env's trajectory is
      contiguous, as in a TorchRL storage holding one env's records after another's, and
      each record carries :data:`TRAJ_KEY` (``"episode"``, int64, one id per trajectory,
      never shared by two streams). ``SliceSampler(traj_key="episode", slice_len=...)``,
      and ``SliceSampler(slice_len=...)`` (which finds ``"episode"`` itself), give slices
      that never mix streams. ``SliceSampler(end_key=("next", "done"))`` sees only ``done``:
      where a trajectory ends without it (a stream's unfinished episode, followed by the
      next stream's records; a gap in a stream's steps), its slices would run into another
      stream, so a buffer over this storage whose ``SliceSampler`` uses ``end_key`` raises
      :class:`~replaystore.errors.UnsupportedCombinationError` at ``sample()`` (a sampler
      called directly, ``sampler.sample(storage, n)``, is not attached and cannot be
      checked: give it ``traj_key="episode"``). Writing through the storage appends to its
      own stream, whose records come last while no other stream starts after it. The
      ``"episode"`` key is not stored: a batch extended back may carry it.
    - **Following other writers**: ``len`` and reads use the view of the last refresh.
      Commits of other processes become visible at :meth:`refresh` (e.g. once per
      training iteration), never in the middle of a ``sample()``, so the positions a
      sampler drew always read the records it drew from; this handle's own ``extend`` is
      visible at once.
    - **Layout**: a sampled batch has the keys, nesting, shapes and dtypes that were
      extended (``("next", "observation")`` ...); ragged fields come back as jagged nested
      tensors (``torch.nested``, layout ``torch.jagged``, shape ``(B, j)``). A store with
      other field names is shown through ``keys``: a store with the built-in transition
      fields gets :data:`TRANSITION_KEYS` (``obs`` -> ``observation``, ``reward`` ->
      ``("next", "reward")`` ...; scalar reward/terminated/truncated shown as ``(B, 1)``,
      and ``("next", "done")`` = terminated | truncated added) unless ``keys`` says otherwise.
    - **State**: ``state_dict`` / ``dumps`` hold only the store's URL and table (and the
      append cursor); the store is the state. Pickling (spawned processes) carries the URL,
      and each process opens the store itself.

    Parameters
    ----------
    url_or_store : str or Store
        The store's URL (local path, ``file://``, ``s3://``; ``memory://`` in one process
        only) or an open store.
    keys : mapping of str to str or tuple of str, optional
        Top-level field name to TensorDict key, for stores not written from TensorDicts
        (``{"obs": "observation", "reward": ("next", "reward")}``); fields not named keep
        their own name. Default: :data:`TRANSITION_KEYS` where the store has those fields.
    table : str, optional
        The table to use (default: the store's only table).
    capacity : int, optional
        For a store this storage creates: keep the newest ``capacity`` records (None:
        unbounded).
    storage_options : dict, optional
        Passed to ``open_store`` (S3 credentials ...).
    stream : int or str, optional
        The stream key appended records get (default ``"torchrl-<writer id>"``).

    Raises
    ------
    FormatVersionError, CorruptObjectError
        The store at the URL is of another format version, or damaged (``open_store``).
    MissingFieldError
        ``keys`` names a field the store does not have (raised at the first read or write).

    Notes
    -----
    Cost: opening the store (no data read). ``extend`` costs an append and a commit
    (on local disk a ``fdatasync``, 2-15 ms: extend in batches). ``sample`` costs one
    read of the sampled rows (see ``TableView.read``). Over a store with episodes, the
    first read of each view (after a refresh that brought commits, or an ``extend``) also
    builds the trajectory order: the stream index, and a read of the terminated/truncated
    columns of every record (8 bytes of index and 2 bytes of flags per record).
    """

    _storage = None  # TorchRL's SliceSampler looks here for a TensorDict to read keys from

    def __init__(self, url_or_store: str | Store, *, keys: Mapping[str, str | tuple[str, ...]] | None = None,
                 table: str | None = None, capacity: int | None = None,
                 storage_options: dict[str, Any] | None = None, stream: int | str | None = None) -> None:
        if isinstance(url_or_store, Store):
            self._store: Store | None = url_or_store
            self.url = url_or_store.url
            self._options = url_or_store.storage_options or {}
        else:
            self._store = None
            self.url = str(url_or_store)
            self._options = dict(storage_options or {})
        self._keys_arg = None if keys is None else {k: _as_key(v) for k, v in keys.items()}
        self._table_name = table
        self._capacity = capacity
        self._stream = stream
        self._pid = os.getpid()
        self._writer: Any = None
        self._plan: list[_Leaf] | None = None
        self._whole: tuple[TableView, TensorDictBase] | None = None  # the last whole-view read, kept per view
        self._done = False
        self._episodic = False  # a store with episodes: trajectory order and the "episode" key
        # per view: (view, row id of each position, episode id of each position, whether end_key misses a boundary)
        self._traj: tuple[TableView, np.ndarray, np.ndarray, bool] | None = None
        self._cursor = 0  # the index (mod max_size) where the next append goes: the TorchRL writer's cursor
        self._cursor_pid = -1  # the process that last wrote through this handle (-1: none yet)
        # where each attached round-robin writer's cursor stood at this handle's last accepted write, in the process
        # of _cursor_pid (keyed by id(writer)): a writer still there has not appended behind this handle's back
        self._writers_seen: dict[int, int] = {}
        if self._store is None:
            self._open()
        cap = self._table().capacity if self._store is not None else capacity
        # StoreStorage's own __init__ connects to a Redis server; only Storage's runs here (StoreStorage is the
        # base so that TorchRL's replay buffers pick the identity collate for storages that return TensorDicts)
        Storage.__init__(self, max_size=cap if cap is not None else UNBOUNDED)

    # -- the store ------------------------------------------------------------------------
    def _open(self, schema: Schema | None = None) -> None:
        """Open the store (this process's own handle); with ``schema``, create it if absent."""
        self._pid = os.getpid()
        self._writer = None
        self._plan = None
        self._whole = None
        self._traj = None
        if schema is not None:
            self._store = open_store(self.url, {self._table_name: schema} if self._table_name else schema, mode="a",
                                     capacity=self._capacity, storage_options=self._options)
            return
        try:
            self._store = open_store(self.url, mode="r+", storage_options=self._options)
        except StoreNotFoundError:
            self._store = None  # created at the first extend

    def _table(self) -> Table:
        st = self.store
        if st is None:
            raise StoreNotFoundError(f"{self.url}: no store yet (the first extend creates it)")
        return st.table(self._table_name) if self._table_name else st.default

    def _leaves(self, table: Table) -> list[_Leaf]:
        if self._plan is None:
            schema = table.schema
            keys = self._keys_arg if self._keys_arg is not None else _default_keys(schema)
            tops = {_column_path(n, _nodes(schema))[0] for n in schema.names}
            for k in keys:
                if k not in tops:
                    raise MissingFieldError(k, f"one of the store's fields {sorted(tops)}", "not in the store")
            self._plan = _plan(schema, keys)
            keyset = {leaf.key for leaf in self._plan}
            self._done = bool(keys) and _DONE not in keyset and _TERMINATED in keyset
            self._episodic = bool(keys) and _TERMINATED in keyset and (TRAJ_KEY,) not in keyset
        return self._plan

    @property
    def store(self) -> Store | None:
        """The open store (None until the first ``extend`` creates it)."""
        if self._pid != os.getpid() or self._store is None:
            self._open()
        return self._store

    def refresh(self) -> bool:
        """Pick up commits other processes made since the last refresh.

        Returns
        -------
        bool
            True if there were any.

        Notes
        -----
        Cost: ``Store.refresh`` (about 0.1 ms when nothing is new).
        """
        st = self.store
        return False if st is None else st.refresh()

    def close(self) -> None:
        """Close this process's writer, if ``extend`` opened one.

        Every ``extend`` is committed already; closing finishes the writer's background work
        and marks it closed, so that its last segment can be reclaimed (as for any writer).
        A later ``extend`` opens a new writer.

        Notes
        -----
        Cost: the writer's ``close``: pending compaction finishes.
        """
        if self._writer is not None and self._pid == os.getpid():
            self._writer.close()
        self._writer = None

    # -- TorchRL's Storage interface --------------------------------------------------------
    def __len__(self) -> int:
        return 0 if self.store is None else len(self._table())

    @property
    def _last_cursor_index(self) -> int | None:
        """The position of the newest record: the ring's end, for TorchRL's SliceSampler.

        SliceSampler reads it right after the whole view it finds trajectories in: a
        SliceSampler of a buffer over this storage that finds them by ``end_key`` alone is
        refused here where that would cross streams (an error raised from the whole-view read
        itself would reach the user wrapped in TorchRL's RuntimeError).
        """
        if self.store is not None:
            table = self._table()
            self._check_slicers(table, table.view())
        n = len(self)
        return n - 1 if n else None

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """Append ``data`` (a TorchRL writer's ``extend``/``add`` at its cursor) and commit.

        The storage keeps the append cursor a ``RoundRobinWriter`` keeps: the index (modulo
        ``max_size``) where the next append goes, moved past each write it accepts. A write is
        an append, and accepted, when its indices are consecutive (modulo ``max_size``) and start
        at that cursor; the cursor wrapping at ``max_size`` onto the oldest record is an append
        too (a capped store drops that record, as a ring would overwrite it). The first write
        through this storage in a process may also start at 0, where a new TorchRL writer
        starts (a resumed run, a spawned collector); and a run that a ``RoundRobinWriter`` of
        a buffer over this storage has just moved its cursor past is its append (its cursor
        restored from a checkpoint, or shared with other processes). Anything else, e.g. the
        single-index overwrites of ``TensorDictMaxValueWriter`` or ``storage.set(i, td)``
        elsewhere, would overwrite a record in place, which a store cannot do: it is refused.

        Parameters
        ----------
        cursor : int, slice or torch.Tensor
            The writer's indices: consecutive (modulo ``max_size``), one per record.
        data : TensorDictBase
            The records, batch size ``[len(cursor)]`` (``[]`` for one record at an int cursor).
        set_cursor : bool, optional
            False for a write at explicit indices (``storage[i] = data``, ``write_at``), which
            is refused.

        Raises
        ------
        AppendOnlyError
            ``set_cursor=False``, an index outside ``-max_size .. max_size - 1`` (where
            TorchRL's LazyTensorStorage raises IndexError), or indices that are not one run
            starting at the append cursor (the message names both); nothing is written and the
            cursor stays.
        ShapeError, DTypeError, MissingFieldError, UnknownFieldError, ValidationError
            ``data`` does not match the store's schema (nothing written; the cursor moves past
            the indices, as the TorchRL writer's did before it called ``set``).

        Notes
        -----
        Cost: validation, an append and a commit.
        """
        if isinstance(cursor, slice):
            idx = torch.arange(*cursor.indices(self.max_size))
        else:
            idx = torch.as_tensor(cursor).reshape(-1)
        if not set_cursor:
            raise AppendOnlyError(self._not_an_append(idx, "a write at explicit indices (storage[i] = data, "
                                                           "write_at) would overwrite records in place"))
        if not isinstance(data, TensorDictBase):
            raise DTypeError("data", "a TensorDict", type(data).__name__)
        if data.batch_dims == 0:
            data = data.unsqueeze(0)
        if idx.numel() != data.shape[0]:
            raise ShapeError("batch_size", f"[{idx.numel()}] records, one per index", list(data.batch_size))
        first_here = self._cursor_pid != os.getpid()
        if idx.numel() and bool(((idx >= self.max_size) | (idx < -self.max_size)).any()):
            raise AppendOnlyError(self._not_an_append(idx, f"an index outside the storage's positions "
                                                           f"-{self.max_size}..{self.max_size - 1}"))
        if idx.numel():
            start = int(idx[0]) % self.max_size
            run = bool(((idx[1:] - idx[:-1]) % self.max_size == 1 % self.max_size).all())
            end = (start + idx.numel()) % self.max_size
            if not run or (start != self._cursor and not (first_here and start == 0)
                           and not self._round_robin_append(start, end)):
                raise AppendOnlyError(self._not_an_append(idx, "it would overwrite records in place" if run
                                                          else "its indices are not one consecutive run"))
            # (moved before the data is checked, as the TorchRL writer moved its own before calling set)
            self._cursor = end
            self._cursor_pid = os.getpid()
            self._writers_seen = {id(writer): cursor for writer, cursor in self._round_robin_cursors()}
        if self.store is None:
            self._open(schema_from_tensordict(data))
        table = self._table()
        batch = self._columns(table, data)
        if self._writer is None:
            assert self._store is not None
            self._writer = self._store.writer()
        stream = self._stream if self._stream is not None else f"torchrl-{self._writer.id}"
        self._writer.append(batch, stream=stream, table=table.name)
        self._writer.commit()

    def _round_robin_cursors(self) -> list[tuple[Any, int]]:
        """``(writer, cursor mod max_size)`` of each round-robin writer of a buffer over this storage."""
        out = []
        for entity in getattr(self, "_attached_entities", ()):  # (TorchRL's buffers attach themselves)
            writer = getattr(entity, "_writer", None)
            cursor = getattr(writer, "_cursor", None) if isinstance(writer, RoundRobinWriter) else None
            if cursor is not None:
                out.append((writer, int(cursor) % self.max_size))
        return out

    def _round_robin_append(self, start: int, end: int) -> bool:
        """Whether a round-robin writer of a buffer over this storage has just moved its cursor ``start`` -> ``end``.

        Such a writer moves its cursor past a run before it calls :meth:`set` with it: the run is
        its append, from a cursor this storage did not see move (restored from a checkpoint, or
        shared with other processes writing the same buffer). A run ending where this storage's
        own cursor stands would rewrite its newest records: never an append. Nor is a run from a
        writer whose cursor stood at ``start`` when this storage last wrote (in this process):
        that writer did not move behind this storage's back, so the run rewrites the records
        written since (``storage.set`` at the cursor, then the writer's own ``extend``). Nor is
        a run from a writer whose cursor has not moved since this storage last wrote: that
        writer wrote nothing since, so the run is a ``storage.set`` at another index.
        """
        if end == self._cursor:
            return False
        seen = self._writers_seen if self._cursor_pid == os.getpid() else {}
        return any(cursor == end and seen.get(id(writer)) not in (start, cursor)
                   for writer, cursor in self._round_robin_cursors())

    def _not_an_append(self, idx: torch.Tensor, why: str) -> str:
        shown = idx.tolist()
        text = f"index {shown[0]}" if len(shown) == 1 else f"indices {shown[:8]}{'...' if len(shown) > 8 else ''}"
        where = (f"{self._cursor}" if self._cursor_pid == os.getpid() or self._cursor == 0
                 else f"{self._cursor} (or 0, for a new writer)")
        return (f"{self.url}: a write at {text} is not an append ({why}); the next append goes at index {where}. "
                "A store only appends: use TorchRL's RoundRobinWriter (the default writer of its replay buffers), "
                "not a writer that overwrites chosen indices (TensorDictMaxValueWriter)")

    def _columns(self, table: Table, data: TensorDictBase) -> dict[str, np.ndarray]:
        """``data``'s leaves as the store's flat columns; checks the key set first."""
        leaves = self._leaves(table)
        n = data.shape[0]
        given = {_as_key(k) for k in data.keys(include_nested=True, leaves_only=True)} - {_INDEX}
        if self._done:
            given.discard(_DONE)
        if self._episodic:
            given.discard((TRAJ_KEY,))
        wanted = {leaf.key for leaf in leaves}
        for k in sorted(given - wanted):
            raise UnknownFieldError(SEP.join(k), f"one of the store's keys {sorted(wanted)}", "an extra key")
        out: dict[str, np.ndarray] = {}
        for leaf in leaves:
            if leaf.key not in given:
                raise MissingFieldError(SEP.join(leaf.key), f"a value for the store's field {leaf.column!r}", "missing")
            value = data.get(leaf.key)
            if leaf.offsets is not None:
                if not _is_jagged(value):
                    raise ShapeError(SEP.join(leaf.key), "a jagged nested tensor (one list per record)",
                                     f"{type(value).__name__} {tuple(value.shape)}")
                out[leaf.column], out[leaf.offsets] = _jagged_parts(leaf.key, value)
                continue
            arr = _numpy(leaf.key, value)
            if leaf.unsqueeze and arr.shape == (n, 1):
                arr = arr.reshape(n)
            out[leaf.column] = arr
        return out

    def get(self, index: Any) -> TensorDictBase:
        """The records at positions ``index`` as a TensorDict.

        Parameters
        ----------
        index : int, slice, sequence, numpy.ndarray or torch.Tensor
            Positions ``0 <= i < len`` (negative ones count from the end); a tuple of one
            index tensor (what TorchRL's samplers pass) is that tensor.

        Returns
        -------
        TensorDictBase
            Batch size the index's shape (``[]`` for an int).

        Raises
        ------
        RowError
            A position outside ``[-len, len)``.

        Notes
        -----
        Cost: one read of those rows (``TableView.read``); tensors share the read's memory. A
        read of the whole view (``storage[:]``, which TorchRL's ``SliceSampler`` makes at each
        sample) is kept until the view changes (a refresh that brought commits, an ``extend``):
        it holds every record in memory once, and its tensors are shared with later
        whole-view reads, so treat them as read-only.
        """
        table = self._table()
        view = table.view()
        n = len(view)
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        if isinstance(index, slice):
            if index.indices(n) == (0, n, 1):  # the whole view: SliceSampler asks for it at every sample
                if self._whole is None or self._whole[0] is not view:
                    self._whole = (view, self._read(table, view, np.arange(n, dtype=np.int64)))
                return self._whole[1].copy()
            pos = np.arange(*index.indices(n), dtype=np.int64)
            shape: tuple[int, ...] = pos.shape
        else:
            if isinstance(index, torch.Tensor):
                index = index.cpu().numpy()
            arr = np.asarray(index, dtype=np.int64)
            shape = arr.shape
            pos = arr.reshape(-1)
            if pos.size and pos.min() < 0:
                pos = np.where(pos < 0, pos + n, pos)
        td = self._read(table, view, pos)
        if shape == pos.shape:
            return td
        return td[0] if shape == () else td.reshape(shape)

    def _trajectories(self, table: Table, view: TableView) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """Per position of ``view``: its row id and episode id, in trajectory order; None for a store without episodes.

        The third value says whether some trajectory ends without ``done`` (where an end_key
        slicer would cross into the next one).
        """
        columns = {leaf.key: leaf.column for leaf in self._leaves(table)}  # (sets _episodic)
        if not self._episodic:
            return None
        if self._traj is not None and self._traj[0] is view:
            return self._traj[1:]
        parts = [p for p in (view.rows(s) for s in view.streams()) if len(p[0])]
        parts.sort(key=lambda p: int(p[0].min()))
        n = sum(len(p[0]) for p in parts)
        rows = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
        start = np.zeros(n, dtype=bool)
        at = 0
        for _, steps in parts:
            start[at] = True
            start[at + 1:at + len(steps)] = np.diff(steps) != 1  # a gap in a stream's steps ends a trajectory
            at += len(steps)
        wanted = [columns[k] for k in (_TERMINATED, _TRUNCATED) if k in columns]
        arrays = view.read_columns(rows, wanted).arrays if n else {}
        done = np.zeros(n, dtype=bool)
        for c in wanted:
            done |= np.asarray(arrays[c], dtype=bool).reshape(n)
        start[1:] |= done[:-1]
        episode = np.cumsum(start, dtype=np.int64) - 1
        hidden = bool((start[1:] & ~done[:-1]).any())
        self._traj = (view, rows, episode, hidden)
        return rows, episode, hidden

    def _check_slicers(self, table: Table, view: TableView) -> None:
        """Refuse a SliceSampler finding trajectories by ``end_key`` where one ends without ``done``.

        Its slices would cross streams there.
        """
        for entity in getattr(self, "_attached_entities", ()):
            sampler = getattr(entity, "_sampler", None)
            if isinstance(sampler, SliceSampler) and not getattr(sampler, "_fetch_traj", True):
                traj = self._trajectories(table, view)
                if traj is None or not traj[2]:
                    return
                end = sampler.end_keys if sampler.end_keys is not None else sampler.end_key
                raise UnsupportedCombinationError(
                    f"SliceSampler(end_key={end!r})", f"ReplayStoreStorage({self.url!r})",
                    "the store's streams (sub-envs) each end in an unfinished episode, or their steps have gaps, "
                    "where no done flag marks the end, so slices found by end_key would run from one stream into "
                    f"the next; use SliceSampler(traj_key={TRAJ_KEY!r}, ...), the trajectory id this storage "
                    "gives each record")

    def _read(self, table: Table, view: TableView, pos: np.ndarray) -> TensorDictBase:
        leaves = self._leaves(table)
        traj = self._trajectories(table, view)
        if traj is None:
            rows = view.rows_at(pos)
        else:
            if pos.size and (pos.min() < 0 or pos.max() >= len(traj[0])):
                rows = view.rows_at(pos)  # (raises RowError naming the position)
            rows = traj[0][pos]
        arrays = view.read_columns(rows).arrays
        b = len(pos)
        tree: dict[str, Any] = {}
        for leaf in leaves:
            if leaf.offsets is not None:
                value = torch.nested.nested_tensor_from_jagged(torch.from_numpy(arrays[leaf.column]),
                                                               torch.from_numpy(arrays[leaf.offsets]))
            else:
                value = torch.from_numpy(arrays[leaf.column])
                if leaf.unsqueeze:
                    value = value.unsqueeze(-1)
            node = tree
            for part in leaf.key[:-1]:
                node = node.setdefault(part, {})
            node[leaf.key[-1]] = value
        if self._done:
            nxt = tree["next"]
            done = nxt["terminated"]
            if "truncated" in nxt:
                done = done | nxt["truncated"]
            nxt["done"] = done
        if traj is not None:
            tree[TRAJ_KEY] = torch.from_numpy(traj[1][pos])
        return TensorDict(tree, batch_size=[b])

    def contains(self, item: Any) -> bool:
        """Whether position ``item`` is a visible record.

        Parameters
        ----------
        item : int
            A position.

        Returns
        -------
        bool
            ``0 <= item < len(self)``.
        """
        return 0 <= int(item) < len(self)

    def _empty(self) -> None:
        raise AppendOnlyError(f"{self.url}: a store only appends; empty() would remove its records "
                              "(delete the store, or open it with mode 'w+', to start again)")

    def state_dict(self) -> dict[str, Any]:
        """The storage's state: which store and table (the records are the store's).

        Returns
        -------
        dict
            ``url``, ``table``, ``records`` (the visible count, for information) and ``cursor``
            (the append cursor, which the buffer's writer saves alongside as its own).
        """
        return {"url": self.url, "table": self._table().name if self.store is not None else self._table_name,
                "records": len(self), "cursor": self._cursor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check ``state_dict`` names this storage's store, take its append cursor, and refresh.

        Parameters
        ----------
        state_dict : dict
            From :meth:`state_dict` (the restored writer continues at its saved cursor, and
            so does this storage).

        Raises
        ------
        ResumeMismatchError
            It names another store or table, or its cursor is not an index below ``max_size``.
        """
        mine = self.state_dict()
        differ = {k: (state_dict.get(k), mine[k]) for k in ("url", "table")
                  if state_dict.get(k) is not None and state_dict.get(k) != mine[k]}
        cursor = state_dict.get("cursor")
        if cursor is not None and (not isinstance(cursor, int) or isinstance(cursor, bool)
                                   or not 0 <= cursor < self.max_size):
            differ["cursor"] = (cursor, f"an int in [0, {self.max_size})")
        if differ:
            raise ResumeMismatchError("torchrl storage", differ, "a storage state names the store it was taken from")
        if cursor is not None:
            self._cursor = cursor
        self.refresh()

    def dumps(self, path: Any) -> None:
        """Write :meth:`state_dict` as JSON to ``path/replaystore.json`` (no data: the store holds it).

        Parameters
        ----------
        path : str or os.PathLike
            A directory (created if absent).
        """
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        (p / "replaystore.json").write_text(json.dumps(self.state_dict()))

    def loads(self, path: Any) -> None:
        """Read what :meth:`dumps` wrote and :meth:`load_state_dict` it.

        Parameters
        ----------
        path : str or os.PathLike
            The directory given to :meth:`dumps`.

        Raises
        ------
        ResumeMismatchError
            It names another store or table.
        """
        self.load_state_dict(json.loads((Path(path) / "replaystore.json").read_text()))

    def __getstate__(self) -> dict[str, Any]:
        state = Storage.__getstate__(self)
        state.update(_store=None, _writer=None, _plan=None, _whole=None, _traj=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        Storage.__setstate__(self, state)
        self._pid = -1  # each process opens the store itself, at first use

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, len={len(self)}, max_size={self.max_size})"


__all__ = ["TRAJ_KEY", "TRANSITION_KEYS", "UNBOUNDED", "ReplayStoreStorage", "schema_from_tensordict"]
