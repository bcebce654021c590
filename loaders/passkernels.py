"""Compiled (numba) grouping of an epoch pass's positions by bucket (loaders/passorder.py).

Imported through :func:`replaystore.compiled.kernels` (numba loads, not turned off). The
numpy twin in loaders/passorder.py is a stable argsort of the labels; this is a counting
sort, one pass to count and one to scatter, with the same result (integers, so exactly):
each bucket's positions ascending, buckets in label order (docs/PERFORMANCE.md, "Epoch
passes in buckets").
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, boundscheck=False)
def group(labels: np.ndarray, buckets: int, out: np.ndarray) -> np.ndarray:
    """Group the positions ``0..len(labels)-1`` by label into ``out``.

    Each group ascending, groups in label order: a counting sort, one pass to
    count and one to scatter.

    Parameters
    ----------
    labels : numpy.ndarray
        Unsigned integer labels, each ``< buckets``.
    buckets : int
        The number of labels.
    out : numpy.ndarray
        ``len(labels)`` integers: receives the grouped positions.

    Returns
    -------
    numpy.ndarray
        int64: each group's end in ``out``.
    """
    ends = np.zeros(buckets, np.int64)
    for i in range(labels.shape[0]):
        ends[labels[i]] += 1
    at = np.empty(buckets, np.int64)  # where each group's next position goes
    total = 0
    for b in range(buckets):
        at[b] = total
        total += ends[b]
        ends[b] = total
    for i in range(labels.shape[0]):
        b = labels[i]
        out[at[b]] = i
        at[b] += 1
    return ends
