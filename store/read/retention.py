"""Which records a capped store keeps.

The newest ``capacity`` records across all writers, by commit time (docs/FORMAT.md, "Reading a
store" and "Capacity and reclamation"). Pure functions of the live fragments: readers show what
:func:`visible_from` keeps, writers reclaim what lies beyond it and a grace margin
(:func:`reclaimable`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np

from replaystore.store.format.fragment import Fragment


def grace(capacity: int) -> int:
    """The grace margin of a capped store.

    How many records beyond ``capacity`` stay stored after eviction, for readers
    whose view lags (docs/FORMAT.md, "Capacity and reclamation").

    Parameters
    ----------
    capacity : int
        The store's capacity.

    Returns
    -------
    int
        ``max(capacity // 4, 1)``.
    """
    return max(capacity // 4, 1)


def visible_from(frags: list[Fragment], capacity: int) -> np.ndarray:
    """Per fragment, the local offset from which its rows are among the newest ``capacity``.

    All parts ordered newest first by ``(time_ns, writer, seq)`` (then fragment,
    offset), records taken from them until ``capacity`` are. Cost: a lexsort of
    every append part of the live fragments.

    Parameters
    ----------
    frags : list of Fragment
        The live fragments.
    capacity : int
        The records kept.

    Returns
    -------
    numpy.ndarray
        int64 per fragment: its first visible local row (``f.rows``: none visible).
    """
    vis_from = np.array([f.rows for f in frags], dtype=np.int64)
    if not frags:
        return vis_from
    tables = [f.part_table for f in frags]
    counts = np.array([len(t) for t in tables], dtype=np.int64)
    parts = np.concatenate(tables)
    frag = np.repeat(np.arange(len(frags), dtype=np.int64), counts)
    writer = np.repeat(np.array([f.writer for f in frags], dtype=np.int64), counts)
    time_ns, seq, rows, offset = parts.T
    order = np.lexsort((rows, offset, frag, seq, writer, time_ns))[::-1]
    rows, offset, frag = rows[order], offset[order], frag[order]
    before = np.cumsum(rows) - rows  # records taken before each part
    taken = before < capacity
    take = np.minimum(rows[taken], capacity - before[taken])
    # a fragment's rows are visible from the oldest part taken from it: its last in this order
    last = frag[taken][::-1]
    ids, at = np.unique(last, return_index=True)
    vis_from[ids] = (offset[taken] + rows[taken] - take)[::-1][at]
    return vis_from


def retained_parts(frags: list[Fragment], budget: int) -> set[tuple[int, int]]:
    """``(writer, seq)`` of the append parts holding any of the newest ``budget`` records.

    Empty parts among them are included: kept is the safe side for a reclaim.
    Cost: a sort of every append part.

    Parameters
    ----------
    frags : list of Fragment
        The live fragments.
    budget : int
        Records to keep.

    Returns
    -------
    set of tuple of int
        The retained parts.
    """
    parts = sorted(((t, f.writer, seq, rows) for f in frags for seq, t, rows in f.parts), reverse=True)
    kept: set[tuple[int, int]] = set()
    for _, writer, seq, rows in parts:
        if budget <= 0:
            break
        kept.add((writer, seq))
        budget -= rows
    return kept


def reclaimable(counts: list[tuple[Fragment, int]], writer: int, writing: set[str],
                is_gone: Callable[[int], bool]) -> set[str]:
    """The units writer ``writer`` may delete (docs/FORMAT.md, "Capacity and reclamation").

    From each live fragment with its rows beyond the grace margin: fragments of
    their own wholly evicted, and segments all of whose fragments are, when
    nobody adds to them any more: full ones, ``writer``'s own not in
    ``writing``, and those of writers ``is_gone`` (asked last: it may probe
    liveness). Cost: the fragments.

    Parameters
    ----------
    counts : list of tuple of (Fragment, int)
        Each live fragment with its first local row within the grace margin.
    writer : int
        The reclaiming writer's id.
    writing : set of str
        Names of the segments ``writer`` still appends to.
    is_gone : callable
        Whether a writer id is gone (no longer appends).

    Returns
    -------
    set of str
        Object paths (fragment or segment directories) to delete.
    """
    evicted = {(f.writer, f.name) for f, v in counts if v >= f.rows}
    paths = {f.path for f, v in counts if v >= f.rows and f.segment is None}
    segments: dict[tuple[int, str], list[Fragment]] = {}
    for f, _ in counts:
        if f.segment is not None:
            segments.setdefault((f.writer, f.segment.name), []).append(f)
    for (owner, name), backed in segments.items():
        if all((f.writer, f.name) in evicted for f in backed) and (
                max(f.segment.row + f.rows for f in backed) == backed[0].segment.capacity  # type: ignore[union-attr]
                or (name not in writing if owner == writer else is_gone(owner))):
            paths.add(backed[0].path)
    return paths


_SEGMENT_NAME = re.compile(r"s[0-9]{10}")


def unreferenced_segments(names: Iterable[str], live: set[str]) -> list[str]:
    """A gone writer's segments no live fragment of its final log is backed by.

    Spares, a segment its last uncommitted appends went to, segments it retired
    and did not finish deleting (docs/FORMAT.md, "Capacity and reclamation").
    Cost: the names.

    Parameters
    ----------
    names : iterable of str
        The names listed under the writer's ``data/<table>/`` (data, validated
        here: only segment names count).
    live : set of str
        Names of the segments live fragments are backed by.

    Returns
    -------
    list of str
        Sorted segment names.
    """
    return sorted(n for n in names if _SEGMENT_NAME.fullmatch(n) and n not in live)
