"""``Store.info``: a summary of an open store (format, writers, sizes, state slots, tables)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from replaystore.schemas import Schema
from replaystore.store.format.codecs import column_bytes
from replaystore.store.format.streamkeys import StreamKey
from replaystore.store.read.log import CommitLog
from replaystore.store.read.table import TableReader
from replaystore.store.storage import Storage
from replaystore.store.storage import cache as chunkcache


class SummarizedTable(Protocol):
    """What :func:`summary` reads of a table (a ``Table``)."""

    reader: TableReader

    @property
    def schema(self) -> Schema:
        """The table's schema."""

    def __len__(self) -> int: ...

    def streams(self) -> list[StreamKey]:
        """The table's stream keys."""


def summary(storage: Storage, log: CommitLog, manifest: Mapping[str, Any], state: dict[str, dict[str, Any]],
            tables: Mapping[str, SummarizedTable]) -> dict[str, Any]:
    """A summary of a store: format version, capacity, writers, sizes, state slots, tables.

    Parameters
    ----------
    storage : Storage
        The store's storage.
    log : CommitLog
        Its commit log, refreshed.
    manifest : mapping
        Its manifest body.
    state : dict
        Its state slots (``Store.state_slots``).
    tables : mapping of str to Table
        Its tables by name.

    Returns
    -------
    dict
        ``url``, ``format_version``, ``capacity``, ``writers``, ``writers_closed``,
        ``commits``, ``log_checkpoint``, ``bytes`` (the storage the store occupies; local:
        what ``du -s --block-size=1`` reports, allocated blocks of the root and of every
        directory, file and link under it, hard links once), ``apparent_bytes`` (the sum
        of its objects' sizes; local: what ``du -sb`` reports, counting the unwritten,
        sparse tail of segments; on object storage the two are equal), ``state``
        (``Store.state_slots``), ``chunk_cache`` and per table
        its schema name, records, streams, fragments and ``columns`` (per dense field its
        ``stored`` and ``raw`` bytes and ``codec``).

    Notes
    -----
    Cost: a walk of the store's objects.
    """
    return {
        "url": storage.url,
        "format_version": manifest["format_version"],
        "capacity": manifest["capacity"],
        "writers": len(log.writers),
        "writers_closed": sum(w.closed for w in log.writers.values()),
        # every record but close records (each writer's last, if it closed): no history read
        "commits": sum(w.next_seq - w.closed for w in log.writers.values()),
        "log_checkpoint": log.checkpoint,
        "bytes": storage.total_size(),
        "apparent_bytes": storage.apparent_size(),
        "state": state,
        # where this reader caches the store's chunk objects, and how much of them it holds
        "chunk_cache": None if (cache := chunkcache.store_cache(storage)) is None else {
            "directory": cache.root, "bytes": cache.size()},
        "tables": {n: {"schema": t.schema.name, "records": len(t), "streams": len(t.streams()),
                       "fragments": len(t.reader.fragments),
                       "columns": column_bytes(storage, t.schema, t.reader.fragments)}
                   for n, t in tables.items()},
    }
