"""Stream keys: checking them, coding them as small integers, grouping records by stream.

The codes are the ``_stream`` index array's: a batch's (or a fragment's) keys, numbered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from replaystore.errors import StepRangeError, StreamKeyError

StreamKey: TypeAlias = int | str
STREAM_CODE = np.dtype(np.int32)
"""The dtype of the ``_stream`` codes: indices into a fragment's (or a batch's) stream keys."""

MAX_STEP = 2**63 - 2
"""The largest step a record may carry (docs/FORMAT.md, "Streams and steps"): steps are int64
and ``step + 1`` (the adjacent step) must be one too."""

Coded: TypeAlias = tuple[np.ndarray, list[StreamKey]]
"""Stream keys of a batch's records: each record's code, an index into the distinct keys in
order of first appearance, and those keys."""


class StreamKeys:
    """The stream keys of records being written and their ``_stream`` codes (in order of first use).

    Attributes
    ----------
    keys : list of StreamKey
        The keys, in order of first use (a key's code is its index).
    """

    def __init__(self) -> None:
        self.keys: list[StreamKey] = []
        self._code: dict[StreamKey, int] = {}

    def __len__(self) -> int:
        """The number of keys."""
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a code."""
        return key in self._code

    def codes(self, keys: Sequence[StreamKey]) -> np.ndarray:
        """The code of each of ``keys``; keys not seen before get the next codes.

        Cost: one dict lookup per key.

        Parameters
        ----------
        keys : sequence of StreamKey
            Checked stream keys.

        Returns
        -------
        numpy.ndarray
            int32 codes.
        """
        out = np.empty(len(keys), dtype=STREAM_CODE)
        for i, key in enumerate(keys):
            code = self._code.get(key)
            if code is None:
                code = self._code[key] = len(self.keys)
                self.keys.append(key)
            out[i] = code
        return out

    def truncate(self, count: int) -> None:
        """Forget every key after the first ``count``.

        Parameters
        ----------
        count : int
            Keys to keep.
        """
        for key in self.keys[count:]:
            del self._code[key]
        del self.keys[count:]


def check_key(value: Any) -> StreamKey:
    """``value`` as a stream key (a Python int or str).

    Parameters
    ----------
    value : Any
        An int, str, numpy integer or numpy str.

    Returns
    -------
    StreamKey
        ``int(value)`` or ``str(value)``.

    Raises
    ------
    StreamKeyError
        Anything else (bools too).
    """
    if isinstance(value, (bool, np.bool_)):
        raise StreamKeyError("stream", "an int or str stream key", f"bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (str, np.str_)):
        return str(value)
    raise StreamKeyError("stream", "an int or str stream key", f"{type(value).__name__} {value!r}")


def check_step_range(first: int, last: int, key: StreamKey | None) -> None:
    """Check that the steps ``first .. last`` (Python ints) lie in ``[0, MAX_STEP]``.

    Parameters
    ----------
    first : int
        The smallest step.
    last : int
        The largest step.
    key : StreamKey, optional
        The stream, named in the error.

    Raises
    ------
    StepRangeError
        A step lies outside the range.
    """
    where = "" if key is None else f" in stream {key!r}"
    if first < 0:
        raise StepRangeError("step", f"steps in [0, {MAX_STEP}]{where}", f"step {first}")
    if last > MAX_STEP:
        raise StepRangeError("step", f"steps in [0, {MAX_STEP}]{where}", f"step {last}")


def per_record_keys(stream: Any, n: int) -> list[StreamKey]:
    """One key per record.

    Parameters
    ----------
    stream : Any
        A key, or ``n`` keys.
    n : int
        The number of records.

    Returns
    -------
    list of StreamKey
        ``n`` checked keys.

    Raises
    ------
    StreamKeyError
        None, a key that is not an int or str, or a number of keys other than ``n``.
    """
    values = _values(stream, n)
    return [check_key(stream)] * n if values is None else [check_key(v) for v in values]


def stream_codes(stream: Any, n: int) -> Coded:
    """The :data:`Coded` keys of ``n`` records.

    Integer and string arrays are coded without a Python object per record
    (one ``np.unique``); other sequences cost a dict lookup per record.

    Parameters
    ----------
    stream : Any
        A key, or ``n`` keys (a sequence or a 1-D array).
    n : int
        The number of records.

    Returns
    -------
    Coded
        Each record's code and the distinct keys in order of first appearance.

    Raises
    ------
    StreamKeyError
        None, a key that is not an int or str, or a number of keys other than ``n``.
    """
    values = _values(stream, n)
    if values is None:
        return np.zeros(n, dtype=STREAM_CODE), [check_key(stream)] if n else []
    if isinstance(stream, np.ndarray) and stream.ndim == 1 and stream.dtype.kind in "iuU":
        uniq, first, inverse = np.unique(stream, return_index=True, return_inverse=True)
        order = np.argsort(first)
        rank = np.empty(len(order), dtype=STREAM_CODE)
        rank[order] = np.arange(len(order), dtype=STREAM_CODE)
        return rank[inverse.reshape(-1)], uniq[order].tolist()
    return codes_of([check_key(v) for v in values])


def _values(stream: Any, n: int) -> list[Any] | None:
    """``stream``'s ``n`` per-record values, or None when it is one key for every record."""
    if stream is None:
        raise StreamKeyError("stream", "a stream key (int or str) or one key per record", "None")
    if isinstance(stream, (int, str, np.integer, np.str_, bool, np.bool_)):
        return None
    if hasattr(stream, "tolist"):
        values = stream.tolist()
    else:
        try:
            values = list(stream)
        except TypeError:  # not iterable: a scalar of the wrong type (float, object, ...)
            values = stream
    if not isinstance(values, list):  # numpy scalars and 0-d arrays: one key for every record
        return None
    if len(values) != n:
        raise StreamKeyError("stream", f"{n} per-record stream keys", f"{len(values)}")
    return values


def codes_of(keys: list[StreamKey]) -> tuple[np.ndarray, list[StreamKey]]:
    """Each record's index into the distinct ``keys`` (in order of appearance), and those keys.

    Parameters
    ----------
    keys : list of StreamKey
        One checked key per record.

    Returns
    -------
    codes : numpy.ndarray
        int32 per record.
    keys : list of StreamKey
        The distinct keys.
    """
    uniq = list(dict.fromkeys(keys))
    if len(uniq) <= 1:
        return np.zeros(len(keys), dtype=STREAM_CODE), uniq
    code_of = {k: i for i, k in enumerate(uniq)}
    return np.fromiter((code_of[k] for k in keys), dtype=STREAM_CODE, count=len(keys)), uniq


def group_positions(codes: np.ndarray, count: int) -> list[np.ndarray]:
    """The positions of each code ``0 .. count - 1`` in ``codes``, ascending.

    Cost: one stable argsort.

    Parameters
    ----------
    codes : numpy.ndarray
        Codes in ``[0, count)``.
    count : int
        The number of codes.

    Returns
    -------
    list of numpy.ndarray
        Per code, its positions.
    """
    if count <= 1:
        return [np.arange(len(codes))] * count
    order = np.argsort(codes, kind="stable")
    return np.split(order, np.cumsum(np.bincount(codes, minlength=count))[:-1])
