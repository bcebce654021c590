"""A writer's pending appends, and the part of a commit record that describes them.

:class:`PendingAppends` keeps, per table, each append made since the writer's last commit (its
records already sit in the table's staged fragment or segments, see
:class:`~replaystore.store.write.segmentpool.SegmentPool`); at commit time :meth:`PendingAppends.fill`
finishes their fragments and writes the commit body's per-table changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from replaystore.store.format.fragment import Fragment
from replaystore.store.format.segment import Segment
from replaystore.store.write.segmentpool import SegmentPool


@dataclass
class Pending:
    """One append of a table: its records are in the table's staged fragment or segments."""

    rows: int
    meta: dict[str, Any]


class PendingAppends:
    """Each table's appends since the last commit, oldest first.

    Parameters
    ----------
    tables : iterable of str
        The store's table names.
    segments : SegmentPool
        Where the appends' records were written; :meth:`fill` finishes their fragments there.
    """

    def __init__(self, tables: Iterable[str], segments: SegmentPool) -> None:
        self.by_table: dict[str, list[Pending]] = {t: [] for t in tables}
        self.segments = segments

    def add(self, table: str, rows: int, meta: dict[str, Any]) -> None:
        """Record an append of ``rows`` records (with its batch metadata ``meta``) to ``table``."""
        self.by_table[table].append(Pending(rows, meta))

    def __bool__(self) -> bool:
        return any(self.by_table.values())

    def counts(self) -> dict[str, int]:
        """The pending records per table that has any."""
        return {t: sum(p.rows for p in ps) for t, ps in self.by_table.items() if ps}

    def clear(self) -> None:
        """Forget every pending append (committed, or discarded)."""
        for pending in self.by_table.values():
            pending.clear()

    def fill(self, body: dict[str, Any], seq: int, now: int, new_frags: dict[str, list[Fragment]],
             retired: dict[str, list[Fragment]], segments: list[Segment], rows: dict[str, tuple[int, int]]) -> None:
        """Finish the pending appends' fragments and describe them (and ``retired``) in ``body``.

        Fills ``new_frags`` (per table, the fragments of commit ``seq`` made at ``now``),
        ``segments`` (those whose pending bytes become durable with the record) and ``rows``
        (per table, the ``[first, end)`` row ids of the new records).
        """
        for table, pending in self.by_table.items():
            change: dict[str, Any] = {}
            if pending:
                frags = new_frags[table] = self.segments.finish(table, seq, now, sum(p.rows for p in pending),
                                                                segments)
                lo = frags[0].row_start
                appends = []
                for p in pending:
                    appends.append({"rows": [lo, lo + p.rows], "meta": p.meta})
                    lo += p.rows
                change.update({"add": [f.to_dict() for f in frags], "appends": appends})
                rows[table] = (frags[0].first_id, frags[-1].first_id + frags[-1].rows)
            if retired.get(table):
                change["remove"] = [f.name for f in retired[table]]
            if change:
                body["tables"][table] = change
