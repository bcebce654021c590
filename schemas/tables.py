"""Validate one batch against several tables' schemas (e.g. a DeepCfrBatch into two tables)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replaystore.errors import UnknownFieldError
from replaystore.schemas.columns import Columns
from replaystore.schemas.schema import Schema
from replaystore.schemas.validate import batch_items, validate


def validate_tables(schemas: Mapping[str, Schema], batch: Any) -> dict[str, Columns]:
    """Split ``batch`` into one :class:`Columns` per table.

    Each table takes the items its schema names. Batch metadata (e.g.
    ``telemetry``) goes to every table whose schema declares it. Cost: one
    :meth:`Schema.validate` per table.

    Parameters
    ----------
    schemas : mapping of str to Schema
        Table name to that table's schema.
    batch : Any
        A mapping or an object with named attributes (see :meth:`Schema.validate`).

    Returns
    -------
    dict of str to Columns
        Table name to its validated columns.

    Raises
    ------
    UnknownFieldError
        An item no table claims.
    ValidationError
        A missing field (``MissingFieldError``) or any other check of
        :meth:`Schema.validate`.
    """
    items = batch_items(batch)
    claimed = {name for schema in schemas.values() for name in schema.input_names}
    unknown = sorted(set(items) - claimed)
    if unknown:
        raise UnknownFieldError(unknown[0], f"one of {sorted(claimed)}", "an unknown field",
                                f"no table of {sorted(schemas)} has field(s) {unknown}")
    return {table: validate(schema, items, allow_extra=True) for table, schema in schemas.items()}
