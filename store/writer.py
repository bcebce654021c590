"""The writer: validates appends, buffers them, and commits fragments + one commit record."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import ReadOnlyError, StepOrderError, StoreError, StreamKeyError
from replaystore.schemas import Columns, episode_columns, rollout_columns, validate_tables
from replaystore.schemas.validate import batch_items, to_numpy
from replaystore.store import bodies, layout, liveness, records, retention
from replaystore.store.compaction import due_run, full_runs, rewrite
from replaystore.store.fragment import Fragment, coalesce
from replaystore.store.log import CLOSE
from replaystore.store.segment import SEGMENT_FLOOR_BYTES, VALUES_PER_ROW, Segment, fixed_row_bytes
from replaystore.store.staging import StagedFragment
from replaystore.store.storage import LocalStorage
from replaystore.store.streamkeys import (
    STREAM_CODE,
    Coded,
    StreamKey,
    group_positions,
    per_record_keys,
    stream_codes,
)
from replaystore.store.streamkeys import check_step_range as _check_range

if TYPE_CHECKING:
    from replaystore.store.store import Store

MAX_FRAGMENT_ROWS = 1 << 20
TRASH_GRACE_NS = 30 * 10**9


@dataclass
class _Pending:
    """One append of a table: its records are in the table's staged fragment."""

    rows: int
    meta: dict[str, Any]


@dataclass(frozen=True)
class CommitResult:
    """What one commit made visible."""

    writer: int
    seq: int
    rows: dict[str, tuple[int, int]]  # table -> [first, end) row ids


class Writer:
    """Appends records to a store; one per process. ``with st.writer() as w:`` commits on exit.

    Each writer registers a writer number (create-if-absent on ``writers/NNNNNN``),
    owns every object under that prefix and its own commit sequence.
    """

    def __init__(self, store: Store) -> None:
        if store.mode == "r":
            raise ReadOnlyError("store opened read-only (mode='r'): writer() is not allowed")
        self.store = store
        self.storage = store.storage
        self.id = self._register()
        lock_fd = liveness.hold(self.storage, self.id)  # held until closed (store/liveness.py)
        # released by close(), or when the writer is collected unclosed (it is then gone)
        self._unlock = weakref.finalize(self, os.close, lock_fd) if lock_fd is not None else None
        self._dead: set[int] = set()  # other writers found dead: their segments are reclaimable
        self._swept: set[int] = set()  # dead writers whose unreferenced segments (spares) were deleted
        self.seq = 0
        self.next_row = dict.fromkeys(store.schemas, 0)
        self.fragments: dict[str, list[Fragment]] = {t: [] for t in store.schemas}
        self._pending: dict[str, list[_Pending]] = {t: [] for t in store.schemas}
        self._staged: dict[str, StagedFragment] = {}  # per table: the fragment the pending appends are in
        # format 2 on local storage without capacity: appends go to open segments instead (store/segment.py)
        self._segmented = isinstance(self.storage, LocalStorage) and store.manifest["format_version"] >= 2
        self._open: dict[str, Segment] = {}  # per table: the segment appends go to
        self._filling: dict[str, list[Segment]] = {t: [] for t in store.schemas}  # the pending appends' segments
        self._spares: dict[str, Future[Segment]] = {}  # per table: the next segment, created ahead
        self._io: ThreadPoolExecutor | None = None  # spares and deletions of reclaimed storage
        self._deleting: set[str] = set()  # paths handed to the I/O threads for deletion
        self._deleted: set[str] = set()  # paths deleted (or found gone) by them: the log may list them forever
        self._undeleted: dict[str, BaseException] = {}  # paths whose deletion failed: tried again at the next reclaim
        self._last_step: dict[tuple[str, StreamKey], int] = {}
        self._last_done: dict[tuple[str, StreamKey], bool] = {}
        # what the appends since the last commit replaced in those two maps (None: absent), so that
        # discard() restores them at the cost of the streams appended to, not of all streams written
        self._undo: tuple[dict[tuple[str, StreamKey], int | None], dict[tuple[str, StreamKey], bool | None]] = ({}, {})
        # commit times only move forward, even if this host's clock is behind the log's
        self._time_ns = store.log.time_ns
        self._fresh = False  # whether this append already refreshed the store (see _known_last)
        self._created: dict[int, bytes] = {}  # records created and not yet applied to self.store (by seq)
        self._trash: list[tuple[int, Fragment]] = []  # (due time_ns, compacted-away fragment)
        self._names = itertools.count()  # fragment names f0000000000, f0000000001, ...
        # seq and time allocation, record creation, self.fragments and self._trash: shared with the
        # compaction thread (one merge at a time, self._merging)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._merging: Future[bool] | None = None
        # commit(wait=False): the one commit record being made durable on the committer thread, and
        # the error that broke the writer if making one failed (its records, and every later append, are lost)
        self._committer: ThreadPoolExecutor | None = None
        self._in_flight: Future[None] | None = None
        self._in_flight_segments: set[str] = set()  # the segments it references (not reclaimable)
        self._failed: BaseException | None = None
        self.closed = False

    def _register(self) -> int:
        """Take the next free writer number; its registration records the capacity this writer
        works under. CorruptObjectError, registering nothing, where the manifest's capacity
        differs from one an earlier writer registered under (:func:`bodies.check_capacity`).
        """
        names = self.storage.list(layout.WRITERS)
        bodies.check_capacity(self.storage, self.store.capacity, names)
        n = len(names)
        doc = {**liveness.registration(self.storage), "capacity": self.store.capacity}
        while True:
            if self.storage.create(layout.writer_record(n), records.encode({"writer": n, **doc})):
                return n
            n += 1

    # -- appending --------------------------------------------------------------------
    def append(self, batch: Any, stream: Any = None, step: Any = None, reset: Any = None, *,
               table: str | None = None) -> int:
        """Validate ``batch`` and buffer it until :meth:`commit`; returns the records appended.

        ``stream`` is a key (int or str) or one key per record; ``step`` is None
        (auto-increment per stream) or one step per record, strictly increasing per
        stream; ``reset`` marks recurrent boundaries (a bool for the first record of
        each stream in this append, or one bool per record). An Episode
        (``final_obs`` + ``terminated``) appends as one stream starting with a reset;
        a ``[T, B]`` Rollout appends as B streams (``stream``: one key per slot).
        A batch matching several tables (e.g. a DeepCfrBatch) is split between them.
        Nothing is buffered if anything is invalid. The records are copied into the table's
        staged fragment: the caller may reuse its buffers at once.
        """
        self._check_open()
        self._fresh = False
        done_updates: dict[tuple[str, StreamKey], bool] = {}
        tables = self._convert(batch, 0 if stream is None else stream, stream is None, reset, table, done_updates)
        new_last: dict[tuple[str, StreamKey], int] = {}
        steps = {name: self._steps(name, coded, step, new_last) for name, (_, coded, _) in tables.items()}
        added: list[tuple[StagedFragment | Segment, Any]] = []
        try:
            for name, (cols, (codes, streams), resets) in tables.items():
                frag = self._segment(name, cols, streams) if self._segmented else self._stage(name)
                mark = frag.mark()
                frag.add(cols, codes, streams, steps[name], resets)  # all or nothing
                added.append((frag, mark))
        except BaseException:
            for frag, mark in reversed(added):
                frag.rollback(mark)
            raise
        for name, (cols, _, _) in tables.items():
            self._pending[name].append(_Pending(len(cols), dict(cols.meta)))
        for undo, now, changes in zip(self._undo, (self._last_step, self._last_done), (new_last, done_updates),
                                      strict=True):
            for key in changes.keys() - undo.keys():
                undo[key] = now.get(key)
            now.update(changes)
        return sum(len(cols) for cols, _, _ in tables.values())

    def _stage(self, table: str) -> StagedFragment:
        """The table's staged fragment, opened (named) by the first append after a commit."""
        frag = self._staged.get(table)
        if frag is None:
            frag = self._staged[table] = StagedFragment(self.storage, self.store.schemas[table], self.id, table,
                                                        self._new_name(), self.next_row[table], buffered=True)
        return frag

    def _segment(self, table: str, cols: Columns, streams: list[StreamKey]) -> Segment:
        """The table's open segment, if ``cols`` fit in it; else a new one (the old one is sealed).

        Once the open segment is half full its successor is created on the writer's I/O thread
        (a *spare*: creating a segment's files and directories durably takes ~10 ms),
        so that a rollover rarely waits.
        """
        nnz = {off: int(cols.arrays[off][-1]) - int(cols.arrays[off][0]) for off in cols.schema.offsets_groups}
        seg = self._open.get(table)
        rolled = False  # a full segment was left: the writer fills segments, keep a spare ready
        if seg is None or not seg.fits(len(cols), nnz, streams):
            filling = self._filling[table]
            if seg is not None:
                seg.sealed = rolled = True
                if seg not in filling:  # nothing pending in it: no commit will close it
                    self._close_committed(seg)
            seg = self._take_spare(table, len(cols), nnz) or self._new_segment(table, len(cols), nnz, len(cols))
            seg.row_start = self.next_row[table] + sum(s.pending for s in filling)
            self._open[table] = seg
        filling = self._filling[table]
        if not filling or filling[-1] is not seg:
            filling.append(seg)
        if table not in self._spares and (rolled or 2 * (seg.rows + len(cols)) >= seg.capacity or any(
                2 * (seg.nnz[k] + v) >= seg.value_capacity[k] for k, v in nnz.items())):
            used = {k: seg.nnz[k] + v for k, v in nnz.items()}
            self._spares[table] = self._background(self._new_segment, table, 0, used, seg.rows + len(cols))
        return seg

    def _new_segment(self, table: str, rows: int, nnz: dict[str, int], sample_rows: int) -> Segment:
        """A new segment for at least ``rows`` rows, its values capacity sized from ``nnz`` values
        per CSR group over ``sample_rows`` records (docs/FORMAT.md, "Segments").
        """
        capacity = max(self._segment_rows(table), rows)
        values = {off: max(capacity * VALUES_PER_ROW, 2 * -(-v * capacity // max(sample_rows, 1)))
                  for off, v in nnz.items()}
        return Segment(self.storage, self.store.schemas[table], self.id, table,  # type: ignore[arg-type]
                       layout.segment_name(next(self._names)), capacity, values)

    def _take_spare(self, table: str, rows: int, nnz: dict[str, int]) -> Segment | None:
        """The table's spare segment if it holds an append of these sizes (and no vacuum deleted it)."""
        future = self._spares.pop(table, None)
        if future is None:
            return None
        try:
            spare = future.result()
        except Exception:  # noqa: BLE001 - the caller creates a segment now and meets the error if it persists
            return None
        if spare.capacity >= rows and all(spare.value_capacity[k] >= v for k, v in nnz.items()) and spare.present():
            return spare
        self._drop_segment(spare)
        return None

    def _drop_segment(self, seg: Segment) -> None:
        """Close and delete a segment no commit references."""
        seg.close()
        self.storage.delete(seg.path)

    def _background(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the writer's I/O threads (spare segments, deleting reclaimed storage)."""
        if self._io is None:  # (two threads: a spare is not queued behind deletions)
            self._io = ThreadPoolExecutor(2, thread_name_prefix=f"replaystore-io-{self.id}")
        return self._io.submit(fn, *args)

    def _delete_later(self, path: str) -> None:
        """Delete the unit at ``path`` on an I/O thread, whatever is left of it: a writer killed while
        deleting it leaves part of it (its group's ``zarr.json`` possibly first), which the log
        still lists, so another writer's reclaim finishes the job.
        """
        if path in self._deleting or path in self._deleted:
            return
        self._deleting.add(path)

        def delete() -> None:
            try:
                self.storage.delete(path)  # (absent: nothing to do)
                self._deleted.add(path)
            except Exception as exc:  # (the log may no longer list it: only this writer knows it is due)
                self._undeleted[path] = exc
            finally:
                self._deleting.discard(path)
        self._background(delete)

    def _convert(self, batch: Any, stream: Any, default_stream: bool, reset: Any, table: str | None,
                 done_updates: dict[tuple[str, StreamKey], bool],
                 ) -> dict[str, tuple[Columns, Coded, np.ndarray]]:
        schemas = self.store.schemas
        if table is not None:
            if table not in schemas:
                raise StoreError(f"table {table!r}: expected one of {sorted(schemas)}")
            schemas = {table: schemas[table]}
        if len(schemas) > 1:
            split = validate_tables(schemas, batch)
            out = {}
            for name, cols in split.items():
                if isinstance(stream, (Sequence, np.ndarray)) and not isinstance(stream, str):
                    raise StreamKeyError("stream", "one stream key for a batch split across tables",
                                         "per-record keys")
                coded = stream_codes(stream, len(cols))
                out[name] = (cols, coded, self._resets(reset, coded))
            return out
        (name, schema), = schemas.items()
        items = batch_items(batch)
        if "final_obs" in items and "truncated" in schema:
            cols = episode_columns(schema, items)
            coded = stream_codes(stream, len(cols))
            resets = np.zeros(len(cols), dtype=bool)
            resets[0] = True
            return {name: (cols, coded, resets)}
        obs_field = schema.field("obs") if "obs" in schema else None
        if ("truncated" in schema and obs_field is not None and "obs" in items
                and to_numpy("obs", items["obs"]).ndim == len(obs_field.shape) + 2):
            cols, steps_t, slots, resets = rollout_columns(schema, items)
            slot_keys: list[StreamKey] = list(range(slots)) if default_stream else per_record_keys(stream, slots)
            if len(set(slot_keys)) != slots:  # one key for several slots would splice their steps together
                raise StreamKeyError("stream", f"{slots} distinct stream keys, one per environment slot",
                                     f"{stream!r}")
            coded = np.repeat(np.arange(slots, dtype=STREAM_CODE), steps_t), slot_keys
            for b, k in enumerate(slot_keys):
                carried = self._last_done.get((name, k))
                # a slot's first step ever starts an episode; later rollouts carry the previous done flag
                resets[b * steps_t] = self._known_last(name, k, {}) is None if carried is None else carried
            done = cols.arrays["terminated"] | cols.arrays["truncated"]
            for b, k in enumerate(slot_keys):
                done_updates[(name, k)] = bool(done[(b + 1) * steps_t - 1])
            return {name: (cols, coded, resets)}
        cols = schema.validate(items)
        coded = stream_codes(stream, len(cols))
        return {name: (cols, coded, self._resets(reset, coded))}

    @staticmethod
    def _resets(reset: Any, coded: Coded) -> np.ndarray:
        codes, uniq = coded
        n = len(codes)
        if reset is None or reset is False:
            return np.zeros(n, dtype=bool)
        if reset is True:  # each stream's first record in the batch
            out = np.zeros(n, dtype=bool)
            out[np.unique(codes, return_index=True)[1] if len(uniq) > 1 else slice(0, 1)] = True
            return out
        arr = to_numpy("reset", reset)
        if arr.dtype != np.bool_ or arr.shape != (n,):
            raise StepOrderError("reset", f"a bool or {n} per-record bools", f"{arr.dtype} of shape {arr.shape}")
        return arr.copy()

    def _known_last(self, table: str, key: StreamKey, staged: dict[tuple[str, StreamKey], int]) -> int | None:
        if (table, key) in staged:
            return staged[(table, key)]
        if (table, key) in self._last_step:
            return self._last_step[(table, key)]
        if not self._fresh:
            # A stream this writer has not written yet: ask a current view, once per append. The
            # handle's view may predate another writer's commits to this stream (auto steps would
            # then repeat stored steps) or reference fragments reclaimed since (StaleReadError).
            self.store.refresh()
            self._fresh = True
        reader = self.store.table(table).reader
        last = reader.index.last_step(key) if reader.lists_stream(key) else None
        if last is not None:
            self._last_step[(table, key)] = last
        return last

    def _steps(self, table: str, coded: Coded, step: Any, staged: dict[tuple[str, StreamKey], int]) -> np.ndarray:
        """Each record's step (``coded``: the records' stream keys)."""
        codes, uniq = coded
        n = len(codes)
        groups = group_positions(codes, len(uniq))
        if step is None:
            steps = np.empty(n, dtype=np.int64)
            for k, pos in zip(uniq, groups, strict=True):
                last = self._known_last(table, k, staged)
                start = 0 if last is None else last + 1
                _check_range(start, start + len(pos) - 1, k)
                steps[pos] = np.arange(start, start + len(pos))
                staged[(table, k)] = start + len(pos) - 1
            return steps
        if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
            if len(uniq) != 1:
                raise StepOrderError("step", "one step per record when a batch spans several streams", "a scalar")
            _check_range(int(step), int(step) + n - 1, uniq[0] if uniq else None)
            steps = np.arange(int(step), int(step) + n, dtype=np.int64)
        else:
            steps = to_numpy("step", step)
            if steps.dtype.kind not in "iu" or steps.shape != (n,):
                raise StepOrderError("step", f"{n} integer steps", f"{steps.dtype} of shape {steps.shape}")
            if n:  # before the cast: a uint64 step past the int64 range would wrap negative
                _check_range(int(steps.min()), int(steps.max()), None)
            steps = steps.astype(np.int64)
        for k, pos in zip(uniq, groups, strict=True):
            s = steps[pos]
            if len(s) > 1 and np.any(np.diff(s) <= 0):
                i = int(np.flatnonzero(np.diff(s) <= 0)[0])
                raise StepOrderError("step", f"strictly increasing steps in stream {k!r}",
                                     f"step {s[i + 1]} after {s[i]}")
            last = self._known_last(table, k, staged)
            if last is not None and s[0] <= last:
                raise StepOrderError("step", f"steps after {last} in stream {k!r}", f"step {s[0]}")
            if s[0] < 0:
                raise StepOrderError("step", "non-negative steps", f"step {s[0]}")
            staged[(table, k)] = int(s[-1])
        return steps

    # -- committing ---------------------------------------------------------------------
    def _now(self) -> int:
        self._time_ns = max(time.time_ns(), self._time_ns + 1)
        return self._time_ns

    def commit(self, metadata: dict[str, Any] | None = None, *, wait: bool = True) -> CommitResult | None:
        """Make everything appended since the last commit durable and visible, atomically.

        Returns None (writing nothing) when there is nothing to commit. An error of the
        background compaction (see :meth:`close`) is raised here, before anything is written.

        ``wait=False`` pipelines the commit: it returns once the records are written and
        described, and the writer's committer thread makes them durable and then creates the
        commit record, while the caller appends on. Commits still become visible one by one,
        in order, each only once durable. :meth:`wait`, the next commit (either kind) and
        :meth:`close` wait for it first: a commit made with ``wait=False`` is durable once
        any of those has returned. If making it durable fails, that call raises, and the
        writer is broken: the commit and every append after it are lost (a crash would lose
        them too), and only :meth:`close` is allowed.
        """
        self._check_open()
        self._collect_merge()
        if not any(self._pending.values()) and metadata is None:
            if wait:
                self.wait()
            return None
        meta_doc = records.json_document("metadata", metadata)
        with self._lock:
            self._settle()
        # the merge scheduled by the last commit publishes after that commit's record: waited for
        # here, not after this commit's record is queued, or a pipelined commit would wait for itself
        self._collect_merge(wait=True)
        rows: dict[str, tuple[int, int]] = {}
        with self._lock:  # a background merge publishes between commits, never inside one
            seq, now = self.seq, self._now()
            body: dict[str, Any] = {"writer": self.id, "seq": seq, "time_ns": now, "kind": "append",
                                    "metadata": meta_doc, "tables": {}}
            new_frags: dict[str, list[Fragment]] = {}
            retired = self._retire()
            segments: list[Segment] = []  # whose pending bytes become durable with the record's file
            for table, pending in self._pending.items():
                change: dict[str, Any] = {}
                if pending:
                    frags = new_frags[table] = self._finish(table, seq, now, sum(p.rows for p in pending), segments)
                    lo = frags[0].row_start
                    appends = []
                    for p in pending:
                        appends.append({"rows": [lo, lo + p.rows], "meta": p.meta})
                        lo += p.rows
                    change.update({"add": [f.to_dict() for f in frags], "appends": appends})
                    rows[table] = (frags[0].first_id, frags[-1].first_id + frags[-1].rows)
                if retired.get(table):
                    change["remove"] = [f.name for f in retired[table]]
                if change:
                    body["tables"][table] = change
            self._create_record(seq, body, segments, wait=wait)
            self.seq += 1
            for table, frags in new_frags.items():
                self.fragments[table] += frags
                self.next_row[table] += sum(f.rows for f in frags)
                self._committed_segments(table)
            for table, frags in retired.items():
                gone = {f.name for f in frags}
                self.fragments[table] = [f for f in self.fragments[table] if f.name not in gone]
        for pending in self._pending.values():
            pending.clear()
        staged, self._staged = self._staged, {}
        for table, frag in staged.items():
            if table in new_frags:
                frag.close()
            else:  # opened by an append that failed: nothing of it is pending
                frag.abort()
        self._undo = ({}, {})
        self._refresh_view()
        if self.store.log.checkpoint_due():
            self.store.refresh()  # (a checkpoint of every writer's newest state: readers start there)
            self.store.log.write_checkpoint()
        self._reclaim()
        self._schedule_merge()
        return CommitResult(self.id, seq, rows)

    def _refresh_view(self) -> None:
        """Show this writer's commits through its store handle, from the records it created (no
        read of storage). Other writers' new commits are read too only in a capped store, where
        eviction (and so what this writer retires and reclaims) follows them: reading everyone's
        records after every commit costs each writer work, and requests on object storage, in
        proportion to the number of writers (docs/PERFORMANCE.md, "Many writers into one store").
        ``st.refresh()`` picks them up on demand.
        """
        if self.store.capacity is not None:
            self.store.refresh()
        self.store._apply_created(self.id, self._created)

    def wait(self) -> None:
        """Wait until the commit made with ``commit(wait=False)``, if one is in flight, is durable
        and visible; the writer's store handle then shows it.
        """
        self._check_open()
        with self._lock:
            flying = self._in_flight is not None
            self._settle()
        if flying:
            self._refresh_view()

    def _finish(self, table: str, seq: int, now: int, rows: int, segments: list[Segment]) -> list[Fragment]:
        """The table's pending records as fragments (not yet referenced): its staged fragment,
        made durable, or a fragment per segment holding pending records, whose segment is added
        to ``segments`` (made durable by :meth:`_create_record`).
        """
        if not self._segmented:
            return [self._staged[table].finish([(seq, now, rows)])]
        segs = [s for s in self._filling[table] if s.pending] or self._filling[table][-1:]  # (empty appends)
        segments += segs
        return [s.fragment(self._new_name(), [(seq, now, s.pending)]) for s in segs]

    def _committed_segments(self, table: str) -> None:
        """The table's pending segment records were committed: sealed segments are done (closed
        once the commit record is made, which may still be syncing their files).
        """
        for seg in self._filling[table]:
            seg.advance()
            if seg is not self._open.get(table):
                self._close_committed(seg)
        self._filling[table] = []

    def _close_committed(self, seg: Segment) -> None:
        """Close a sealed segment, once the commit record being made (which may be syncing its
        files) is.
        """
        future = self._in_flight  # (read once: the compaction thread may settle it meanwhile)
        if future is None:
            seg.close()
        else:
            future.add_done_callback(lambda _: seg.close())  # (at once if it is done)

    def _create_record(self, seq: int, body: dict[str, Any], segments: Sequence[Segment] = (), *,
                       wait: bool = True) -> None:
        """Create commit record ``seq`` (under ``self._lock``), after the record before it exists;
        the pending bytes of ``segments`` are made durable first, concurrently with the record's
        own file, and checked present before it is published. ``wait=False``: on the committer
        thread (:meth:`commit`).
        """
        self._settle()
        path, data = layout.commit_record(self.id, seq), records.encode(body)
        fds = [fd for seg in segments for fd in seg.dirty_fds()]

        def create() -> None:
            if segments:
                def check() -> None:
                    for seg in segments:
                        seg.check_present()

                created = self.storage.create_after(path, data, fds, check)  # type: ignore[attr-defined]
            else:
                created = self.storage.create(path, data)
            if not created:
                raise StoreError(f"commit record {path} already exists: two writers share one writer number")
            self._created[seq] = data

        if wait:
            create()
            return
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"replaystore-commit-{self.id}")
        self._in_flight = self._committer.submit(create)
        self._in_flight_segments = {seg.name for seg in segments}

    def _settle(self) -> None:
        """Wait for the commit record being made on the committer thread (under ``self._lock``);
        if that failed, the writer is broken (:meth:`commit`).
        """
        future = self._in_flight
        if future is None:
            return
        try:
            future.result()
        except BaseException as exc:
            self._failed = exc
            raise StoreError(f"writer {self.id}: a commit made with wait=False failed ({exc}); it and every "
                             "append since are lost; close() this writer") from exc
        finally:
            # only now: an append (without the lock) that seals a segment reads it (_close_committed)
            self._in_flight, self._in_flight_segments = None, set()

    def _new_name(self) -> str:
        return layout.fragment_name(next(self._names))  # itertools.count: atomic under the GIL

    # -- retention and compaction --------------------------------------------------------------
    def _grace(self, capacity: int) -> int:
        return retention.grace(capacity)

    def _retire(self) -> dict[str, list[Fragment]]:
        """This writer's fragments wholly evicted (beyond the grace margin): dropped from its log."""
        out: dict[str, list[Fragment]] = {}
        cap = self.store.capacity
        if cap is None:
            return out
        for table in self.store.schemas:
            reader = self.store.table(table).reader
            mine = {f.name for f in self.fragments[table]}
            gone = [f for f in reader.evicted_fragments(self._grace(cap)) if f.writer == self.id and f.name in mine]
            if gone:
                out[table] = gone
        return out

    def _reclaim(self) -> None:
        """Delete the storage of wholly evicted fragments (any writer's: dead writers leave garbage too)."""
        now = time.time_ns()
        cap = self.store.capacity
        retained = {t: self.store.table(t).reader.retained_parts(self._grace(cap))
                    for t in self.store.schemas} if cap is not None else {}
        for path in list(self._undeleted):
            self._undeleted.pop(path, None)
            self._delete_later(path)
        due, kept = [], []
        with self._lock:
            for entry in self._trash:
                t, frag = entry
                # compacted-away originals go after the time grace or, in a capped store, as soon as
                # all their records are older than the newest capacity + grace (retention.py)
                gone = cap is not None and not any((frag.writer, seq) in retained[frag.table]
                                                   for seq, _, _ in frag.parts)
                (due if t <= now or gone else kept).append(entry)
            self._trash = kept
        for _, frag in due:
            self._delete_later(frag.path)
        if cap is None:
            return
        mine = ({seg.name for seg in self._open.values()}
                | {seg.name for segs in self._filling.values() for seg in segs} | self._in_flight_segments)
        for table in self.store.schemas:
            counts = self.store.table(table).reader.evicted_rows(self._grace(cap))
            self._seal_if_evicted(table, counts)
            for path in sorted(retention.reclaimable(counts, self.id, mine, self._is_gone)):
                self._delete_later(path)
        for writer in sorted(self._dead - self._swept):
            self._sweep(writer)

    def _sweep(self, writer: int) -> None:
        """Delete the segments of dead writer ``writer`` that its log does not reference: its spares
        and the segment of appends it never committed (docs/FORMAT.md, "Capacity and reclamation").
        Its death was proved first, so its log is final: the directories are listed, then the log
        is read, and a segment committed before it died is seen as referenced. Once per writer.
        Cost: a listing per table and a refresh of the log.
        """
        self._swept.add(writer)
        listed = {t: self.storage.list(f"{layout.writer_dir(writer)}/data/{t}") for t in self.store.schemas}
        self.store.refresh()
        wlog = self.store.log.writers.get(writer)
        for table, names in listed.items():
            frags = wlog.fragments.get(table, {}).values() if wlog is not None else ()
            live = {f.segment.name if f.segment is not None else f.name for f in frags}
            for name in retention.unreferenced_segments(names, live):
                self._delete_later(layout.fragment_dir(writer, table, name))

    def _seal_if_evicted(self, table: str, counts: list[tuple[Fragment, int]]) -> None:
        """Seal the table's open segment once eviction has reached its records (``counts``: each
        fragment's rows beyond the grace margin): the next append starts a new segment, and
        this one is reclaimed once the rest of it is evicted. A writer that gets a small share
        of the appends (one of many collectors) would otherwise keep the evicted records of a
        long-filling segment on disk until it was full (docs/FORMAT.md, "Capacity and
        reclamation").
        """
        seg = self._open.get(table)
        if seg is None or seg.sealed or not any(
                v > 0 and f.writer == self.id and f.segment is not None and f.segment.name == seg.name
                for f, v in counts):
            return
        seg.sealed = True
        if table not in self._spares:
            self._spares[table] = self._background(self._new_segment, table, 0, dict(seg.nnz), max(seg.rows, 1))

    def _is_gone(self, writer: int) -> bool:
        """Whether another writer will never write again: it closed, or it died (store/liveness.py)."""
        wlog = self.store.log.writers.get(writer)
        if wlog is not None and wlog.closed:
            return True
        if writer not in self._dead and liveness.is_dead(self.storage, writer):
            self._dead.add(writer)
        return writer in self._dead

    def _max_rows(self) -> int:
        cap = self.store.capacity
        return MAX_FRAGMENT_ROWS if cap is None else max(min(MAX_FRAGMENT_ROWS, cap // 4), 1)

    def _segment_rows(self, table: str) -> int:
        """Rows of a new segment: the largest fragment, or in a store with capacity N at least
        ``SEGMENT_FLOOR_BYTES`` of fixed-size columns, up to N (docs/FORMAT.md, "Segments").
        """
        cap = self.store.capacity
        if cap is None:
            return self._max_rows()
        floor = -(-SEGMENT_FLOOR_BYTES // fixed_row_bytes(self.store.schemas[table]))
        return max(self._max_rows(), min(cap, MAX_FRAGMENT_ROWS, floor))

    def _fully_visible(self, table: str) -> set[str]:
        reader = self.store.table(table).reader
        return {f.name for f, v in zip(reader.fragments, reader.vis_from, strict=True) if v == 0 and f.writer == self.id}

    def _next_merge(self) -> tuple[str, list[Fragment]] | None:
        """This writer's trailing run of fragments due for a merge (store/compaction.py), if any."""
        with self._lock:
            fragments = {t: list(frags) for t, frags in self.fragments.items()}
        for table, frags in fragments.items():
            run = due_run(frags, self._max_rows())
            if run:
                visible = self._fully_visible(table)
                if all(f.name in visible for f in run):
                    return table, run
        return None

    def compact(self) -> int:
        """Merge this writer's committed fragments into as few as the fragment size cap allows
        (2^20 records, or capacity // 4), now, blocking; returns the number of merges published.

        Random reads cost per fragment a batch touches (docs/PERFORMANCE.md), and the
        background policy leaves about 8 fragments per size tier. Call this when a dataset
        is finished or before a read-heavy phase: it rewrites every record not yet in a
        full-size fragment once. Pending appends stay pending.
        """
        self._check_open()
        self._collect_merge(wait=True)
        with self._lock:
            self._settle()
        self._refresh_view()
        max_rows, merges = self._max_rows(), 0
        for table in self.store.schemas:
            visible = self._fully_visible(table)
            with self._lock:
                frags = list(self.fragments[table])
            for run in full_runs(frags, visible, max_rows):
                merges += self._merge(table, run)
        self._refresh_view()
        return merges

    def _schedule_merge(self) -> None:
        """Start the next due merge on the writer's compaction thread.

        A merge still running from the previous commit is waited for first, so compaction
        runs at most one commit behind and picks the same runs as merging inside each
        commit would (skipping instead would let runs grow past the tiers under load).
        """
        self._collect_merge(wait=True)
        job = self._next_merge()
        if job is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"replaystore-compact-{self.id}")
        self._merging = self._pool.submit(self._merge, *job)

    def _collect_merge(self, wait: bool = False) -> None:
        """Forget a finished (or, with ``wait``, the running) merge; re-raise its error."""
        future = self._merging
        if future is None or not (wait or future.done()):
            return
        self._merging = None
        future.result()

    def _merge(self, table: str, run: list[Fragment]) -> bool:
        """Rewrite ``run`` as one fragment, then publish it with a ``compact`` commit record
        (True) or abandon it (False).

        Runs on the compaction thread: the data are written without the writer's lock; the
        record's seq and time are taken, and the record created, under it, so this writer's
        records stay gapless and in time order. A run whose fragments were retired (evicted)
        meanwhile is abandoned and its merged objects deleted: nothing references them.
        """
        merged = coalesce(run, self._new_name())
        if merged is not None:
            return self._publish_merge(table, run, merged, None)
        done = rewrite(self.storage, self.store.schemas[table], self.id, table, self._new_name(), run)
        return done is not None and self._publish_merge(table, run, *done)

    def _publish_merge(self, table: str, run: list[Fragment], merged: Fragment, path: str | None) -> bool:
        """Publish ``merged`` in place of ``run`` with a ``compact`` commit record (True), or abandon
        it (False; its objects at ``path`` deleted) if part of ``run`` was retired meanwhile.
        """
        with self._lock:
            live = {f.name for f in self.fragments[table]}
            if not all(f.name in live for f in run):
                if path is not None:
                    self.storage.delete(path)
                return False
            seq, now = self.seq, self._now()
            body = {"writer": self.id, "seq": seq, "time_ns": now, "kind": "compact", "metadata": {},
                    "tables": {table: {"add": [merged.to_dict()], "remove": [f.name for f in run]}}}
            self._create_record(seq, body)
            self.seq += 1
            gone = {f.name for f in run}
            self.fragments[table] = sorted([f for f in self.fragments[table] if f.name not in gone] + [merged],
                                           key=lambda f: f.row_start)
            if path is not None:  # (a coalesced run's records stay where they are)
                self._trash += [(now + TRASH_GRACE_NS, f) for f in run]
        return True

    def _finish_merges(self, drain: bool) -> None:
        """Wait for the running merge; with ``drain``, then run every due merge to completion."""
        try:
            self._collect_merge(wait=True)
            while drain:
                self._refresh_view()
                job = self._next_merge()
                if job is None:
                    break
                self._merge(*job)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # -- lifecycle ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise StoreError(f"writer {self.id} is closed")
        if self._failed is not None:
            raise StoreError(f"writer {self.id} is broken: a commit made with wait=False failed "
                             f"({self._failed}); close() it") from self._failed

    def discard(self) -> None:
        """Drop everything appended since the last commit (and the steps those appends took);
        a commit made with ``wait=False`` is waited for first.
        """
        with self._lock:
            self._settle()
        for pending in self._pending.values():
            pending.clear()
        staged, self._staged = list(self._staged.values()), {}
        for frag in staged:
            frag.abort()
        for table, segs in self._filling.items():
            for seg in segs:
                seg.discard()
                if not seg.committed:  # opened by these appends: nothing references it
                    seg.close()
                    self.storage.delete(seg.path)
                    if self._open.get(table) is seg:
                        del self._open[table]
                elif seg is not self._open.get(table):  # sealed by these appends
                    self._close_committed(seg)
            self._filling[table] = []
        for undo, now in zip(self._undo, (self._last_step, self._last_done), strict=True):
            for key, old in undo.items():
                if old is None:
                    now.pop(key, None)
                else:
                    now[key] = old
        self._undo = ({}, {})

    def close(self) -> None:
        """Commit what is pending, finish compaction and release the writer.

        Merges of small fragments run on a background thread after commits; ``close`` waits
        for the running one and then performs every merge still due, so a finished writer
        leaves its fragments compacted (no other writer ever merges them).
        """
        if self.closed:
            return
        if self._failed is None:
            try:
                self.commit()
            except BaseException:
                if self._failed is None:  # (the writer stays open: the caller may discard() and close)
                    raise
                self._abandon()
                raise
        if self._failed is not None:  # broken by a failed commit(wait=False), already reported
            self._abandon()
            return
        self.closed = True
        self._close_segments()
        self._finish_merges(drain=True)
        self._close_record()
        self._refresh_view()

    def _close_segments(self) -> None:
        """Close the open segments (the committer thread is done with them), delete the spares
        and wait for the I/O threads' work.
        """
        if self._committer is not None:
            self._committer.shutdown(wait=True)
            self._committer = None
        for seg in self._open.values():
            seg.close()
        self._open = {}
        spares, self._spares = self._spares, {}
        for future in spares.values():
            with contextlib.suppress(Exception):  # (a failed spare deleted what it had created)
                self._drop_segment(future.result())
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
        if self._undeleted:
            path, exc = next(iter(self._undeleted.items()))
            warnings.warn(f"writer {self.id}: could not delete {len(self._undeleted)} reclaimed unit(s), e.g. {path} "
                          f"({exc}); `replaystore vacuum` removes them", stacklevel=3)

    def _close_record(self) -> None:
        """Create this writer's last record, ``close``, then drop its liveness lock: from now on any
        writer may reclaim its evicted segments, and readers stop probing for its commits.
        """
        try:
            with self._lock:
                seq, now = self.seq, self._now()
                self._create_record(seq, {"writer": self.id, "seq": seq, "time_ns": now, "kind": CLOSE,
                                          "metadata": {}, "tables": {}})
                self.seq += 1
        finally:
            self._release()

    def _release(self) -> None:
        """Drop the liveness lock: the writer counts as dead (store/liveness.py)."""
        if self._unlock is not None:
            self._unlock()  # (once: later calls do nothing)

    def _abandon(self) -> None:
        """Release the writer without committing what is pending (an error is propagating, or a
        commit made with ``wait=False`` failed: then no close record either, as readers stop at
        the missing commit record and would never reach it).
        """
        with contextlib.suppress(Exception):  # (the error propagating, or already reported, wins)
            self.discard()
        self.closed = True
        self._close_segments()
        # the running merge is waited for, but its error must not mask the one propagating
        with contextlib.suppress(Exception):
            self._finish_merges(drain=False)
        if self._failed is not None:
            self._release()
            return
        with contextlib.suppress(Exception):  # (nor may the close record's)
            self._close_record()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif not self.closed:
            self._abandon()
