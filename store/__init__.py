"""The on-disk format.

Tables of Zarr columns in immutable fragments, a commit log per writer, a stream/step index,
retention, state slots.

The public interface is the names below (``__all__``), plus two modules imported by path:
``replaystore.store.storage`` (the storage layer: ``open_storage``, ``Storage``,
``StorageURLError``) and ``replaystore.store.sql`` (``QueryError``, ``connect``). Code outside
this package uses nothing else of it (``tests/test_import_boundary.py`` checks): the other
modules and every underscore name are internals that may change.
"""

from typing import Any

from replaystore.store.format import bodies, layout, records
from replaystore.store.format.layout import ROW_BITS
from replaystore.store.maintenance.verify import Problem
from replaystore.store.maintenance.verify import verify as verify_store
from replaystore.store.read.index import StreamIndex
from replaystore.store.read.retention import grace
from replaystore.store.read.scan import SCAN_ROWS, scan_fragment, scan_projection
from replaystore.store.read.segments import Segments, grown
from replaystore.store.read.view import FragmentInfo, TableView
from replaystore.store.storage import Storage
from replaystore.store.storage.cache import ChunkCache
from replaystore.store.store import DEFAULT_TABLE, Mode, Store, Table, _read_manifest, open_store
from replaystore.store.write.writer import CommitResult, Writer


def read_manifest(storage: Storage) -> dict[str, Any] | None:
    """The manifest of the store at ``storage`` (what ``open_store`` checks), without opening it.

    Parameters
    ----------
    storage : Storage
        From ``replaystore.store.storage.open_storage``.

    Returns
    -------
    dict or None
        The manifest document; None where there is no store.

    Raises
    ------
    StoreNotFoundError
        The URL is a file.
    FormatVersionError, CorruptObjectError
        The manifest is of another format version, or damaged.

    Notes
    -----
    Cost: one read of the manifest object.
    """
    return _read_manifest(storage)


def read_state_record(storage: Storage, slot: str, version: int) -> dict[str, Any]:
    """State record ``version`` of ``slot``, checked as ``Store.load_state`` checks it.

    Parameters
    ----------
    storage : Storage
        The store's storage.
    slot : str
        The state slot (its name checked against the format's grammar).
    version : int
        The version.

    Returns
    -------
    dict
        The record's body: ``slot``, ``version``, ``time_ns``, ``doc`` and ``arrays``
        (array name to its payload's path in this slot).

    Raises
    ------
    CorruptObjectError
        The record is damaged: not a record, a missing or malformed field, a payload
        path that is not this slot's (UnsafeNameError), larger than a record may be,
        or not a regular file.
    FileNotFoundError
        The record is absent.

    Notes
    -----
    Cost: one read of the record.
    """
    path = layout.state_record(slot, version)
    return bodies.state(path, records.decode(path, records.read(storage, path)), slot, version)


__all__ = [
    "DEFAULT_TABLE",
    "ROW_BITS",
    "SCAN_ROWS",
    "ChunkCache",
    "CommitResult",
    "FragmentInfo",
    "Mode",
    "Problem",
    "Segments",
    "Store",
    "StreamIndex",
    "Table",
    "TableView",
    "Writer",
    "grace",
    "grown",
    "layout",
    "open_store",
    "read_manifest",
    "read_state_record",
    "records",
    "scan_fragment",
    "scan_projection",
    "verify_store",
]
