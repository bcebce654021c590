"""DuckDB over a store: each table as a lazily scanned Arrow dataset, plus ``commits`` and ``appends``."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from replaystore.errors import StoreError
from replaystore.store.scan import scan, scan_schema
from replaystore.store.table import TableReader

if TYPE_CHECKING:
    from replaystore.store.store import Store


RESERVED_VIEWS = ("commits", "appends")


class QueryError(StoreError):
    """DuckDB rejected a query (syntax, unknown column, type error)."""


class TableDataset(ds.InMemoryDataset):
    """A pyarrow dataset DuckDB can scan with projection and filter pushdown.

    DuckDB calls :meth:`scanner` with the columns it needs and the filter it pushes
    down; we stream record batches reading only those columns (plus any the filter
    names) from the store, and let pyarrow apply the filter.
    """

    def __init__(self, reader: TableReader) -> None:
        reader.sync()
        super().__init__(scan_schema(reader).empty_table())
        self.reader = reader

    def scanner(self, *args: Any, columns: list[str] | None = None, filter: Any = None, **kwargs: Any) -> ds.Scanner:
        full = self.schema
        wanted = list(full.names) if columns is None else list(columns)
        needed = list(wanted)
        if filter is not None:
            text = str(filter)
            needed += [n for n in full.names if n not in needed and re.search(rf"\b{re.escape(n)}\b", text)]
        batches = scan(self.reader, needed)
        schema = pa.schema([full.field(n) for n in needed])
        return ds.Scanner.from_batches(batches, schema=schema, columns=wanted, filter=filter)


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


def connect(store: Store, connection: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with every table of ``store`` registered under its name,
    plus ``commits`` (one row per commit) and ``appends`` (one row per append, with
    its ``telemetry``). Metadata columns hold JSON text (``metadata->>'$.iteration'``)."""
    con = connection or duckdb.connect()
    store.refresh()
    for name in store.tables:
        if name in RESERVED_VIEWS:
            raise StoreError(f"table name {name!r} clashes with the built-in {name!r} view")
        con.register(name, TableDataset(store.table(name).reader))
    commits, appends = _commit_tables(store)
    con.register("commits", commits)
    con.register("appends", appends)
    return con


def to_arrow(relation: duckdb.DuckDBPyRelation) -> pa.Table:
    """A relation's result as a pyarrow Table (``to_arrow_table`` on DuckDB >= 1.5, else ``fetch_arrow_table``)."""
    convert = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table
    return convert()


def query(store: Store, sql: str) -> pa.Table:
    """Run ``sql`` over the store; the result as a pyarrow Table."""
    con = connect(store)
    try:
        return to_arrow(con.sql(sql))
    except duckdb.Error as exc:
        raise QueryError(str(exc).splitlines()[0]) from None
    finally:
        con.close()
