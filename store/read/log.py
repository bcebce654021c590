"""Reading the commit log: every writer's commit records, merged into the live fragments per table.

A log checkpoint (docs/FORMAT.md, "Log checkpoints") summarises the records applied up to
a position per writer, so that opening a store reads one object and the records after it
instead of every record ever written.

Arguments named as in :mod:`replaystore.store.format` (``storage``, ``schema``, ``writer``,
``table``) mean the same here (see its docstring).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replaystore.errors import CorruptObjectError, StoreError
from replaystore.store.format import bodies, layout, records
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.generations import foreign
from replaystore.store.storage import Storage

if TYPE_CHECKING:
    from replaystore.schemas import Schema

CLOSE = "close"  # the kind of a writer's last record: no commit follows it (docs/FORMAT.md)
CHECKPOINT = "checkpoint"  # the kind of a log checkpoint document
READ_AHEAD = 64  # the most commit records of one writer a refresh asks for at once
CHECKPOINT_EVERY = 1024
"""Records applied since the newest checkpoint a writer knows of, after which its commit writes one."""
HISTORY_BATCH = 1024  # commit records read at once when the history is loaded
_FIRST_ID = operator.attrgetter("first_id")


@dataclass
class WriterLog:
    """What a reader has applied of one writer's commit sequence.

    Attributes
    ----------
    next_seq : int
        The sequence number of the next record to apply.
    closed : bool
        Its ``close`` record was applied: it never writes again.
    fragments : dict of str to dict of str to Fragment
        Per table, its live fragments by name.
    committed : dict of str to int
        Per table, the writer's records ever committed (the end of the highest local row
        range any applied record added), evicted and removed fragments included.
    counted : bool
        Whether ``committed`` is exact: False where it was taken from a checkpoint without
        ``committed`` counts (then only the live fragments' ends were known).
    closed_ns : int
        Where ``closed``, the time of its ``close`` record, or a later one where that record was
        taken from a checkpoint (the checkpoint's time): never earlier than the close.
    """

    writer: int
    next_seq: int = 0
    closed: bool = False  # its ``close`` record was applied: it never writes again
    fragments: dict[str, dict[str, Fragment]] = field(default_factory=dict)  # table -> name -> fragment
    committed: dict[str, int] = field(default_factory=dict)  # table -> local rows ever committed
    counted: bool = True
    closed_ns: int = field(default=0, compare=False)  # (not part of ``state``: a checkpoint bounds it)
    # table -> its live fragments ordered by row id, while unchanged (see ``ordered``)
    _ordered: dict[str, list[Fragment]] = field(default_factory=dict, repr=False, compare=False)

    def ordered(self, table: str) -> list[Fragment]:
        """The writer's live fragments of ``table`` in row-id order (kept until they change).

        Cost: a sort of the writer's fragments when they changed; a lookup otherwise.

        Returns
        -------
        list of Fragment
            The fragments (shared: do not modify).

        Raises
        ------
        CorruptObjectError
            Two live fragments overlap in rows (their records would show twice).
        """
        out = self._ordered.get(table)
        if out is None:
            out = sorted(self.fragments.get(table, {}).values(), key=_FIRST_ID)
            for a, b in itertools.pairwise([f for f in out if f.rows]):
                if a.row_start + a.rows > b.row_start:  # (their records would show twice)
                    raise CorruptObjectError(layout.commits_dir(self.writer),
                                             f"live fragments {a.name!r} and {b.name!r} of table {table!r} overlap "
                                             f"(rows [{a.row_start}, {a.row_start + a.rows}) and from {b.row_start})")
            _check_segment_ranges(self.writer, table, out)
            self._ordered[table] = out
        return out

    def state(self) -> tuple[int, bool, dict[str, list[dict[str, Any]]]]:
        """What two applications of the same records agree on, whatever order the fragments were added in.

        Returns
        -------
        tuple
            Next seq, closed flag and live fragment descriptors per table (sorted by name).
        """
        return self.next_seq, self.closed, {t: sorted((f.to_dict() for f in frags.values()), key=lambda d: d["name"])
                                            for t, frags in self.fragments.items() if frags}


def _check_segment_ranges(writer: int, table: str, frags: list[Fragment]) -> None:
    """Refuse live fragments of one segment whose rows (or values) in it overlap.

    A writer fills a segment front to back, so its fragments of one segment, in row-id order,
    lie at increasing, disjoint rows and values of it; two that share a segment row would read
    the same record under two row ids. Cost: one pass over ``frags`` (in row-id order).
    """
    last: dict[str, Fragment] = {}
    for b in frags:
        sb = b.segment
        if sb is None or not b.rows:
            continue
        a = last.get(sb.name)
        last[sb.name] = b
        if a is None:
            continue
        sa = a.segment
        assert sa is not None
        bad = [k for k in sb.values if sa.values.get(k, 0) + a.nnz.get(k, 0) > sb.values[k]]
        if sa.row + a.rows > sb.row or bad:
            what = (f"rows [{sa.row}, {sa.row + a.rows}) and from {sb.row}" if not bad else
                    f"values of {bad[0]!r} [{sa.values[bad[0]]}, {sa.values[bad[0]] + a.nnz[bad[0]]}) and from "
                    f"{sb.values[bad[0]]}")
            raise CorruptObjectError(layout.commits_dir(writer),
                                     f"live fragments {a.name!r} and {b.name!r} of table {table!r} overlap in "
                                     f"segment {sb.name!r} ({what}): one record would show under two row ids")


@dataclass
class CommitInfo:
    """One applied commit record (its body, as stored).

    Attributes
    ----------
    seq : int
        The record's sequence number.
    body : dict of str to Any
        The record's body.
    """

    writer: int
    seq: int
    body: dict[str, Any]


class CommitLog:
    """Incrementally applies commit records; ``refresh`` costs what is new, not what is stored.

    The first refresh starts from the newest readable log checkpoint. The
    applied records' bodies are not kept: :meth:`history` reads them back when
    asked, and keeps them from then on.

    Parameters
    ----------
    tables : list of str or mapping of str to Schema
        The known tables; with schemas, records are also checked against their
        CSR offsets arrays.
    checkpoints : bool, optional
        Start from the newest checkpoint (False: from every writer's first record).
    generation : str or None, optional
        The store's generation: commit records and checkpoints of another one (left by the
        writers of a store replaced at this location) are not applied; None checks none.

    Attributes
    ----------
    writers : dict of int to WriterLog
        What has been applied, per writer.
    version : int
        Bumps whenever something new was applied.
    time_ns : int
        The latest commit time applied.
    """

    def __init__(self, storage: Storage, tables: list[str] | Mapping[str, Schema], *, checkpoints: bool = True,
                 generation: str | None = None) -> None:
        self.storage = storage
        self.generation = generation
        self.tables = list(tables)
        # the known tables, with their CSR offsets arrays where given schemas: what records are checked against
        self.offsets: Mapping[str, Collection[str]] | Collection[str] = (
            {t: tuple(s.offsets_groups) for t, s in tables.items()} if isinstance(tables, Mapping) else self.tables)
        self.writers: dict[int, WriterLog] = {}
        self.version = 0  # bumps whenever something new was applied
        self.time_ns = 0  # the latest commit time applied
        self.checkpoint: int | None = None  # the newest checkpoint this log started from or wrote
        self.since_checkpoint = 0  # records applied since then (or since the first record)
        self._use_checkpoints = checkpoints
        self._started = False
        self._history: list[CommitInfo] | None = None
        # table -> its live fragments in row-id order, and the writers applied since it was made
        self._ordered: dict[str, list[Fragment]] = {}
        self._stale: dict[str, set[int]] = {}
        self._listed: set[str] = set()  # the names under writers/ at the last refresh
        self._listed_token: object = None  # its token (Storage.list_changed)
        self._open: set[int] = set()  # the writers whose close record is not applied

    def refresh(self) -> bool:
        """Apply every commit created since the last call.

        The next record of every writer that has not closed is probed in one
        ``read_many`` (concurrent on object storage); writers that had one are read
        on in rounds of doubling windows (up to ``READ_AHEAD``) until each reaches an
        absent record. Everything is read before anything is applied. Cost: one
        listing of ``writers/`` (skipped where the backend can tell it is
        unchanged), plus the new records.

        Returns
        -------
        bool
            True if anything changed.

        Raises
        ------
        CorruptObjectError
            A record is damaged or malformed; nothing was applied.
        """
        if not self._started:
            self._started = True
            if self._use_checkpoints:
                self._start_from_checkpoint()
        # every writer has a directory under writers/: none made since the last listing, no new writer
        names, self._listed_token = self.storage.list_changed(layout.WRITERS, self._listed_token)
        if names is not None:
            listed = set(names)
            for name in listed.difference(self._listed):  # names not seen before (cost: those)
                if name.isdigit() and int(name) not in self.writers:
                    self.writers[int(name)] = WriterLog(int(name))
                    self._open.add(int(name))
            self._listed = listed
        # read everything first (a damaged record raises with nothing applied), then apply in order
        new: dict[int, list[dict[str, Any]]] = {}
        pending = sorted(self._open)
        window = 1
        while pending:
            starts = {w: self.writers[w].next_seq + len(new.get(w, ())) for w in pending}
            paths = [layout.commit_record(w, starts[w] + k) for w in pending for k in range(window)]
            datas = self.storage.read_many(paths)
            advancing = []
            for i, writer in enumerate(pending):
                for path, data in zip(paths[i * window:(i + 1) * window], datas[i * window:(i + 1) * window],
                                      strict=True):
                    if data is None:  # records are created in order: none after it is applied yet
                        break
                    seq = self.writers[writer].next_seq + len(new.get(writer, ()))
                    body = bodies.commit(path, records.decode(path, data), writer, seq, self.offsets)
                    if foreign(body, self.generation):  # a replaced store's writer's: as if absent
                        break
                    new.setdefault(writer, []).append(body)
                    if body["kind"] == CLOSE:
                        break
                else:
                    advancing.append(writer)
            pending = advancing
            window = min(2 * window, READ_AHEAD)
        self._apply_new(new)
        return bool(new)

    def apply_created(self, writer: int, created: dict[int, bytes]) -> bool | None:
        """Apply writer ``writer``'s records that its own process created, without reading storage.

        Only that writer creates its records, so the ones it holds are all there
        are. Takes from ``created`` each record it applies and drops those already
        applied; applies in order from the writer's next record and stops at the
        first it does not hold.

        Parameters
        ----------
        created : dict of int to bytes
            Seq to the record's bytes, as stored; consumed.

        Returns
        -------
        bool or None
            True if anything was applied; None if this log has not read the store
            yet (nothing done: call :meth:`refresh`).

        Raises
        ------
        CorruptObjectError
            A record is malformed.
        """
        if not self._started:
            return None
        if writer not in self.writers:
            self.writers[writer] = WriterLog(writer)
            self._open.add(writer)
        wlog = self.writers[writer]
        for seq in [s for s in list(created) if s < wlog.next_seq]:  # (applied by a refresh)
            created.pop(seq, None)
        docs: list[dict[str, Any]] = []
        while not wlog.closed and (data := created.pop(wlog.next_seq + len(docs), None)) is not None:
            seq = wlog.next_seq + len(docs)
            path = layout.commit_record(writer, seq)
            docs.append(bodies.commit(path, records.decode(path, data), writer, seq, self.offsets))
            if docs[-1]["kind"] == CLOSE:
                break
        self._apply_new({writer: docs} if docs else {})
        return bool(docs)

    def _apply_new(self, new: dict[int, list[dict[str, Any]]]) -> None:
        """Apply each writer's next records ``new`` (decoded, in seq order)."""
        for stale in self._stale.values():
            stale.update(new)
        for writer, batch in new.items():
            wlog = self.writers[writer]
            for body in batch:
                self._apply(wlog, body)
                if self._history is not None:
                    self._history.append(CommitInfo(writer, wlog.next_seq, body))
                wlog.next_seq += 1
            if wlog.closed:
                self._open.discard(writer)
        self.since_checkpoint += sum(map(len, new.values()))
        if new:
            self.version += 1

    def _apply(self, wlog: WriterLog, body: dict[str, Any]) -> None:
        apply_record(wlog, body)
        self.time_ns = max(self.time_ns, int(body.get("time_ns", 0)))

    def fragments(self, table: str) -> list[Fragment]:
        """Live fragments of ``table``, ordered by row id.

        A writer's row ids all follow those of lower writer numbers. Cost: the
        fragments of the writers whose records were applied since the last call.

        Returns
        -------
        list of Fragment
            The fragments; shared until the log changes: do not modify it.

        Raises
        ------
        CorruptObjectError
            Two live fragments of a writer overlap.
        """
        out = self._ordered.get(table)
        if out is None:
            out = list(itertools.chain.from_iterable(self.writers[w].ordered(table) for w in sorted(self.writers)))
        elif self._stale[table]:
            out = list(out)
            for w in sorted(self._stale[table]):  # a writer's fragments are one run of the list
                lo = bisect.bisect_left(out, w << layout.ROW_BITS, key=_FIRST_ID)
                hi = bisect.bisect_left(out, (w + 1) << layout.ROW_BITS, lo=lo, key=_FIRST_ID)
                out[lo:hi] = self.writers[w].ordered(table)
        self._ordered[table], self._stale[table] = out, set()
        return out

    def committed(self, table: str) -> int:
        """Records ever committed to ``table``, over all writers: evicted and reclaimed ones included.

        The sum over writers of the end of the highest local row range applied (row ids
        count each writer's records of a table from 0). Exact where the log was read from
        the first records or from a checkpoint with ``committed`` counts; from an older
        checkpoint, fragments removed before it are not counted. Cost: O(writers).

        Returns
        -------
        int
            The count, as of the last refresh.
        """
        return sum(wlog.committed.get(table, 0) for wlog in self.writers.values())

    # -- history --------------------------------------------------------------------------
    def history(self) -> list[CommitInfo]:
        """Every applied record, ordered by commit time, then writer and seq.

        Each writer's records up to where this log has applied them. Read from
        storage at the first call (the log may have started from a checkpoint), then
        kept and extended by each refresh.

        Returns
        -------
        list of CommitInfo
            The records.

        Raises
        ------
        StoreError
            A record is missing (records are never deleted).
        CorruptObjectError
            A record is damaged.
        """
        if self._history is None:
            self._history = list(self._read_records({w: wlog.next_seq for w, wlog in self.writers.items()}))
        return sorted(self._history, key=lambda c: (int(c.body.get("time_ns", 0)), c.writer, c.seq))

    def _read_records(self, ends: dict[int, int]) -> list[CommitInfo]:
        """Records ``0 .. ends[w] - 1`` of each writer ``w``.

        A missing one is a StoreError (raised at the first batch that meets it: ``ends`` from a
        damaged checkpoint may be absurd).
        """
        wanted = ((w, seq) for w in sorted(ends) for seq in range(ends[w]))
        out: list[CommitInfo] = []
        while chunk := list(itertools.islice(wanted, HISTORY_BATCH)):
            paths = [layout.commit_record(w, seq) for w, seq in chunk]
            for (w, seq), path, data in zip(chunk, paths, self.storage.read_many(paths),
                                            strict=True):
                if data is None:
                    raise StoreError(f"{path}: commit record missing (records are never deleted); "
                                     "run replaystore verify")
                out.append(CommitInfo(w, seq, bodies.commit(path, records.decode(path, data), w, seq, self.offsets)))
        return out

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint_numbers(self) -> list[int]:
        """The numbers of the checkpoints in storage, ascending.

        Cost: one listing.

        Returns
        -------
        list of int
            The numbers.
        """
        names = self.storage.list(layout.CHECKPOINTS)
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def _start_from_checkpoint(self) -> None:
        """Take the state of the newest checkpoint that reads back whole (none: start empty).

        A damaged checkpoint is skipped (``replaystore verify`` reports it); one deleted
        meanwhile (superseded) likewise: the commit records hold everything it summarised.
        """
        for number in reversed(self.checkpoint_numbers()):
            path = layout.checkpoint(number)
            try:
                data = self.storage.read_many([path])[0]
                if data is None:
                    continue
                writers, time_ns = decode_checkpoint(path, data, number, self.offsets, self.generation)
            except CorruptObjectError:
                continue
            if writers is None:  # another store generation's (a replaced store's writer wrote it)
                continue
            self.writers, self.time_ns = writers, time_ns
            self.checkpoint = number
            self.version += 1
            self._ordered.clear()
            self._open = {w for w, wlog in self.writers.items() if not wlog.closed}
            return

    def checkpoint_due(self) -> bool:
        """Whether this log applied ``CHECKPOINT_EVERY`` records since the newest checkpoint it knows.

        Returns
        -------
        bool
            True when a checkpoint is due.
        """
        return self.since_checkpoint >= CHECKPOINT_EVERY

    def write_checkpoint(self) -> int | None:
        """Create the next checkpoint of what this log has applied and delete those before the previous one.

        None, writing nothing, if another writer made a checkpoint this log did not
        know of (listed, or created first under the same number). Either way the
        count of records since a checkpoint starts again. Cost: one listing, one
        create-if-absent, and the deletes.

        Returns
        -------
        int or None
            The new checkpoint's number.
        """
        numbers = self.checkpoint_numbers()
        known = -1 if self.checkpoint is None else self.checkpoint
        self.since_checkpoint = 0
        if numbers and numbers[-1] > known:  # another writer's is recent enough: one per interval
            self.checkpoint = numbers[-1]
            return None
        number = known + 1
        if not self.storage.create(layout.checkpoint(number),
                                   encode_checkpoint(number, self.writers, self.time_ns, self.generation)):
            self.checkpoint = number
            return None
        self.checkpoint = number
        # the previous one stays, for readers that listed before this one was created
        self.storage.delete_objects([layout.checkpoint(old) for old in numbers if old < number - 1])
        return number

    def state_at(self, ends: dict[int, int]) -> dict[int, WriterLog]:
        """The writers' state after applying records ``0 .. ends[w] - 1`` of each writer ``w``.

        What a checkpoint at those positions must hold, read from the records
        themselves (cost: those records).

        Parameters
        ----------
        ends : dict of int to int
            Per writer, the number of records to apply.

        Returns
        -------
        dict of int to WriterLog
            The state.

        Raises
        ------
        StoreError
            A record is missing.
        CorruptObjectError
            A record is damaged.
        """
        state = {w: WriterLog(w) for w in ends}
        for info in self._read_records(ends):
            apply_record(state[info.writer], info.body)
            state[info.writer].next_seq = info.seq + 1
        return state


def apply_record(wlog: WriterLog, body: dict[str, Any]) -> None:
    """Apply one of ``wlog``'s commit records (the next one) to its live fragments.

    Parameters
    ----------
    wlog : WriterLog
        The writer's state.
    body : dict of str to Any
        The record's checked body.
    """
    for table, change in body.get("tables", {}).items():
        wlog._ordered.pop(table, None)
        frags = wlog.fragments.setdefault(table, {})
        for name in change.get("remove", []):
            frags.pop(name, None)
        for d in change.get("add", []):
            frag = Fragment.from_dict(wlog.writer, table, d)
            frags[frag.name] = frag
            end = frag.row_start + frag.rows
            if end > wlog.committed.get(table, 0):
                wlog.committed[table] = end
    wlog.closed = body.get("kind") == CLOSE
    if wlog.closed:
        wlog.closed_ns = int(body.get("time_ns", 0))


def encode_checkpoint(number: int, writers: dict[int, WriterLog], time_ns: int, generation: str | None = None) -> bytes:
    """A checkpoint document: per writer its next seq, whether it closed, its live fragments.

    Parameters
    ----------
    number : int
        The checkpoint's number.
    writers : dict of int to WriterLog
        The state to record.
    time_ns : int
        The latest commit time applied.
    generation : str or None, optional
        The store's generation, recorded in the checkpoint (None: none recorded).

    Returns
    -------
    bytes
        The self-checking document.
    """
    return records.encode({
        "kind": CHECKPOINT, "number": number, "time_ns": time_ns,
        **({"generation": generation} if generation is not None else {}),
        "writers": {str(w): {"next_seq": wlog.next_seq, "closed": wlog.closed,
                             "tables": {t: [f.to_dict() for f in frags.values()]
                                        for t, frags in wlog.fragments.items() if frags},
                             # (counts known only as a lower bound, from an older checkpoint, are left out)
                             **({"committed": {t: n for t, n in sorted(wlog.committed.items()) if n}}
                                if wlog.counted else {})}
                    for w, wlog in sorted(writers.items())},
    })


def decode_checkpoint(path: str, data: bytes, number: int | None = None,
                      tables: Mapping[str, Collection[str]] | Collection[str] | None = None,
                      generation: str | None = None) -> tuple[dict[int, WriterLog] | None, int]:
    """``(writers, latest commit time)`` of a checkpoint document.

    ``writers`` is None for a checkpoint of another store generation than ``generation``
    (written by a writer of a store replaced at this location): it is not this store's.

    Parameters
    ----------
    path : str
        The checkpoint's path, named in errors.
    data : bytes
        The document.
    number : int, optional
        The number it must carry.
    tables : mapping or collection of str, optional
        The known tables, with their CSR offsets arrays where a mapping.
    generation : str or None, optional
        The store's generation (None: not checked).

    Returns
    -------
    writers : dict of int to WriterLog or None
        The state it holds; None if it is another generation's.
    time_ns : int
        The latest commit time it records.

    Raises
    ------
    CorruptObjectError
        It is damaged, not a checkpoint or malformed (store/format/bodies.py).
    """
    body = bodies.checkpoint(path, records.decode(path, data), number, tables)
    if foreign(body, generation):
        return None, body["time_ns"]
    writers: dict[int, WriterLog] = {}
    for key, doc in body["writers"].items():
        w = int(key)
        frags = {t: {d["name"]: Fragment.from_dict(w, t, d) for d in ds} for t, ds in doc["tables"].items()}
        # records ever committed per table: the checkpoint's counts (older checkpoints have none:
        # the live fragments' ends, which miss fragments removed before the checkpoint)
        committed = {t: int(n) for t, n in doc.get("committed", {}).items()}
        for t, fs in frags.items():
            end = max((f.row_start + f.rows for f in fs.values()), default=0)
            if end > committed.get(t, 0):
                committed[t] = end
        writers[w] = WriterLog(w, doc["next_seq"], doc["closed"], frags, committed, "committed" in doc)
        if doc["closed"]:  # (the close's own time is not kept: the checkpoint's is no earlier)
            writers[w].closed_ns = int(body["time_ns"])
    return writers, body["time_ns"]
