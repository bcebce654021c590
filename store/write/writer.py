"""The writer: validates appends, buffers them, and commits fragments + one commit record.

:class:`Writer` is the public interface; it composes collaborators with one job each (see
docs/INTERNALS.md, "Writer"): :class:`~replaystore.store.write.stepbook.StepBook` (each stream's last
step), :class:`~replaystore.store.write.segmentpool.SegmentPool` (where pending appends are written),
:class:`~replaystore.store.write.committer.Committer` (commit records, inline or pipelined),
:class:`~replaystore.store.write.reclaimer.Reclaimer` (retiring and deleting evicted storage) and
:class:`~replaystore.store.write.compactor.Compactor` (merging committed fragments).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from replaystore.errors import ReadOnlyError, StoreError, StoreReplacedError
from replaystore.store.format import records
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.segment import Segment
from replaystore.store.format.staging import StagedFragment
from replaystore.store.write import liveness
from replaystore.store.write.batches import convert
from replaystore.store.write.committer import Committer
from replaystore.store.write.compactor import Compactor
from replaystore.store.write.context import WriteHost
from replaystore.store.write.iothreads import IOThreads
from replaystore.store.write.pending import PendingAppends
from replaystore.store.write.reclaimer import Reclaimer
from replaystore.store.write.segmentpool import SegmentPool
from replaystore.store.write.stepbook import StepBook


class InsertLimiter(Protocol):
    """What ``Writer(rate_limiter=)`` takes: ``replaystore.loaders.RateLimiter`` (kept duck-typed here)."""

    def admit_inserts(self, store: Any, counts: Mapping[str, int]) -> None:
        """Return once ``counts`` records (per table) may be committed; raise if they may not in time."""


@dataclass(frozen=True)
class CommitResult:
    """What one commit made visible.

    Attributes
    ----------
    writer : int
        The number of the writer that committed.
    seq : int
        The commit record's sequence number.
    rows : dict[str, tuple[int, int]]
        Per table appended to, the ``[first, end)`` row ids of the new records.
    """

    writer: int
    seq: int
    rows: dict[str, tuple[int, int]]  # table -> [first, end) row ids


class Writer:
    """Appends records to a store; one per process. ``with st.writer() as w:`` commits on exit.

    Each writer registers a writer number (create-if-absent on ``writers/NNNNNN``),
    owns every object under that prefix and its own commit sequence.

    Parameters
    ----------
    store : Store
        The store handle to write through (use ``store.writer()``); the writer and its parts
        receive from it only its :class:`~replaystore.store.write.context.WriteContext`.
    rate_limiter : InsertLimiter, optional
        A ``replaystore.loaders.RateLimiter``: each :meth:`commit` first waits while the
        table's inserts are too far ahead of the samples drawn under it (docs/GUIDE.md, "Rate
        limiting").

    Raises
    ------
    ReadOnlyError
        If the store was opened with ``mode="r"``.
    CorruptObjectError
        If the manifest's capacity differs from one an earlier writer registered under.

    Cost: a listing of the writer records and one create-if-absent per number tried.
    """

    def __init__(self, store: WriteHost, *, rate_limiter: InsertLimiter | None = None) -> None:
        if store.mode == "r":
            raise ReadOnlyError("store opened read-only (mode='r'): writer() is not allowed")
        self.store = store
        """The store handle written through (what the rate limiter is handed)."""
        ctx = self._context = store.write_context()
        self.storage = ctx.storage
        self.id = liveness.register(self.storage, ctx.tables.capacity, ctx.generation)
        lock_fd = liveness.hold(self.storage, self.id)  # held until closed (store/write/liveness.py)
        # released by close(), or when the writer is collected unclosed (it is then gone)
        self._unlock = weakref.finalize(self, os.close, lock_fd) if lock_fd is not None else None
        tables, guard = ctx.tables, ctx.guard
        self.next_row = dict.fromkeys(tables.schemas, 0)
        # this writer's committed fragments; shared with the compaction thread under the committer's lock
        self.fragments: dict[str, list[Fragment]] = {t: [] for t in tables.schemas}
        names = itertools.count()  # fragment and segment names f0000000000, s0000000001, ...
        self._io = IOThreads(self.id)
        self._steps = StepBook(tables)
        self._committer = Committer(self.storage, self.id, generation=ctx.generation, after_ns=ctx.log.time_ns,
                                    guard=guard, tables=tables, show_created=ctx.show_created)
        self._segments = SegmentPool(self.storage, self.id, names, self._io, self._committer, schemas=tables.schemas,
                                     capacity=tables.capacity, format_version=ctx.format_version, guard=guard)
        self._pending = PendingAppends(tables.schemas, self._segments)
        self._reclaimer = Reclaimer(self.storage, self.id, self._io, self._committer.lock, self._segments,
                                    self._committer, tables=tables, log=ctx.log, may_delete=guard.may_delete)
        self._compactor = Compactor(self.storage, self.id, names, self._committer, self._reclaimer, self.fragments,
                                    tables=tables, guard=guard)
        self.closed = False
        self.rate_limiter = rate_limiter
        """Throttles :meth:`commit` (see ``replaystore.loaders.RateLimiter.admit_inserts``); None: off."""

    @property
    def seq(self) -> int:
        """The sequence number of this writer's next commit record."""
        return self._committer.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self._committer.seq = value

    # -- appending --------------------------------------------------------------------
    def append(self, batch: Any, stream: Any = None, step: Any = None, reset: Any = None, *,
               table: str | None = None) -> int:
        """Validate ``batch`` and buffer it until :meth:`commit`.

        An Episode (``final_obs`` + ``terminated``) appends as one stream starting with a
        reset; a ``[T, B]`` Rollout appends as B streams (``stream``: one key per slot). A
        batch matching several tables (e.g. a DeepCfrBatch) is split between them. Nothing is
        buffered if anything is invalid. The records are copied into the table's staged
        fragment or open segment: the caller may reuse its buffers at once.

        Parameters
        ----------
        batch : Any
            A batch object or mapping of field name to array, an Episode or a Rollout.
        stream : Any
            A stream key (int or str), or one key per record; None: stream 0.
        step : Any
            None (auto-increment per stream), or one step per record, strictly increasing
            per stream and after the stream's last step.
        reset : Any
            Recurrent boundaries: a bool for the first record of each stream in this append,
            or one bool per record.
        table : str or None
            The table to append to; None: every table the batch matches.

        Returns
        -------
        int
            The records appended (over all tables).

        Raises
        ------
        StoreReplacedError
            The store was replaced (``mode="w+"``) while this append opened a segment.
        StoreError
            If the writer is closed or broken, or ``table`` is unknown.
        FieldError, StreamKeyError, StepOrderError
            If the batch, stream keys, steps or resets are invalid.
        OSError
            If writing into a segment fails (the append is undone).

        Cost: O(records) to validate and copy; a new segment now and then (created ahead).
        """
        self._check_open()
        book = self._steps
        book.begin()
        tables = convert(self._context.tables.schemas, batch, 0 if stream is None else stream, stream is None, reset,
                         table, book)
        steps = {name: book.steps(name, coded, step) for name, (_, coded, _) in tables.items()}
        added: list[tuple[StagedFragment | Segment, Any]] = []
        try:
            with self._context.guard.as_replaced():  # (a replace deleting the segment it writes fails it so)
                for name, (cols, (codes, streams), resets) in tables.items():
                    frag = self._segments.target(name, cols, streams, self.next_row[name])
                    mark = frag.mark()
                    frag.add(cols, codes, streams, steps[name], resets)  # all or nothing
                    added.append((frag, mark))
        except BaseException:
            for frag, mark in reversed(added):
                frag.rollback(mark)
            raise
        for name, (cols, _, _) in tables.items():
            self._pending.add(name, len(cols), dict(cols.meta))
        book.accept()
        return sum(len(cols) for cols, _, _ in tables.values())

    # -- committing ---------------------------------------------------------------------
    def commit(self, metadata: dict[str, Any] | None = None, *, wait: bool = True) -> CommitResult | None:
        """Make everything appended since the last commit durable and visible, atomically.

        ``wait=False`` pipelines the commit: it returns once the records are written and
        described, and the writer's committer thread makes them durable and then creates the
        commit record, while the caller appends on. Commits still become visible one by one,
        in order, each only once durable. :meth:`wait`, the next commit (either kind) and
        :meth:`close` wait for it first: a commit made with ``wait=False`` is durable once
        any of those has returned. If making it durable fails, that call raises, and the
        writer is broken: the commit and every append after it are lost (a crash would lose
        them too), and only :meth:`close` is allowed.

        Parameters
        ----------
        metadata : dict or None
            A JSON document kept with the commit; a commit with metadata is made even with
            nothing pending.
        wait : bool
            False: pipeline the commit (see above).

        Returns
        -------
        CommitResult or None
            The writer, the record's seq and each table's new row ids; None (writing
            nothing) when there is nothing to commit.

        Raises
        ------
        StoreReplacedError
            The store was replaced (``mode="w+"``) since this writer registered: nothing is
            written (the appends stay pending; only :meth:`close` or :meth:`discard` help).
        StoreError
            If the writer is closed or broken, a pipelined commit failed, or the background
            compaction failed (raised before anything is written).
        RateLimitTimeout
            With a ``rate_limiter``: the commit was not admitted within the limiter's
            ``timeout`` (nothing written; the appends stay pending).
        OSError
            If writing fails (nothing becomes visible; the appends stay pending).

        Cost: with a ``rate_limiter``, its check first (a refresh and the sample counts'
        reads; waiting while the inserts are too far ahead); a read of the manifest (is the
        store still the one registered in?); then the pending records' write and fsync, one
        record; then reclamation and the scheduling of a merge.
        """
        self._check_open()
        compactor, committer = self._compactor, self._committer
        compactor.collect()
        if not self._pending and metadata is None:
            if wait:
                self.wait()
            return None
        meta_doc = records.json_document("metadata", metadata)
        with committer.lock:
            committer.settle()
        if self.rate_limiter is not None:  # (after the commit in flight is counted) may wait, or raise
            self.rate_limiter.admit_inserts(self.store, self._pending.counts())
        # the merge scheduled by the last commit publishes after that commit's record: waited for
        # here, not after this commit's record is queued, or a pipelined commit would wait for itself
        compactor.collect(wait=True)
        # a replaced store's writer writes nothing more: the new store's writers may have its number
        self._context.guard.check_current()
        rows: dict[str, tuple[int, int]] = {}
        with committer.lock:  # a background merge publishes between commits, never inside one
            seq, now = committer.seq, committer.now()
            body: dict[str, Any] = {"writer": self.id, "seq": seq, "time_ns": now, "kind": "append",
                                    "metadata": meta_doc, "tables": {}}
            new_frags: dict[str, list[Fragment]] = {}
            retired = self._reclaimer.retire(self.fragments)
            segments: list[Segment] = []  # whose pending bytes become durable with the record's file
            with self._context.guard.as_replaced():  # (a replace that deletes what this commit writes fails it so)
                self._pending.fill(body, seq, now, new_frags, retired, segments, rows)
                committer.create(seq, body, segments, wait=wait)
            for table, frags in new_frags.items():
                self.fragments[table] += frags
                self.next_row[table] += sum(f.rows for f in frags)
                self._segments.committed(table)
            for table, frags in retired.items():
                gone = {f.name for f in frags}
                self.fragments[table] = [f for f in self.fragments[table] if f.name not in gone]
        self._pending.clear()
        self._segments.close_staged(set(new_frags))
        self._steps.commit()
        committer.refresh_view()
        ctx = self._context
        if ctx.log.checkpoint_due() and ctx.guard.may_delete():  # (it deletes older checkpoints)
            ctx.tables.refresh()  # (a checkpoint of every writer's newest state: readers start there)
            ctx.log.write_checkpoint()
        self._reclaimer.reclaim()
        compactor.schedule()
        return CommitResult(self.id, seq, rows)

    def wait(self) -> None:
        """Wait until the commit made with ``commit(wait=False)``, if any, is durable and visible.

        The writer's store handle then shows it.

        Raises
        ------
        StoreError
            If the writer is closed or broken, or the commit in flight failed (the writer is
            then broken).

        Cost: as long as the commit in flight takes to become durable.
        """
        self._check_open()
        committer = self._committer
        with committer.lock:
            flying = committer.in_flight is not None
            committer.settle()
        if flying:
            committer.refresh_view()

    def compact(self) -> int:
        """Merge this writer's committed fragments into as few as the size cap allows, now, blocking.

        The fragment size cap is 2^20 records, or capacity // 4.

        Random reads cost per fragment a batch touches (docs/PERFORMANCE.md), and the
        background policy leaves about 8 fragments per size tier. Call this when a dataset
        is finished or before a read-heavy phase. Pending appends stay pending. Segments
        that appends no longer go to and that are less than half full are copied into
        right-sized ones (docs/GUIDE.md, "Size on disk"); ``close`` does that for all of them.

        Returns
        -------
        int
            The number of merges published (segments right-sized included).

        Raises
        ------
        StoreError
            If the writer is closed or broken, or a background merge failed.
        OSError
            If writing a merged fragment fails.

        Cost: rewrites every record not yet in a full-size fragment once.
        """
        self._check_open()
        with self._committer.lock:
            self._committer.settle()
        return self._compactor.compact(self._segments.in_use() | self._committer.in_flight_segments)

    # -- lifecycle ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise StoreError(f"writer {self.id} is closed")
        failed = self._committer.failed
        if failed is not None:
            kind = StoreReplacedError if isinstance(failed, StoreReplacedError) else StoreError
            raise kind(f"writer {self.id} is broken: a commit made with wait=False failed "
                             f"({failed}); close() it") from failed

    def discard(self) -> None:
        """Drop everything appended since the last commit (and the steps those appends took).

        A commit made with ``wait=False`` is waited for first.

        Raises
        ------
        StoreError
            If the commit in flight failed (the writer is then broken).
        OSError
            If deleting a segment these appends opened fails.

        Cost: O(pending appends); one deletion per segment they opened.
        """
        with self._committer.lock:
            self._committer.settle()
        self._pending.clear()
        self._segments.discard()
        self._steps.rollback()

    def close(self) -> None:
        """Commit what is pending, finish compaction and release the writer.

        Merges of small fragments run on a background thread after commits; ``close`` waits
        for the running one and then performs every merge still due, so a finished writer
        leaves its fragments compacted (no other writer ever merges them). Then each of its
        segments that is less than half full is copied into a right-sized one, so that no
        sparse tail stays referenced (the originals go at the next ``vacuum`` past its age
        threshold or, in a store with a capacity, by another writer's reclaim once this close is
        older than the trash grace; a copy that fails, on a full disk for instance, only warns). Closing twice
        does nothing; a writer broken by a failed pipelined commit is released without
        committing.

        Raises
        ------
        StoreReplacedError
            The store was replaced (``mode="w+"``) since this writer registered: the writer
            is released, what was pending is dropped and no record is written.
        StoreError, OSError
            If the final commit fails (the writer stays open: ``discard()`` then ``close()``),
            or a merge or the close record fails.

        Cost: a commit, the due merges, a copy of the committed bytes of each under-filled
        segment (in the kernel where it can), and one record.
        """
        if self.closed:
            return
        if self._committer.failed is None:
            try:
                self.commit()
            except StoreReplacedError:  # nothing more to write anywhere: released, its appends dropped
                self._abandon()
                raise
            except BaseException:
                if self._committer.failed is None:  # (the writer stays open: the caller may discard() and close)
                    raise
                self._abandon()
                raise
        if self._committer.failed is not None:  # broken by a failed commit(wait=False), already reported
            self._abandon()
            return
        self.closed = True
        self._close_segments()
        self._compactor.finish(drain=True)
        self._compactor.rightsize(strict=False)  # nothing more goes to its segments: no sparse tails stay referenced
        self._close_record()
        self._committer.refresh_view()

    def _close_segments(self) -> None:
        """Close the open segments, delete the spares and wait for the I/O threads' work.

        The committer thread is done with the segments by then.
        """
        self._committer.shutdown()
        self._segments.close()
        self._io.shutdown()
        self._reclaimer.warn_undeleted()

    def _close_record(self) -> None:
        """Create this writer's last record, ``close``, then drop its liveness lock.

        From now on any writer may reclaim its evicted segments, and readers stop probing for
        its commits.
        """
        try:
            self._context.guard.check_current()  # (a replaced store's writer: no record in the new store)
            self._committer.create_close()
        finally:
            self._release()

    def _release(self) -> None:
        """Drop the liveness lock: the writer counts as dead (store/write/liveness.py)."""
        if self._unlock is not None:
            self._unlock()  # (once: later calls do nothing)

    def _abandon(self) -> None:
        """Release the writer without committing what is pending.

        An error is propagating, or a commit made with ``wait=False`` failed: then no close
        record either, as readers stop at the missing commit record and would never reach it.
        """
        with contextlib.suppress(Exception):  # (the error propagating, or already reported, wins)
            self.discard()
        self.closed = True
        self._close_segments()
        # the running merge is waited for, but its error must not mask the one propagating
        with contextlib.suppress(Exception):
            self._compactor.finish(drain=False)
        if self._committer.failed is not None:
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
