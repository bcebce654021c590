"""Where a writer's pending appends are written.

Per table, a staged fragment (object storage, format 1) or open segments filled in place,
with a spare segment created ahead (docs/FORMAT.md, "Segments").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from concurrent.futures import Future

from replaystore.schemas import Columns, Schema
from replaystore.store.format import layout
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.segment import VALUES_PER_ROW, Segment
from replaystore.store.format.staging import StagedFragment
from replaystore.store.format.streamkeys import StreamKey
from replaystore.store.storage import Storage
from replaystore.store.write.committer import Committer
from replaystore.store.write.context import Guard
from replaystore.store.write.iothreads import IOThreads
from replaystore.store.write.sizing import segment_rows


class SegmentPool:
    """The objects one writer's pending appends go to, per table, and their hand-over to a commit.

    Appends (the caller's thread) write into the table's staged fragment or open segment; a
    commit turns them into fragments (:meth:`finish`) and, once its record is created,
    advances them (:meth:`committed`). Once an open segment is half full its successor (a
    *spare*: creating a segment's files and directories durably takes ~10 ms) is created on
    the writer's I/O threads, so that a rollover rarely waits. A sealed segment is closed once
    the commit record that may still be syncing its files (the committer's) is made.

    Parameters
    ----------
    storage : Storage
        Where staged fragments and segments are written.
    writer : int
        Whose data directory they go to.
    names : Iterator[int]
        Names for new fragments and segments (the compactor draws from it too: names never repeat).
    io : IOThreads
        Spares are created there.
    committer : Committer
        Its record in flight, whose files a sealed segment may hold.
    schemas : Mapping[str, Schema]
        Each table's schema, which its fragments and segments are laid out by.
    capacity : int or None
        Segment sizes follow it.
    format_version : int
        Format 2 on local storage: appends go to segments.
    guard : Guard
        Checked before a segment is created; asked before one is deleted.

    See Also
    --------
    replaystore.store.write.context.WriteContext : Where ``schemas`` and ``capacity`` (of its
        ``tables``), ``format_version`` and ``guard`` come from.
    """

    def __init__(self, storage: Storage, writer: int, names: Iterator[int], io: IOThreads,
                 committer: Committer, *, schemas: Mapping[str, Schema], capacity: int | None,
                 format_version: int, guard: Guard) -> None:
        self.storage = storage
        self.schemas = schemas
        self.capacity = capacity
        self.guard = guard
        self.writer = writer
        self._names = names
        self._io = io
        self._committer = committer
        # format 2 on local storage: appends go to open segments instead of staged fragments
        self.segmented = self.storage.supports_in_place_writes and format_version >= 2
        self.staged: dict[str, StagedFragment] = {}  # per table: the fragment the pending appends are in
        self.open: dict[str, Segment] = {}  # per table: the segment appends go to
        self.filling: dict[str, list[Segment]] = {t: [] for t in schemas}  # the pending appends' segments
        self.spares: dict[str, Future[Segment]] = {}  # per table: the next segment, created ahead

    def target(self, table: str, cols: Columns, streams: list[StreamKey], next_row: int) -> StagedFragment | Segment:
        """The object an append of ``cols`` to ``table`` goes to.

        Parameters
        ----------
        table : str
            The table appended to.
        cols : Columns
            The append's validated columns.
        streams : list[StreamKey]
            Its stream keys.
        next_row : int
            The table's first row not yet committed by this writer.

        Returns
        -------
        StagedFragment or Segment
            The staged fragment, or a segment ``cols`` fit in (see :meth:`segment`).

        Raises
        ------
        OSError
            If a new segment cannot be created.

        Cost: O(1); a segment's creation (~10 ms) on a rollover without a spare.
        """
        if self.segmented and not self.schemas[table].compressed:
            return self.segment(table, cols, streams, next_row)
        return self.stage(table, next_row)  # (compressed fields: shards are written whole, never in place)

    def stage(self, table: str, next_row: int) -> StagedFragment:
        """The table's staged fragment, opened (named) by the first append after a commit.

        Parameters
        ----------
        table : str
            The table whose staged fragment it is.
        next_row : int
            Its first row not yet committed by this writer.

        Returns
        -------
        StagedFragment
            Buffered: the caller may reuse its arrays once added.

        Cost: O(fields) when opened, else O(1).
        """
        frag = self.staged.get(table)
        if frag is None:
            frag = self.staged[table] = StagedFragment(self.storage, self.schemas[table], self.writer, table,
                                                       self._new_name(), next_row, buffered=True)
        return frag

    def segment(self, table: str, cols: Columns, streams: list[StreamKey], next_row: int) -> Segment:
        """The table's open segment, if ``cols`` fit in it; else a new one (the old one is sealed).

        The parameters are :meth:`target`'s.

        Returns
        -------
        Segment
            The segment the append goes to (listed as filling).

        Raises
        ------
        OSError
            If a new segment cannot be created.

        Cost: O(CSR groups); a new segment: the spare taken, or ~10 ms to create one.
        """
        nnz = {off: int(cols.arrays[off][-1]) - int(cols.arrays[off][0]) for off in cols.schema.offsets_groups}
        seg = self.open.get(table)
        rolled = False  # a full segment was left: the writer fills segments, keep a spare ready
        if seg is None or not seg.fits(len(cols), nnz, streams):
            filling = self.filling[table]
            if seg is not None:
                seg.sealed = rolled = True
                if seg not in filling:  # nothing pending in it: no commit will close it
                    self.close_committed(seg)
            seg = self._take_spare(table, len(cols), nnz) or self._new_segment(table, len(cols), nnz, len(cols))
            seg.row_start = next_row + sum(s.pending for s in filling)
            self.open[table] = seg
        filling = self.filling[table]
        if not filling or filling[-1] is not seg:
            filling.append(seg)
        if table not in self.spares and (rolled or 2 * (seg.rows + len(cols)) >= seg.capacity or any(
                2 * (seg.nnz[k] + v) >= seg.value_capacity[k] for k, v in nnz.items())):
            used = {k: seg.nnz[k] + v for k, v in nnz.items()}
            self.spares[table] = self._io.submit(self._new_segment, table, 0, used, seg.rows + len(cols))
        return seg

    def _new_segment(self, table: str, rows: int, nnz: dict[str, int], sample_rows: int) -> Segment:
        """A new segment for at least ``rows`` rows.

        Its values capacity is sized from ``nnz`` values per CSR group over ``sample_rows``
        records (docs/FORMAT.md, "Segments").
        """
        self.guard.check_current()  # (never create files where the new store's writer may have this number)
        capacity = max(self.segment_rows(table), rows)
        values = {off: max(capacity * VALUES_PER_ROW, 2 * -(-v * capacity // max(sample_rows, 1)))
                  for off, v in nnz.items()}
        return Segment(self.storage, self.schemas[table], self.writer, table,
                       layout.segment_name(next(self._names)), capacity, values,
                       may_delete=self.guard.may_delete)

    def segment_rows(self, table: str) -> int:
        """Rows of a new segment of ``table`` unless an append needs more (see ``sizing.segment_rows``).

        Parameters
        ----------
        table : str
            The table the new segment is for.

        Returns
        -------
        int
            The row capacity.

        Cost: O(fields).
        """
        return segment_rows(self.schemas[table], self.capacity)

    def _take_spare(self, table: str, rows: int, nnz: dict[str, int]) -> Segment | None:
        """The table's spare segment if it holds an append of these sizes (and no vacuum deleted it)."""
        future = self.spares.pop(table, None)
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

    def _delete(self, path: str) -> None:
        """Delete this writer's segment at ``path``, unless the store was replaced.

        In a replaced store's location the path may name the new store's segment (a writer there
        may have this writer's number); this writer's own was deleted by the replace.
        """
        if self.guard.may_delete():
            self.storage.delete(path)

    def _drop_segment(self, seg: Segment) -> None:
        """Close and delete a segment no commit references."""
        seg.close()
        self._delete(seg.path)

    def _new_name(self) -> str:
        return layout.fragment_name(next(self._names))  # itertools.count: atomic under the GIL

    def finish(self, table: str, seq: int, now: int, rows: int, segments: list[Segment]) -> list[Fragment]:
        """The table's pending records as fragments of commit ``seq`` (not yet referenced).

        Parameters
        ----------
        table : str
            A table with pending appends.
        seq, now : int
            The commit record's sequence number and time.
        rows : int
            The pending records.
        segments : list[Segment]
            Extended with the segments holding pending records (made durable with the record).

        Returns
        -------
        list[Fragment]
            The staged fragment, made durable, or one fragment per segment holding pending records.

        Raises
        ------
        OSError
            If the staged fragment cannot be written.

        Cost: a staged fragment's write and fsync; O(segments) otherwise.
        """
        if not self.segmented or self.schemas[table].compressed:
            return [self.staged[table].finish([(seq, now, rows)])]
        segs = [s for s in self.filling[table] if s.pending] or self.filling[table][-1:]  # (empty appends)
        segments += segs
        return [s.fragment(self._new_name(), [(seq, now, s.pending)]) for s in segs]

    def committed(self, table: str) -> None:
        """The table's pending segment records were committed: sealed segments are done.

        They are closed once the commit record is made, which may still be syncing their files.

        Parameters
        ----------
        table : str
            The table the commit covered.

        Cost: O(segments filled since the last commit).
        """
        for seg in self.filling[table]:
            seg.advance()
            if seg is not self.open.get(table):
                self.close_committed(seg)
        self.filling[table] = []

    def close_staged(self, committed: set[str]) -> None:
        """After a commit: close the staged fragments it referenced; abort the others.

        The others were opened by an append that failed: nothing of them is pending.

        Parameters
        ----------
        committed : set[str]
            The tables whose staged fragment the commit referenced.

        Cost: O(tables).
        """
        staged, self.staged = self.staged, {}
        for table, frag in staged.items():
            if table in committed:
                frag.close()
            else:
                frag.abort()

    def close_committed(self, seg: Segment) -> None:
        """Close a sealed segment once the commit record being made is closed.

        The commit record may still be syncing the segment's files.

        Parameters
        ----------
        seg : Segment
            A sealed segment no pending append is in.

        Cost: O(1).
        """
        future = self._committer.in_flight  # (read once: the compaction thread may settle it meanwhile)
        if future is None:
            seg.close()
        else:
            future.add_done_callback(lambda _: seg.close())  # (at once if it is done)

    def discard(self) -> None:
        """Drop the pending appends.

        Aborts the staged fragments, discards the segments' pending records, and deletes the
        segments they opened (nothing references them).

        Raises
        ------
        OSError
            If deleting a segment fails.

        Cost: O(segments filled since the last commit) and their deletion.
        """
        staged, self.staged = list(self.staged.values()), {}
        for frag in staged:
            frag.abort()
        for table, segs in self.filling.items():
            for seg in segs:
                seg.discard()
                if not seg.committed:  # opened by these appends: nothing references it
                    seg.close()
                    self._delete(seg.path)
                    if self.open.get(table) is seg:
                        del self.open[table]
                elif seg is not self.open.get(table):  # sealed by these appends
                    self.close_committed(seg)
            self.filling[table] = []

    def in_use(self) -> set[str]:
        """Names of the segments this writer still writes into or has pending records in.

        Returns
        -------
        set[str]
            Segment names (not reclaimable).

        Cost: O(tables + filling segments).
        """
        return {seg.name for seg in self.open.values()} | {seg.name for segs in self.filling.values() for seg in segs}

    def seal_if_evicted(self, table: str, counts: list[tuple[Fragment, int]]) -> None:
        """Seal the table's open segment once eviction has reached its records.

        The next append then starts a new segment, and this one is reclaimed once the rest of it
        is evicted. A writer that gets a small share of the appends (one of many collectors)
        would otherwise keep the evicted records of a long-filling segment on disk until it was
        full (docs/FORMAT.md, "Capacity and reclamation").

        Parameters
        ----------
        table : str
            The table evicted from.
        counts : list[tuple[Fragment, int]]
            Each fragment's rows beyond the grace margin.

        Cost: O(fragments); a spare's creation is queued on the I/O threads.
        """
        seg = self.open.get(table)
        if seg is None or seg.sealed or not any(
                v > 0 and f.writer == self.writer and f.segment is not None and f.segment.name == seg.name
                for f, v in counts):
            return
        seg.sealed = True
        if table not in self.spares:
            self.spares[table] = self._io.submit(self._new_segment, table, 0, dict(seg.nnz), max(seg.rows, 1))

    def close(self) -> None:
        """Close the open segments (the committer thread must be done with them) and delete the spares.

        Cost: waits for the spares being created; one deletion per spare.
        """
        for seg in self.open.values():
            seg.close()
        self.open = {}
        spares, self.spares = self.spares, {}
        for future in spares.values():
            with contextlib.suppress(Exception):  # (a failed spare deleted what it had created)
                self._drop_segment(future.result())
