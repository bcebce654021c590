"""Compiled (numba) CSR gather index for ``gather.gather`` (store/read/gather.py): one call per offsets group.

Imported through :func:`replaystore.compiled.kernels` (numba loads, not turned off). The
numpy twin in store/read/table.py takes each record's start and end offsets, checks them, and
builds the new offsets and the index of every gathered value with ~12 numpy calls per group;
this does the same in one pass over the rows, with the same results (integers, so exactly)
and the same checks (docs/PERFORMANCE.md, "A compiled CSR gather").
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, boundscheck=False)
def csr_index(offsets: np.ndarray, loc: np.ndarray, shift: np.ndarray, top: int,
              new_offsets: np.ndarray) -> tuple[bool, np.ndarray]:
    """The CSR gather plan of records ``loc`` of ``offsets``.

    Fill ``new_offsets`` (``len(loc) + 1``, rebased to 0) and return ``(True, value_index)``, each gathered value's
    index in the values array (plus ``shift[i]`` for record i when ``shift`` is not empty); ``(False, empty)`` if any
    record is not in ``offsets`` or its offsets are negative, decreasing or above ``top``.
    """
    n = loc.shape[0]
    new_offsets[0] = 0
    total = 0
    for i in range(n):
        if loc[i] < 0 or loc[i] + 1 >= offsets.shape[0]:  # (numpy's take raises for these)
            return False, np.empty(0, np.int64)
        start = offsets[loc[i]]
        end = offsets[loc[i] + 1]
        if start < 0 or end < start or end > top:
            return False, np.empty(0, np.int64)
        total += end - start
        new_offsets[i + 1] = total
    value_index = np.empty(total, np.int64)
    shifted = shift.shape[0] > 0
    k = 0
    for i in range(n):
        first = offsets[loc[i]]
        if shifted:
            first += shift[i]
        for j in range(new_offsets[i + 1] - new_offsets[i]):
            value_index[k] = first + j
            k += 1
    return True, value_index
