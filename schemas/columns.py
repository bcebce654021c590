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

    ``arrays`` maps each dense field to its ``(records, *shape)`` array, each
    ragged field to its values array and each offsets name to its int64 offsets
    (``records + 1``, starting at 0). ``meta`` maps batch-metadata fields to
    their JSON documents.
    """

    schema: Schema
    num_records: int
    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def ragged(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)`` of a ragged field."""
        f = self.schema.field(name)
        return self.arrays[name], self.arrays[f.offsets]  # type: ignore[union-attr]

    def take(self, rows: np.ndarray) -> Columns:
        """The records at ``rows`` (in that order), ragged slices gathered and rebased.

        ``rows`` are integer record indices; negative ones count from the end, as in numpy.
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
        """An Arrow RecordBatch sharing these buffers (ragged values are not copied)."""
        from replaystore.schemas.arrow import columns_to_arrow

        return columns_to_arrow(self)

    @classmethod
    def from_arrow(cls, schema: Schema, batch: pa.RecordBatch | pa.Table) -> Columns:
        """Columns from an Arrow batch of ``schema.to_arrow()`` (zero-copy where Arrow allows)."""
        from replaystore.schemas.arrow import columns_from_arrow

        return columns_from_arrow(schema, batch)


def concat_columns(parts: list[Columns]) -> Columns:
    """Records of several Columns of one schema, in order (CSR offsets shifted; metadata dropped)."""
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
