"""Schema and columns <-> Arrow.

Mapping (documented in docs/SCHEMAS.md):

* dense scalar field -> the primitive Arrow type of its dtype;
* dense field with trailing shape ``(a, b, ...)`` -> nested ``fixed_size_list``
  (outermost size ``a``), which DuckDB reads as ``ARRAY`` and Parquet stores natively;
* ragged field -> ``large_list<T>`` built from the int64 offsets and the values
  buffers without copying (aligned ragged fields share one offsets buffer);
* batch metadata -> not a column; kept in the schema-level metadata.

Each Arrow field carries its replaystore field description under the metadata key
``replaystore.field`` and the schema carries the whole replaystore schema under
``replaystore.schema``, so a round trip through Arrow or Parquet is exact.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from replaystore.errors import OffsetsError, SchemaError
from replaystore.schemas.columns import Columns
from replaystore.schemas.fields import OFFSETS_DTYPE, BatchMeta, Dense, Field, Ragged

if TYPE_CHECKING:
    from replaystore.schemas.schema import Schema

SCHEMA_KEY = b"replaystore.schema"
FIELD_KEY = b"replaystore.field"
META_KEY = b"replaystore.meta"


def _dense_type(f: Dense) -> pa.DataType:
    t = pa.from_numpy_dtype(f.dtype)
    for size in reversed(f.shape):
        t = pa.list_(t, size)
    return t


def arrow_type(f: Dense | Ragged) -> pa.DataType:
    """The Arrow type of one dense or ragged field.

    Parameters
    ----------
    f : Dense or Ragged
        The field.

    Returns
    -------
    pyarrow.DataType
        The primitive type of the dtype, nested ``fixed_size_list`` for a trailing
        shape, ``large_list`` for a ragged field.
    """
    if isinstance(f, Dense):
        return _dense_type(f)
    return pa.large_list(pa.from_numpy_dtype(f.dtype))


def schema_to_arrow(schema: Schema) -> pa.Schema:
    """The Arrow schema of ``schema``'s record fields, carrying the schema document.

    Each field's replaystore description goes under the field metadata key
    ``replaystore.field`` and the whole schema under ``replaystore.schema``;
    batch-metadata fields are not columns.

    Parameters
    ----------
    schema : Schema
        The replaystore schema.

    Returns
    -------
    pyarrow.Schema
        Non-nullable fields in schema order.
    """
    doc = schema.to_dict()
    fields = []
    for f, fd in zip(schema.fields, doc["fields"], strict=True):
        if isinstance(f, BatchMeta):
            continue
        fields.append(pa.field(f.name, arrow_type(f), nullable=False,
                               metadata={FIELD_KEY: json.dumps(fd).encode()}))
    return pa.schema(fields, metadata={SCHEMA_KEY: json.dumps(doc).encode()})


def _field_from_arrow(af: pa.Field) -> Field:
    t = af.type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if shape:
            raise SchemaError(f"field {af.name!r}: a list nested in a fixed-size list is not supported")
        return Ragged(af.name, t.value_type.to_pandas_dtype(), offsets=f"{af.name}_offsets")
    try:
        dtype = np.dtype(t.to_pandas_dtype())
    except (NotImplementedError, TypeError) as exc:
        raise SchemaError(f"field {af.name!r}: Arrow type {af.type} has no replaystore equivalent") from exc
    return Dense(af.name, dtype, tuple(shape))


def schema_from_arrow(arrow_schema: pa.Schema, name: str | None = None) -> Schema:
    """The exact replaystore schema if ``arrow_schema`` carries one, else one inferred from types.

    Parameters
    ----------
    arrow_schema : pyarrow.Schema
        The Arrow schema.
    name : str, optional
        Name of an inferred schema (default ``"imported"``).

    Returns
    -------
    Schema
        The replaystore schema.

    Raises
    ------
    SchemaError
        The embedded schema document is malformed or names columns the Arrow
        schema lacks, or a column type has no replaystore equivalent (e.g. a list
        nested in a fixed-size list).
    """
    from replaystore.schemas.schema import Schema

    meta = arrow_schema.metadata or {}
    if SCHEMA_KEY in meta:
        schema = Schema.from_json(meta[SCHEMA_KEY])
        missing = [f.name for f in schema.fields if not isinstance(f, BatchMeta)
                   and arrow_schema.get_field_index(f.name) < 0]
        if missing:
            raise SchemaError(f"Arrow schema lacks columns {missing} of replaystore schema {schema.name!r}")
        return schema
    return Schema(name or "imported", [_field_from_arrow(af) for af in arrow_schema])


def _numpy_to_arrow(arr: np.ndarray) -> pa.Array:
    """A primitive Arrow array over ``arr``'s buffer (zero-copy except for bool, which Arrow bit-packs)."""
    flat = arr.reshape(-1)
    if flat.dtype == np.bool_:
        return pa.array(flat, type=pa.bool_())
    return pa.Array.from_buffers(pa.from_numpy_dtype(flat.dtype), len(flat), [None, pa.py_buffer(flat)])


def dense_to_arrow(f: Dense, arr: np.ndarray) -> pa.Array:
    """A (nested fixed-size list) Arrow array over a dense field's records, zero-copy except bool.

    Parameters
    ----------
    f : Dense
        The field.
    arr : numpy.ndarray
        Its contiguous ``(records, *shape)`` array.

    Returns
    -------
    pyarrow.Array
        The Arrow array (bool is bit-packed, hence copied).
    """
    out = _numpy_to_arrow(arr)
    for size in reversed(f.shape):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out


def ragged_to_arrow(values: np.ndarray, offsets: np.ndarray) -> pa.LargeListArray:
    """A ``large_list`` array over CSR ``values`` and ``offsets`` (int64), without copying.

    Parameters
    ----------
    values : numpy.ndarray
        Contiguous flat values.
    offsets : numpy.ndarray
        int64 CSR offsets.

    Returns
    -------
    pyarrow.LargeListArray
        One list per record.
    """
    return pa.LargeListArray.from_arrays(_numpy_to_arrow(offsets), _numpy_to_arrow(values))


def columns_to_arrow(cols: Columns) -> pa.RecordBatch:
    """An Arrow RecordBatch over ``cols``' buffers (zero-copy except bool).

    Batch metadata goes into the schema metadata under ``replaystore.meta``.

    Parameters
    ----------
    cols : Columns
        Validated columns.

    Returns
    -------
    pyarrow.RecordBatch
        One column per record field, with :func:`schema_to_arrow`'s schema.
    """
    schema = cols.schema
    arrays: list[pa.Array] = []
    for f in schema.fields:
        if isinstance(f, Dense):
            arrays.append(dense_to_arrow(f, cols.arrays[f.name]))
        elif isinstance(f, Ragged):
            arrays.append(ragged_to_arrow(cols.arrays[f.name], cols.arrays[f.offsets]))
    arrow_schema = schema_to_arrow(schema)
    if cols.meta:
        arrow_schema = arrow_schema.with_metadata({**arrow_schema.metadata, META_KEY: json.dumps(cols.meta).encode()})
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _primitive_to_numpy(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        bools: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return bools
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _flatten_fixed(arr: pa.Array, depth: int) -> pa.Array:
    for _ in range(depth):
        arr = arr.flatten()
    return arr


def columns_from_arrow(schema: Schema, batch: pa.RecordBatch | pa.Table) -> Columns:
    """Columns from an Arrow batch of ``schema`` (zero-copy where Arrow allows).

    Parameters
    ----------
    schema : Schema
        The schema the batch follows.
    batch : pyarrow.RecordBatch or pyarrow.Table
        The Arrow data (a Table is combined into one batch first, which copies).

    Returns
    -------
    Columns
        The arrays, checked by :meth:`Schema.validate`.

    Raises
    ------
    SchemaError
        A column holds nulls.
    OffsetsError
        Ragged fields sharing one offsets name have different list offsets.
    ValidationError
        The arrays do not conform to ``schema`` (a subclass names the field).
    KeyError
        The batch lacks a column of ``schema``.
    """
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist(
            [], schema=batch.schema)
    arrays: dict[str, Any] = {}
    for f in schema.fields:
        if isinstance(f, BatchMeta):
            continue
        col = batch.column(f.name)
        if col.null_count:
            raise SchemaError(f"column {f.name!r}: nulls are not allowed")
        if isinstance(f, Dense):
            flat = _primitive_to_numpy(_flatten_fixed(col, len(f.shape)), f.dtype)
            arrays[f.name] = flat.reshape((len(col), *f.shape))
        else:
            offsets = _primitive_to_numpy(col.offsets, OFFSETS_DTYPE) if pa.types.is_large_list(col.type) \
                else col.offsets.to_numpy().astype(OFFSETS_DTYPE)
            values = _primitive_to_numpy(col.values, f.dtype)
            base = offsets[0]
            if base:
                offsets = offsets - base
            arrays[f.name] = values[base:base + offsets[-1]]
            shared = arrays.setdefault(f.offsets, offsets)
            if shared is not offsets and not np.array_equal(shared, offsets):
                raise OffsetsError(f.name, f"the same list offsets as the other fields sharing {f.offsets!r}",
                                   "different offsets")
    meta_doc = (batch.schema.metadata or {}).get(META_KEY)
    meta = json.loads(meta_doc) if meta_doc else {}
    return schema.validate({**arrays, **meta})
