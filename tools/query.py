"""``replaystore query``: DuckDB SQL over a store, printed or written to a file."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from replaystore.errors import ReplayStoreError
from replaystore.store import Store
from replaystore.tools.tables import format_table


def _json_lines(table: pa.Table) -> str:
    import json

    return "".join(json.dumps(row, default=str) + "\n" for row in table.to_pylist())


def run_query(st: Store, sql: str, fmt: str = "table", output: str | None = None,
              allow_file_access: bool = False) -> int:
    """Run ``sql``; print it as a table, or write csv / json (one object per line) / parquet.

    ``allow_file_access`` lets the query itself read and write files (``Store.sql(unsafe=True)``).
    """
    result = st.sql(sql, unsafe=allow_file_access)
    try:
        return _write(result, fmt, output)
    except OSError as exc:
        if output is None:
            raise
        raise OSError(exc.errno, f"cannot write --output {output}: {exc.strerror or exc}") from None


def _write(result: pa.Table, fmt: str, output: str | None) -> int:
    if fmt == "parquet":
        if not output:
            raise ReplayStoreError("--format parquet needs --output FILE")
        pq.write_table(result, output)
        return 0
    if fmt == "csv":
        try:
            if output:
                pacsv.write_csv(result, output)
            else:
                sink = pa.BufferOutputStream()
                pacsv.write_csv(result, sink)
                sys.stdout.write(sink.getvalue().to_pybytes().decode())
            return 0
        except pa.ArrowInvalid as exc:
            raise ReplayStoreError(f"csv cannot hold list columns ({exc}); use --format json or parquet") from None
    text = _json_lines(result) if fmt == "json" else format_table(result) + "\n"
    if output:
        with open(output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
