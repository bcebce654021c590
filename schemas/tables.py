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

    Each table takes the items its schema names; an item no table claims is an
    :class:`UnknownFieldError`, a missing one a ``MissingFieldError``. Batch
    metadata (e.g. ``telemetry``) goes to every table whose schema declares it.
    """
    items = batch_items(batch)
    claimed = {name for schema in schemas.values() for name in schema.input_names}
    unknown = sorted(set(items) - claimed)
    if unknown:
        raise UnknownFieldError(unknown[0], f"one of {sorted(claimed)}", "an unknown field",
                                f"no table of {sorted(schemas)} has field(s) {unknown}")
    return {table: validate(schema, items, allow_extra=True) for table, schema in schemas.items()}
