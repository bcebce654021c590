"""DuckDB over a store: each table as a lazily scanned Arrow dataset, plus ``commits`` and ``appends``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from replaystore.errors import ReplayStoreError, StoreError
from replaystore.schemas.nestarrow import struct_batch, struct_schema

if TYPE_CHECKING:
    from replaystore.store.store import Store, Table


RESERVED_VIEWS = ("commits", "appends")

SAFE_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,
}
"""DuckDB settings of a connection made for a store (unless ``unsafe``): no file, network or
extension access (``COPY ... TO``, ``ATTACH``, ``INSTALL``/``LOAD``, ``read_csv`` and every other
file reader or writer are refused), no scans of the caller's Python variables, and the
configuration locked so a query cannot turn them back on."""


class QueryError(StoreError):
    """DuckDB rejected a query (syntax, unknown column, type error).

    Raised by :func:`query` (and ``Store.sql``) for an empty query, a statement
    that is not text, anything DuckDB rejects, and file, network or extension
    access on a safe connection.
    """


class BatchScan:
    """One scan of a table, as DuckDB consumes it: :meth:`to_reader`, pulled on DuckDB's own threads.

    A ``pyarrow.dataset.Scanner`` built from a Python iterator reads it ahead on an
    Arrow I/O thread that runs on after DuckDB stops early (``LIMIT``), running Python
    code while the interpreter shuts down (a fatal ``PyGILState_Release``). This reader
    has no thread of its own: each batch is read, filtered and projected when DuckDB
    asks for it, inside the query, and nothing more once it stops asking.

    Parameters
    ----------
    batches : iterator of pyarrow.RecordBatch
        Batches holding the ``needed`` columns.
    schema : pyarrow.Schema
        The schema DuckDB sees for the ``wanted`` columns.
    wanted : list of str
        The columns to return, in order.
    filter : pyarrow.compute.Expression, optional
        Rows to keep (null counts as false, as in a pyarrow scanner).
    failed : list of BaseException, optional
        Where a store error (``ReplayStoreError``, ``OSError``) raised while reading is
        kept, for :func:`query` to raise in place of DuckDB's message.
    """

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, wanted: list[str],
                 filter: Any = None, failed: list[BaseException] | None = None) -> None:
        self.batches = batches
        self.schema = schema
        self.wanted = wanted
        self.filter = filter
        self.failed = [] if failed is None else failed

    def _batches(self) -> Iterator[pa.RecordBatch]:
        try:
            for b in self.batches:
                if self.filter is not None:
                    b = b.filter(self.filter)
                yield b.select(self.wanted)
        except (ReplayStoreError, OSError) as exc:  # kept, so that the query raises it, not DuckDB's text
            self.failed.append(exc)
            raise

    def to_reader(self) -> pa.RecordBatchReader:
        """The scan as a reader that reads a batch only when asked for one.

        Returns
        -------
        pyarrow.RecordBatchReader
            The ``wanted`` columns of the rows the filter keeps.
        """
        return pa.RecordBatchReader.from_batches(self.schema, self._batches())


class TableDataset(ds.InMemoryDataset):
    """A pyarrow dataset DuckDB can scan with projection and filter pushdown.

    DuckDB calls :meth:`scanner` with the columns it needs and the filter it
    pushes down; we stream record batches reading only those columns (plus any
    the filter names) from the store, and apply the filter with pyarrow.

    Parameters
    ----------
    table : Table
        The table to scan.
    """

    def __init__(self, table: Table) -> None:
        self.nesting = table.schema.nesting
        self.stored = table.scan_schema()
        if self.nesting is not None:  # a nested field as one STRUCT column
            self.stored = struct_schema(self.stored, self.nesting)
        super().__init__(sql_schema(self.stored).empty_table())
        self.source = table
        self.failed: list[BaseException] = []

    def scanner(self, *args: Any, columns: list[str] | None = None, filter: Any = None,
                **kwargs: Any) -> BatchScan:
        """A scan of the table's record batches, reading only the columns needed.

        Cost: reading the needed columns of the visible records, a batch at a
        time, as DuckDB asks for them (nothing is read ahead).

        Parameters
        ----------
        *args
            Ignored (DuckDB's positional arguments).
        columns : list of str, optional
            The columns wanted (default: all).
        filter : pyarrow.compute.Expression, optional
            A filter applied to the batches.
        **kwargs
            Ignored.

        Returns
        -------
        BatchScan
            The scan (DuckDB calls its ``to_reader``).
        """
        full = self.schema
        wanted = list(full.names) if columns is None else list(columns)
        needed = list(wanted)
        if filter is not None:
            text = str(filter)
            needed += [n for n in full.names if n not in needed and re.search(rf"\b{re.escape(n)}\b", text)]
        batches: Iterator[pa.RecordBatch]
        if self.nesting is None:
            batches = self.source.scan(needed)
        else:
            leaves = self.nesting.columns(needed)
            nested = pa.schema([self.stored.field(n) for n in needed])
            batches = (struct_batch(b, nested, self.nesting) for b in self.source.scan(leaves))
        schema = pa.schema([full.field(n) for n in needed])
        if schema != pa.schema([self.stored.field(n) for n in needed]):
            batches = (b.cast(schema) for b in batches)
        return BatchScan(batches, pa.schema([full.field(n) for n in wanted]), wanted, filter, self.failed)


def _sql_type(t: pa.DataType) -> pa.DataType:
    """``t`` with float16 (which DuckDB cannot scan) widened to float32, also inside lists and structs."""
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field(t.value_field.name, _sql_type(t.value_type)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, _sql_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _sql_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_sql_type(t.field(i).type)) for i in range(t.num_fields)])
    return t


def sql_schema(stored: pa.Schema) -> pa.Schema:
    """The schema DuckDB sees for a table scanned as ``stored``.

    float16 values read as float32 (exact: every float16 is a float32); every
    other type as stored.

    Parameters
    ----------
    stored : pyarrow.Schema
        The scan schema.

    Returns
    -------
    pyarrow.Schema
        The schema with float16 widened.
    """
    return pa.schema([f.with_type(_sql_type(f.type)) for f in stored], metadata=stored.metadata)


def _commit_tables(store: Store) -> tuple[pa.Table, pa.Table]:
    commits: dict[str, list[Any]] = {k: [] for k in ("writer", "commit", "commit_time", "kind", "records",
                                                      "metadata")}
    appends: dict[str, list[Any]] = {k: [] for k in ("writer", "commit", "table", "first_row", "end_row",
                                                      "records", "telemetry", "meta")}
    for body in store.commits():
        writer, seq = body["writer"], body["seq"]
        records = 0
        for table, change in body.get("tables", {}).items():
            base = writer << 40
            for a in change.get("appends", []):
                lo, hi = a["rows"]
                records += hi - lo
                meta = a.get("meta", {})
                appends["writer"].append(writer)
                appends["commit"].append(seq)
                appends["table"].append(table)
                appends["first_row"].append(base | lo)
                appends["end_row"].append(base | hi)
                appends["records"].append(hi - lo)
                appends["telemetry"].append(json.dumps(meta["telemetry"]) if "telemetry" in meta else None)
                appends["meta"].append(json.dumps(meta))
        commits["writer"].append(writer)
        commits["commit"].append(seq)
        commits["commit_time"].append(body["time_ns"])
        commits["kind"].append(body["kind"])
        commits["records"].append(records)
        commits["metadata"].append(json.dumps(body.get("metadata", {})))
    commit_schema = pa.schema([("writer", pa.int32()), ("commit", pa.int64()),
                               ("commit_time", pa.timestamp("ns", tz="UTC")), ("kind", pa.string()),
                               ("records", pa.int64()), ("metadata", pa.string())])
    append_schema = pa.schema([("writer", pa.int32()), ("commit", pa.int64()), ("table", pa.string()),
                               ("first_row", pa.int64()), ("end_row", pa.int64()), ("records", pa.int64()),
                               ("telemetry", pa.string()), ("meta", pa.string())])
    return pa.table(commits, schema=commit_schema), pa.table(appends, schema=append_schema)


def _connect(store: Store, connection: duckdb.DuckDBPyConnection | None,
             unsafe: bool) -> tuple[duckdb.DuckDBPyConnection, list[TableDataset]]:
    if connection is not None:
        con = connection
    elif unsafe:
        con = duckdb.connect()
    else:
        con = duckdb.connect(config=dict(SAFE_CONFIG))
    store.refresh()
    datasets = []
    for name in store.tables:
        if name in RESERVED_VIEWS:
            raise StoreError(f"table name {name!r} clashes with the built-in {name!r} view")
        datasets.append(TableDataset(store.table(name)))
        con.register(name, datasets[-1])
    commits, appends = _commit_tables(store)
    con.register("commits", commits)
    con.register("appends", appends)
    if connection is None and not unsafe:
        con.execute("SET lock_configuration = true")
    return con, datasets


def connect(store: Store, connection: duckdb.DuckDBPyConnection | None = None,
            unsafe: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with every table of ``store`` registered under its name.

    Also ``commits`` (one row per commit) and ``appends`` (one row per append,
    with its ``telemetry``). Metadata columns hold JSON text
    (``metadata->>'$.iteration'``). A connection made here is read-only towards
    the outside world (:data:`SAFE_CONFIG`) unless ``unsafe`` is true; a
    ``connection`` passed in keeps the settings its caller gave it. Cost: one
    refresh of the store and one pass over the commit log.

    Parameters
    ----------
    store : Store
        The opened store.
    connection : duckdb.DuckDBPyConnection, optional
        Register into this connection instead of a new one.
    unsafe : bool, optional
        Allow file, network and extension access on a new connection.

    Returns
    -------
    duckdb.DuckDBPyConnection
        The connection.

    Raises
    ------
    StoreError
        A table name clashes with a built-in view (``commits``, ``appends``).
    """
    return _connect(store, connection, unsafe)[0]


def to_arrow(relation: duckdb.DuckDBPyRelation) -> pa.Table:
    """A relation's result as a pyarrow Table.

    Uses ``to_arrow_table`` on DuckDB >= 1.5, else ``fetch_arrow_table``.

    Parameters
    ----------
    relation : duckdb.DuckDBPyRelation
        A query's relation.

    Returns
    -------
    pyarrow.Table
        The result.
    """
    convert = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    return convert()


def query(store: Store, sql: str, unsafe: bool = False) -> pa.Table:
    """Run ``sql`` over the store; the result as a pyarrow Table.

    A statement that returns nothing (``COPY``, ``SET``) gives an empty table.
    Cost: :func:`connect`, then the query (tables are scanned lazily, reading
    only the columns it needs).

    Parameters
    ----------
    store : Store
        The opened store.
    sql : str
        One or more SQL statements (the last one's result is returned).
    unsafe : bool, optional
        Allow file, network and extension access (see :func:`connect`).

    Returns
    -------
    pyarrow.Table
        The result.

    Raises
    ------
    QueryError
        ``sql`` is not text, is empty (nothing but whitespace and comments), or
        DuckDB rejects it, including file, network and extension access unless
        ``unsafe``. An unknown column lists the columns of the tables the query
        names (all tables when it names none); an unknown table lists the tables.
    StoreError
        A table name clashes with a built-in view.
    ReplayStoreError
        Reading the store failed while the query ran: the store's own typed error
        (``CorruptObjectError`` naming the object, ``StaleReadError``, ...), not DuckDB's
        text; an ``OSError`` from the storage likewise.
    """
    if not isinstance(sql, str):
        raise QueryError(f"query: expected SQL text, got {type(sql).__name__}")
    con, datasets = _connect(store, None, unsafe)
    try:
        if not con.extract_statements(sql):
            raise QueryError("query: expected an SQL statement, got an empty query")
        relation = con.sql(sql)
        return pa.table({}) if relation is None else to_arrow(relation)
    except duckdb.Error as exc:
        failed = [e for d in datasets for e in d.failed]
        if failed:
            raise failed[0].with_traceback(None) from None
        message = str(exc).splitlines()[0]
        if isinstance(exc, duckdb.BinderException):
            message += _available_columns(con, sql, [*store.tables, *RESERVED_VIEWS])
        elif isinstance(exc, duckdb.CatalogException):
            message += f" (tables: {', '.join([*store.tables, *RESERVED_VIEWS])})"
        raise QueryError(message) from None
    finally:
        con.close()


def _available_columns(con: duckdb.DuckDBPyConnection, sql: str, names: list[str]) -> str:
    """The columns of the tables ``sql`` names (every registered table when it names none), for a binder error."""
    queried = [n for n in names if re.search(rf'(?<![\w"]){re.escape(n)}(?![\w"])|"{re.escape(n)}"', sql, re.I)]
    parts = []
    for name in queried or names:
        try:
            columns = con.sql(f'SELECT * FROM "{name}" LIMIT 0').columns
        except duckdb.Error:  # noqa: PERF203 - a table that cannot be described is left out of the hint
            continue
        parts.append(f"{name}: {', '.join(columns)}")
    return f" (available columns: {'; '.join(parts)})" if parts else ""
