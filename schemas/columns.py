"""Validated columns: what a batch becomes after :meth:`Schema.validate`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from replaystore.schemas.schema import Schema


@dataclass(frozen=True)
class Columns:
    """The arrays of ``num_records`` records of one schema, checked and contiguous.

    What a batch becomes after :meth:`Schema.validate`; build one through it
    rather than directly (the constructor checks nothing).

    Parameters
    ----------
    schema : Schema
        The schema the arrays conform to.
    num_records : int
        Number of records.
    arrays : mapping of str to numpy.ndarray
        Each dense field's ``(records, *shape)`` array, each ragged field's values
        array and each offsets name's int64 offsets (``records + 1``, starting at 0).
    meta : mapping of str to Any, optional
        Batch-metadata fields mapped to their JSON documents.
    """

    schema: Schema
    num_records: int
    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        """The number of records."""
        return self.num_records

    def __getitem__(self, name: str) -> np.ndarray:
        """The array called ``name`` (a field or an offsets array)."""
        return self.arrays[name]

    def ragged(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)`` of a ragged field.

        Parameters
        ----------
        name : str
            A ragged field's name.

        Returns
        -------
        values : numpy.ndarray
            The flat values.
        offsets : numpy.ndarray
            The int64 CSR offsets (``records + 1``).

        Raises
        ------
        SchemaError
            The schema has no field ``name``.
        """
        f = self.schema.field(name)
        return self.arrays[name], self.arrays[f.offsets]  # type: ignore[union-attr]

    def take(self, rows: np.ndarray) -> Columns:
        """The records at ``rows`` (in that order), ragged slices gathered and rebased.

        Cost: one fancy-index per array, linear in the records taken and their values.

        Parameters
        ----------
        rows : numpy.ndarray
            1-D integer record indices; negative ones count from the end, as in numpy.

        Returns
        -------
        Columns
            A new Columns of ``len(rows)`` records (metadata copied).

        Raises
        ------
        TypeError
            ``rows`` is not a 1-D integer array.
        IndexError
            An index lies outside ``[-num_records, num_records)``.
        """
        from replaystore.schemas.csr import gather_csr

        rows = np.asarray(rows)
        if rows.size == 0:
            rows = np.zeros(0, dtype=np.int64)
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise TypeError(f"rows: expected a 1-D array of integer record indices, got {rows.dtype} "
                            f"of shape {rows.shape}")
        rows = rows.astype(np.int64, copy=False)
        n = self.num_records
        if rows.size and (rows.min() < -n or rows.max() >= n):
            raise IndexError(f"rows: record indices must lie in [-{n}, {n})")
        # gather_csr reads offsets[rows] and offsets[rows + 1]: a negative row would pair
        # the dense record rows[i] with the ragged slice of a different record
        rows = np.where(rows < 0, rows + n, rows)
        arrays: dict[str, np.ndarray] = {}
        for f in self.schema.dense_fields:
            arrays[f.name] = self.arrays[f.name][rows]
        for off_name, names in self.schema.offsets_groups.items():
            offsets = self.arrays[off_name]
            new_offsets, value_index = gather_csr(offsets, rows)
            arrays[off_name] = new_offsets
            for name in names:
                arrays[name] = self.arrays[name][value_index]
        return Columns(self.schema, len(rows), arrays, dict(self.meta))

    def to_arrow(self) -> pa.RecordBatch:
        """An Arrow RecordBatch sharing these buffers (ragged values are not copied).

        Returns
        -------
        pyarrow.RecordBatch
            One column per record field, ragged fields as list arrays.
        """
        from replaystore.schemas.arrow import columns_to_arrow

        return columns_to_arrow(self)

    @classmethod
    def from_arrow(cls, schema: Schema, batch: pa.RecordBatch | pa.Table) -> Columns:
        """Columns from an Arrow batch of ``schema.to_arrow()`` (zero-copy where Arrow allows).

        Parameters
        ----------
        schema : Schema
            The schema the batch follows.
        batch : pyarrow.RecordBatch or pyarrow.Table
            The Arrow data (a Table is combined into one batch first).

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
        from replaystore.schemas.arrow import columns_from_arrow

        return columns_from_arrow(schema, batch)


def concat_columns(parts: list[Columns]) -> Columns:
    """Records of several Columns of one schema, in order (CSR offsets shifted; metadata dropped).

    Cost: one concatenation per array (a single part is returned without copying).

    Parameters
    ----------
    parts : list of Columns
        At least one Columns, all of the same schema.

    Returns
    -------
    Columns
        All records of ``parts``, in order.
    """
    schema = parts[0].schema
    if len(parts) == 1:
        return Columns(schema, parts[0].num_records, parts[0].arrays)
    arrays: dict[str, np.ndarray] = {}
    for f in schema.dense_fields:
        arrays[f.name] = np.concatenate([p.arrays[f.name] for p in parts])
    for off_name, names in schema.offsets_groups.items():
        shifts = np.cumsum([0] + [int(p.arrays[off_name][-1]) for p in parts[:-1]])
        arrays[off_name] = np.concatenate(
            [parts[0].arrays[off_name][:1]] + [p.arrays[off_name][1:] + s for p, s in zip(parts, shifts, strict=True)])
        for n in names:
            arrays[n] = np.concatenate([p.arrays[n] for p in parts])
    return Columns(schema, sum(p.num_records for p in parts), arrays)
