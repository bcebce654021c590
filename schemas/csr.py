"""Vectorised CSR helpers: gather rows' slices, densify a minibatch's legality mask."""

from __future__ import annotations

import numpy as np


def gather_csr(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR ``offsets`` and the records ``rows``, return ``(new_offsets, value_index)``.

    Vectorised; linear in the number of rows and gathered values.

    Parameters
    ----------
    offsets : numpy.ndarray
        int64 CSR offsets, ``records + 1`` long.
    rows : numpy.ndarray
        Non-negative record indices to gather, in order.

    Returns
    -------
    new_offsets : numpy.ndarray
        int64, starts at 0 and delimits each chosen row's slice in the gathered values.
    value_index : numpy.ndarray
        int64 indices into the original values array (``values[value_index]``).

    Examples
    --------
    >>> import numpy as np
    >>> new_offsets, value_index = gather_csr(np.array([0, 2, 2, 5]), np.array([2, 0]))
    >>> new_offsets.tolist(), value_index.tolist()
    ([0, 3, 5], [2, 3, 4, 0, 1])
    """
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    total = int(new_offsets[-1])
    # position within each slice, plus the slice's original start
    value_index = np.arange(total, dtype=np.int64) - np.repeat(new_offsets[:-1] - starts, counts)
    return new_offsets, value_index


def dense_mask(ids: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """A boolean ``(records, width)`` mask with ``mask[i, ids[offsets[i]:offsets[i+1]]] = True``.

    Cost: one ``records x width`` allocation plus a scatter of the ids.

    Parameters
    ----------
    ids : numpy.ndarray
        Integer ids in ``[0, width)``, the CSR values.
    offsets : numpy.ndarray
        CSR offsets delimiting each record's ids.
    width : int
        Number of mask columns (e.g. the action count).

    Returns
    -------
    numpy.ndarray
        The bool mask.
    """
    records = len(offsets) - 1
    mask = np.zeros((records, width), dtype=bool)
    rows = np.repeat(np.arange(records), np.diff(offsets))
    mask[rows, ids] = True
    return mask
