"""The Zarr arrays that store a table of a schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from replaystore.schemas.fields import OFFSETS_DTYPE, Dense

if TYPE_CHECKING:
    from replaystore.schemas.schema import Schema


@dataclass(frozen=True)
class ArraySpec:
    """One Zarr array of a table.

    Parameters
    ----------
    name : str
        The array's name (a field name or an offsets name).
    dtype : numpy.dtype
        Dtype of its entries.
    trailing_shape : tuple of int
        Shape of one entry (a dense record's shape; ``()`` for values and offsets).
    role : {"dense", "values", "offsets"}
        ``"dense"`` (one row of ``trailing_shape`` per record), ``"values"`` (the
        flat values of the ragged fields ``fields``) or ``"offsets"`` (the int64 CSR
        offsets shared by the ragged fields ``fields``; ``records + 1`` long).
    fields : tuple of str
        The schema fields stored in this array.
    """

    name: str
    dtype: np.dtype
    trailing_shape: tuple[int, ...]
    role: Literal["dense", "values", "offsets"]
    fields: tuple[str, ...]

    @property
    def row_bytes(self) -> int:
        """Bytes of one entry: a record's row (dense), one value or one offset."""
        return np.dtype(self.dtype).itemsize * int(np.prod(self.trailing_shape))


def zarr_layout(schema: Schema) -> tuple[ArraySpec, ...]:
    """The Zarr arrays a table of ``schema`` is stored as.

    Dense fields first, in schema order, then per offsets group its offsets array
    followed by its values arrays. Cost: linear in the number of fields.

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    tuple of ArraySpec
        One spec per stored array.
    """
    specs: list[ArraySpec] = []
    for f in schema.fields:
        if isinstance(f, Dense):
            specs.append(ArraySpec(f.name, f.dtype, f.shape, "dense", (f.name,)))
    for off_name, names in schema.offsets_groups.items():
        specs.append(ArraySpec(off_name, OFFSETS_DTYPE, (), "offsets", names))
        for name in names:
            specs.append(ArraySpec(name, schema.field(name).dtype, (), "values", (name,)))  # type: ignore[union-attr]
    return tuple(specs)
