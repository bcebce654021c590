"""Per-row values of a table's streams, kept up to date at the cost of each change of the table.

Frame stacking's frame index, the n-step window summary and HER's episode bounds are each a
value per visible row computed from the row's neighbours in its stream (the table's
:class:`~replaystore.store.StreamIndex`). An :class:`EntryFollower` keeps such values the way
the sequence sampler keeps its windows: per row (a :class:`~replaystore.loaders.tracking.RowSlots`
slot) the stream-index slot of its stream and its *relative* position there (which survives
the index's segment moves and head drops), and after a change of the view it recomputes only
the entries the change can affect: the entries appended to a stream plus a few before them
(a subclass says how many), every entry of a stream the index rewrote, nothing for the oldest
entries dropped (values read at query time clip to the stream's first visible entry). A new
index object (the table rebuilt it) or a first look means a full build.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.loaders.tracking import RowSlots, ViewTracker, expand
from replaystore.segments import grown
from replaystore.store import StreamIndex, Table

_EMPTY = np.zeros(0, dtype=np.int64)


class SortedRows:
    """An ascending set of row ids, changed at the cost of the change near its ends.

    Rows added after the largest are appended (amortised O(1) each); rows removed from the
    front move its start. Elsewhere a change moves the entries after the first row changed.
    :attr:`values` is a view that the next change may overwrite.
    """

    def __init__(self) -> None:
        self._buf = np.zeros(16, dtype=np.int64)
        self._lo = self._hi = 0

    @property
    def values(self) -> np.ndarray:
        """The rows, ascending (a view, valid until the next change)."""
        return self._buf[self._lo:self._hi]

    def __len__(self) -> int:
        """The number of rows."""
        return self._hi - self._lo

    def add(self, rows: np.ndarray) -> None:
        """Add ascending row ids, none in the set yet.

        Parameters
        ----------
        rows : numpy.ndarray
            Ascending int64 row ids.
        """
        k = len(rows)
        if not k:
            return
        v = self.values
        at = int(np.searchsorted(v, rows[0])) if len(v) else 0
        merged = rows if at == len(v) else np.sort(np.concatenate((v[at:], rows)), kind="stable")
        if self._lo + at + len(merged) > len(self._buf):  # room to double, from the buffer's start
            buf = np.empty(2 * (len(v) + k) + 16, dtype=np.int64)
            buf[:at] = v[:at]
            self._buf, self._lo = buf, 0
        start = self._lo + at
        self._buf[start:start + len(merged)] = merged
        self._hi = start + len(merged)

    def remove_in(self, iv: np.ndarray) -> None:
        """Remove the rows inside sorted disjoint ``[lo, hi)`` intervals.

        Parameters
        ----------
        iv : numpy.ndarray
            ``(k, 2)`` int64 intervals.
        """
        v = self.values
        if not len(v) or not len(iv):
            return
        a, b = np.searchsorted(v, iv[:, 0]), np.searchsorted(v, iv[:, 1])
        hit = b > a
        if hit.any():
            self._cut(a[hit], b[hit])

    def remove(self, rows: np.ndarray) -> None:
        """Remove ascending row ids, all in the set.

        Parameters
        ----------
        rows : numpy.ndarray
            Ascending int64 row ids.
        """
        if len(rows):
            at = np.searchsorted(self.values, rows)
            self._cut(at, at + 1)

    def _cut(self, a: np.ndarray, b: np.ndarray) -> None:
        """Remove the entries ``[a_i, b_i)`` (ascending, disjoint, non-empty)."""
        if len(a) == 1 and a[0] == 0:
            self._lo += int(b[0])
            return
        v = self.values
        first = int(a[0])
        keep = np.ones(len(v) - first, dtype=bool)
        keep[expand(np.stack((a, b), axis=1)) - first] = False
        rest = v[first:][keep]
        self._buf[self._lo + first:self._lo + first + len(rest)] = rest
        self._hi = self._lo + first + len(rest)


class EntryFollower:
    """Values per visible row computed from its stream, followed across the table's changes.

    Subclasses name their per-row columns in :attr:`columns` (name to dtype and the fill of
    a new row), read what they need of new rows in :meth:`_added`, say where recomputation
    must start after appends in :meth:`_first`, and compute the values of a batch of stream
    slices in :meth:`_compute`. :meth:`sync` brings everything up to the table's current
    view; the per-row arrays are indexed by the slots :meth:`locate` gives.

    Parameters
    ----------
    table : Table
        The table followed.
    """

    columns: dict[str, tuple[Any, Any]] = {}
    """Per-row columns of the subclass: name to ``(dtype, fill)``."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.changes = 0
        """Incremented by every :meth:`sync` that changed something."""
        self._clear()

    def _clear(self) -> None:
        """Forget everything: the next :meth:`sync` builds afresh."""
        self.index: StreamIndex | None = None
        self.tracker = ViewTracker(self.table)
        self.slots = RowSlots()
        self.version = -1
        self.stamp, self.rel_lo, self.rel_hi = _EMPTY, _EMPTY, _EMPTY
        self.cols: dict[str, np.ndarray] = {"stream": _EMPTY, "rel": _EMPTY}
        for name, (dtype, _) in self.columns.items():
            self.cols[name] = np.zeros(0, dtype=dtype)
        self._grow()
        self._cleared()

    def _cleared(self) -> None:
        """Subclass hook: reset what the subclass keeps beside the per-row columns."""

    def sync(self) -> bool:
        """Bring the values up to the table's current view.

        Cost: nothing when the view is unchanged; after appends and evictions at the ends
        of streams, the rows changed (plus the subclass's context per stream touched);
        a stream the stream index rewrote costs that stream; a new stream index (the table
        rebuilt it) a full build over every visible row.

        Returns
        -------
        bool
            Whether anything changed.
        """
        change = self.tracker.poll()
        index = self.table.stream_index()
        if change is None and index is self.index and index.version == self.version:
            return False
        self.changes += 1
        if change is None or change.full or index is not self.index:
            self._build(index, expand(self.tracker.view))
            return True
        if len(change.removed):
            self._removed(change.removed)
            self.slots.remove(change.removed)
        new = expand(change.added)
        if len(new):
            slots = self.slots.add(new)
            self._grow()
            for name, (_, fill) in self.columns.items():
                self.cols[name][slots] = fill
            self._added(new, slots)
        n = index.seg.slots
        self.stamp = grown(self.stamp, n, -1)
        self.rel_lo, self.rel_hi = grown(self.rel_lo, n, 0), grown(self.rel_hi, n, 0)
        cand = index.touched_since(self.version)
        if cand is None:
            cand = np.arange(n, dtype=np.int64)
        seg = index.seg
        stamp, lo, hi = index.stamp[cand], seg.lo[cand] - seg.origin[cand], seg.hi[cand] - seg.origin[cand]
        old_hi = self.rel_hi[cand]
        redo = stamp != self.stamp[cand]
        grew = ~redo & (hi > old_hi)
        self.stamp[cand], self.rel_lo[cand], self.rel_hi[cand] = stamp, lo, hi
        self.version = index.version
        jobs = (redo | grew) & (hi > lo)
        s, lo, hi, old_hi, redo = cand[jobs], lo[jobs], hi[jobs], np.maximum(old_hi[jobs], lo[jobs]), redo[jobs]
        ctx, first = self._first(index, s, lo, old_hi)
        ctx, first = np.where(redo, lo, ctx), np.where(redo, lo, first)
        if not self._recompute(index, s, ctx, first, hi):
            self._build(index, expand(self.tracker.view))
        return True

    def _build(self, index: StreamIndex, rows: np.ndarray) -> None:
        """Every value afresh from ``index``, whose rows are the ascending ``rows`` (cost: the rows)."""
        tracker = self.tracker
        self._clear()
        self.tracker = tracker
        self.index = index
        slots = self.slots.add(rows)
        self._grow()
        for name, (_, fill) in self.columns.items():
            self.cols[name][slots] = fill
        self._added(rows, slots)
        seg = index.seg
        self.stamp, self.rel_lo, self.rel_hi = index.stamp.copy(), seg.rel_lo(), seg.rel_hi()
        self.version = index.version
        s = np.flatnonzero(self.rel_hi > self.rel_lo)
        lo = self.rel_lo[s]
        if not self._recompute(index, s, lo, lo, self.rel_hi[s]):
            raise AssertionError("the stream index lists rows the table's view does not show")

    def _grow(self) -> None:
        n = max(self.slots.nslots, 1)  # (slot 0 answers lookups of rows not tracked)
        for name, arr in self.cols.items():
            self.cols[name] = grown(arr, n, 0)

    def _recompute(self, index: StreamIndex, s: np.ndarray, ctx: np.ndarray, first: np.ndarray,
                   hi: np.ndarray) -> bool:
        """Recompute entries ``[first, hi)`` of stream slots ``s`` from their entries ``[ctx, hi)``.

        False when an entry's row is not tracked (the index and the view disagree).
        """
        if not len(s):
            return True
        seg = index.seg
        counts = hi - ctx
        bounds = np.zeros(len(s) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        total = int(bounds[-1])
        jid = np.repeat(np.arange(len(s), dtype=np.int64), counts)
        rel = np.arange(total, dtype=np.int64) - np.repeat(bounds[:-1] - ctx, counts)
        pos = rel + np.repeat(seg.origin[s], counts)
        rows = seg.cols["rows"][pos]
        slots, found = self.slots.lookup(rows)
        if not found.all():
            return False
        write = rel >= first[jid]
        self.cols["stream"][slots[write]] = s[jid[write]]
        self.cols["rel"][slots[write]] = rel[write]
        self._compute(jid, bounds, ctx < first, rows, seg.cols["steps"][pos], seg.cols["resets"][pos], slots, rel,
                      write)
        return True

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row id: its slot, whether it is visible, its buffer position, its stream's origin and first.

        Cost: a binary search per row over the row slots' segments (none with one).

        Parameters
        ----------
        rows : numpy.ndarray
            Row ids.

        Returns
        -------
        tuple of numpy.ndarray
            ``slots`` (0 where not visible), ``found``, ``pos`` (the entry's position in the
            stream index's column buffers), ``origin`` (its stream's relative position 0 there)
            and ``lo`` (the relative position of its stream's first visible entry).
        """
        assert self.index is not None
        slots, found = self.slots.lookup(rows)
        if not len(self.slots):
            zero = np.zeros(len(slots), dtype=np.int64)
            return slots, found, zero, zero, zero
        s = self.cols["stream"][slots]
        seg = self.index.seg
        origin = seg.origin[s]
        return slots, found, origin + self.cols["rel"][slots], origin, seg.lo[s] - origin

    # -- subclass hooks ---------------------------------------------------------------------------
    def _removed(self, iv: np.ndarray) -> None:
        """Rows in the intervals ``iv`` stopped being visible (still tracked when called)."""

    def _added(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Rows became visible (ascending), with their new slots: read what the subclass needs of them."""

    def _first(self, index: StreamIndex, s: np.ndarray, lo: np.ndarray, old_hi: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray]:
        """Per stream slot that grew from ``old_hi``: where the context starts and where recomputing starts."""
        return old_hi, old_hi

    def _compute(self, jid: np.ndarray, bounds: np.ndarray, has_ctx: np.ndarray, rows: np.ndarray,
                 steps: np.ndarray, resets: np.ndarray, slots: np.ndarray, rel: np.ndarray,
                 write: np.ndarray) -> None:
        """Compute the values of the entries marked ``write`` of stream slices.

        Slice j holds entries ``bounds[j]:bounds[j+1]`` of the arrays, one stream's entries
        in step order (``jid``: the slice of each entry); its first entry is context only
        (its values are kept) where ``has_ctx[j]``.
        """
        raise NotImplementedError
