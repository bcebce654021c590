"""Reclamation by one writer: retiring evicted fragments and deleting storage no one needs.

The writer retires its evicted fragments from its log, and deletes the storage of evicted
segments (any writer's), of dead writers' unreferenced segments, of closed writers'
unreferenced segments once their close is older than the trash grace (the originals of the
segments they right-sized at close) and of compacted-away fragments (docs/FORMAT.md,
"Capacity and reclamation").
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable

from replaystore.store.format import layout
from replaystore.store.format.fragment import Fragment
from replaystore.store.read import retention
from replaystore.store.read.log import CommitLog
from replaystore.store.storage import Storage
from replaystore.store.write import liveness
from replaystore.store.write.committer import Committer
from replaystore.store.write.context import Tables
from replaystore.store.write.iothreads import IOThreads
from replaystore.store.write.segmentpool import SegmentPool

TRASH_GRACE_NS = 30 * 10**9
"""How long a compacted-away fragment stays stored after the merge replacing it (readers lag)."""

CLOSED_SWEEPS_PER_RECLAIM = 16
"""At most this many closed writers' unreferenced segments are swept by one reclaim (a listing
per table each): a writer joining a store that many writers closed spreads them over its commits."""


class Reclaimer:
    """Decides what one writer may delete, and deletes it on the writer's I/O threads.

    Runs on the thread that commits (after each commit's record), except the deletions
    themselves. Storage another writer still uses is never deleted: this writer's segments
    in use (the segment pool's, the committer's record in flight) are kept, and another
    writer's segments only once that writer closed or died (store/write/liveness.py).

    Parameters
    ----------
    storage : Storage
        Where evicted and merged-away objects are deleted (and closed writers' segments listed).
    writer : int
        The writer whose objects are its own (other writers' segments wait until they are gone).
    io : IOThreads
        Deletions run there.
    lock : threading.Lock
        The committer's lock, which guards the trash (the compaction thread adds to it).
    segments : SegmentPool
        Segments in use; sealing an evicted open segment.
    committer : Committer
        The segments its record in flight references.
    tables : Tables
        Their capacity, and the handle's view, which decides what is evicted.
    log : CommitLog
        The other writers' logs (which closed, what they reference).
    may_delete : Callable[[], bool]
        Asked before the first deletion of each reclaim (the guard's ``may_delete``).

    See Also
    --------
    replaystore.store.write.context.WriteContext : Where ``tables``, ``log`` and ``may_delete`` (of
        its ``guard``) come from.
    """

    def __init__(self, storage: Storage, writer: int, io: IOThreads, lock: threading.Lock, segments: SegmentPool,
                 committer: Committer, *, tables: Tables, log: CommitLog, may_delete: Callable[[], bool]) -> None:
        self.storage = storage
        self.tables = tables
        self.log = log
        self._ask_may_delete = may_delete
        self.writer = writer
        self._io = io
        self._lock = lock
        self._segments = segments
        self._committer = committer
        self._dead: set[int] = set()  # other writers found dead: their segments are reclaimable
        self._swept: set[int] = set()  # dead or closed writers whose unreferenced segments were deleted
        self._deleting: set[str] = set()  # paths handed to the I/O threads for deletion
        self._deleted: set[str] = set()  # paths deleted (or found gone) by them: the log may list them forever
        self._may_delete: bool | None = None  # the store is still this writer's (None: not asked since reclaim)
        self.undeleted: dict[str, BaseException] = {}  # paths whose deletion failed: tried again at the next reclaim
        self._trash: list[tuple[int, Fragment]] = []  # (due time_ns, compacted-away fragment)

    def retire(self, fragments: dict[str, list[Fragment]]) -> dict[str, list[Fragment]]:
        """Find the writer's fragments wholly evicted (beyond the grace margin): to drop from its log.

        Parameters
        ----------
        fragments : dict[str, list[Fragment]]
            The writer's committed fragments per table.

        Returns
        -------
        dict[str, list[Fragment]]
            Per table with any, the fragments to retire (empty without capacity).

        Cost: O(fragments of the view).
        """
        out: dict[str, list[Fragment]] = {}
        cap = self.tables.capacity
        if cap is None:
            return out
        for table in self.tables.schemas:
            reader = self.tables.reader(table)
            mine = {f.name for f in fragments[table]}
            gone = [f for f in reader.evicted_fragments(retention.grace(cap))
                    if f.writer == self.writer and f.name in mine]
            if gone:
                out[table] = gone
        return out

    def trash(self, frags: list[Fragment], now: int) -> None:
        """Delete compacted-away fragments later (under the committer's lock).

        They are deleted after ``TRASH_GRACE_NS`` or, in a capped store, once all their records
        are beyond retention.

        Parameters
        ----------
        frags : list[Fragment]
            The merged-away fragments.
        now : int
            The time of the record that replaced them.

        Cost: O(len(frags)).
        """
        self._trash += [(now + TRASH_GRACE_NS, f) for f in frags]

    def reclaim(self) -> None:
        """Delete the storage no one needs any more; retry failed deletions.

        That is the storage of wholly evicted fragments (any writer's: dead writers leave
        garbage too), of due trash, of dead writers' unreferenced segments and, in a store with
        a capacity, of closed writers' unreferenced segments once their ``close`` record is
        older than ``TRASH_GRACE_NS`` (:meth:`sweep_closed`).

        Raises
        ------
        StoreError
            If reading the store fails.

        Cost: O(fragments of the view) per table, O(writers of the view); a listing per table
        per dead or closed writer, once (at most ``CLOSED_SWEEPS_PER_RECLAIM`` closed ones a call).
        """
        self._may_delete = None  # (asked again, once, by the first deletion of this reclaim)
        now = time.time_ns()
        cap = self.tables.capacity
        retained = {t: self.tables.reader(t).retained_parts(retention.grace(cap))
                    for t in self.tables.schemas} if cap is not None else {}
        for path in list(self.undeleted):
            self.undeleted.pop(path, None)
            self.delete_later(path)
        due: list[tuple[int, Fragment]] = []
        kept: list[tuple[int, Fragment]] = []
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
            self.delete_later(frag.path)
        if cap is None:
            return
        mine = self._segments.in_use() | self._committer.in_flight_segments
        for table in self.tables.schemas:
            counts = self.tables.reader(table).evicted_rows(retention.grace(cap))
            self._segments.seal_if_evicted(table, counts)
            for path in sorted(retention.reclaimable(counts, self.writer, mine, self.is_gone)):
                self.delete_later(path)
        for writer in sorted(self._dead - self._swept):
            self._sweep(writer)
        self.sweep_closed(now)

    def sweep_closed(self, now: int) -> int:
        """Delete closed writers' unreferenced segments once their close is older than the grace.

        A writer that closed right-sized its under-filled segments (store/write/compactor.py) just
        before its ``close`` record; the originals are unreferenced from then on, but a reader
        that follows an older log may still read them, so they stay until the ``close`` record
        (which follows every record that replaced one) is ``TRASH_GRACE_NS`` old by its time
        (docs/FORMAT.md, "Capacity and reclamation", rule 10). A closed writer's log is final:
        what it references is known without reading again. Each closed writer once (newest
        writers first, at most ``CLOSED_SWEEPS_PER_RECLAIM`` a call); one whose close is too
        recent is tried again at a later reclaim.

        Parameters
        ----------
        now : int
            The time (ns since the epoch) the grace is measured to.

        Returns
        -------
        int
            Closed writers swept by this call.

        Cost: O(writers of the view); a listing per table per writer swept.
        """
        swept = 0
        for writer, wlog in sorted(self.log.writers.items(), reverse=True):
            if swept >= CLOSED_SWEEPS_PER_RECLAIM:
                break
            if writer == self.writer or writer in self._swept or not wlog.closed:
                continue
            if now - wlog.closed_ns < TRASH_GRACE_NS:
                continue
            self._sweep(writer, final=True)
            swept += 1
        return swept

    def _sweep(self, writer: int, final: bool = False) -> None:
        """Delete the segments of dead (or closed) writer ``writer`` that its log does not reference.

        These are its spares, the segment of appends it never committed and the originals of
        segments it right-sized (docs/FORMAT.md, "Capacity and reclamation"). Its death was
        proved first, so its log is final: the directories are listed, then the log is read, and
        a segment committed before it died is seen as referenced. A closed writer's log
        (``final``) was final when its ``close`` record was read. Once per writer.
        Cost: a listing per table and (unless ``final``) a refresh of the log.
        """
        self._swept.add(writer)
        listed = {t: self.storage.list(f"{layout.writer_dir(writer)}/data/{t}") for t in self.tables.schemas}
        if not final:
            self.tables.refresh()
        wlog = self.log.writers.get(writer)
        for table, names in listed.items():
            frags = wlog.fragments.get(table, {}).values() if wlog is not None else ()
            live = {f.segment.name if f.segment is not None else f.name for f in frags}
            for name in retention.unreferenced_segments(names, live):
                self.delete_later(layout.fragment_dir(writer, table, name))

    def is_gone(self, writer: int) -> bool:
        """Whether another writer will never write again: it closed, or it died (store/write/liveness.py).

        Parameters
        ----------
        writer : int
            The other writer's number.

        Returns
        -------
        bool
            True once it closed or its liveness lock is free (remembered: dead stays dead).

        Cost: O(1), or a probe of its liveness lock.
        """
        wlog = self.log.writers.get(writer)
        if wlog is not None and wlog.closed:
            return True
        if writer not in self._dead and liveness.is_dead(self.storage, writer):
            self._dead.add(writer)
        return writer in self._dead

    def delete_later(self, path: str) -> None:
        """Delete the unit at ``path`` on an I/O thread, whatever is left of it.

        A writer killed while deleting it leaves part of it (its group's ``zarr.json`` possibly
        first), which the log still lists, so another writer's reclaim finishes the job. A
        failed deletion is remembered and retried at the next reclaim.

        Parameters
        ----------
        path : str
            A fragment or segment directory.

        Cost: O(1) here; the deletion on an I/O thread.
        """
        if path in self._deleting or path in self._deleted:
            return
        if self._may_delete is None:
            # a replaced store's paths may name the new store's storage (its writers may have these
            # numbers): a replaced store's writer deletes nothing (nor one that cannot tell)
            self._may_delete = self._ask_may_delete()
        if not self._may_delete:
            return
        self._deleting.add(path)

        def delete() -> None:
            try:
                self.storage.delete(path)  # (absent: nothing to do)
                self._deleted.add(path)
            except Exception as exc:  # (the log may no longer list it: only this writer knows it is due)
                self.undeleted[path] = exc
            finally:
                self._deleting.discard(path)
        self._io.submit(delete)

    def warn_undeleted(self) -> None:
        """Warn (at the writer's caller) if deletions failed and will not be retried.

        Cost: O(1).
        """
        if self.undeleted:
            path, exc = next(iter(self.undeleted.items()))
            # stacklevel: this, Writer._close_segments, Writer.close (or _abandon), the caller
            warnings.warn(f"writer {self.writer}: could not delete {len(self.undeleted)} reclaimed unit(s), e.g. "
                          f"{path} ({exc}); `replaystore vacuum` removes them", stacklevel=4)
