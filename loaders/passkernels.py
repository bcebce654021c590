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
    """Fill ``out`` with the positions ``0..len(labels)-1`` grouped by label and return each group's end in ``out``.

    Each group is ascending, groups are in label order. Labels are ``< buckets``.
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
