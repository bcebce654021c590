"""Growable column buffers holding one variable-length segment per slot (the index's streams).

Each slot's entries lie at ``[lo, hi)`` of every column, with room up to ``end``. An
entry is named by its *relative* position ``rel = position - origin``, which stays the
same when the segment moves (growth, compaction) or loses its head, so positions held
elsewhere (the sequence sampler's windows) survive those changes. ``replace`` starts a
new numbering. Appending costs the entries appended (a full segment moves to the top of
the buffer with room to double; amortised O(1) per entry); holes left behind are
reclaimed by one compaction once they outnumber the live entries.
"""

from __future__ import annotations

import numpy as np


class Segments:
    """Named columns with one segment per slot; slots are dense ints ``0 .. slots-1``.

    Empty, or the dense ``columns`` cut at ``bounds`` into the segments of slots
    ``slot_order``. Each segment gets room for an eighth more entries (its first
    appends do not move it), and the buffer ``slack`` free entries after them.
    Construction costs one copy of the columns.

    Parameters
    ----------
    dtypes : dict of str to numpy.dtype
        The columns' names and dtypes.
    columns : dict of str to numpy.ndarray, optional
        Dense initial contents, slot after slot.
    bounds : numpy.ndarray, optional
        ``bounds[i]:bounds[i+1]`` delimits the i-th segment in ``columns``.
    slack : int, optional
        Free entries at the end of the buffer.
    slot_order : numpy.ndarray, optional
        The slot of each segment of ``columns`` (default ``0, 1, ...``).
    slots : int, optional
        Slots in all (the others empty); default: one per segment.

    Attributes
    ----------
    cols : dict of str to numpy.ndarray
        The column buffers.
    lo, hi, end, origin : numpy.ndarray
        Per slot: its entries' ``[lo, hi)``, the end of its room, and the buffer
        position of its relative position 0.
    """

    def __init__(self, dtypes: dict[str, np.dtype], columns: dict[str, np.ndarray] | None = None,
                 bounds: np.ndarray | None = None, slack: int = 0, slot_order: np.ndarray | None = None,
                 slots: int | None = None) -> None:
        """Build the buffers (see the class docstring)."""
        bounds = np.zeros(1, dtype=np.int64) if bounds is None else np.asarray(bounds, dtype=np.int64)
        counts = np.diff(bounds)
        ends = np.cumsum(counts + counts // 8)
        starts = ends - counts - counts // 8
        top = int(ends[-1]) if len(ends) else 0
        self.cols = {k: np.empty(top + slack, dtype=dt) for k, dt in dtypes.items()}
        if len(counts) * 256 <= bounds[-1]:  # few long segments: one slice copy each
            for k, arr in (columns or {}).items():
                for a, b, t in zip(bounds[:-1].tolist(), bounds[1:].tolist(), starts.tolist(), strict=True):
                    self.cols[k][t:t + b - a] = arr[a:b]
        else:
            at = np.repeat(starts - bounds[:-1], counts) + np.arange(int(bounds[-1]), dtype=np.int64)
            for k, arr in (columns or {}).items():
                self.cols[k][at] = arr
        order = np.arange(len(counts)) if slot_order is None else slot_order
        self.lo = np.full(len(order) if slots is None else slots, top, dtype=np.int64)
        self.hi, self.end = self.lo.copy(), self.lo.copy()
        self.lo[order], self.hi[order], self.end[order] = starts, starts + counts, ends
        self.origin = self.lo.copy()
        self.top = top
        self.live = int(bounds[-1])

    @property
    def slots(self) -> int:
        """The number of slots."""
        return len(self.lo)

    def add_slots(self, count: int) -> None:
        """``count`` new empty slots, numbered after the existing ones.

        Parameters
        ----------
        count : int
            Slots to add.
        """
        if count:
            n = self.slots + count
            self.lo, self.hi, self.end, self.origin = (grown(a, n, self.top)
                                                       for a in (self.lo, self.hi, self.end, self.origin))

    def count(self, slot: int) -> int:
        """The number of entries of ``slot``.

        Parameters
        ----------
        slot : int
            The slot.

        Returns
        -------
        int
            Its entry count.
        """
        return int(self.hi[slot] - self.lo[slot])

    def view(self, slot: int, name: str) -> np.ndarray:
        """The entries of ``slot`` in column ``name``, as a view (no copy).

        Parameters
        ----------
        slot : int
            The slot.
        name : str
            The column.

        Returns
        -------
        numpy.ndarray
            A view of the buffer.
        """
        return self.cols[name][self.lo[slot]:self.hi[slot]]

    def positions(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Buffer positions of every entry of slots ``order``, slot after slot, and the slots' counts.

        Cost: linear in the entries.

        Parameters
        ----------
        order : numpy.ndarray
            Slots, in the order wanted.

        Returns
        -------
        positions : numpy.ndarray
            int64 buffer positions.
        counts : numpy.ndarray
            int64 entries per slot of ``order``.
        """
        counts = (self.hi - self.lo)[order]
        total = int(counts.sum())
        starts = np.cumsum(counts) - counts
        return np.repeat(self.lo[order] - starts, counts) + np.arange(total, dtype=np.int64), counts

    def rel_lo(self) -> np.ndarray:
        """Per slot, the relative position of its first entry.

        Returns
        -------
        numpy.ndarray
            ``lo - origin``.
        """
        return self.lo - self.origin

    def rel_hi(self) -> np.ndarray:
        """Per slot, the relative position after its last entry.

        Returns
        -------
        numpy.ndarray
            ``hi - origin``.
        """
        return self.hi - self.origin

    def append(self, slot: int, arrays: dict[str, np.ndarray]) -> None:
        """Append entries to ``slot`` (every column).

        Cost: the entries appended; a full segment moves to the top of the buffer
        with room to double (amortised O(1) per entry).

        Parameters
        ----------
        slot : int
            The slot.
        arrays : dict of str to numpy.ndarray
            One array per column, of equal lengths.
        """
        k = len(next(iter(arrays.values())))
        if not k:
            return
        if self.hi[slot] + k > self.end[slot]:
            self._move(slot, 2 * (self.count(slot) + k))
        h = int(self.hi[slot])
        for name, a in arrays.items():
            self.cols[name][h:h + k] = a
        self.hi[slot] += k
        self.live += k

    def drop_head(self, slot: int, k: int) -> None:
        """Drop the first ``k`` entries of ``slot`` (relative positions of the rest stay).

        Parameters
        ----------
        slot : int
            The slot.
        k : int
            Entries to drop.
        """
        self.lo[slot] += k
        self.live -= k

    def replace(self, slot: int, arrays: dict[str, np.ndarray]) -> None:
        """New contents for ``slot``, numbered from relative position 0.

        Written at the top of the buffer: entries once handed out as views are never
        overwritten in place.

        Parameters
        ----------
        slot : int
            The slot.
        arrays : dict of str to numpy.ndarray
            One array per column (empty dict: the slot becomes empty).
        """
        self.live -= self.count(slot)
        self.lo[slot] = self.hi[slot] = self.end[slot] = self.origin[slot] = self.top
        if arrays:
            self.append(slot, arrays)

    def _move(self, slot: int, room: int) -> None:
        """Put ``slot``'s segment at the top of the buffer with ``room`` entries of space."""
        n = self.count(slot)
        cap = len(next(iter(self.cols.values())))
        if self.top + room > cap:
            if 2 * self.live < self.top:
                self._compact()
            cap = len(next(iter(self.cols.values())))
            if self.top + room > cap:
                self._grow(max(2 * cap, self.top + room))
        lo, t = int(self.lo[slot]), self.top
        for c in self.cols.values():
            c[t:t + n] = c[lo:lo + n]
        self.origin[slot] += t - lo
        self.lo[slot], self.hi[slot], self.end[slot] = t, t + n, t + room
        self.top = t + room

    def _grow(self, cap: int) -> None:
        for name, c in self.cols.items():
            new = np.empty(cap, dtype=c.dtype)
            new[:self.top] = c[:self.top]
            self.cols[name] = new

    def _compact(self) -> None:
        """Every segment packed in slot order, without room (the next append moves it)."""
        counts = self.hi - self.lo
        new_lo = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        idx = np.repeat(self.lo - new_lo, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        cap = len(next(iter(self.cols.values())))
        for name, c in self.cols.items():
            new = np.empty(cap, dtype=c.dtype)
            new[:len(idx)] = c[idx]
            self.cols[name] = new
        self.origin += new_lo - self.lo
        self.lo, self.hi = new_lo, new_lo + counts
        self.end = self.hi.copy()
        self.top = len(idx)


def grown(a: np.ndarray, n: int, fill: int) -> np.ndarray:
    """``a`` extended to length ``n`` with ``fill`` (``a`` itself when long enough).

    Amortised O(added): the result is the start of a buffer with room to
    double, which later calls fill in place. So ``a`` must be an array its
    caller owns outright (no other live view of its buffer beyond ``len(a)``) or
    an earlier result of this function.

    Parameters
    ----------
    a : numpy.ndarray
        A 1-D array.
    n : int
        The length wanted.
    fill : int
        The value of the new entries.

    Returns
    -------
    numpy.ndarray
        An array of length ``n`` (at least).
    """
    if len(a) >= n:
        return a
    base = a.base
    if not (isinstance(base, np.ndarray) and base.ndim == 1 and base.dtype == a.dtype and len(base) >= n
            and a.strides == base.strides and a.ctypes.data == base.ctypes.data):
        base = np.empty(max(n, 2 * len(a), 16), dtype=a.dtype)
        base[:len(a)] = a
    base[len(a):n] = fill
    return base[:n]
