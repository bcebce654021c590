"""The on-disk format.

Tables of Zarr columns in immutable fragments, a commit log per writer, a stream/step index,
retention, state slots.

The public interface is the names below (``__all__``), plus three modules imported by path:
``replaystore.store.storage`` (the storage layer: ``open_storage``, ``Storage``,
``StorageURLError``), ``replaystore.store.sql`` (``QueryError``, ``connect``, ``query``) and
``replaystore.store.maintenance`` (the maintenance API of the tools: ``verify_store``,
``Problem``, ``VacuumReport``, ``live_objects``, ``read_state_record``). Code outside this
package uses nothing else of it (``tests/test_import_boundary.py`` checks): the other modules
and every underscore name are internals that may change.

Opening and writing: :func:`open_store`, :class:`Store`, :class:`Table`, :class:`Writer` (with
its :class:`CommitResult`), ``Mode`` (the modes of ``open_store``), ``DEFAULT_TABLE`` (the table
of a single-schema store), :class:`ChunkCache` (a read cache shared by handles).

Reading: :class:`TableView` (a table as of one refresh) and its :class:`StreamIndex`;
fragment-level scans for distributed engines: :class:`FragmentInfo`, :func:`scan_fragment`,
:func:`scan_projection`, ``SCAN_ROWS``.

Format facts callers compute with: ``ROW_BITS`` (a row id is ``writer << ROW_BITS | position``,
docs/FORMAT.md), :func:`grace` (the grace margin past a capacity), :func:`read_manifest`, and
the state-slot name grammar: :func:`check_slot_name`, :func:`state_slot_names`.
"""

from typing import Any

from replaystore.store.format import layout
from replaystore.store.format.layout import ROW_BITS
from replaystore.store.read.index import StreamIndex
from replaystore.store.read.retention import grace
from replaystore.store.read.scan import SCAN_ROWS, scan_fragment, scan_projection
from replaystore.store.read.view import FragmentInfo, TableView
from replaystore.store.storage import Storage
from replaystore.store.storage.cache import ChunkCache
from replaystore.store.store import DEFAULT_TABLE, Mode, Store, Table, _read_manifest, open_store, register_sql_face
from replaystore.store.write.writer import CommitResult, Writer


class _SqlModule:
    """The SQL face of every ``Store``: ``replaystore.store.sql``, loaded (with DuckDB) at its first use.

    ``sql.py`` sits above ``store.py`` (it reads a ``Store``) and ``store.py`` never imports it;
    this package, above both, registers this face for ``Store.sql`` and ``Store.duckdb``.
    """

    def query(self, store: Store, query: str, unsafe: bool) -> Any:
        from replaystore.store import sql

        return sql.query(store, query, unsafe=unsafe)

    def connect(self, store: Store, connection: Any, unsafe: bool) -> Any:
        from replaystore.store import sql

        return sql.connect(store, connection, unsafe=unsafe)


register_sql_face(_SqlModule())


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


def check_slot_name(slot: object, argument: str) -> str:
    """``slot`` as a state slot's name, checked against the format's name grammar.

    Parameters
    ----------
    slot : object
        The name (docs/FORMAT.md, "Object names": no ``/``, not starting with ``.``).
    argument : str
        What gave it, named in the error.

    Returns
    -------
    str
        ``slot``.

    Raises
    ------
    InvalidNameError
        ``slot`` is not a str or breaks the grammar (naming ``argument``).
    """
    return layout.given_name("state slot", slot, argument)


def state_slot_names(store: Store) -> list[str]:
    """The names of the store's state slots, those breaking the name grammar left out.

    Parameters
    ----------
    store : Store
        The open store.

    Returns
    -------
    list of str
        Slot names as listed (a slot without a saved version may be among them:
        ``Store.load_state`` gives None for it).

    Notes
    -----
    Cost: one listing of ``state/`` (cheaper than ``Store.state_slots``, which also lists
    each slot).
    """
    return [s for s in store.storage.list(layout.STATE) if layout.name_problem("state slot", s) is None]


__all__ = [
    "DEFAULT_TABLE",
    "ROW_BITS",
    "SCAN_ROWS",
    "ChunkCache",
    "CommitResult",
    "FragmentInfo",
    "Mode",
    "Store",
    "StreamIndex",
    "Table",
    "TableView",
    "Writer",
    "check_slot_name",
    "grace",
    "open_store",
    "read_manifest",
    "scan_fragment",
    "scan_projection",
    "state_slot_names",
]
