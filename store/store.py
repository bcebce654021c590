"""``open_store`` and the :class:`Store` / :class:`Table` read API."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

import numpy as np

from replaystore.errors import (
    ModeError,
    ReadOnlyError,
    SchemaMismatchError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from replaystore.schemas import Schema
from replaystore.store.format import layout, records
from replaystore.store.format.generations import new_generation, store_generation
from replaystore.store.read.face import ReadFace
from replaystore.store.read.follow import LogFollower
from replaystore.store.read.log import CommitLog
from replaystore.store.read.manifest import ReplaceWatch, read_manifest
from replaystore.store.read.summary import summary
from replaystore.store.read.table import TableReader
from replaystore.store.state import STATE_KEEP_LAST, StateSlots
from replaystore.store.storage import Storage, open_storage
from replaystore.store.storage import cache as chunkcache
from replaystore.store.storage.cache import ChunkCache
from replaystore.store.write.context import Guard, Tables, WriteContext
from replaystore.store.write.writer import InsertLimiter, Writer

if TYPE_CHECKING:
    from replaystore.store.maintenance.vacuum import VacuumReport
    from replaystore.store.read.view import TableView

Mode = Literal["r", "r+", "a", "w", "w-", "x", "w+"]
"""How :func:`open_store` opens a store (its docstring has the table of modes)."""
MODES: tuple[Mode, ...] = get_args(Mode)
CREATE_EXCLUSIVE: tuple[Mode, ...] = ("w", "w-", "x")
"""The modes that create a store and refuse a location that already holds one."""
DEFAULT_TABLE = "records"


class SqlFace(Protocol):
    """What :meth:`Store.sql` and :meth:`Store.duckdb` call: the SQL face over a store.

    ``replaystore.store.sql`` sits above this module (it reads a ``Store``), and this module
    never imports it (the imports run one way): the package's ``__init__``, above both,
    registers a face that runs ``sql.query`` and ``sql.connect`` with :func:`register_sql_face`,
    so every ``Store`` has it.
    """

    def query(self, store: Store, query: str, unsafe: bool) -> Any:
        """Run ``query`` over ``store``; see :meth:`Store.sql`."""

    def connect(self, store: Store, connection: Any, unsafe: bool) -> Any:
        """A DuckDB connection with the store's views; see :meth:`Store.duckdb`."""


_SQL_FACE: list[SqlFace] = []


def register_sql_face(face: SqlFace) -> None:
    """Make ``face`` the SQL face of every store (the package's ``__init__`` calls this once).

    Parameters
    ----------
    face : SqlFace
        The face :meth:`Store.sql` and :meth:`Store.duckdb` call.
    """
    _SQL_FACE[:] = [face]


REPORT_PACKAGE = "replaystore.report"
"""The package :meth:`Store.report` and :meth:`Store._repr_html_` load by name at their first call: it sits
above the store (it reads a ``Store`` through the loaders), so no module of the store imports it."""


def _report(module: str) -> Any:
    """``replaystore.report.<module>``, imported by name (once; Python keeps it in ``sys.modules``)."""
    return importlib.import_module(f"{REPORT_PACKAGE}.{module}")


def _sql_face() -> SqlFace:
    if not _SQL_FACE:  # (never: importing this module runs the package's __init__, which registers it)
        raise StoreError("the SQL face is not registered: import replaystore.store")
    return _SQL_FACE[0]


class Table(ReadFace):
    """One table of a store: the read API over its visible records.

    What is visible changes only when the store refreshes (:meth:`Store.refresh`, or a
    writer of this handle committing); :meth:`view` returns it as an immutable
    :class:`~replaystore.store.read.view.TableView` snapshot. The read methods (shared with
    ``TableView`` and ``Store``: :class:`~replaystore.store.read.face.ReadFace`) read the
    table's current view.

    Parameters
    ----------
    reader : TableReader
        The store's reader of the table (internal); obtain a table from
        :meth:`Store.table` or :attr:`Store.default` rather than constructing one.
    """

    def __init__(self, reader: TableReader) -> None:
        self.reader = reader

    @property
    def name(self) -> str:
        """The table's name."""
        return self.reader.name

    @property
    def schema(self) -> Schema:
        """The table's schema (fixed at creation)."""
        return self.reader.schema

    @property
    def capacity(self) -> int | None:
        """The store's capacity in records per table (None: unbounded), plus any :meth:`widen`."""
        return self.reader.capacity

    def total_committed(self) -> int:
        """Records ever committed to the table, as of the store's last refresh: evicted ones included.

        The count a rate limiter takes for inserts (``replaystore.loaders.RateLimiter``); it
        never decreases. Exact unless the store was opened from a log checkpoint written
        before checkpoints carried ``committed`` counts (docs/FORMAT.md, "Log checkpoints"):
        then records of fragments removed before that checkpoint are missing.

        Returns
        -------
        int
            The count. Cost: O(writers).
        """
        return self.reader.log.committed(self.name)

    def view(self) -> TableView:
        """The visible records as of the store's last refresh, as an immutable snapshot.

        The same object until a refresh changes the table; a refresh then makes a new view
        and leaves this one as it was, so code holding a view (a sampler drawing a batch,
        an export) sees one stable set of records.

        Returns
        -------
        TableView
            Row ids, positions, the fragments as read-only descriptions, the log version.
            Cost: O(1); after a refresh that changed the table, the first call costs
            building the new view (the fragments that changed).
        """
        self.reader.sync()
        return self.reader.view

    def _snapshot(self) -> TableView:
        # docstring inherited (the current view, after following the commits the store has seen)
        self.reader.sync()
        return self.reader.view

    def widen(self, extra: int) -> None:
        """Show ``extra`` more records than the capacity.

        Those evicted most recently and still stored within the grace margin (docs/FORMAT.md,
        "Capacity and reclamation").

        For a handle that only gathers rows another handle's (possibly older) view chose,
        such as a DataLoader worker's. No effect without a capacity.

        Parameters
        ----------
        extra : int
            Records to show beyond the capacity (``<= 0``: no effect).

        Notes
        -----
        Cost: one view built afresh.
        """
        self.reader.widen(extra)


class Store(ReadFace):
    """A replaystore store: named tables, a commit log, state slots.

    Obtain one from :func:`open_store`. A single-table store answers the read methods of
    :class:`Table` itself (``len(st)``, ``st.read``, ``st.scan``, ``st.streams``, ...: the
    shared :class:`~replaystore.store.read.face.ReadFace`); with several tables they raise
    :class:`StoreError`: use :meth:`table`.

    Parameters
    ----------
    storage : Storage
        The store's storage (from ``open_storage``).
    manifest : dict
        The manifest body, as read and checked by :func:`open_store`.
    mode : Mode
        The mode it was opened with; ``"r"`` refuses every mutation.
    manifest_bytes : bytes, optional
        The manifest as stored (default: as this library encodes ``manifest``): it names the
        store's replace claim (docs/FORMAT.md, "Replacing a store").

    Notes
    -----
    Cost: constructing reads the commit log (from its newest checkpoint) and builds each
    table's view.
    """

    def __init__(self, storage: Storage, manifest: dict[str, Any], mode: Mode,
                 manifest_bytes: bytes | None = None) -> None:
        self.storage = storage
        self.mode = mode
        self.manifest = manifest
        self.schemas: dict[str, Schema] = {n: Schema.from_dict(d) for n, d in manifest["tables"].items()}
        self.capacity: int | None = manifest["capacity"]
        self.generation = store_generation(manifest)
        """The store's generation (docs/FORMAT.md, "Replacing a store"): every record this handle's
        writers create carries it, and records of another generation are not this store's."""
        self._watch = ReplaceWatch(storage, records.encode(manifest) if manifest_bytes is None else manifest_bytes,
                                   self.generation)
        self.log = CommitLog(storage, self.schemas, generation=self.generation)
        self.log.refresh()
        self._tables = {n: Table(TableReader(storage, self.log, n, s, self.capacity))
                        for n, s in self.schemas.items()}
        self._follower = LogFollower(self.log, lambda: (t.reader for t in self._tables.values()))
        self._states = StateSlots(storage, self.generation, mode == "r", self.check_current, self._may_delete)
        self.closed = False
        self.storage_options: dict[str, Any] = {}

    # -- tables ---------------------------------------------------------------------
    @property
    def cache(self) -> ChunkCache | None:
        """The chunk cache this handle reads through (``open_store``'s ``cache``), if any."""
        cache = chunkcache.store_cache(self.storage)
        return None if cache is None else cache.cache

    @property
    def url(self) -> str:
        """The store's URL as its storage spells it (a local path, ``memory://...``, ``s3://...``)."""
        return self.storage.url

    @property
    def tables(self) -> list[str]:
        """The names of the store's tables, in manifest order (fixed at creation)."""
        return list(self.schemas)

    def table(self, name: str) -> Table:
        """One table of the store.

        Parameters
        ----------
        name : str
            The table's name (a single-schema store has one, ``"records"``).

        Returns
        -------
        Table
            The table's read API; the same object on every call.

        Raises
        ------
        StoreError
            No table of that name; the message lists the tables there are.

        Notes
        -----
        Cost: a dictionary lookup.
        """
        try:
            return self._tables[name]
        except KeyError:
            raise StoreError(f"table {name!r}: expected one of {sorted(self.schemas)}") from None

    @property
    def default(self) -> Table:
        """The store's only table; :class:`StoreError` if it has several (use :meth:`table`)."""
        if len(self._tables) == 1:
            return next(iter(self._tables.values()))
        raise StoreError(f"this store has tables {sorted(self.schemas)}: use st.table(name)")

    @property
    def schema(self) -> Schema:
        """The schema of the store's only table; :class:`StoreError` if it has several."""
        return self.default.schema

    def _snapshot(self) -> TableView:
        # docstring inherited (the only table's current view)
        return self.default._snapshot()

    # -- log: forwarded to LogFollower (store/read/follow.py), whose docstrings they carry ---------
    def refresh(self) -> bool:  # noqa: D102
        return self._follower.refresh()

    refresh.__doc__ = LogFollower.refresh.__doc__

    def _apply_created(self, writer: int, created: dict[int, bytes]) -> None:
        self._follower.apply_created(writer, created)

    def commits(self) -> list[dict[str, Any]]:  # noqa: D102
        return self._follower.commits()

    commits.__doc__ = LogFollower.commits.__doc__

    def writer(self, *, rate_limiter: InsertLimiter | None = None) -> Writer:
        """Register a new writer (one per process; several processes may write at once).

        Parameters
        ----------
        rate_limiter : RateLimiter, optional
            Throttle the writer's commits on a sample-to-insert ratio
            (``replaystore.loaders.RateLimiter``; docs/GUIDE.md, "Rate limiting").

        Returns
        -------
        Writer
            The writer; use it as a context manager, or call ``close()``.

        Raises
        ------
        ReadOnlyError
            The store was opened with mode ``"r"``.
        StoreReplacedError
            The store was replaced (``mode="w+"``) since this handle opened it.
        CorruptObjectError
            A writer registration records a capacity that differs from the manifest's.

        Notes
        -----
        Cost: one read of the manifest, a listing of ``writers/``, then one create-if-absent
        per writer number tried.
        """
        self.check_current()
        return Writer(self, rate_limiter=rate_limiter)

    def write_context(self) -> WriteContext:
        """What this handle's writers receive: its storage, tables, log and replace checks.

        Internal: :class:`Writer` calls it; users call :meth:`writer` (docs/INTERNALS.md,
        "Writer").

        Returns
        -------
        WriteContext
            A new context bound to this handle.

        Notes
        -----
        Cost: O(1).
        """
        tables = Tables(self.schemas, self.capacity, lambda name: self._tables[name].reader, self.refresh)
        guard = Guard(self.check_current, self._may_delete, self._as_replaced)
        return WriteContext(self.storage, self.generation, self.manifest["format_version"], tables, self.log,
                            guard, self._apply_created)

    # -- replace checks: forwarded to ReplaceWatch (store/read/manifest.py), whose docstrings they carry
    def replaced(self) -> bool:  # noqa: D102
        return self._watch.replaced()

    replaced.__doc__ = ReplaceWatch.replaced.__doc__

    def _may_delete(self) -> bool:
        return self._watch.may_delete()

    def _as_replaced(self) -> contextlib.AbstractContextManager[None]:
        return self._watch.as_replaced()

    def check_current(self) -> None:  # noqa: D102
        self._watch.check_current()

    check_current.__doc__ = ReplaceWatch.check_current.__doc__

    @property
    def writers(self) -> list[int]:
        """Numbers of the writers this handle's log knows of, ascending (closed ones included)."""
        return sorted(self.log.writers)

    # -- SQL ------------------------------------------------------------------------------
    def sql(self, query: str, unsafe: bool = False) -> Any:
        """Run DuckDB SQL over the store.

        Each table is a view under its name (a single-schema store: ``records``) with
        ``row, stream, step, reset``, every schema field (ragged fields as LIST,
        multi-dimensional dense fields as fixed-size arrays), ``writer, commit,
        commit_time``; ``commits`` and ``appends`` hold the commit log and per-append
        batch metadata. float16 fields read as float32 (DuckDB has no half floats).

        Parameters
        ----------
        query : str
            One or more SQL statements; the last one's result is returned.
        unsafe : bool, default False
            The connection is read-only towards everything but the store: file readers and
            writers (``read_csv``, ``COPY ... TO``), ``ATTACH``, ``INSTALL``/``LOAD`` and
            network access are refused. True lifts that for trusted queries (e.g.
            ``COPY (SELECT ...) TO 'out.parquet'``).

        Returns
        -------
        pyarrow.Table
            The result (an empty table for a statement that returns nothing).

        Raises
        ------
        QueryError
            An empty query, anything DuckDB rejects, or outside access without ``unsafe``.
            An unknown column lists the available columns of the tables queried; an unknown
            table lists the tables.

        Notes
        -----
        Cost: a new DuckDB connection; scans stream and read only the columns the query uses.

        Examples
        --------
        >>> import numpy as np
        >>> from replaystore.schemas import transitions
        >>> st = open_store("memory://doc-sql", transitions(obs_shape=1), mode="x")
        >>> with st.writer() as w:
        ...     for actor in ("a", "b"):
        ...         _ = w.append({"obs": np.zeros((2, 1), np.float32), "action": np.array([0, 1]),
        ...                       "reward": np.array([0.5, 1.0], np.float32),
        ...                       "next_obs": np.zeros((2, 1), np.float32),
        ...                       "terminated": np.array([False, True])}, stream=actor)
        >>> st.sql("SELECT stream, sum(reward) AS r FROM records GROUP BY stream ORDER BY stream").to_pylist()
        [{'stream': 'a', 'r': 1.5}, {'stream': 'b', 'r': 1.5}]
        """
        return _sql_face().query(self, query, unsafe)

    def duckdb(self, connection: Any = None, unsafe: bool = False) -> Any:
        """A DuckDB connection with this store's views registered (see :meth:`sql`).

        Parameters
        ----------
        connection : duckdb.DuckDBPyConnection, optional
            A connection to register the views on; it keeps its own settings. None: a new
            in-memory connection.
        unsafe : bool, default False
            A new connection is read-only towards the outside world unless True.

        Returns
        -------
        duckdb.DuckDBPyConnection
            The connection; close it when done.

        Raises
        ------
        StoreError
            A table's name clashes with a built-in view (``commits``, ``appends``).

        Notes
        -----
        Cost: registering one lazily scanned view per table; nothing is read until queried.
        """
        return _sql_face().connect(self, connection, unsafe)

    # -- state slots: forwarded to StateSlots (store/state.py), whose docstrings they carry ------
    def save_state(self, slot: str, doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None, *,  # noqa: D102
                   keep_last: int = STATE_KEEP_LAST) -> int:
        return self._states.save(slot, doc, arrays, keep_last=keep_last)

    save_state.__doc__ = StateSlots.save.__doc__

    def _state_versions(self, slot: str) -> list[int]:
        return self._states.versions(slot)

    def state_slots(self) -> dict[str, dict[str, Any]]:  # noqa: D102
        return self._states.slots()

    state_slots.__doc__ = StateSlots.slots.__doc__

    def load_state(self, slot: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:  # noqa: D102
        return self._states.load(slot)

    load_state.__doc__ = StateSlots.load.__doc__

    # -- storage ---------------------------------------------------------------------------
    def vacuum(self, older_than_s: float = 3600.0, dry_run: bool = False,
               state_keep_last: int = STATE_KEEP_LAST, progress: bool = False) -> VacuumReport:
        """Delete objects no live commit references, once older than ``older_than_s``.

        Removes crashed writers' uncommitted fragments, compacted-away and retired fragments,
        unnamed state payloads, state versions older than each slot's newest ``state_keep_last``
        and temporary objects (docs/FORMAT.md, "Vacuum").

        Parameters
        ----------
        older_than_s : float, default 3600.0
            Only units unreferenced for at least this long go. Shorter than the longest
            commit of a running writer risks its data (docs/FORMAT.md, "Vacuum").
        dry_run : bool, default False
            Delete nothing; report what would be deleted.
        state_keep_last : int, default 2
            Versions of each state slot to keep.
        progress : bool, default False
            Show a progress bar of the units deleted on stderr when it is a terminal.

        Returns
        -------
        VacuumReport
            What was (or would be) deleted with its bytes, and what was too recent.

        Raises
        ------
        ReadOnlyError
            Mode ``"r"`` without ``dry_run``.
        CorruptObjectError
            A commit record is damaged (nothing is deleted).

        Notes
        -----
        Cost: a listing of every object, two reads of the commit log, one delete per object
        (S3: one request per 1000).
        """
        from replaystore.store.maintenance.vacuum import vacuum

        if self.mode == "r" and not dry_run:
            raise ReadOnlyError("store opened read-only (mode='r'): vacuum is not allowed (dry_run=True is)")
        if not (progress and sys.stderr.isatty()):
            return vacuum(self, older_than_s, dry_run, state_keep_last)
        return _with_bar("vacuum", "unit", lambda advance: vacuum(self, older_than_s, dry_run, state_keep_last,
                                                                  progress=advance))

    # -- looking at it: replaystore.report, loaded by name at the first call --------------------
    def report(self, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        """Write a self-contained HTML report of the store (``replaystore report``; docs/GUIDE.md, "Look at a dataset").

        The summary, episodes and returns per stream, the learning curve, per-field statistics,
        data health, frame strips, sampler states and commits per writer, in one file that uses
        no network when viewed. Cost: about a second per million records.

        Parameters
        ----------
        path : str or path-like
            The HTML file to write.
        **kwargs
            ``table=`` (a store with several tables; else ``StoreError``) and ``progress=``,
            as :func:`replaystore.report.html.build_report` takes them.

        Returns
        -------
        ReportSummary
            ``path``, ``bytes``, ``seconds`` and ``sections``.
        """
        return _report("html").build_report(self, path, **kwargs)

    def _repr_html_(self) -> str:
        """The summary table (schema, records, streams, episodes, writers, size) for notebooks.

        Kept cheap: :func:`replaystore.report.summary.summary_html` with its cap (episodes
        counted only in tables of at most 100,000 records; the commits' time span taken from
        the fragments, without reading the commit history).
        """
        html: str = _report("summary").summary_html(self)
        return html

    # -- lifecycle ------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """A summary of the store: format version, capacity, writers, sizes, state slots, tables.

        Returns
        -------
        dict
            The keys :func:`~replaystore.store.read.summary.summary` lists: ``url``,
            ``format_version``, ``capacity``, writers and commits, ``bytes`` and
            ``apparent_bytes``, ``state`` (:meth:`state_slots`), ``chunk_cache``, ``tables``.

        Raises
        ------
        CorruptObjectError
            As :meth:`refresh`, which it calls first.

        Notes
        -----
        Cost: a refresh, a walk of the store's objects and a listing of each slot.
        """
        self.refresh()
        return summary(self.storage, self.log, self.manifest, self.state_slots(), self._tables)

    def close(self) -> None:
        """Mark the handle closed.

        It holds no resource that needs releasing: writers are closed on their own
        (``Writer.close``). Cost: none.
        """
        self.closed = True

    def __enter__(self) -> Store:
        """The store itself; leaving the block calls :meth:`close`."""
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Store {self.url!r} tables={self.tables} capacity={self.capacity}>"


def _with_bar(desc: str, unit: str, run: Any) -> Any:
    """``run(advance)`` with a tqdm bar on stderr that ``advance(done, total)`` moves."""
    from tqdm import tqdm

    with tqdm(desc=desc, unit=unit, leave=False, file=sys.stderr) as bar:

        def advance(done: int, total: int) -> None:
            if bar.total != total:  # known once the garbage is listed
                bar.total = total
                bar.refresh()
            bar.update(done - bar.n)

        return run(advance)


def _schemas_arg(schema: Schema | Mapping[str, Schema] | None) -> dict[str, Schema] | None:
    if schema is None:
        return None
    if isinstance(schema, Schema):
        return {DEFAULT_TABLE: schema}
    if isinstance(schema, Mapping) and schema and all(isinstance(s, Schema) for s in schema.values()):
        for name in schema:
            layout.given_name("table", name, "schema")
        return dict(schema)
    raise StoreError(f"schema: expected a Schema or a non-empty mapping of table name -> Schema, got {schema!r}")


def _read_manifest(storage: Storage) -> dict[str, Any] | None:
    read = read_manifest(storage)
    return None if read is None else read[0]


def _exists(url: str, mode: str) -> StoreExistsError:
    return StoreExistsError(f"{url}: a store already exists (mode {mode!r}); use 'a' or 'r+' to open it, "
                            "'w+' to replace it")


def open_store(url: str | Storage, schema: Schema | Mapping[str, Schema] | None = None, *, mode: Mode = "a",
               capacity: int | None = None, storage_options: Mapping[str, Any] | None = None,
               cache: ChunkCache | str | os.PathLike[str] | bool | None = None) -> Store:
    """Open or create a store.

    ======================  =====================  ==================================  =========
    mode                    store absent           store present                       can write
    ======================  =====================  ==================================  =========
    ``"r"``                 StoreNotFoundError     opens it                            no
    ``"r+"``                StoreNotFoundError     opens it                            yes
    ``"a"`` (default)       creates it             opens it                            yes
    ``"w"``, ``"w-"``,      creates it             StoreExistsError                    yes
    ``"x"``
    ``"w+"``                creates it             replaces it (deletes it, creates)   yes
    ======================  =====================  ==================================  =========

    ``"w"`` creates exclusively, like zarr's and h5py's ``"w-"``; ``"w+"`` is the mode that
    overwrites. A refused open (any error above) leaves the location as it was.

    Parameters
    ----------
    url : str or Storage
        A local path or an fsspec URL: ``file://``, ``memory://`` (this process only) or
        ``s3://bucket/prefix``; or a :class:`Storage` instance (a custom backend, docs/GUIDE.md).
    schema : Schema or mapping of str to Schema, optional
        One schema (table ``records``) or ``{table name: Schema}``. Required to create a store;
        checked against the stored one otherwise (omit it to open a store as it is).
    mode : {"r", "r+", "a", "w", "w-", "x", "w+"}, default "a"
        How to open it: the table above.
    capacity : int, optional
        None for an unbounded dataset; N to keep the newest N records per table. Fixed at
        creation: checked against the stored one otherwise.
    storage_options : mapping, optional
        fsspec options for the URL (e.g. s3fs's ``endpoint_url``, ``key``, ``secret``).
    cache : ChunkCache, str, os.PathLike, bool or None, optional
        Where a reader keeps the chunk objects of a store on S3: None, the default
        :class:`ChunkCache` (``$REPLAYSTORE_CACHE_DIR`` or ``~/.cache/replaystore``); a directory
        or a ChunkCache; False, none (objects read are held in memory). Local stores are read
        in place: it does not apply to them (nor, unless given, to ``memory://``).

    Returns
    -------
    Store
        The open store; ``store.mode`` is ``mode`` as given.

    Raises
    ------
    ModeError
        ``mode`` is not one of the modes above.
    StoreNotFoundError
        Modes ``"r"`` and ``"r+"``: no store at ``url``.
    StoreExistsError
        Modes ``"w"``, ``"w-"`` and ``"x"``: a store already exists at ``url`` (also when
        another opener created it first).
    NotAStoreError
        Mode ``"w+"``: the location holds objects that are not a replaystore store (nothing
        is deleted).
    StoreReplacedError
        Mode ``"w+"``: another opener is replacing the store at the same time
        (docs/FORMAT.md, "Replacing a store").
    SchemaMismatchError
        ``schema`` differs from the stored schema.
    FormatVersionError
        The store was written in an unknown or newer format version.
    StorageError
        A :class:`Storage` given without ``supports_atomic_create`` or
        ``supports_consistent_listing``, or with ``storage_options`` (nothing is written).
    StoreError
        A bad ``capacity``, ``schema`` or ``storage_options``; no schema to create a store
        with; a ``capacity`` that differs from the stored one.

    Notes
    -----
    Cost: one read of the manifest (creating: one create-if-absent; ``"w+"`` on a store: a
    listing and the deletion of every object), then a read of the commit log (its checkpoint
    and the records since).

    Examples
    --------
    >>> import numpy as np
    >>> from replaystore.schemas import transitions
    >>> st = open_store("memory://doc-open-store", transitions(obs_shape=2), mode="x")
    >>> batch = {"obs": np.zeros((3, 2), np.float32), "action": np.array([0, 1, 1]),
    ...          "reward": np.ones(3, np.float32), "next_obs": np.ones((3, 2), np.float32),
    ...          "terminated": np.array([False, False, True])}
    >>> with st.writer() as w:  # committed when the block ends
    ...     w.append(batch, stream="actor-0")
    3
    >>> len(st), st.streams()
    (3, ['actor-0'])
    >>> open_store("memory://doc-open-store", mode="r").read([0, 2])["action"]
    array([0, 1])
    >>> open_store("memory://doc-open-store", mode="x")
    Traceback (most recent call last):
    ...
    replaystore.errors.StoreExistsError: memory://doc-open-store: a store already exists (mode 'x'); ...
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise ModeError(mode, MODES)
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0):
        raise StoreError(f"capacity: expected None or a positive int, got {capacity!r}")
    schemas = _schemas_arg(schema)
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise StoreError(f"storage_options: expected a mapping of fsspec options, got "
                         f"{type(storage_options).__name__}")
    storage = open_storage(url, storage_options)
    chunk_cache = chunkcache.choose(cache, storage.remote)  # (a bad argument raises here, whatever the backend)
    if storage.supports_local_paths:  # local files are read in place
        chunk_cache = None
    if mode == "w+" and schemas is None:  # refused before the old store is deleted
        raise StoreError(f"{storage.url}: mode 'w+' creates a store, which needs a schema")
    if mode == "w+":  # only a store is replaced, by one opener at a time (store/maintenance/replace.py)
        from replaystore.store.maintenance.replace import clear_for_create

        clear_for_create(storage)
    read = read_manifest(storage)
    manifest, manifest_bytes = (None, None) if read is None else read
    if manifest is None:
        if mode in ("r", "r+"):
            raise StoreNotFoundError(f"{storage.url}: no replaystore store here (mode {mode!r} does not create one)")
        if schemas is None:
            raise StoreError(f"{storage.url}: creating a store needs a schema")
        body = {"format": layout.FORMAT_NAME, "format_version": layout.FORMAT_VERSION,
                "tables": {n: s.to_dict() for n, s in schemas.items()}, "capacity": capacity,
                "created_ns": time.time_ns(), "generation": new_generation()}
        created = storage.create(layout.MANIFEST, records.encode(body))
        if not created and mode in CREATE_EXCLUSIVE:  # a concurrent creator won
            raise _exists(storage.url, mode)
        read = read_manifest(storage)  # (theirs, if a concurrent creator won)
        assert read is not None
        manifest, manifest_bytes = read
    elif mode in CREATE_EXCLUSIVE:
        raise _exists(storage.url, mode)
    stored = {n: Schema.from_dict(d) for n, d in manifest["tables"].items()}
    if schemas is not None and schemas != stored:
        raise SchemaMismatchError(f"{storage.url}: the stored schema differs from the one given "
                                  f"(stored tables {sorted(stored)}); schemas are fixed at creation")
    if capacity is not None and capacity != manifest["capacity"]:
        raise StoreError(f"{storage.url}: capacity {capacity} differs from the stored {manifest['capacity']}")
    if chunk_cache is not None:
        storage = chunkcache.CachingStorage(storage, chunk_cache.for_store(storage.url, manifest))
    store = Store(storage, manifest, mode, manifest_bytes)
    store.storage_options = dict(storage_options or {})
    return store
