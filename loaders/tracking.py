"""Following a table's visible rows across store changes at the cost of the change, and per-row slots.

The visible rows of a table are a few runs of consecutive row ids (one per fragment, less
what capacity evicted), so they are kept as sorted disjoint ``[lo, hi)`` intervals: an
``(k, 2)`` int64 array. Samplers compare the intervals before and after a refresh
(cost: number of fragments) instead of listing every visible row (cost: table size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replaystore.store import Table

_NONE = np.zeros((0, 2), dtype=np.int64)


def merge(iv: np.ndarray) -> np.ndarray:
    """Sorted disjoint intervals with empty ones dropped and touching ones joined.

    Parameters
    ----------
    iv : numpy.ndarray
        ``(k, 2)`` int64 ``[lo, hi)`` intervals, sorted by ``lo``, not overlapping.

    Returns
    -------
    numpy.ndarray
        The merged intervals.
    """
    iv = iv[iv[:, 1] > iv[:, 0]]
    if len(iv) < 2:
        return iv
    start = np.r_[True, iv[1:, 0] > iv[:-1, 1]]
    end = np.r_[start[1:], True]
    return np.stack((iv[start, 0], iv[end, 1]), axis=1)


def inside(rows: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """Per row id, whether it lies in one of the intervals.

    Cost: a binary search per row.

    Parameters
    ----------
    rows : numpy.ndarray
        Row ids.
    iv : numpy.ndarray
        Sorted disjoint ``(k, 2)`` intervals.

    Returns
    -------
    numpy.ndarray
        Bool per row.
    """
    return (np.searchsorted(iv.reshape(-1), rows, side="right") & 1).astype(bool)


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intervals of the rows in ``a`` and not in ``b``.

    Cost: O((k_a + k_b) log(k_a + k_b)).

    Parameters
    ----------
    a, b : numpy.ndarray
        Sorted disjoint ``(k, 2)`` intervals.

    Returns
    -------
    numpy.ndarray
        Sorted disjoint intervals.
    """
    if not len(a) or not len(b):
        return a
    points = np.unique(np.concatenate((a.reshape(-1), b.reshape(-1))))
    left, right = points[:-1], points[1:]
    keep = inside(left, a) & ~inside(left, b)
    return merge(np.stack((left[keep], right[keep]), axis=1))


def expand(iv: np.ndarray) -> np.ndarray:
    """Every row id of the intervals, ascending.

    Cost: linear in the result.

    Parameters
    ----------
    iv : numpy.ndarray
        Sorted disjoint ``(k, 2)`` intervals.

    Returns
    -------
    numpy.ndarray
        int64 row ids.
    """
    counts = iv[:, 1] - iv[:, 0]
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) + np.repeat(iv[:, 0] - starts, counts)


def rows_in(sorted_rows: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """The entries of an ascending row-id array that lie in the intervals (cost: the result).

    Parameters
    ----------
    sorted_rows : numpy.ndarray
        Ascending int64 row ids.
    iv : numpy.ndarray
        Sorted disjoint ``(k, 2)`` intervals.

    Returns
    -------
    numpy.ndarray
        The entries of ``sorted_rows`` inside ``iv``, ascending.
    """
    lo = np.searchsorted(sorted_rows, iv[:, 0])
    hi = np.searchsorted(sorted_rows, iv[:, 1])
    return sorted_rows[expand(np.stack((lo, hi), axis=1))]


@dataclass
class Change:
    """Rows that became visible and rows that stopped being visible, as intervals.

    Attributes
    ----------
    added : numpy.ndarray
        Intervals of rows that became visible.
    removed : numpy.ndarray
        Intervals of rows that stopped being visible.
    full : bool
        Marks the first poll (or one after :meth:`ViewTracker.reset`): ``added``
        is then everything visible and the caller cannot know what was removed.
    """

    added: np.ndarray
    removed: np.ndarray
    full: bool


class ViewTracker:
    """What changed in a table's visible rows since the last :meth:`poll`.

    Parameters
    ----------
    reader : TableReader
        The table's reader to follow.
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.version = -1
        self.view = _NONE

    def reset(self) -> None:
        """Forget the last view: the next poll reports a full change."""
        self.version = -1

    def poll(self) -> Change | None:
        """The change since the last poll.

        Cost: the table's current view, then O(fragments) when the log changed.

        Returns
        -------
        Change or None
            None when the log did not change.
        """
        view = self.table.view()
        version = view.version
        if version == self.version:
            return None
        new, old, full = view.intervals(), self.view, self.version < 0
        self.version, self.view = version, new
        if full:
            return Change(new, _NONE, True)
        return Change(difference(new, old), difference(old, new), False)


class RowSlots:
    """A stable slot (0, 1, 2, ...) per tracked row id; slots of dropped rows are reused.

    Rows map to slots through segments: row ids ``[lo, hi)`` have slots
    ``first + (row - lo)``, sorted by ``lo``. Appended rows get consecutive fresh
    (or freed) slots, so a table's rows are a few segments and adding or dropping
    rows costs the rows changed, not the rows tracked.
    """

    def __init__(self) -> None:
        self._set(_NONE, np.zeros(0, dtype=np.int64))
        self._row_of = np.zeros(0, dtype=np.int64)
        self.nslots = 0
        self.count = 0
        self.free = np.zeros(0, dtype=np.int64)

    @property
    def row_of(self) -> np.ndarray:
        """``row_of[slot]``: the row id of each slot (-1 for a free slot)."""
        return self._row_of[:self.nslots]

    def __len__(self) -> int:
        """The number of tracked rows."""
        return self.count

    def _set(self, iv: np.ndarray, first: np.ndarray) -> None:
        """Install segments (any order), joining those contiguous in both rows and slots."""
        order = np.argsort(iv[:, 0], kind="stable")
        iv, first = iv[order], first[order]
        if len(iv) > 1:
            start = np.r_[True, (iv[1:, 0] != iv[:-1, 1]) | (first[1:] != first[:-1] + iv[:-1, 1] - iv[:-1, 0])]
            end = np.r_[start[1:], True]
            iv, first = np.stack((iv[start, 0], iv[end, 1]), axis=1), first[start]
        self.lo, self.hi, self.first = iv[:, 0].copy(), iv[:, 1].copy(), first

    def add(self, rows: np.ndarray) -> np.ndarray:
        """Track ascending row ids not tracked yet.

        Cost: the rows added plus the segments.

        Parameters
        ----------
        rows : numpy.ndarray
            Ascending int64 row ids, none tracked yet.

        Returns
        -------
        numpy.ndarray
            Their slots (freed slots first, then fresh).
        """
        m = len(rows)
        if not m:
            return np.zeros(0, dtype=np.int64)
        reuse = min(len(self.free), m)
        fresh = np.arange(self.nslots, self.nslots + m - reuse, dtype=np.int64)
        slots = np.concatenate((self.free[:reuse], fresh))
        self.free = self.free[reuse:]
        need = self.nslots + len(fresh)
        if need > len(self._row_of):  # amortised growth: doubling
            grown = np.full(max(need, 2 * len(self._row_of)), -1, dtype=np.int64)
            grown[:self.nslots] = self.row_of
            self._row_of = grown
        self.nslots = need
        self._row_of[slots] = rows
        self.count += m
        brk = np.r_[True, (np.diff(rows) != 1) | (np.diff(slots) != 1)]
        ends = np.r_[np.flatnonzero(brk)[1:] - 1, m - 1]
        new = np.stack((rows[brk], rows[ends] + 1), axis=1)
        self._set(np.concatenate((np.stack((self.lo, self.hi), axis=1), new)),
                  np.concatenate((self.first, slots[brk])))
        return slots

    def remove(self, iv: np.ndarray) -> np.ndarray:
        """Stop tracking the rows in intervals ``iv``.

        Cost: the segments and intervals involved, plus the rows freed.

        Parameters
        ----------
        iv : numpy.ndarray
            Sorted disjoint ``(k, 2)`` intervals.

        Returns
        -------
        numpy.ndarray
            The freed slots (in ascending row order).
        """
        seg = np.stack((self.lo, self.hi), axis=1)
        if not len(iv) or not len(seg):
            return np.zeros(0, dtype=np.int64)
        # segments overlapping some interval: the first interval ending after lo starts before hi
        k = np.searchsorted(iv[:, 1], self.lo, side="right")
        hit = k < len(iv)
        hit[hit] = iv[k[hit], 0] < self.hi[hit]
        if not hit.any():
            return np.zeros(0, dtype=np.int64)
        # cut the hit segments at every interval edge; each piece is wholly in or out of iv
        hs, hf = seg[hit], self.first[hit]
        points = np.unique(np.concatenate((hs.reshape(-1), iv.reshape(-1))))
        left, right = points[:-1], points[1:]
        owner = np.searchsorted(hs[:, 0], left, side="right") - 1
        oc = np.maximum(owner, 0)
        valid = (owner >= 0) & (left < hs[oc, 1])
        gone = valid & inside(left, iv)
        keep = valid & ~gone
        pfirst = hf[oc] + left - hs[oc, 0]
        freed = expand(np.stack((pfirst[gone], pfirst[gone] + right[gone] - left[gone]), axis=1))
        self._row_of[freed] = -1
        self.free = np.concatenate((self.free, freed))
        self.count -= len(freed)
        self._set(np.concatenate((seg[~hit], np.stack((left[keep], right[keep]), axis=1))),
                  np.concatenate((self.first[~hit], pfirst[keep])))
        return freed

    def tracked(self) -> np.ndarray:
        """Every tracked row id, ascending (cost: rows tracked).

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        return expand(np.stack((self.lo, self.hi), axis=1))

    def sync(self, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Track exactly the ascending row ids ``visible``.

        Cost: rows tracked (for a resumed sampler's first look at the table).

        Parameters
        ----------
        visible : numpy.ndarray
            Ascending int64 row ids.

        Returns
        -------
        freed : numpy.ndarray
            Slots of rows no longer tracked.
        new : numpy.ndarray
            Slots of rows newly tracked.
        """
        tracked = self.tracked()
        gone = np.setdiff1d(tracked, visible, assume_unique=True)
        freed = self.remove(np.stack((gone, gone + 1), axis=1))
        return freed, self.add(np.setdiff1d(visible, tracked, assume_unique=True))

    def lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of row ids, and whether each is tracked.

        Cost: a binary search per row (none with one segment).

        Parameters
        ----------
        rows : array_like
            Row ids.

        Returns
        -------
        slots : numpy.ndarray
            int64 slot per row (0 for rows not tracked).
        found : numpy.ndarray
            Bool per row.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if not len(self.lo):
            return np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=bool)
        if len(self.lo) == 1:  # one segment (e.g. one writer's rows): no search
            lo, hi = int(self.lo[0]), int(self.hi[0])
            found = (rows >= lo) & (rows < hi)
            return np.where(found, rows + (int(self.first[0]) - lo), 0), found
        i = np.searchsorted(self.lo, rows, side="right") - 1
        ic = np.maximum(i, 0)
        found = (i >= 0) & (rows < self.hi[ic])
        return np.where(found, self.first[ic] + rows - self.lo[ic], 0), found

    def state(self) -> dict[str, np.ndarray]:
        """The slots as arrays, for a sampler's saved state.

        Returns
        -------
        dict of str to numpy.ndarray
            ``slot_lo``, ``slot_hi``, ``slot_first``, ``slot_row_of`` and ``slot_free``.
        """
        return {"slot_lo": self.lo, "slot_hi": self.hi, "slot_first": self.first, "slot_row_of": self.row_of.copy(),
                "slot_free": self.free}

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state` (or the per-row ``slot_rows``/``slot_ids`` arrays of earlier versions).

        Parameters
        ----------
        state : dict of str to numpy.ndarray
            A saved state holding the slot arrays.
        """
        if "slot_lo" not in state and "slot_rows" in state:  # one segment per row, joined by _set
            rows = np.asarray(state["slot_rows"], dtype=np.int64)
            state = {**state, "slot_lo": rows, "slot_hi": rows + 1, "slot_first": state["slot_ids"]}
        lo, hi = (np.asarray(state[k], dtype=np.int64) for k in ("slot_lo", "slot_hi"))
        self._set(np.stack((lo, hi), axis=1), np.asarray(state["slot_first"], dtype=np.int64))
        self._row_of = np.asarray(state["slot_row_of"], dtype=np.int64).copy()
        self.nslots = len(self._row_of)
        self.count = int((hi - lo).sum())
        self.free = np.asarray(state["slot_free"], dtype=np.int64)
