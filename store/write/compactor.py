"""A writer's compaction: merging its committed fragments.

Merges run on the writer's compaction thread after commits, all due merges at close, and
every mergeable run on demand (``Writer.compact``).

Which runs to merge is decided by store/maintenance/compaction.py; this module runs the merges and
publishes each with a ``compact`` commit record through the writer's committer.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from replaystore.store.format import layout
from replaystore.store.format.fragment import Fragment, coalesce
from replaystore.store.maintenance.compaction import due_run, full_runs, rewrite, rightsize, segment_runs, underfilled
from replaystore.store.storage import Storage
from replaystore.store.write.committer import Committer
from replaystore.store.write.context import Guard, Tables
from replaystore.store.write.reclaimer import Reclaimer
from replaystore.store.write.sizing import max_fragment_rows


class Compactor:
    """Runs one writer's merges: at most one at a time, on ``replaystore-compact-<writer>``.

    A merge scheduled after a commit runs while the caller appends on; the next commit waits
    for it first, so compaction runs at most one commit behind. The merged data are written
    without the committer's lock; the ``compact`` record is created, and the writer's
    fragments updated, under it. Fragments a merge replaced go to the reclaimer's trash.

    Parameters
    ----------
    storage : Storage
        Where merged fragments are written (and an abandoned merge's deleted).
    writer : int
        Whose fragments are merged (only this writer's).
    names : Iterator[int]
        Names for the merged fragments (the counter the segment pool draws from too).
    committer : Committer
        Its lock, sequence and record creation: the ``compact`` records.
    reclaimer : Reclaimer
        Takes the merged-away fragments into its trash.
    fragments : dict[str, list[Fragment]]
        The writer's committed fragments per table (``Writer.fragments``; under the committer's lock).
    tables : Tables
        Schemas and capacity; the handle's readers tell what is fully visible.
    guard : Guard
        Checked before a merge writes; asked before an abandoned merge's objects are deleted.

    See Also
    --------
    replaystore.store.write.context.WriteContext : Where ``tables`` and ``guard`` come from.
    """

    def __init__(self, storage: Storage, writer: int, names: Iterator[int], committer: Committer,
                 reclaimer: Reclaimer, fragments: dict[str, list[Fragment]], *, tables: Tables,
                 guard: Guard) -> None:
        self.storage = storage
        self.tables = tables
        self.guard = guard
        self.writer = writer
        self._names = names
        self._committer = committer
        self._reclaimer = reclaimer
        self._fragments = fragments
        self._thread: ThreadPoolExecutor | None = None
        self._merging: Future[bool] | None = None

    def _max_rows(self) -> int:
        return max_fragment_rows(self.tables.capacity)

    def _new_name(self) -> str:
        return layout.fragment_name(next(self._names))  # itertools.count: atomic under the GIL

    def _fully_visible(self, table: str) -> set[str]:
        reader = self.tables.reader(table)
        return {f.name for f, v in zip(reader.fragments, reader.vis_from, strict=True)
                if v == 0 and f.writer == self.writer}

    def _next_merge(self) -> tuple[str, list[Fragment]] | None:
        """Find the writer's trailing run of fragments due for a merge (store/maintenance/compaction.py), if any."""
        with self._committer.lock:
            fragments = {t: list(frags) for t, frags in self._fragments.items()}
        for table, frags in fragments.items():
            run = due_run(frags, self._max_rows())
            if run:
                visible = self._fully_visible(table)
                if all(f.name in visible for f in run):
                    return table, run
        return None

    def compact(self, in_use: Collection[str] = ()) -> int:
        """Merge this writer's committed fragments into as few as the fragment size cap allows, now.

        Then right-size the under-filled segments not in ``in_use`` (:meth:`rightsize`).

        Parameters
        ----------
        in_use : collection of str
            Names of the segments appends may still go to (left as they are).

        Returns
        -------
        int
            The number of merges published (right-sizings included).

        Raises
        ------
        StoreError
            If the background merge or the record in flight failed, or reading the store fails.
        OSError
            If writing a merged fragment or its record fails.

        Cost: rewrites every committed record not yet in a full-size fragment once.
        """
        self.collect(wait=True)
        with self._committer.lock:
            self._committer.settle()
        self._committer.refresh_view()
        max_rows, merges = self._max_rows(), 0
        for table in self.tables.schemas:
            visible = self._fully_visible(table)
            with self._committer.lock:
                frags = list(self._fragments[table])
            for run in full_runs(frags, visible, max_rows):
                merges += self.merge(table, run)
        self._committer.refresh_view()
        return merges + self.rightsize(in_use)

    def rightsize(self, in_use: Collection[str] = (), strict: bool = True) -> int:
        """Copy each under-filled segment of this writer into a right-sized one and publish it.

        A segment appends will not go to any more (not in ``in_use``) whose committed bytes
        are less than half its files' sizes (store/maintenance/compaction.py, ``underfilled``) is copied
        into a new segment of exactly its committed rows and values, published by a
        ``compact`` record that replaces its fragments by one in the new segment
        (docs/FORMAT.md, "Right-sizing a segment"). The old segment goes to the trash (deleted
        after the grace time by a later reclaim, or by vacuum; in a store with a capacity, once
        its records are evicted, and after this writer closed by another writer's reclaim once
        the close is older than the grace): it is never truncated, since readers may map its
        files. The new segment is full, so in a capped store any writer reclaims it once its
        records are evicted.

        Parameters
        ----------
        in_use : collection of str
            Names of the segments appends may still go to.
        strict : bool
            Raise a copy's error; else warn and leave that segment as it is (at close: the
            records are committed, a full disk must not fail the close).

        Returns
        -------
        int
            Segments right-sized.

        Raises
        ------
        StoreError, OSError
            If a record cannot be created, or (``strict``) a copy fails.

        Cost: copies the committed bytes of each such segment (in the kernel where it can),
        less than half of each one's size.
        """
        done = 0
        self._committer.refresh_view()
        for table, schema in self.tables.schemas.items():
            visible = self._fully_visible(table)
            with self._committer.lock:
                frags = list(self._fragments[table])
            for seg, run in segment_runs(frags).items():
                if seg in in_use or not all(f.name in visible for f in run) or not underfilled(schema, run):
                    continue
                try:
                    copied = rightsize(self.storage, schema, self.writer, table, self._new_name(),
                                       layout.segment_name(next(self._names)), run)
                except OSError as exc:  # (CorruptObjectError is a StoreError: always raised)
                    if strict:
                        raise
                    warnings.warn(f"writer {self.writer}: {run[0].path} was left at its full size ({exc})",
                                  stacklevel=3)  # (the caller of Writer.close)
                    continue
                done += copied is not None and self._publish(table, run, *copied)
        if done:
            self._committer.refresh_view()
        return done

    def schedule(self) -> None:
        """Start the next due merge on the compaction thread.

        A merge still running from the previous commit is waited for first, so compaction
        runs at most one commit behind and picks the same runs as merging inside each
        commit would (skipping instead would let runs grow past the tiers under load).

        Raises
        ------
        StoreError, OSError
            The error of the merge waited for.

        Cost: O(fragments) to pick the run; the merge itself runs in the background.
        """
        self.collect(wait=True)
        job = self._next_merge()
        if job is None:
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"replaystore-compact-{self.writer}")
        self._merging = self._thread.submit(self.merge, *job)

    def collect(self, wait: bool = False) -> None:
        """Forget a finished (or, with ``wait``, the running) merge; re-raise its error.

        Parameters
        ----------
        wait : bool
            Wait for a running merge.

        Raises
        ------
        StoreError, OSError
            The merge's error.

        Cost: O(1), or as long as the running merge takes.
        """
        future = self._merging
        if future is None or not (wait or future.done()):
            return
        self._merging = None
        future.result()

    def merge(self, table: str, run: list[Fragment]) -> bool:
        """Rewrite ``run`` as one fragment, then publish it with a ``compact`` commit record.

        Runs on the compaction thread (or the caller's, from :meth:`compact` and :meth:`finish`).
        A run whose fragments were retired (evicted) meanwhile is abandoned and its merged
        objects deleted: nothing references them.

        Parameters
        ----------
        table : str
            The table the run belongs to.
        run : list[Fragment]
            Consecutive committed fragments of this writer.

        Returns
        -------
        bool
            True if published, False if abandoned.

        Raises
        ------
        StoreError, OSError
            If the record cannot be created or the data cannot be written.

        Cost: reads and rewrites the run's records (none for a run of one segment's fragments).
        """
        self.guard.check_current()  # (a replaced store's writer writes nothing into the new store)
        merged = coalesce(run, self._new_name())
        if merged is not None:
            return self._publish(table, run, merged, None)
        done = rewrite(self.storage, self.tables.schemas[table], self.writer, table, self._new_name(), run,
                       may_delete=self.guard.may_delete)
        return done is not None and self._publish(table, run, *done)

    def _publish(self, table: str, run: list[Fragment], merged: Fragment, path: str | None) -> bool:
        """Publish ``merged`` in place of ``run`` with a ``compact`` commit record, or abandon it.

        Returns True when published; False when abandoned (its objects at ``path`` deleted)
        because part of ``run`` was retired meanwhile.
        """
        committer = self._committer
        with committer.lock:
            live = {f.name for f in self._fragments[table]}
            if not all(f.name in live for f in run):
                if path is not None and self.guard.may_delete():
                    self.storage.delete(path)
                return False
            seq, now = committer.seq, committer.now()
            body = {"writer": self.writer, "seq": seq, "time_ns": now, "kind": "compact", "metadata": {},
                    "tables": {table: {"add": [merged.to_dict()], "remove": [f.name for f in run]}}}
            committer.create(seq, body)
            gone = {f.name for f in run}
            self._fragments[table] = sorted([f for f in self._fragments[table] if f.name not in gone] + [merged],
                                            key=lambda f: f.row_start)
            if path is not None:  # (a coalesced run's records stay where they are)
                self._reclaimer.trash(run, now)
        return True

    def finish(self, drain: bool) -> None:
        """Wait for the running merge; with ``drain``, then run every due merge to completion.

        Parameters
        ----------
        drain : bool
            Run the due merges on the caller's thread (at close).

        Raises
        ------
        StoreError, OSError
            A merge's error (the compaction thread is stopped anyway).

        Cost: as long as the merges take.
        """
        try:
            self.collect(wait=True)
            while drain:
                self._committer.refresh_view()
                job = self._next_merge()
                if job is None:
                    break
                self.merge(*job)
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None
