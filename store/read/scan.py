"""Streaming a table's visible records as Arrow record batches, reading only the columns asked for."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from replaystore.errors import StoreError
from replaystore.schemas import Schema
from replaystore.schemas.arrow import arrow_type, dense_to_arrow, ragged_to_arrow
from replaystore.schemas.fields import BatchMeta, Dense, Ragged
from replaystore.store.format.fragment import FragmentData
from replaystore.store.read.table import TableReader
from replaystore.store.read.view import FragmentInfo, TableView
from replaystore.store.storage import Storage

SCAN_ROWS = 65536
"""Records per scanned batch by default (memory stays bounded by this, whatever the table's size)."""


def _view_of(source: TableView | TableReader) -> TableView:
    if isinstance(source, TableReader):
        source.sync()
        return source.view
    return source


def _stream_type(view: TableView) -> pa.DataType:
    keys = {k for f in view._frags for k in f.streams}
    return pa.int64() if all(isinstance(k, int) for k in keys) else pa.string()


def scan_schema(source: TableView | TableReader) -> pa.Schema:
    """The scanned columns of a table's view.

    ``row``, ``stream``, ``step``, ``reset``, the schema's fields, then ``writer``, ``commit``
    (its seq) and ``commit_time``.

    Parameters
    ----------
    source : TableView
        The view (a ``TableReader``: its current view).

    Returns
    -------
    pyarrow.Schema
        ``stream`` is int64 where every key of the view is an int, else string. Cost: O(fragments).
    """
    view = _view_of(source)
    fields = [pa.field("row", pa.int64(), nullable=False), pa.field("stream", _stream_type(view), nullable=False),
              pa.field("step", pa.int64(), nullable=False), pa.field("reset", pa.bool_(), nullable=False)]
    for f in view.schema.fields:
        if not isinstance(f, BatchMeta):
            fields.append(pa.field(f.name, arrow_type(f), nullable=False))
    fields += [pa.field("writer", pa.int32(), nullable=False), pa.field("commit", pa.int64(), nullable=False),
               pa.field("commit_time", pa.timestamp("ns", tz="UTC"), nullable=False)]
    arrow_schema = view.schema.to_arrow()
    return pa.schema(fields, metadata=arrow_schema.metadata)


def scan_projection(full: pa.Schema, columns: Sequence[str] | None, table: str = "records") -> pa.Schema:
    """``full`` (a :func:`scan_schema`) narrowed to ``columns``, in that order.

    Parameters
    ----------
    full : pyarrow.Schema
        The schema to narrow.
    columns : sequence of str, optional
        The columns to keep (None: all).
    table : str
        The table's name, for the error.

    Returns
    -------
    pyarrow.Schema
        Cost: O(columns).

    Raises
    ------
    StoreError
        Naming the columns ``full`` does not have.
    """
    names = list(full.names) if columns is None else ([columns] if isinstance(columns, str) else list(columns))
    unknown = [c for c in names if full.get_field_index(c) < 0]
    if unknown:
        raise StoreError(f"table {table!r} has no column(s) {unknown}; columns: {full.names}")
    return pa.schema([full.field(c) for c in names], metadata=full.metadata)


def _batch_rows(batch_rows: int | None) -> int:
    if batch_rows is None:
        return SCAN_ROWS
    if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows <= 0:
        raise StoreError(f"batch_rows: expected a positive int, got {batch_rows!r}")
    return batch_rows


def scan(source: TableView | TableReader, columns: Sequence[str] | None = None, batch_rows: int | None = None,
         ) -> Iterator[pa.RecordBatch]:
    """Visible records of a view in row-id order, ``batch_rows`` at a time, with only ``columns``.

    This is ``TableView.scan`` and ``Table.scan``.

    Only the arrays behind the requested columns are read: selecting two fields of
    a wide table reads two fields' objects. Unknown columns and a bad ``batch_rows``
    raise StoreError at the call; records reclaimed since the view was taken raise
    StaleReadError while iterating.
    """
    view = _view_of(source)
    rows = _batch_rows(batch_rows)
    schema = scan_projection(scan_schema(view), columns, view.name)
    return _scan_view(view, schema, rows)


def _scan_view(view: TableView, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    data_of = view._reader._data_of(view)
    for frag, vis in zip(view._frags, view.visible_from.tolist(), strict=True):
        yield from scan_data(data_of(frag), vis, schema, batch_rows)


def scan_fragment(storage: Storage, table_schema: Schema, fragment: FragmentInfo, schema: pa.Schema,
                  batch_rows: int | None = None, start: int | None = None,
                  stop: int | None = None) -> Iterator[pa.RecordBatch]:
    """One fragment's records as Arrow batches, read from its own objects (no commit log).

    For a process that has only a fragment's description, such as a Ray read task
    (``FragmentInfo.from_descriptor``).

    Parameters
    ----------
    storage : Storage
        The store's storage (``replaystore.store.storage.open_storage``).
    table_schema : Schema
        The fragment's table's schema.
    fragment : FragmentInfo
        The fragment.
    schema : pyarrow.Schema
        The columns to produce: the table's :func:`scan_schema` or a :func:`scan_projection` of it.
    batch_rows : int, optional
        Records per batch at most (default :data:`SCAN_ROWS`).
    start, stop : int, optional
        Local rows ``[start, stop)`` (default: from ``fragment.visible_from`` to its end).

    Returns
    -------
    iterator of pyarrow.RecordBatch
        Cost: the named columns' objects of the fragment.

    Raises
    ------
    StoreError
        A bad ``batch_rows`` (at the call).
    StaleReadError
        While iterating: the fragment's objects are gone (compacted or reclaimed).
    """
    rows = _batch_rows(batch_rows)
    first = fragment.visible_from if start is None else int(start)
    return scan_data(FragmentData(storage, table_schema, fragment._fragment), first, schema, rows, stop)


def scan_data(data: FragmentData, vis_from: int, schema: pa.Schema, batch_rows: int = SCAN_ROWS,
              stop: int | None = None) -> Iterator[pa.RecordBatch]:
    """One fragment's records ``[vis_from, stop)`` as batches with exactly the columns of ``schema``.

    ``stop`` is the fragment's end by default.

    ``schema`` is :func:`scan_schema` of the table (or a :func:`scan_projection` of it), so
    that every fragment of a table yields the same column types (e.g. ``stream`` is string
    if any fragment of the table has a string key). ``vis_from`` is the fragment's first
    visible local row (``TableView.visible_from``; 0 without capacity). Needs only the
    fragment's own objects: a process that knows the fragment's descriptor can read it
    without reading the commit log (Ray Data read tasks do).
    """
    names = schema.names
    string_streams = "stream" in names and pa.types.is_string(schema.field("stream").type)
    frag = data.frag
    end = frag.rows if stop is None else min(int(stop), frag.rows)
    for lo in range(int(vis_from), end, batch_rows):
        hi = min(lo + batch_rows, end)
        yield pa.RecordBatch.from_arrays([_column(data, c, lo, hi, string_streams) for c in names], schema=schema)


def _commit_columns(frag, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    seqs = np.repeat([p[0] for p in frag.parts], [p[2] for p in frag.parts])[lo:hi]
    times = np.repeat([p[1] for p in frag.parts], [p[2] for p in frag.parts])[lo:hi]
    return seqs.astype(np.int64), times.astype(np.int64)


def _column(data: FragmentData, name: str, lo: int, hi: int, string_streams: bool) -> pa.Array:
    frag, schema = data.frag, data.schema
    if name == "row":
        return pa.array(np.arange(frag.first_id + lo, frag.first_id + hi, dtype=np.int64))
    if name == "stream":
        keys = np.array([str(k) if string_streams else k for k in frag.streams] + [None], dtype=object)[:-1]
        codes = np.asarray(data.array("_stream")[lo:hi])
        return pa.array(keys[codes].tolist(), type=pa.string() if string_streams else pa.int64())
    if name == "step":
        return pa.array(np.asarray(data.array("_step")[lo:hi]))
    if name == "reset":
        return pa.array(np.asarray(data.array("_reset")[lo:hi]))
    if name == "writer":
        return pa.array(np.full(hi - lo, frag.writer, dtype=np.int32))
    if name in ("commit", "commit_time"):
        seqs, times = _commit_columns(frag, lo, hi)
        return pa.array(seqs) if name == "commit" else pa.array(times, type=pa.timestamp("ns", tz="UTC"))
    f = schema.field(name)
    if isinstance(f, Dense):
        return dense_to_arrow(f, np.asarray(data.array(name)[lo:hi]))
    assert isinstance(f, Ragged), name  # metadata fields are not scanned columns
    offsets = np.asarray(data.array(f.offsets)[lo:hi + 1])
    start, stop = int(offsets[0]), int(offsets[-1])
    return ragged_to_arrow(np.asarray(data.array(name)[start:stop]), offsets - start)
