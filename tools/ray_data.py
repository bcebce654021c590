"""Ray Data over a replaystore store: :func:`read_replaystore` returns a ``ray.data.Dataset``.

The dataset is a snapshot of the table's committed records as of the call. Its read
tasks are the table's live fragments (one task per fragment, or runs of consecutive
fragments when Ray asks for fewer tasks); a task carries only the fragment's
descriptor and first visible row (a few hundred bytes), opens the store itself
read-only in whichever Ray worker runs it and streams that fragment's visible records
with :func:`replaystore.store.scan_fragment`, reading only the projected
columns' objects. The driver reads the commit log once and never holds the data.

Columns and types are those of ``st.sql``'s views (``Table.scan_schema``):
``row, stream, step, reset``, every schema field (dense multi-dimensional fields as
``fixed_size_list``, ragged fields as ``large_list``), ``writer, commit, commit_time``.

Ray is an optional dependency: ``pip install 'replaystore[ray]'``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

try:
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "replaystore.tools.ray_data needs Ray Data, which is an optional extra: "
        "pip install 'replaystore[ray]'") from exc

import numpy as np
import pyarrow as pa

from replaystore.errors import StaleReadError
from replaystore.schemas import Schema
from replaystore.schemas.fields import Dense, Ragged
from replaystore.store import SCAN_ROWS, FragmentInfo, open_store, read_manifest, scan_fragment, scan_projection
from replaystore.store.storage import open_storage

__all__ = ["ReplayStoreDatasource", "read_replaystore"]

_FIXED_BYTES = {"row": 8, "stream": 8, "step": 8, "reset": 1, "writer": 4, "commit": 8, "commit_time": 8}


def _column_bytes(schema: Schema, name: str, frag: FragmentInfo, visible: int) -> int:
    """An estimate of one column's in-memory bytes for ``visible`` records of ``frag``."""
    if name in _FIXED_BYTES:
        return _FIXED_BYTES[name] * visible
    f = schema.field(name)
    if isinstance(f, Dense):
        return f.dtype.itemsize * math.prod(f.shape) * visible
    assert isinstance(f, Ragged)
    nnz = frag.nnz.get(f.offsets, 0)
    return 8 * (visible + 1) + f.dtype.itemsize * (nnz * visible // max(frag.rows, 1))


def _read_fragments(url: str, storage_options: dict[str, Any], created_ns: int, table: str,
                    parts: list[tuple[int, dict[str, Any], int]], schema: pa.Schema,
                    batch_rows: int) -> Iterator[pa.Table]:
    """A read task's body: open the store read-only here, stream each fragment's visible records."""
    storage = open_storage(url, storage_options)
    manifest = read_manifest(storage)
    if manifest is None or manifest["created_ns"] != created_ns:
        raise StaleReadError(f"{url}: the store this dataset was created from is gone or was replaced "
                             "since; call read_replaystore again")
    table_schema = Schema.from_dict(manifest["tables"][table])
    for writer, descriptor, vis_from in parts:
        frag = FragmentInfo.from_descriptor(writer, table, descriptor, vis_from)
        done = vis_from
        try:
            for batch in scan_fragment(storage, table_schema, frag, schema, batch_rows):
                yield pa.Table.from_batches([batch], schema=schema)
                done += batch.num_rows
        except StaleReadError:
            # the fragment's objects are gone: a compaction replaced it (its originals are deleted
            # 30 s later) or its records were evicted and reclaimed. Read the same row ids from
            # the fragments that hold them now (compaction keeps records and row ids byte for byte).
            yield from _read_rows(url, storage_options, table, writer, frag.first_id + done,
                                  frag.first_id + frag.rows, schema, batch_rows)


def _read_rows(url: str, storage_options: dict[str, Any], table: str, writer: int, lo: int, hi: int,
               schema: pa.Schema, batch_rows: int) -> Iterator[pa.Table]:
    """Row ids ``[lo, hi)`` of one writer from the store's live fragments now; StaleReadError if gone."""
    st = open_store(url, mode="r", storage_options=storage_options)
    table_schema = st.table(table).schema
    covered = lo
    for frag in st.table(table).view().live_fragments:  # in row-id order
        if frag.writer != writer or frag.first_id + frag.rows <= covered or frag.first_id >= hi:
            continue
        if frag.first_id > covered:
            break  # a gap: those records were evicted and reclaimed
        start, stop = covered - frag.first_id, min(hi, frag.first_id + frag.rows) - frag.first_id
        for batch in scan_fragment(st.storage, table_schema, frag, schema, batch_rows, start, stop):
            yield pa.Table.from_batches([batch], schema=schema)
        covered = frag.first_id + stop
    if covered < hi:
        raise StaleReadError(f"{url}: row ids {covered}..{hi - 1} of the snapshot were evicted and their storage "
                             "reclaimed since read_replaystore was called; call it again for a fresh snapshot")


class ReplayStoreDatasource(Datasource):
    """A ``ray.data.Datasource`` over one table of a store, as of construction (see the module doc).

    Supports Ray's projection pushdown: ``ds.select_columns([...])`` after the read
    narrows what the read tasks read.

    Parameters
    ----------
    url : str
        The store, as for :func:`replaystore.store.open_store`; every Ray worker that runs a
        read task must reach it.
    columns : sequence of str, optional
        Columns in that order (default: all, as ``Table.scan_schema``).
    table : str, optional
        The table; needed for stores with several tables.
    storage_options : mapping, optional
        Passed to the storage backend (here and in every read task).
    batch_rows : int, optional
        Rows per block a read task yields at most (default ``replaystore.store.SCAN_ROWS``).

    Raises
    ------
    ValueError
        ``batch_rows`` is not a positive int.
    StoreError
        The store cannot be opened read-only, the table does not exist, or a column is
        unknown (named in the message).

    Notes
    -----
    Cost: one read of the commit log at construction; the driver never reads the data.
    """

    def __init__(self, url: str, columns: Sequence[str] | None = None, *, table: str | None = None,
                 storage_options: Mapping[str, Any] | None = None, batch_rows: int = SCAN_ROWS) -> None:
        super().__init__()
        self._projection_map: dict[str, str] | None = None
        if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows <= 0:
            raise ValueError(f"batch_rows: expected a positive int, got {batch_rows!r}")
        st = open_store(url, mode="r", storage_options=storage_options)
        t = st.default if table is None else st.table(table)
        view = t.view()
        self.url = st.url
        self.table = t.name
        self.storage_options = dict(storage_options or {})
        self.batch_rows = batch_rows
        self.created_ns = int(st.manifest["created_ns"])
        self.table_schema = t.schema
        self.schema = view.scan_schema(columns)
        # the snapshot: (writer, descriptor, first visible row) of each live fragment, in row-id order
        self.fragments = [(f.writer, f.descriptor(), f.visible_from) for f in view.fragments]
        self.num_rows = len(view)

    # -- projection pushdown ------------------------------------------------------------------
    def supports_projection_pushdown(self) -> bool:
        """Whether Ray may push a column projection into the read (it may).

        Returns
        -------
        bool
            Always True.
        """
        return True

    def read_schema(self) -> pa.Schema:
        """The columns the read tasks produce: the requested ones, narrowed by any pushed-down projection.

        Returns
        -------
        pyarrow.Schema
            The schema of every block. Cost: O(columns).
        """
        if self._projection_map is None:
            return self.schema
        wanted = [n for n in self._projection_map if self.schema.get_field_index(n) >= 0]
        return scan_projection(self.schema, wanted, self.table)

    # -- Datasource -----------------------------------------------------------------------------
    def get_name(self) -> str:
        """The name Ray shows for this source's read operator.

        Returns
        -------
        str
            ``"ReplayStore"``.
        """
        return "ReplayStore"

    def _bytes(self, schema: pa.Schema, descriptor: dict[str, Any], writer: int, vis_from: int) -> int:
        frag = FragmentInfo.from_descriptor(writer, self.table, descriptor)
        visible = frag.rows - vis_from
        return sum(_column_bytes(self.table_schema, n, frag, visible) for n in schema.names)

    def estimate_inmemory_data_size(self) -> int:
        """The size of the projected columns of the snapshot's visible records, in memory.

        Returns
        -------
        int
            Bytes, estimated from the fragments' descriptors (no read). Cost: O(fragments).
        """
        schema = self.read_schema()
        return sum(self._bytes(schema, d, w, v) for w, d, v in self.fragments)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        """The read tasks: the snapshot's fragments split into at most ``parallelism`` runs.

        Parameters
        ----------
        parallelism : int
            Tasks Ray asks for; 0 or less for one task per fragment.
        per_task_row_limit : int, optional
            Rows each task yields at most, as Ray sets it.
        data_context : object, optional
            Ray's data context (unused).

        Returns
        -------
        list of ray.data.datasource.ReadTask
            One task per run of consecutive fragments (one task yielding no rows for an empty
            table). Each opens the store read-only in its worker and raises StaleReadError if
            its records were evicted and reclaimed since the snapshot. Cost: O(fragments).
        """
        schema = self.read_schema()
        if not self.fragments:  # an empty table: one task yielding no rows, so the schema is known
            return [ReadTask(lambda: [schema.empty_table()],
                             BlockMetadata(num_rows=0, size_bytes=0, exec_stats=None, input_files=None),
                             schema=schema, per_task_row_limit=per_task_row_limit)]
        groups = len(self.fragments) if parallelism <= 0 else min(parallelism, len(self.fragments))
        tasks = []
        for idx in np.array_split(np.arange(len(self.fragments)), groups):
            parts = [self.fragments[int(i)] for i in idx]
            rows = sum(d["rows"] - v for _, d, v in parts)
            size = sum(self._bytes(schema, d, w, v) for w, d, v in parts)
            read = partial(_read_fragments, self.url, self.storage_options, self.created_ns, self.table, parts,
                           schema, self.batch_rows)
            tasks.append(ReadTask(read, BlockMetadata(num_rows=rows, size_bytes=size, exec_stats=None,
                                                      input_files=None),
                                  schema=schema, per_task_row_limit=per_task_row_limit))
        return tasks


def read_replaystore(url: str, columns: Sequence[str] | None = None, *, table: str | None = None,
                     storage_options: Mapping[str, Any] | None = None, batch_rows: int = SCAN_ROWS,
                     **read_args: Any) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of a table's visible records (a snapshot as of this call).

    A read task whose fragment was compacted away since the snapshot (its objects are
    deleted 30 s after the compaction) reads the same records from the merged fragment.
    One whose records were evicted and reclaimed since (a store with a capacity) fails
    with ``StaleReadError``: call ``read_replaystore`` again for a fresh snapshot.

    Parameters
    ----------
    url : str
        The store, as for :func:`replaystore.store.open_store`. Every Ray worker that runs a
        read task must reach the same URL: object storage, or a filesystem all nodes share.
    columns : sequence of str, optional
        Columns in that order (default: all, see the module doc).
    table : str, optional
        The table; needed for stores with several tables.
    storage_options : mapping, optional
        As for :func:`replaystore.store.open_store`.
    batch_rows : int, optional
        Rows per block a task yields at most.
    **read_args
        Passed to ``ray.data.read_datasource`` (``override_num_blocks``, ``concurrency``,
        ``ray_remote_args``, ...).

    Returns
    -------
    ray.data.Dataset
        Lazy: the data is read when the dataset is consumed. Cost here: one read of the
        commit log; the driver never holds the data.

    Raises
    ------
    ValueError
        ``batch_rows`` is not a positive int.
    StoreError
        The store cannot be opened, or an unknown table or column.
    """
    source = ReplayStoreDatasource(url, columns, table=table, storage_options=storage_options,
                                   batch_rows=batch_rows)
    return ray.data.read_datasource(source, **read_args)
