"""Where a view's row ids lie: each one's visible fragment and local row."""

from __future__ import annotations

import numpy as np

from replaystore.errors import RowError
from replaystore.store.read.rows import row_array
from replaystore.store.read.view import TableView

_and = np.bitwise_and.reduce


def locate(v: TableView, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(visible fragment index, local offset)`` of row ids of ``v``.

    Parameters
    ----------
    v : TableView
        The view the rows are visible in.
    rows : numpy.ndarray
        int64 row ids.

    Returns
    -------
    tuple of numpy.ndarray
        Cost: one search per row (none where one fragment is visible).

    Raises
    ------
    RowError
        A row id that is not visible in ``v``.
    """
    rows = row_array(rows)
    if len(v._frags) == 1 and rows.size:  # fast path: one visible fragment
        local = rows - int(v.first_ids[0])
        if local.min() >= v.visible_from[0] and local.max() < v.ends[0] - v.first_ids[0]:
            return np.zeros(rows.shape, dtype=np.int64), local
    ic = fragment_of(v, rows)
    return ic, rows - v.first_ids[ic]


def fragment_of(v: TableView, rows: np.ndarray) -> np.ndarray:
    """The visible fragment index of each of ``rows`` in ``v``.

    Parameters
    ----------
    v : TableView
        The view whose visible fragments are numbered.
    rows : numpy.ndarray
        int64 row ids (checked by ``row_array``).

    Returns
    -------
    numpy.ndarray
        int64, one search per row.

    Raises
    ------
    RowError
        A row id that is not visible in ``v`` (names up to five).
    """
    j = v._edges.searchsorted(rows, side="right")  # odd: inside fragment j // 2
    if rows.size and not _and(j, axis=None) & 1:  # all odd iff the AND of all has bit 0
        bad = rows[(j & 1) == 0][:5].tolist()
        raise RowError(f"table {v.name!r}: rows {bad} are not visible records (never written or evicted)")
    j >>= 1
    return j
