"""What a writer and its parts receive from the store handle they write through.

The store handle (store/store.py) builds a :class:`WriteContext` for each writer it creates; each
part of the writer then receives only the pieces of it that it uses (docs/INTERNALS.md,
"Writer"). Nothing in this package imports the store handle's module.

The parts (committer.py, segmentpool.py, reclaimer.py, compactor.py) take the store's
``storage`` and the writer's number ``writer`` first, then what they share with the writer's
other parts (its name counter, its I/O threads, the other parts), then by keyword the pieces of
the :class:`WriteContext` they use (``tables``, ``guard`` or one of its checks, ``log``, ...).
Such a piece is what :class:`WriteContext` says it is; a part's docstring says only what the
part uses it for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from replaystore.schemas import Schema
from replaystore.store.read.log import CommitLog
from replaystore.store.read.table import TableReader
from replaystore.store.storage import Storage


@dataclass(frozen=True)
class Guard:
    """The store handle's replace checks, as a writer's parts call them.

    Attributes
    ----------
    check_current : Callable[[], None]
        Raise ``StoreReplacedError`` if the store the handle opened was replaced: called before
        anything is written or deleted.
    may_delete : Callable[[], bool]
        Whether the handle's writers may delete storage: the store is not replaced (nor unknown).
    as_replaced : Callable[[], AbstractContextManager[None]]
        A context that turns any failure inside into ``StoreReplacedError`` once the store is
        found replaced (a replace deleted the writer's storage under it).
    """

    check_current: Callable[[], None]
    may_delete: Callable[[], bool]
    as_replaced: Callable[[], AbstractContextManager[None]]


@dataclass(frozen=True)
class Tables:
    """The store's tables as the handle currently shows them.

    Attributes
    ----------
    schemas : Mapping[str, Schema]
        Each table's schema, in manifest order.
    capacity : int or None
        The store's capacity in records; None for an unbounded store.
    reader : Callable[[str], TableReader]
        The handle's current reader of a table.
    refresh : Callable[[], bool]
        Pick up every writer's new commits (the handle's ``refresh``); True if any was applied.
    """

    schemas: Mapping[str, Schema]
    capacity: int | None
    reader: Callable[[str], TableReader]
    refresh: Callable[[], bool]


@dataclass(frozen=True)
class WriteContext:
    """Everything a :class:`~replaystore.store.write.writer.Writer` receives from its store handle.

    Attributes
    ----------
    storage : Storage
        Where the writer's objects and records go (``writers/<writer>/``).
    generation : str
        The store's generation: every record the writer creates carries it.
    format_version : int
        The manifest's format version.
    tables : Tables
        The tables: schemas, capacity, readers and the refresh.
    log : CommitLog
        The handle's commit log (its writers, its newest commit time, its checkpoints).
    guard : Guard
        The handle's replace checks.
    show_created : Callable[[int, dict[int, bytes]], None]
        Show the records a writer of this process created (by sequence number) through the
        handle, without reading storage.
    """

    storage: Storage
    generation: str
    format_version: int
    tables: Tables
    log: CommitLog
    guard: Guard
    show_created: Callable[[int, dict[int, bytes]], None]


class WriteHost(Protocol):
    """What ``Writer(store)`` takes: a store handle (``replaystore.store.Store``)."""

    @property
    def mode(self) -> str:
        """The mode the handle was opened with; ``"r"`` refuses writers."""

    def write_context(self) -> WriteContext:
        """What the handle's writers receive (a new :class:`WriteContext`)."""
