"""Gathers of records from a table's arrays: the CSR index, the per-fragment gather, the index arrays.

Pure functions over arrays and one :class:`~replaystore.store.read.view.TableView`: the table's
reader (store/read/table.py) chooses the arrays (contiguous views or one fragment's) and calls
one of them once per read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replaystore.errors import CorruptObjectError
from replaystore.schemas.csr import gather_csr
from replaystore.store.format.fragment import Fragment, FragmentData
from replaystore.store.read.view import TableView

_PAIR = np.array([0, 1], dtype=np.int64)
"""Added to local offsets ``[:, None]``: the (start, end) offsets indices of each record."""

_ZERO = np.zeros(1, dtype=np.int64)
_NO_SHIFT = np.zeros(0, dtype=np.int64)
_max, _cumsum = np.maximum.reduce, np.add.accumulate


def gather(array: Callable[[str], np.ndarray], loc: np.ndarray, shifts: dict[str, np.ndarray] | None,
           frag_i: np.ndarray, dense: list[Any], ragged: list[Any], v: TableView,
           csr: Any) -> dict[str, np.ndarray]:
    """Records at rows ``loc`` of ``array(name)`` for the arrays of ``dense`` and ``ragged``, in that order.

    Parameters
    ----------
    array : callable
        One fragment's arrays by name (``shifts`` None) or the contiguous views.
    loc : numpy.ndarray
        int64 rows of ``array(name)``.
    shifts : dict of str to numpy.ndarray or None
        For the contiguous views: ``shifts[offsets]`` is the base row of each record's
        fragment in that group's values.
    frag_i : numpy.ndarray
        Each record's visible fragment index in ``v`` (named by errors).
    dense, ragged : list
        The read plan (see ``ReadPlans.of``, store/read/plan.py).
    v : TableView
        The view read.
    csr : module or None
        The compiled CSR index (store/read/csrkernels.py), or None for numpy (anything where
        ``ragged`` is empty).

    Returns
    -------
    dict of str to numpy.ndarray
        Dense fields, rebased CSR offsets and ragged values.

    Raises
    ------
    CorruptObjectError
        CSR offsets that point outside their fragment's values.
    """
    out: dict[str, np.ndarray] = {}
    for name, _, _ in dense:
        out[name] = array(name).take(loc, axis=0)
    if ragged and csr is not None:
        for off_name, values in ragged:
            new_offsets = np.empty(len(loc) + 1, dtype=np.int64)
            shift = _NO_SHIFT if shifts is None else shifts[off_name]
            ok, value_index = csr.csr_index(array(off_name), loc, shift, v._max_nnz[off_name], new_offsets)
            if not ok:
                offsets = array(off_name)
                raise bad_offsets(off_name, offsets.take(loc), offsets.take(loc + 1), frag_i, v)
            out[off_name] = new_offsets
            for name, _ in values:
                out[name] = array(name).take(value_index)
    elif ragged:
        # (numpy ufunc methods called directly: at 256 rows the wrappers of min/cumsum cost
        # as much as the work)
        loc1 = loc + 1
        for off_name, values in ragged:
            offsets = array(off_name)
            starts, ends = offsets.take(loc), offsets.take(loc1)
            top = v._max_nnz[off_name]  # as unsigned, a negative offset is above it too
            if _max(starts.view(np.uint64)) > top or _max(ends.view(np.uint64)) > top:
                raise bad_offsets(off_name, starts, ends, frag_i, v)
            counts = ends - starts
            cum = _cumsum(counts)
            first = ends - cum  # each record's first value index, less its place in the output
            if shifts is not None:
                first += shifts[off_name]
            try:
                value_index = first.repeat(counts)  # (bounded: every count <= top)
            except ValueError:  # a negative count
                raise bad_offsets(off_name, starts, ends, frag_i, v) from None
            value_index += np.arange(len(value_index), dtype=np.int64)
            out[off_name] = np.concatenate((_ZERO, cum))
            for name, _ in values:
                out[name] = array(name).take(value_index)
    return out


def gather_fragments(data_of: Callable[[Fragment], FragmentData], frags: Sequence[Fragment], frag_i: np.ndarray,
                     local: np.ndarray, dense: list[Any], ragged: list[Any]) -> dict[str, np.ndarray]:
    """Records at ``(frag_i, local)`` gathered fragment by fragment, in the order given.

    Parameters
    ----------
    data_of : callable
        Opens a fragment's data (asked for the fragments ``frag_i`` names only).
    frags : sequence of Fragment
        The view's visible fragments.
    frag_i, local : numpy.ndarray
        Each record's visible fragment index and local row (checked by ``TableReader.locate``),
        more than one fragment among them.
    dense, ragged : list
        The read plan (see ``ReadPlans.of``, store/read/plan.py).

    Returns
    -------
    dict of str to numpy.ndarray
        As :func:`gather`. Cost: rows grouped by fragment once; per field one ``take`` per
        fragment touched plus one permutation back to the requested order; ragged values
        through CSR offsets computed for all rows at once.

    Raises
    ------
    CorruptObjectError
        CSR offsets that point outside their fragment's values.
    """
    n = len(frag_i)
    order = np.argsort(frag_i, kind="stable")
    sorted_i = frag_i[order]
    cuts = (np.flatnonzero(sorted_i[1:] != sorted_i[:-1]) + 1).tolist()
    spans = list(zip([0, *cuts], [*cuts, n], strict=True))
    opened = [data_of(frags[int(sorted_i[s])]) for s, _ in spans]
    sorted_local = local[order]
    locs = [sorted_local[s:e] for s, e in spans]
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    for name, shape, dtype in dense:
        buf = np.empty((n, *shape), dtype=dtype)
        for data, loc, (s, e) in zip(opened, locs, spans, strict=True):
            data.array(name).take(loc, axis=0, out=buf[s:e], mode="clip")  # loc checked by locate
        out[name] = buf.take(inv, axis=0)
    if ragged:
        # (start, end) offsets index pairs: one take per fragment and offsets array
        pairs = sorted_local[:, None] + _PAIR
        for off_name, values in ragged:
            bounds = np.empty((n, 2), dtype=np.int64)
            for data, (s, e) in zip(opened, spans, strict=True):
                data.array(off_name).take(pairs[s:e], out=bounds[s:e], mode="clip")
            starts = bounds[:, 0]
            counts = bounds[:, 1] - starts
            sorted_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(counts, out=sorted_offsets[1:])
            # index of each gathered value in its own fragment's values array
            value_index = np.arange(int(sorted_offsets[-1]), dtype=np.int64) + np.repeat(
                starts - sorted_offsets[:-1], counts)
            new_offsets, perm = gather_csr(sorted_offsets, inv)
            out[off_name] = new_offsets
            for name, dtype in values:
                buf = np.empty(len(value_index), dtype=dtype)
                for data, (s, e) in zip(opened, spans, strict=True):
                    lo, hi = int(sorted_offsets[s]), int(sorted_offsets[e])
                    data.array(name).take(value_index[lo:hi], out=buf[lo:hi])  # raises on bad offsets
                out[name] = buf.take(perm)
    return out


def bad_offsets(off_name: str, starts: np.ndarray, ends: np.ndarray, frag_i: np.ndarray,
                v: TableView) -> CorruptObjectError:
    """The error for a gather whose offsets ``starts``/``ends`` point outside their fragment's values.

    Reads check only what keeps a gather bounded (no negative offset or count, no end
    beyond the largest fragment's values); offsets damaged within that range read wrong
    values, as any damaged data would: ``replaystore verify`` finds them by checksum.

    Parameters
    ----------
    off_name : str
        The CSR offsets array.
    starts, ends : numpy.ndarray
        Each gathered record's offsets.
    frag_i : numpy.ndarray
        Each record's visible fragment index in ``v``.
    v : TableView
        The view read.

    Returns
    -------
    CorruptObjectError
        Naming the first bad record's fragment's offsets array.
    """
    bad = (ends < starts) | (starts < 0) | (ends > v._nnz[off_name][frag_i])
    frag = v._frags[int(frag_i[np.argmax(bad)])]
    return CorruptObjectError(f"{frag.path}/{off_name}", "offsets out of range (run replaystore verify)")


def empty(dense: list[Any], ragged: list[Any]) -> dict[str, np.ndarray]:
    """What a gather of no records returns for the read plan ``(dense, ragged)``.

    Parameters
    ----------
    dense, ragged : list
        The read plan (see ``ReadPlans.of``, store/read/plan.py).

    Returns
    -------
    dict of str to numpy.ndarray
        Empty arrays, and ``[0]`` for each CSR offsets array.
    """
    out: dict[str, np.ndarray] = {name: np.empty((0, *shape), dtype=dtype) for name, shape, dtype in dense}
    for off_name, values in ragged:
        out[off_name] = np.zeros(1, dtype=np.int64)
        for name, dtype in values:
            out[name] = np.empty(0, dtype=dtype)
    return out


def gather_index(data_of: Callable[[Fragment], FragmentData], frags: Sequence[Fragment], frag_i: np.ndarray,
                 local: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(stream keys as object array, steps, resets)`` of the records at ``(frag_i, local)``.

    The parameters are :func:`gather_fragments`' first four.

    Returns
    -------
    tuple of numpy.ndarray
        Cost: one read of the index arrays per fragment touched.
    """
    streams = np.empty(len(frag_i), dtype=object)
    steps = np.empty(len(frag_i), dtype=np.int64)
    resets = np.empty(len(frag_i), dtype=bool)
    for fi, pos in group(frag_i):
        frag = frags[fi]
        data = data_of(frag)
        loc = local[pos]
        keys = np.array(frag.streams + [None], dtype=object)[:-1]
        streams[pos] = keys[data.array("_stream")[loc]]
        steps[pos] = data.array("_step")[loc]
        resets[pos] = data.array("_reset")[loc]
    return streams, steps, resets


def group(frag_i: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Positions grouped by fragment.

    Parameters
    ----------
    frag_i : numpy.ndarray
        Each position's fragment index.

    Returns
    -------
    list of tuple
        ``[(fragment index, positions), ...]``, by fragment index.
    """
    if not len(frag_i):
        return []
    if frag_i[0] == frag_i[-1] and (frag_i == frag_i[0]).all():  # one fragment: no sort
        return [(int(frag_i[0]), np.arange(len(frag_i)))]
    order = np.argsort(frag_i, kind="stable")
    sorted_i = frag_i[order]
    cuts = np.flatnonzero(np.diff(sorted_i)) + 1
    return [(int(sorted_i[s]), order[s:e]) for s, e in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True)]
