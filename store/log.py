"""Reading the commit log: every writer's commit records, merged into the live fragments per table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replaystore.store import layout, records
from replaystore.store.fragment import Fragment
from replaystore.store.storage import Storage

CLOSE = "close"  # the kind of a writer's last record: no commit follows it (docs/FORMAT.md)


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
        """Apply every commit created since the last call; True if anything changed."""
        changed = False
        for name in self.storage.list(layout.WRITERS):
            if name.isdigit() and int(name) not in self.writers:
                self.writers[int(name)] = WriterLog(int(name))
        for wlog in self.writers.values():
            changed |= self._advance(wlog)
        if changed:
            self.version += 1
        return changed

    def _advance(self, wlog: WriterLog) -> bool:
        changed = False
        while not wlog.closed:
            path = layout.commit_record(wlog.writer, wlog.next_seq)
            try:
                data = self.storage.read(path)
            except FileNotFoundError:
                return changed
            body = records.decode(path, data)
            self._apply(wlog, body)
            self.commits.append(CommitInfo(wlog.writer, wlog.next_seq, body))
            wlog.next_seq += 1
            wlog.closed = body.get("kind") == CLOSE
            changed = True
        return changed

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
