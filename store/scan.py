"""Streaming a table's visible records as Arrow record batches, reading only the columns asked for."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from replaystore.errors import StoreError
from replaystore.schemas.arrow import arrow_type, dense_to_arrow, ragged_to_arrow
from replaystore.schemas.fields import BatchMeta, Dense, Ragged
from replaystore.store.fragment import FragmentData
from replaystore.store.table import TableReader

SCAN_ROWS = 65536
"""Records per scanned batch (memory stays bounded by this, whatever the table's size)."""


def _stream_type(reader: TableReader) -> pa.DataType:
    keys = {k for f in reader.fragments for k in f.streams}
    return pa.int64() if all(isinstance(k, int) for k in keys) else pa.string()


def scan_schema(reader: TableReader) -> pa.Schema:
    """The scanned columns.

    ``row``, ``stream``, ``step``, ``reset``, the schema's fields, then ``writer``, ``commit`` (its seq) and
    ``commit_time``.
    """
    fields = [pa.field("row", pa.int64(), nullable=False), pa.field("stream", _stream_type(reader), nullable=False),
              pa.field("step", pa.int64(), nullable=False), pa.field("reset", pa.bool_(), nullable=False)]
    for f in reader.schema.fields:
        if not isinstance(f, BatchMeta):
            fields.append(pa.field(f.name, arrow_type(f), nullable=False))
    fields += [pa.field("writer", pa.int32(), nullable=False), pa.field("commit", pa.int64(), nullable=False),
               pa.field("commit_time", pa.timestamp("ns", tz="UTC"), nullable=False)]
    arrow_schema = reader.schema.to_arrow()
    return pa.schema(fields, metadata=arrow_schema.metadata)


def scan_projection(full: pa.Schema, columns: Sequence[str] | None, table: str = "records") -> pa.Schema:
    """``full`` (a :func:`scan_schema`) narrowed to ``columns`` in that order; StoreError naming unknown ones."""
    names = list(full.names) if columns is None else list(columns)
    unknown = [c for c in names if full.get_field_index(c) < 0]
    if unknown:
        raise StoreError(f"table {table!r} has no column(s) {unknown}; columns: {full.names}")
    return pa.schema([full.field(c) for c in names], metadata=full.metadata)


def scan(reader: TableReader, columns: Sequence[str] | None = None, batch_rows: int = SCAN_ROWS,
         ) -> Iterator[pa.RecordBatch]:
    """Visible records in row-id order, ``batch_rows`` at a time, with only ``columns``.

    Only the arrays behind the requested columns are read: selecting two fields of
    a wide table reads two fields' objects.
    """
    reader.sync()
    schema = scan_projection(scan_schema(reader), columns, reader.name)
    for frag, vis in zip(reader.fragments, reader.vis_from, strict=True):
        yield from scan_fragment(reader.data(frag), int(vis), schema, batch_rows)


def scan_fragment(data: FragmentData, vis_from: int, schema: pa.Schema, batch_rows: int = SCAN_ROWS,
                  stop: int | None = None) -> Iterator[pa.RecordBatch]:
    """One fragment's records ``[vis_from, stop)`` as batches with exactly the columns of ``schema``.

    ``stop`` is the fragment's end by default.

    ``schema`` is :func:`scan_schema` of the table (or a :func:`scan_projection` of it), so
    that every fragment of a table yields the same column types (e.g. ``stream`` is string
    if any fragment of the table has a string key). ``vis_from`` is the fragment's first
    visible local row (``TableReader.vis_from``; 0 without capacity). Needs only the
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
