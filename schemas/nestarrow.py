"""Nested fields in Arrow: a nested field's leaf columns as one ``struct`` column, and back.

A Dict node becomes a struct whose children are named by its keys; a Tuple node a struct whose
children are named ``0``, ``1``, ... (what SQL and Parquet see; see docs/FORMAT.md, "Nested fields").
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from replaystore.schemas.nesting import SEP, Nesting


def _struct_type(nesting: Nesting, prefix: str, flat: pa.Schema) -> pa.DataType:
    children = []
    for k in nesting.children[prefix]:
        t = _struct_type(nesting, k, flat) if k in nesting.nodes else flat.field(k).type
        children.append(pa.field(k.rpartition(SEP)[2], t, nullable=False))
    return pa.struct(children)


def struct_schema(flat: pa.Schema, nesting: Nesting) -> pa.Schema:
    """``flat`` with each nested field's leaf columns replaced by one struct column at its first leaf.

    A nested field with a leaf missing from ``flat`` keeps its leaves flat.

    Parameters
    ----------
    flat : pyarrow.Schema
        Columns by flat name (``obs__image``).
    nesting : Nesting
        The schema's nesting.

    Returns
    -------
    pyarrow.Schema
        The same metadata; cost O(columns).
    """
    fields: list[pa.Field] = []
    done: set[str] = set()
    names = set(flat.names)
    for f in flat:
        r = nesting.root_of.get(f.name)
        if r is None or not all(leaf in names for leaf in nesting.leaves[r]):
            fields.append(f)
        elif r not in done:
            done.add(r)
            fields.append(pa.field(r, _struct_type(nesting, r, flat), nullable=False))
    return pa.schema(fields, metadata=flat.metadata)


def _struct_array(nesting: Nesting, prefix: str, columns: dict[str, Any]) -> pa.StructArray:
    arrays, names = [], []
    for k in nesting.children[prefix]:
        arrays.append(_struct_array(nesting, k, columns) if k in nesting.nodes else columns[k])
        names.append(k.rpartition(SEP)[2])
    return pa.StructArray.from_arrays(arrays, names=names)


def struct_batch(batch: pa.RecordBatch, schema: pa.Schema, nesting: Nesting) -> pa.RecordBatch:
    """``batch`` (flat leaf columns) as a batch of ``schema`` (from :func:`struct_schema`).

    Cost: no copy of values; one struct array per nested field.

    Parameters
    ----------
    batch : pyarrow.RecordBatch
        Flat columns including every leaf of the nested fields in ``schema``.
    schema : pyarrow.Schema
        The target schema.
    nesting : Nesting
        The schema's nesting.

    Returns
    -------
    pyarrow.RecordBatch
    """
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    out = [_struct_array(nesting, f.name, columns) if f.name in nesting.nodes else columns[f.name] for f in schema]
    return pa.RecordBatch.from_arrays(out, schema=schema)


def flat_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every struct column spread into leaf columns named ``parent__child``.

    Parameters
    ----------
    batch : pyarrow.RecordBatch
        Columns, some of them structs (any depth).

    Returns
    -------
    pyarrow.RecordBatch
        Only non-struct columns; cost: no copy of values.
    """
    names: list[str] = []
    arrays: list[Any] = []

    def walk(name: str, arr: Any) -> None:
        if pa.types.is_struct(arr.type):
            for i in range(arr.type.num_fields):
                walk(f"{name}{SEP}{arr.type.field(i).name}", arr.field(i))
        else:
            names.append(name)
            arrays.append(arr)

    for name, arr in zip(batch.schema.names, batch.columns, strict=True):
        walk(name, arr)
    return pa.RecordBatch.from_arrays(arrays, names=names)
