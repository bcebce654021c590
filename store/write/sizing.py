"""How large a writer's fragments and segments are (docs/FORMAT.md, "Segments" and "Compaction").

Pure functions of the store's capacity and a table's schema, shared by the segment pool (the
size of a new segment) and the compactor (the fragment size cap a merge stays under).
"""

from __future__ import annotations

from replaystore.schemas import Schema
from replaystore.store.format.segment import SEGMENT_FLOOR_BYTES, fixed_row_bytes

MAX_FRAGMENT_ROWS = 1 << 20
"""The fragment size cap of a store without capacity (and its upper bound in any store)."""


def max_fragment_rows(capacity: int | None) -> int:
    """The fragment size cap: ``MAX_FRAGMENT_ROWS``, or ``capacity // 4`` (at least 1) if smaller.

    Parameters
    ----------
    capacity : int or None
        The store's capacity in records; None for an unbounded store.

    Returns
    -------
    int
        The most records a merge puts into one fragment.

    Cost: O(1).
    """
    return MAX_FRAGMENT_ROWS if capacity is None else max(min(MAX_FRAGMENT_ROWS, capacity // 4), 1)


def segment_rows(schema: Schema, capacity: int | None) -> int:
    """Rows of a new segment.

    The fragment size cap, or in a store with capacity N at least ``SEGMENT_FLOOR_BYTES`` of
    fixed-size columns, up to N.

    Parameters
    ----------
    schema : Schema
        The table's schema (its fixed-size bytes per record).
    capacity : int or None
        The store's capacity in records; None for an unbounded store.

    Returns
    -------
    int
        The row capacity a new segment gets unless an append needs more.

    Cost: O(fields).
    """
    if capacity is None:
        return max_fragment_rows(capacity)
    floor = -(-SEGMENT_FLOOR_BYTES // fixed_row_bytes(schema))
    return max(max_fragment_rows(capacity), min(capacity, MAX_FRAGMENT_ROWS, floor))
