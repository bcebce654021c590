"""Row ids as arguments: the check every read applies to the ids (or positions) it is given."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import RowIdTypeError

_INT64 = np.dtype(np.int64)
_INT64_MAX = np.iinfo(np.int64).max


def row_array(values: Any, argument: str = "rows") -> np.ndarray:
    """``values`` as an int64 array of row ids (or positions), refusing anything but integers.

    Cost: none for an int64 array; one conversion for other integer dtypes.

    Parameters
    ----------
    values : array_like of int
        An int, a sequence of ints, or an array of any integer dtype.
    argument : str, optional
        What ``values`` are, named in the error.

    Returns
    -------
    numpy.ndarray
        int64 (the input itself where it already is an int64 array).

    Raises
    ------
    RowIdTypeError
        Floats (``1.5`` is no row id), booleans (a mask is no list of ids), strings, objects,
        or unsigned values past the int64 range. An empty sequence is accepted.
    """
    a = values if isinstance(values, np.ndarray) else np.asarray(values)
    dtype = a.dtype
    if dtype == _INT64:
        return a
    if dtype.kind in "iu":
        if dtype.kind == "u" and dtype.itemsize == 8 and a.size and int(a.max()) > _INT64_MAX:
            raise RowIdTypeError(argument, f"unsigned values past the int64 range (up to {int(a.max())})")
        return a.astype(np.int64)
    if a.size == 0:  # (``[]`` becomes float64: no id, nothing to refuse)
        return np.zeros(a.shape, dtype=np.int64)
    what = "booleans (a mask: pass np.flatnonzero(mask) for the ids it selects)" if dtype.kind == "b" else \
        f"values of dtype {dtype}"
    raise RowIdTypeError(argument, what)


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only (no copy): a view's arrays are never written."""
    a.flags.writeable = False
    return a
