"""How a store handle follows its commit log: refreshing it, and keeping each table's view current."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from replaystore.store.read.log import CLOSE, CommitLog
from replaystore.store.read.table import TableReader


class LogFollower:
    """Apply a store's new commits to its commit log and to each table's reader.

    Parameters
    ----------
    log : CommitLog
        The handle's commit log.
    readers : callable
        Returns the handle's table readers (each is synced after the log changed).
    """

    def __init__(self, log: CommitLog, readers: Callable[[], Iterable[TableReader]]) -> None:
        self.log = log
        self.readers = readers

    def refresh(self) -> bool:
        """Pick up commits made since the last refresh, by any writer.

        Each table that changed gets a new :class:`~replaystore.store.read.view.TableView`
        (``Table.view()``); views taken before stay as they were.

        Returns
        -------
        bool
            True if any commit was applied.

        Raises
        ------
        CorruptObjectError
            A new commit record is damaged.

        Notes
        -----
        Cost: a listing of the writers (skipped on local disk while it cannot have changed),
        one probe per writer that has not closed, plus the new records; the tables' views
        then follow what changed.
        """
        changed = self.log.refresh()
        if changed:
            self.sync()
        return changed

    def apply_created(self, writer: int, created: dict[int, bytes]) -> None:
        """Show the records writer ``writer`` of this process created, without reading storage.

        See ``CommitLog.apply_created``; a handle that has not read the store yet refreshes.
        """
        applied = self.log.apply_created(writer, created)
        if applied is None:
            self.refresh()
        elif applied:
            self.sync()

    def sync(self) -> None:
        """Bring each table's reader up to the log."""
        for reader in self.readers():
            reader.sync()

    def commits(self) -> list[dict[str, Any]]:
        """Every applied commit (``append`` and ``compact``), oldest first.

        A writer's ``close`` record is not listed: it commits nothing.

        Returns
        -------
        list of dict
            The commit record bodies: ``writer``, ``seq``, ``time_ns``, ``kind``, ``metadata``
            and per table the per-append batch metadata; ordered by commit time, then writer and
            seq.

        Raises
        ------
        CorruptObjectError
            A commit record is damaged.

        Notes
        -----
        Cost: the first call reads the records back from storage (opening keeps none in
        memory); later calls cost only what was applied since.
        """
        return [c.body for c in self.log.history() if c.body.get("kind") != CLOSE]
