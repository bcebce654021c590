"""Compaction policy and the rewrite of a run of fragments as one (docs/FORMAT.md, "Compaction").

Which of a writer's fragments to merge is decided here, from their sizes, segments and row
ranges alone; the writer's compactor (store/write/compactor.py) runs the merges and publishes them with
``compact`` commit records.

Arguments named as in :mod:`replaystore.store.format` (``storage``, ``schema``, ``writer``,
``table``) mean the same here (see its docstring); ``frags`` is a writer's fragments in row
order and ``max_rows`` the fragment size cap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from replaystore.errors import StaleReadError
from replaystore.schemas import Schema
from replaystore.store.format import layout
from replaystore.store.format.fragment import Fragment, FragmentData, SegmentRef, coalesce
from replaystore.store.format.segment import Segment, segment_bytes
from replaystore.store.format.staging import StagedFragment
from replaystore.store.storage import Storage

COMPACT_FANIN = 8
"""Fragments per merge in the background policy: a run is merged once it has this many."""
MERGE_FETCH_THREADS = 8


def segment_run(frags: list[Fragment]) -> list[Fragment]:
    """The trailing fragments in the last fragment's segment (merging them moves no data).

    Parameters
    ----------
    frags : list of Fragment
        A writer's fragments in row order; the last is segment-backed.

    Returns
    -------
    list of Fragment
        The run.
    """
    seg = frags[-1].segment
    n = 1
    while n < len(frags) and frags[-1 - n].segment is not None and frags[-1 - n].segment.name == seg.name:  # type: ignore[union-attr]
        n += 1
    return frags[-n:]


def tiered_run(frags: list[Fragment], max_rows: int) -> list[Fragment]:
    """The trailing run of small fragments a merge would rewrite (size-tiered).

    An older fragment joins only if the newer ones at least match it, so every
    merge at least doubles a record's fragment and each record is rewritten
    O(log n) times.

    Returns
    -------
    list of Fragment
        The run (possibly empty).
    """
    run: list[Fragment] = []
    total = 0
    for f in reversed(frags):
        if f.segment is not None or f.rows * COMPACT_FANIN > max_rows or total + f.rows > max_rows:
            break
        if run and f.rows > total:
            # size-tiered: an older fragment joins only if the newer ones at least match it,
            # so every merge at least doubles a record's fragment and each record is
            # rewritten O(log n) times (re-merging one growing fragment was O(n) per record)
            break
        run.insert(0, f)
        total += f.rows
    return run


def due_run(frags: list[Fragment], max_rows: int) -> list[Fragment]:
    """The trailing run due for a background merge, if it has reached the fan-in (else empty).

    Segment-backed fragments of one segment, to be described as one, or small
    fragments.

    Returns
    -------
    list of Fragment
        At least :data:`COMPACT_FANIN` fragments, or none.
    """
    if not frags:
        return []
    run = segment_run(frags) if frags[-1].segment is not None else tiered_run(frags, max_rows)
    return run if len(run) >= COMPACT_FANIN else []


def full_runs(frags: list[Fragment], visible: set[str], max_rows: int) -> list[list[Fragment]]:
    """Every run a full compaction merges.

    Adjacent fragments of one kind (one segment's, or fragments of their own) up
    to ``max_rows`` records; runs of one fragment are left out.

    Parameters
    ----------
    visible : set of str
        Names of the fragments every reader sees whole.

    Returns
    -------
    list of list of Fragment
        The runs.
    """
    runs: list[list[Fragment]] = [[]]
    for f in frags:
        run = runs[-1]
        adjacent = bool(run) and run[-1].row_start + run[-1].rows == f.row_start
        if f.name not in visible:
            runs.append([])
            continue
        same = not run or (run[-1].segment is None) == (f.segment is None) and (
            f.segment is None or run[-1].segment.name == f.segment.name)  # type: ignore[union-attr]
        big = f.segment is None and sum(g.rows for g in run) + f.rows > max_rows
        if not adjacent or not same or big:
            runs.append([f])
        else:
            run.append(f)
    return [run for run in runs if len(run) > 1]


def rewrite(storage: Storage, schema: Schema, writer: int, table: str, name: str,
            run: list[Fragment], may_delete: Callable[[], bool] | None = None) -> tuple[Fragment, str] | None:
    """Write ``run``'s records as one new fragment ``name`` of ``writer``.

    The fragment is durable but not yet referenced by any commit record. Cost:
    reading and rewriting the run's records (on object storage, one GET per
    array, issued concurrently).

    Parameters
    ----------
    name : str
        The new fragment's name.
    run : list of Fragment
        Adjacent fragments to merge, in row order.
    may_delete : callable, optional
        Asked before a failure deletes what was written (see ``StagedFragment``).

    Returns
    -------
    tuple of (Fragment, str) or None
        The new fragment and the path of its objects, or None (and nothing left
        behind) if part of the run was evicted and reclaimed while it was read.

    Raises
    ------
    CorruptObjectError
        A fragment's object fails its integrity check.
    OSError
        The storage failed.
    """
    staged = StagedFragment(storage, schema, writer, table, name, run[0].row_start, may_delete=may_delete)
    try:
        datas = [FragmentData(storage, schema, f, cached=False) for f in run]  # read once: not worth a cache
        if not storage.supports_local_paths:  # object storage: one GET per array, issued concurrently
            names = [spec.name for spec in schema.zarr_layout()] + list(layout.INDEX_ARRAYS)
            with ThreadPoolExecutor(MERGE_FETCH_THREADS, thread_name_prefix="replaystore-fetch") as pool:
                for _ in pool.map(lambda job: job[0].array(job[1]), [(d, n) for d in datas for n in names]):
                    pass
        for f, data in zip(run, datas, strict=True):
            staged.add(data.columns(), data.array("_stream"), f.streams, data.array("_step"), data.array("_reset"))
        merged = staged.finish([p for f in run for p in f.parts])
    except BaseException as exc:
        staged.abort()
        if isinstance(exc, StaleReadError):
            return None
        raise
    staged.close()
    return merged, staged.path


def segment_runs(frags: list[Fragment]) -> dict[str, list[Fragment]]:
    """A writer's segment-backed fragments, grouped by segment (each group in row order).

    Parameters
    ----------
    frags : list of Fragment
        A writer's live fragments of one table, in row order.

    Returns
    -------
    dict of str to list of Fragment
        Segment name to the live fragments it backs.
    """
    out: dict[str, list[Fragment]] = {}
    for f in frags:
        if f.segment is not None:
            out.setdefault(f.segment.name, []).append(f)
    return out


def right_capacity(run: list[Fragment]) -> tuple[int, dict[str, int]]:
    """The capacity that holds exactly the committed rows and values of the segment backing ``run``.

    Rows from the segment's first to the end of the last live fragment; values likewise (at
    least one row and one value per CSR group, so no array is empty).

    Parameters
    ----------
    run : list of Fragment
        Every live fragment one segment backs.

    Returns
    -------
    tuple of (int, dict of str to int)
        Rows, and values per CSR group.
    """
    seg = run[0].segment
    assert seg is not None
    rows = max(1, max(f.segment.row + f.rows for f in run))  # type: ignore[union-attr]
    values = {k: max(1, max(f.value_end(k) for f in run)) for k in seg.value_capacity}
    return rows, values


def underfilled(schema: Schema, run: list[Fragment]) -> bool:
    """Whether the segment backing ``run`` is less than half full, by the bytes of its files.

    Such a segment's files are more than twice the size of what was written to them (the
    rest is a sparse hole): it is worth copying into a right-sized one once nothing more will
    be added to it (docs/FORMAT.md, "Right-sizing a segment").

    Parameters
    ----------
    run : list of Fragment
        Every live fragment the segment backs.

    Returns
    -------
    bool
        True when its committed bytes are less than half its files' sizes.
    """
    seg = run[0].segment
    assert seg is not None
    rows, values = right_capacity(run)
    return 2 * segment_bytes(schema, rows, values) < segment_bytes(schema, seg.capacity, seg.value_capacity)


def rightsize(storage: Storage, schema: Schema, writer: int, table: str, name: str, segment: str,
              run: list[Fragment]) -> tuple[Fragment, str] | None:
    """Copy the committed bytes of the segment backing ``run`` into a new, right-sized segment.

    The new segment ``segment`` has the capacity of :func:`right_capacity`, and its files hold
    the old one's first bytes, so every record keeps its row and values position and every
    part its checksums; the returned fragment ``name`` describes ``run`` (coalesced) in it. It
    is durable but not yet referenced by any commit record. The old segment's files are only
    read (readers may map them).

    Parameters
    ----------
    storage : Storage
        The store's storage (local).
    name : str
        The new fragment's name.
    segment : str
        The new segment's name.
    run : list of Fragment
        Every live fragment the old segment backs, adjacent, in row order.

    Returns
    -------
    tuple of (Fragment, str) or None
        The new fragment and the new segment's directory, or None (and nothing left behind)
        if ``run`` is not one adjacent run of one segment, or the old segment's files were
        deleted meanwhile (reclaimed).

    Raises
    ------
    CorruptObjectError
        An old segment file is not a regular file or is shorter than its records.
    OSError
        The storage failed (a full disk, for instance); nothing is left behind.
    """
    merged = coalesce(run, name)
    if merged is None or merged.segment is None:  # (not one adjacent run: left as it is)
        return None
    rows, values = right_capacity(run)
    seg = Segment(storage, schema, writer, table, segment, rows, values)
    try:
        seg.copy_from(run[0].path)
    except BaseException as exc:
        seg.close()
        storage.delete(seg.path)
        if isinstance(exc, FileNotFoundError):
            return None
        raise
    seg.close()
    old = merged.segment
    ref = SegmentRef(segment, old.row, dict(old.values), rows, values, old.crc32c)
    return dataclasses.replace(merged, segment=ref), seg.path
