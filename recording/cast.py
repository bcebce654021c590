"""Safe casts of environment values to a field's dtype and shape, checked before anything is buffered.

The rule: a value keeps its meaning or is refused. Casts numpy calls ``safe`` pass as they are;
``same_kind`` casts (float64 -> float32, int64 -> uint8, int64 -> float32) pass when the values
survive them (no overflow to infinity, no integer out of range, integers exactly representable);
anything else (a float into an integer or bool field, an int into a bool field, a string, an
object) is an :class:`~replaystore.errors.UnsafeCastError` naming the field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import DTypeError, IdRangeError, NonFiniteError, ShapeError, UnsafeCastError

_NUMERIC = "biuf"


def as_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array (a CPU torch tensor, a Python scalar or list, a numpy value).

    Raises DTypeError (naming ``name``) for values that are not bool or numeric. Cost: no copy
    for numpy arrays; one for tensors on the CPU when they are not contiguous.
    """
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DTypeError(name, "a bool or numeric value", type(value).__name__) from exc
    if arr.dtype.kind not in _NUMERIC:
        raise DTypeError(name, "a bool or numeric value", f"{arr.dtype} value {_show(arr)}")
    return arr


def _show(arr: np.ndarray) -> str:
    text = np.array2string(arr.reshape(-1)[:4], separator=", ")
    return text if arr.size <= 4 else text[:-1] + ", ...]"


def cast(name: str, value: Any, dtype: np.dtype, shape: tuple[int, ...], *, finite: bool = False) -> np.ndarray:
    """``value`` as a new array of ``dtype`` shaped ``shape``, or a typed error naming ``name``.

    Parameters
    ----------
    name
        The field named in errors.
    value
        A numpy array, CPU tensor or Python value.
    dtype, shape
        What the field holds (``shape`` includes any leading batch axis).
    finite
        Refuse NaN and infinities (the field's ``finite`` flag).

    Returns
    -------
    numpy.ndarray
        A copy, so later changes to ``value`` do not reach it.

    Raises
    ------
    ShapeError
        The shape differs.
    UnsafeCastError
        The dtype cannot hold the values unchanged.
    NonFiniteError
        ``finite`` and a value is NaN or infinite.

    Cost: one pass over the values per check (a few for narrowing casts).
    """
    arr = value if isinstance(value, np.ndarray) and value.dtype.kind in _NUMERIC else as_array(name, value)
    if arr.shape != shape:
        raise ShapeError(name, f"shape {shape}", f"shape {arr.shape}")
    src = arr.dtype
    if src == dtype:
        out = arr.copy()
    elif np.can_cast(src, dtype, "safe"):
        out = arr.astype(dtype)
    elif np.can_cast(src, dtype, "same_kind"):
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked next
            out = arr.astype(dtype)
        _check_same_kind(name, arr, out)
    else:
        raise UnsafeCastError(name, f"values castable to {dtype}", f"{src} value {_show(arr)}",
                              f"a {src} -> {dtype} cast would change values; cast it yourself if that is meant")
    if finite and dtype.kind == "f" and not np.isfinite(out).all():
        raise NonFiniteError(name, "finite values", f"{_show(out[~np.isfinite(out)])}")
    return out


def _check_same_kind(name: str, arr: np.ndarray, out: np.ndarray) -> None:
    """UnsafeCastError where a ``same_kind`` cast changed a value (overflow, range, precision)."""
    dst = out.dtype
    if dst.kind == "f" and arr.dtype.kind == "f":
        bad = np.isfinite(arr) & ~np.isfinite(out)  # overflow to infinity
    elif dst.kind in "iu" and arr.dtype.kind in "iu":
        info = np.iinfo(dst)
        bad = (arr < info.min) | (arr > info.max)
    else:  # integers into a float too narrow to hold them all exactly
        bad = out.astype(arr.dtype) != arr
    if bad.any():
        raise UnsafeCastError(name, f"values {dst} holds unchanged", f"{arr.dtype} value {_show(arr[bad])}")


def check_bounds(name: str, arr: np.ndarray, low: np.ndarray | int, high: np.ndarray | int) -> None:
    """IdRangeError naming ``name`` unless ``low <= arr < high`` everywhere (broadcast).

    Cost: two comparisons over ``arr``.
    """
    bad = (arr < low) | (arr >= high)
    if np.any(bad):
        bad = np.broadcast_to(bad, arr.shape)
        raise IdRangeError(name, f"values in [{_bound(low)}, {_bound(high)})", f"{_show(arr[bad])}")


def _bound(b: np.ndarray | int) -> str:
    arr = np.asarray(b)
    return str(int(arr)) if arr.ndim == 0 else np.array2string(arr, separator=", ")
