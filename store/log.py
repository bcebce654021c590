"""Reading the commit log: every writer's commit records, merged into the live fragments per table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replaystore.store import layout, records
from replaystore.store.fragment import Fragment
from replaystore.store.storage import Storage

CLOSE = "close"  # the kind of a writer's last record: no commit follows it (docs/FORMAT.md)
READ_AHEAD = 64  # the most commit records of one writer a refresh asks for at once


@dataclass
class WriterLog:
    """What a reader has applied of one writer's commit sequence."""

    writer: int
    next_seq: int = 0
    closed: bool = False  # its ``close`` record was applied: it never writes again
    fragments: dict[str, dict[str, Fragment]] = field(default_factory=dict)  # table -> name -> fragment


@dataclass
class CommitInfo:
    """One applied commit record (its body, as stored)."""

    writer: int
    seq: int
    body: dict[str, Any]


class CommitLog:
    """Incrementally applies commit records; ``refresh`` costs what is new, not what is stored."""

    def __init__(self, storage: Storage, tables: list[str]) -> None:
        self.storage = storage
        self.tables = tables
        self.writers: dict[int, WriterLog] = {}
        self.commits: list[CommitInfo] = []
        self.version = 0  # bumps whenever something new was applied

    def refresh(self) -> bool:
        """Apply every commit created since the last call; True if anything changed.

        The next record of every writer that has not closed is probed in one ``read_many``
        (concurrent on object storage); writers that had one are read on in rounds of
        doubling windows (up to ``READ_AHEAD``) until each reaches an absent record.
        """
        for name in self.storage.list(layout.WRITERS):
            if name.isdigit() and int(name) not in self.writers:
                self.writers[int(name)] = WriterLog(int(name))
        # read everything first (a damaged record raises with nothing applied), then apply in order
        new: dict[int, list[dict[str, Any]]] = {}
        pending = [w.writer for w in self.writers.values() if not w.closed]
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
                    body = records.decode(path, data)
                    new.setdefault(writer, []).append(body)
                    if body.get("kind") == CLOSE:
                        break
                else:
                    advancing.append(writer)
            pending = advancing
            window = min(2 * window, READ_AHEAD)
        for writer, bodies in new.items():
            wlog = self.writers[writer]
            for body in bodies:
                self._apply(wlog, body)
                self.commits.append(CommitInfo(writer, wlog.next_seq, body))
                wlog.next_seq += 1
                wlog.closed = body.get("kind") == CLOSE
        if new:
            self.version += 1
        return bool(new)

    def _apply(self, wlog: WriterLog, body: dict[str, Any]) -> None:
        for table, change in body.get("tables", {}).items():
            frags = wlog.fragments.setdefault(table, {})
            for name in change.get("remove", []):
                frags.pop(name, None)
            for d in change.get("add", []):
                frag = Fragment.from_dict(wlog.writer, table, d)
                frags[frag.name] = frag

    def fragments(self, table: str) -> list[Fragment]:
        """Live fragments of ``table``, ordered by row id."""
        out = [f for w in self.writers.values() for f in w.fragments.get(table, {}).values()]
        out.sort(key=lambda f: f.first_id)
        return out
