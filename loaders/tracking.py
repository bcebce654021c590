"""Keeping a sampler's per-row data in step with the table's visible rows, vectorised."""

from __future__ import annotations

import numpy as np


class RowSlots:
    """A stable slot (0, 1, 2, ...) per tracked row id; slots of dropped rows are reused.

    ``rows``/``slots`` are kept sorted by row id so lookups are ``searchsorted``;
    ``row_of[slot]`` maps back (-1 for a free slot).
    """

    def __init__(self) -> None:
        self.rows = np.zeros(0, dtype=np.int64)
        self.slots = np.zeros(0, dtype=np.int64)
        self.row_of = np.zeros(0, dtype=np.int64)
        self.free = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def sync(self, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Track exactly the sorted row ids ``visible``; returns ``(freed slots, new slots)``."""
        keep = np.isin(self.rows, visible, assume_unique=True)
        freed = self.slots[~keep]
        self.row_of[freed] = -1
        new_rows = np.setdiff1d(visible, self.rows, assume_unique=True)
        free = np.concatenate([self.free, freed])
        reuse = min(len(free), len(new_rows))
        fresh = np.arange(len(self.row_of), len(self.row_of) + len(new_rows) - reuse, dtype=np.int64)
        new_slots = np.concatenate([free[:reuse], fresh])
        self.free = free[reuse:]
        self.row_of = np.concatenate([self.row_of, np.full(len(fresh), -1, dtype=np.int64)])
        self.row_of[new_slots] = new_rows
        rows = np.concatenate([self.rows[keep], new_rows])
        slots = np.concatenate([self.slots[keep], new_slots])
        order = np.argsort(rows, kind="stable")
        self.rows, self.slots = rows[order], slots[order]
        return freed, new_slots

    def lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, found)`` for row ids; slots of rows not tracked are meaningless."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(self.rows):
            return np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=bool)
        pos = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
        found = self.rows[pos] == rows
        return self.slots[pos], found

    def state(self) -> dict[str, np.ndarray]:
        return {"slot_rows": self.rows, "slot_ids": self.slots, "slot_row_of": self.row_of, "slot_free": self.free}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.rows = np.asarray(state["slot_rows"], dtype=np.int64)
        self.slots = np.asarray(state["slot_ids"], dtype=np.int64)
        self.row_of = np.asarray(state["slot_row_of"], dtype=np.int64)
        self.free = np.asarray(state["slot_free"], dtype=np.int64)
