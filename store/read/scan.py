"""Streaming a table's visible records as Arrow record batches, reading only the columns asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from replaystore.errors import StoreError, UnknownColumnError
from replaystore.schemas import Schema
from replaystore.schemas.arrow import arrow_type, dense_to_arrow, ragged_to_arrow
from replaystore.schemas.fields import BatchMeta, Dense, Ragged
from replaystore.store.format.fragment import Fragment, FragmentData
from replaystore.store.read.fraginfo import FragmentInfo
from replaystore.store.storage import Storage

SCAN_ROWS = 65536
"""Records per scanned batch by default (memory stays bounded by this, whatever the table's size)."""


def _stream_type(frags: Sequence[Fragment]) -> pa.DataType:
    keys = {k for f in frags for k in f.streams}
    return pa.int64() if all(isinstance(k, int) for k in keys) else pa.string()


def scan_schema(schema: Schema, frags: Sequence[Fragment]) -> pa.Schema:
    """The scanned columns of a table of ``schema`` whose visible fragments are ``frags``.

    ``row``, ``stream``, ``step``, ``reset``, the schema's fields, then ``writer``, ``commit``
    (its seq) and ``commit_time``.

    Parameters
    ----------
    schema : Schema
        The table's schema.
    frags : sequence of Fragment
        The visible fragments (a view's).

    Returns
    -------
    pyarrow.Schema
        ``stream`` is int64 where every key of ``frags`` is an int, else string. Cost: O(fragments).
    """
    fields = [pa.field("row", pa.int64(), nullable=False), pa.field("stream", _stream_type(frags), nullable=False),
              pa.field("step", pa.int64(), nullable=False), pa.field("reset", pa.bool_(), nullable=False)]
    for f in schema.fields:
        if not isinstance(f, BatchMeta):
            fields.append(pa.field(f.name, arrow_type(f), nullable=False))
    fields += [pa.field("writer", pa.int32(), nullable=False), pa.field("commit", pa.int64(), nullable=False),
               pa.field("commit_time", pa.timestamp("ns", tz="UTC"), nullable=False)]
    arrow_schema = schema.to_arrow()
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
    UnknownColumnError
        Naming the first column ``full`` does not have.
    """
    names = list(full.names) if columns is None else ([columns] if isinstance(columns, str) else list(columns))
    unknown = [c for c in names if full.get_field_index(c) < 0]
    if unknown:
        raise UnknownColumnError(table, unknown, full.names)
    return pa.schema([full.field(c) for c in names], metadata=full.metadata)


def check_batch_rows(batch_rows: int | None) -> int:
    """``batch_rows`` as the records per scanned batch (None: :data:`SCAN_ROWS`).

    Parameters
    ----------
    batch_rows : int or None
        Records per batch at most.

    Returns
    -------
    int
        A positive int.

    Raises
    ------
    StoreError
        ``batch_rows`` is not a positive int.
    """
    if batch_rows is None:
        return SCAN_ROWS
    if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows <= 0:
        raise StoreError(f"batch_rows: expected a positive int, got {batch_rows!r}")
    return batch_rows


def scan_fragments(data_of: Callable[[Fragment], FragmentData], frags: Sequence[Fragment], vis_from: Sequence[int],
                   schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The visible records of ``frags`` in order, ``batch_rows`` at a time, with the columns of ``schema``.

    Parameters
    ----------
    data_of : callable
        Opens a fragment's data (``TableReader._data_of`` of the view).
    frags : sequence of Fragment
        The fragments, in row-id order.
    vis_from : sequence of int
        Each one's first visible local row.
    schema : pyarrow.Schema
        A :func:`scan_schema` of the table or a :func:`scan_projection` of it.
    batch_rows : int
        Records per batch at most.

    Yields
    ------
    pyarrow.RecordBatch
        Read lazily, a fragment at a time.
    """
    for frag, vis in zip(frags, vis_from, strict=True):
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
    rows = check_batch_rows(batch_rows)
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
