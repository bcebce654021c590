"""A writer's commit records: their sequence numbers and times, and their creation.

Records are created either inline or pipelined on the writer's committer thread
(``commit(wait=False)``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from replaystore.errors import CorruptObjectError, StoreError, StoreReplacedError
from replaystore.store.format import bodies, layout, records
from replaystore.store.format.generations import foreign
from replaystore.store.format.segment import Segment
from replaystore.store.read.log import CLOSE
from replaystore.store.storage import Storage
from replaystore.store.write.context import Guard, Tables


class Committer:
    """Creates one writer's commit records in sequence, each only after the one before it exists.

    ``lock`` guards the sequence (``seq`` and the time of the next record), record creation
    and the writer's committed fragments: the append path and the compaction thread both
    publish records, one at a time. A pipelined record is created on the committer thread,
    ``replaystore-commit-<writer>``; at most one is in flight, and :meth:`settle` waits for it.

    Parameters
    ----------
    storage : Storage
        Where the records are created (and a replaced store's record read back).
    writer : int
        Whose records: they go under ``writers/<writer>/commits``.
    generation : str
        Written into every record.
    after_ns : int
        The newest commit time of the handle's log: this writer's records come after it.
    guard : Guard
        Around each create: a failure in a replaced store becomes ``StoreReplacedError``.
    tables : Tables
        Their capacity, and the refresh of a capped store's view (:meth:`refresh_view`).
    show_created : Callable[[int, dict[int, bytes]], None]
        Shows the records this writer created through the handle (see :meth:`refresh_view`).

    See Also
    --------
    replaystore.store.write.context.WriteContext : Where ``generation``, ``guard``, ``tables`` and
        ``show_created`` come from.
    """

    def __init__(self, storage: Storage, writer: int, *, generation: str, after_ns: int, guard: Guard,
                 tables: Tables, show_created: Callable[[int, dict[int, bytes]], None]) -> None:
        self.storage = storage
        self.writer = writer
        self.generation = generation
        self.guard = guard
        self.tables = tables
        self.show_created = show_created
        self.lock = threading.Lock()
        self.seq = 0
        # commit times only move forward, even if this host's clock is behind the log's
        self._time_ns = after_ns
        self.created: dict[int, bytes] = {}  # records created and not yet shown through the handle (by seq)
        # the one commit record being made durable on the committer thread, and the error that broke
        # the writer if making one failed (its records, and every later append, are lost)
        self._thread: ThreadPoolExecutor | None = None
        self.in_flight: Future[None] | None = None
        self.in_flight_segments: set[str] = set()  # the segments it references (not reclaimable)
        self.failed: BaseException | None = None

    def now(self) -> int:
        """The time of the next record: now, or just after the last one if the clock is behind.

        Returns
        -------
        int
            Nanoseconds since the epoch.

        Cost: O(1).
        """
        self._time_ns = max(time.time_ns(), self._time_ns + 1)
        return self._time_ns

    def create(self, seq: int, body: dict[str, Any], segments: Sequence[Segment] = (), *,
               wait: bool = True) -> None:
        """Create commit record ``seq`` (under ``lock``) once the record before it exists.

        The next record is then ``seq + 1``.

        The pending bytes of ``segments`` are made durable first, concurrently with the record's
        own file, and checked present before it is published.

        The record carries the store's generation. Its name may hold a record of another
        generation, left by a writer of a store replaced at this location that took the same
        writer number: that one is deleted and the create repeated, once.

        Parameters
        ----------
        seq : int
            The record's sequence number (``self.seq``).
        body : dict
            The record's document.
        segments : Sequence[Segment]
            The open segments whose pending records the record references.
        wait : bool
            False: create it on the committer thread and return at once (see :meth:`settle`).

        Raises
        ------
        StoreReplacedError
            The record already exists and the store was replaced: this writer's number is
            another store's writer's now (nothing is published).
        StoreError
            If the record before it failed on the committer thread (the writer is broken), or
            the record already exists (two writers share one writer number).
        OSError
            If writing it fails (nothing is published).

        Cost: the record's write and fsync, and the segments' fsyncs (on the committer thread
        with ``wait=False``).
        """
        self.settle()
        body["generation"] = self.generation
        path, data = layout.commit_record(self.writer, seq), records.encode(body)
        fds = [fd for seg in segments for fd in seg.dirty_fds()]

        def attempt() -> bool:
            if segments:
                def check() -> None:
                    for seg in segments:
                        seg.check_present()

                return self.storage.create_after(path, data, fds, check)
            return self.storage.create(path, data)

        def create() -> None:
            with self.guard.as_replaced():  # (a replace deleting its segments under it fails it so)
                make()

        def make() -> None:
            created = attempt()
            if not created:
                self.guard.check_current()  # (replaced: the record there is the new store's)
                if self._foreign_record(path, seq):
                    self.storage.delete(path)
                    created = attempt()
            if not created:
                raise StoreError(f"commit record {path} already exists: two writers share one writer number")
            self.created[seq] = data

        if wait:
            create()
        else:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"replaystore-commit-{self.writer}")
            self.in_flight = self._thread.submit(create)
            self.in_flight_segments = {seg.name for seg in segments}
        self.seq = seq + 1

    def _foreign_record(self, path: str, seq: int) -> bool:
        """Whether the record at ``path`` belongs to another store generation (a replaced store's)."""
        try:
            body = bodies.commit(path, records.decode(path, records.read(self.storage, path)), self.writer, seq)
        except (FileNotFoundError, CorruptObjectError):
            return False
        return foreign(body, self.generation)

    def settle(self) -> None:
        """Wait for the record being made on the committer thread, if any (under ``lock``).

        Raises
        ------
        StoreError
            If making it failed: the writer is broken (``failed`` is set).

        Cost: as long as that record's fsyncs take.
        """
        future = self.in_flight
        if future is None:
            return
        try:
            future.result()
        except BaseException as exc:
            self.failed = exc
            kind = StoreReplacedError if isinstance(exc, StoreReplacedError) else StoreError
            raise kind(f"writer {self.writer}: a commit made with wait=False failed ({exc}); it and every "
                       "append since are lost; close() this writer") from exc
        finally:
            # only now: an append (without the lock) that seals a segment reads it (SegmentPool.close_committed)
            self.in_flight, self.in_flight_segments = None, set()

    def refresh_view(self) -> None:
        """Show this writer's records through its store handle, from the records it created.

        No read of storage.

        Other writers' new commits are read too only in a capped store, where eviction (and so
        what this writer retires and reclaims) follows them: reading everyone's records after
        every commit costs each writer work, and requests on object storage, in proportion to
        the number of writers (docs/PERFORMANCE.md, "Many writers into one store").
        ``st.refresh()`` picks them up on demand.

        Raises
        ------
        StoreError
            If refreshing the store fails.

        Cost: O(records created since the last call); a refresh of the log in a capped store.
        """
        if self.tables.capacity is not None:
            self.tables.refresh()
        self.show_created(self.writer, self.created)

    def create_close(self) -> None:
        """Create the writer's last record, ``close``: it commits nothing.

        Readers stop probing for the writer's commits once they reach it. Cost: one record.
        """
        with self.lock:
            seq, now = self.seq, self.now()
            self.create(seq, {"writer": self.writer, "seq": seq, "time_ns": now, "kind": CLOSE, "metadata": {},
                              "tables": {}})

    def shutdown(self) -> None:
        """Wait for the committer thread's work and stop it.

        Cost: as long as the record in flight takes.
        """
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
