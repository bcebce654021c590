"""Parquet export and import: a hive-partitioned dataset, one ``stream=<key>/`` directory per stream.

Export streams the table's record batches (:func:`replaystore.store.read.scan.scan`) and writes
each batch's rows of a stream as one row group of that stream's open file
(:class:`StreamFiles`), synchronously, so memory holds one batch plus each open file's
encoder state, whatever the table's size. Each file carries the replaystore schema
(``replaystore.schema``) and the export description (``replaystore.export``: table, stream
key type) in its Arrow schema metadata; ``_replaystore.json`` at the root (ignored by
pyarrow.dataset and by a ``*.parquet`` glob) lists the tables, their schemas, the stream key
types and the store's capacity, so import rebuilds the store exactly. Layout and guarantees:
docs/EXPORT.md.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from replaystore.errors import ImportSourceError, SchemaError, StoreError
from replaystore.schemas import BatchMeta, Schema
from replaystore.schemas.arrow import columns_from_arrow, schema_to_arrow
from replaystore.schemas.nestarrow import flat_batch, struct_batch, struct_schema
from replaystore.store import DEFAULT_TABLE, Store, open_store
from replaystore.tools.formats.common import (
    ImportDestination,
    SourceErrors,
    chunk_rows,
    expand_local,
    progress_bar,
)

FORMAT = "replaystore.parquet/1"
MANIFEST = "_replaystore.json"
EXPORT_KEY = b"replaystore.export"
COMMIT_BYTES = 64 << 20
"""Import commits whenever this much data is pending, so the writer's buffer stays bounded."""
INDEX_COLUMNS = ("row", "step", "reset")
MAX_OPEN_FILES = 256
"""Export keeps at most this many stream files open; the least recently written one is closed
(its stream's next rows start the next ``part-<i>.parquet``)."""


# -- filesystems ---------------------------------------------------------------------------------


def filesystem(path: str, storage_options: Any = None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path in it: local paths natively, URLs through fsspec.

    Parameters
    ----------
    path : str
        A local path, a ``file://`` URL or an fsspec URL (``s3://...``).
    storage_options : mapping, optional
        Passed to fsspec for URLs.

    Returns
    -------
    fs : pyarrow.fs.FileSystem
        The filesystem.
    path : str
        The path in it (absolute for local paths, without a trailing slash).
    """
    if "://" in path and not path.startswith("file://"):
        import fsspec

        fs, root = fsspec.core.url_to_fs(path, **dict(storage_options or {}))
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), root.rstrip("/")
    local = path.removeprefix("file://")
    return pafs.LocalFileSystem(), os.path.abspath(local)


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.Directory:
        return []
    return fs.get_file_info(pafs.FileSelector(path, recursive=False))


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# -- export ------------------------------------------------------------------------------------------


class StreamFiles:
    """A hive-partitioned Parquet dataset written batch by batch: ``stream=<key>/part-<i>.parquet``.

    Each batch's rows of one stream become one row group of that stream's open
    file, in batch order, written before :meth:`write` returns (with
    ``pyarrow.dataset.write_dataset`` the Arrow memory of an export grew with
    the table: docs/EXPORT.md). Files hold every column but ``stream``; keys are
    URI-encoded as hive partitioning does. Float columns skip dictionary
    encoding: random floats do not repeat, and each open file would hold a
    dictionary per column. At most :data:`MAX_OPEN_FILES` files are open; use it
    as a context manager, which closes them.

    Parameters
    ----------
    fs : pyarrow.fs.FileSystem
        Where to write.
    base : str
        The dataset's directory in ``fs``.
    schema : pyarrow.Schema
        The batches' schema, with a ``stream`` column.

    Attributes
    ----------
    paths : list of str
        Every file written so far.
    """

    def __init__(self, fs: pafs.FileSystem, base: str, schema: pa.Schema) -> None:
        self._fs, self._base = fs, base
        self._stream = schema.get_field_index("stream")
        self._schema = schema.remove(self._stream)
        self._dictionary = [f.name for f in self._schema if not _is_float(f.type)]
        self._open: OrderedDict[Any, pq.ParquetWriter] = OrderedDict()
        self._parts: dict[Any, int] = {}
        self.paths: list[str] = []

    def write(self, batch: pa.RecordBatch) -> None:
        """Write each stream's rows of ``batch`` as a row group of that stream's file.

        Cost: one stable sort of the batch by stream, then one row group per stream.

        Parameters
        ----------
        batch : pyarrow.RecordBatch
            Rows of the dataset's schema.
        """
        keys = pc.dictionary_encode(batch.column(self._stream))
        codes = keys.indices.to_numpy()
        order = np.argsort(codes, kind="stable")
        ends = np.searchsorted(codes[order], np.arange(1, len(keys.dictionary) + 1))
        grouped = batch.remove_column(self._stream).take(pa.array(order))
        start = 0
        for key, end in zip(keys.dictionary.to_pylist(), ends.tolist(), strict=True):
            self._writer(key).write_batch(grouped.slice(start, end - start))
            start = end

    def _writer(self, key: Any) -> pq.ParquetWriter:
        writer = self._open.get(key)
        if writer is not None:
            self._open.move_to_end(key)
            return writer
        if len(self._open) >= MAX_OPEN_FILES:
            self._open.popitem(last=False)[1].close()
        part = self._parts.get(key, 0)
        self._parts[key] = part + 1
        directory = f"{self._base}/stream={quote(str(key), safe='')}"
        self._fs.create_dir(directory, recursive=True)
        path = f"{directory}/part-{part}.parquet"
        writer = pq.ParquetWriter(path, self._schema, filesystem=self._fs, use_dictionary=self._dictionary)
        self._open[key] = writer
        self.paths.append(path)
        return writer

    def __enter__(self) -> StreamFiles:
        """Return self."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close every open file."""
        while self._open:
            self._open.popitem(last=False)[1].close()


def _is_float(t: pa.DataType) -> bool:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_floating(t)


def _stream_type(keys: list[Any]) -> str:
    ints = [k for k in keys if isinstance(k, int)]
    if len(ints) == len(keys):
        return "int"
    return "str" if not ints else "mixed"


def export_parquet(store: Store, out: str, *, table: str | None = None, progress: bool = False,
                   batch_rows: int | None = None) -> dict[str, Any]:
    """Write ``store`` (one table, or all of them) as a hive-partitioned Parquet dataset at ``out``.

    Columns ``row``, ``step``, ``reset`` and the schema's record fields, one
    directory per stream, and a manifest with each table's schema; several
    tables go into one subdirectory each. Streams the table's record batches,
    so memory stays at a few chunks (docs/EXPORT.md, "Memory").

    Parameters
    ----------
    store : Store
        The opened store.
    out : str
        A local path or fsspec URL of a directory that does not exist or is empty.
    table : str, optional
        Export only this table (default: all).
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    batch_rows : int, optional
        Records per batch (default: about 16 MiB worth).

    Returns
    -------
    dict of str to Any
        ``format``, ``path``, ``files``, ``tables``, ``records``, ``episodes``
        (None) and ``streams``.

    Raises
    ------
    StoreError
        ``out`` exists and is not empty, an unknown table, an int and a str
        stream key that would share one partition, or ``batch_rows`` is not a
        positive int.
    """
    out = expand_local(out)
    fs, root = filesystem(out, store.storage_options)
    if _children(fs, root) or fs.get_file_info(root).type == pafs.FileType.File:
        raise StoreError(f"{out}: already exists and is not empty; export into a new directory")
    names = [table] if table is not None else store.tables
    for name in names:
        store.table(name)  # a clear error for an unknown table
    nested = table is None and len(store.tables) > 1
    manifest: dict[str, Any] = {"format": FORMAT, "source": store.url, "capacity": store.capacity, "tables": {}}
    files: list[str] = []
    records = 0
    for name in names:
        t = store.table(name)
        view = t.view()  # one snapshot: its schema and the records scanned
        keys = t.streams()
        kind = _stream_type(keys)
        if kind == "mixed":
            as_text = [str(k) for k in keys]
            if len(set(as_text)) != len(as_text):
                dup = next(k for k in as_text if as_text.count(k) > 1)
                raise StoreError(f"table {name!r}: streams {dup!r} (str) and {dup} (int) would share one "
                                 f"Parquet partition; rename one of them")
        full = view.scan_schema()
        fields = [f.name for f in t.schema.fields if not isinstance(f, BatchMeta)]
        columns = ["row", "stream", "step", "reset", *fields]
        info: dict[str, Any] = {"path": name if nested else "", "stream_type": kind, "records": len(t),
                                "streams": len(keys)}
        if kind == "mixed":
            info["int_streams"] = [k for k in keys if isinstance(k, int)]
        export_doc = {"format": FORMAT, "table": name, "stream_type": kind}
        if kind == "mixed":
            export_doc["int_streams"] = info["int_streams"]
        schema = pa.schema([full.field(c) for c in columns],
                           metadata={**(full.metadata or {}), EXPORT_KEY: json.dumps(export_doc).encode()})
        nesting = t.schema.nesting
        if nesting is not None:  # a nested field as one struct column
            schema = struct_schema(schema, nesting)
        manifest["tables"][name] = {**info, "schema": t.schema.to_dict()}
        base = f"{root}/{name}" if nested else root
        rows = chunk_rows(t.schema, batch_rows)
        bar = progress_bar(len(t), f"export {name}" if nested else "export parquet", progress)

        with bar, StreamFiles(fs, base, schema) as out_files:
            for b in view.scan(columns, rows):
                if nesting is not None:
                    out_files.write(struct_batch(b, schema, nesting))
                    bar.update(b.num_rows)
                    continue
                out_files.write(pa.RecordBatch.from_arrays(b.columns, schema=schema))
                bar.update(b.num_rows)
        files += out_files.paths
        records += len(t)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{MANIFEST}") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
    return {"format": "parquet", "path": out, "files": len(files) + 1, "tables": names, "records": records,
            "episodes": None, "streams": sum(v["streams"] for v in manifest["tables"].values())}


# -- import ----------------------------------------------------------------------------------------------


def _reading(path: str, what: str = "a Parquet file") -> SourceErrors:
    """Read errors of source ``path`` as ImportSourceError (see :class:`SourceErrors`)."""
    return SourceErrors(path, f"readable {what}")


def _read_manifest(fs: pafs.FileSystem, root: str) -> dict[str, Any] | None:
    path = f"{root}/{MANIFEST}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with _reading(path, "a manifest"), fs.open_input_stream(path) as f:
        raw = f.read()
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportSourceError(MANIFEST, "a JSON document", f"invalid JSON ({exc})", root) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise StoreError(f"{path}: not a replaystore Parquet export manifest (format {found!r})")
    tables = doc.get("tables")
    if not isinstance(tables, dict) or not tables:
        raise ImportSourceError(f"{MANIFEST} tables", "an object of tables", repr(tables)[:80], root)
    for name, info in tables.items():
        where = f"{MANIFEST} tables[{name!r}]"
        if not isinstance(info, dict) or not isinstance(info.get("schema"), dict):
            raise ImportSourceError(where, "an object with a schema", repr(info)[:80], root)
        sub = info.get("path", "")
        if sub not in ("", name) or not isinstance(sub, str) or sub in (".", "..") or "/" in sub or "\\" in sub:
            raise ImportSourceError(f"{where} path", f"'' or the table's name {name!r}", repr(sub), root)
        records = info.get("records", 0)
        if not isinstance(records, int) or isinstance(records, bool) or records < 0:
            raise ImportSourceError(f"{where} records", "a count", repr(records), root)
    capacity = doc.get("capacity")
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1):
        raise ImportSourceError(f"{MANIFEST} capacity", "a positive int or null", repr(capacity), root)
    return doc


def _parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    out = []
    for info in sorted(_children(fs, path), key=lambda i: _natural(i.base_name)):
        if info.base_name.startswith((".", "_")):
            continue
        if info.type == pafs.FileType.File and info.base_name.endswith(".parquet"):
            out.append(info.path)
        elif info.type == pafs.FileType.Directory and "=" not in info.base_name:
            out += _parquet_files(fs, info.path)
    return out


def _key_parser(doc: dict[str, Any] | None) -> Any:
    kind = (doc or {}).get("stream_type")
    ints = {str(k) for k in (doc or {}).get("int_streams", [])}

    def parse(text: str) -> Any:
        if kind == "str":
            return text
        if kind == "int" or (kind == "mixed" and text in ints):
            return int(text)
        if kind is None and re.fullmatch(r"-?\d+", text):
            return int(text)  # no replaystore metadata: digits are int keys, as DuckDB/pyarrow infer them
        return text

    return parse


def _partitions(fs: pafs.FileSystem, base: str, parse: Any) -> list[tuple[Any, list[str]]]:
    """``[(stream key, files)]`` of a table's dataset directory, keys in natural order."""
    parts = []
    loose = []
    for info in _children(fs, base):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name.startswith("stream="):
            parts.append((parse(unquote(name[len("stream="):])), _parquet_files(fs, info.path)))
        elif info.type == pafs.FileType.File and name.endswith(".parquet") and not name.startswith((".", "_")):
            loose.append(info.path)
    if loose:
        if parts:
            raise StoreError(f"{base}: both stream=... partitions and loose Parquet files; not an export layout")
        return [(0, sorted(loose, key=_natural))]  # a plain Parquet dataset: one stream, 0
    parts.sort(key=lambda p: (isinstance(p[0], str), p[0]))
    return parts


def _file_schema(fs: pafs.FileSystem, path: str) -> pa.Schema:
    with _reading(path), fs.open_input_file(path) as f:
        return pq.read_schema(f)


def _table_plan(fs: pafs.FileSystem, root: str, manifest: dict[str, Any] | None,
                ) -> dict[str, tuple[Schema, str, dict[str, Any] | None]]:
    """``{table: (schema, dataset directory, export document)}``."""
    if manifest is not None:
        plan = {}
        for name, info in manifest["tables"].items():
            try:
                schema = Schema.from_dict(info["schema"])
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                if isinstance(exc, SchemaError):
                    raise
                raise ImportSourceError(f"{MANIFEST} tables[{name!r}] schema", "a schema document",
                                        f"a malformed one ({type(exc).__name__}: {exc})", root) from None
            plan[name] = (schema, f"{root}/{info.get('path', '')}".rstrip("/"), info)
        return plan
    files = _parquet_files(fs, root) or [p for d in _children(fs, root)
                                         if d.type == pafs.FileType.Directory
                                         for p in _parquet_files(fs, d.path)]
    if not files:
        raise StoreError(f"{root}: no Parquet files and no {MANIFEST}; not a Parquet export")
    arrow_schema = _file_schema(fs, files[0])
    doc_raw = (arrow_schema.metadata or {}).get(EXPORT_KEY)
    try:
        doc = json.loads(doc_raw) if doc_raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportSourceError(EXPORT_KEY.decode(), "a JSON document", f"invalid JSON ({exc})", files[0]) from None
    if doc is not None and not isinstance(doc, dict):
        raise ImportSourceError(EXPORT_KEY.decode(), "a JSON object", type(doc).__name__, files[0])
    keep = [f for f in arrow_schema if f.name not in ("stream", *INDEX_COLUMNS)]
    schema = Schema.from_arrow(pa.schema(keep, metadata=arrow_schema.metadata), name="imported")
    return {(doc or {}).get("table", DEFAULT_TABLE): (schema, root, doc)}


def _sorted_check(fs: pafs.FileSystem, files: list[str]) -> bool:
    """Whether the files' ``step`` column is strictly increasing (reads that column only)."""
    last = None
    for path in files:
        with _reading(path), fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            if "step" not in pf.schema_arrow.names:
                return True
            steps = pf.read(columns=["step"]).column("step").to_numpy()
        if len(steps) and ((last is not None and steps[0] <= last) or np.any(np.diff(steps) <= 0)):
            return False
        if len(steps):
            last = steps[-1]
    return True


def _batches(fs: pafs.FileSystem, files: list[str], columns: list[str], rows: int, ordered: bool,
             ) -> Iterator[pa.RecordBatch]:
    if not ordered:  # steps out of order across files (several writers on one stream): sort this stream
        tables = []
        for path in files:
            with _reading(path), fs.open_input_file(path) as f:
                tables.append(pq.read_table(f, columns=columns))
        yield from pa.concat_tables(tables).sort_by("step").combine_chunks().to_batches(max_chunksize=rows)
        return
    for path in files:  # a row group at a time: iter_batches' read-ahead held up to the whole file
        with _reading(path), fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            for group in range(pf.num_row_groups):
                yield from pf.read_row_group(group, columns=columns).to_batches(max_chunksize=rows)


def _stored_columns(schema: Schema, fields: list[str]) -> list[str]:
    """The Parquet columns holding ``fields``: a nested field's leaves are one struct column."""
    nesting = schema.nesting
    if nesting is None:
        return fields
    out: list[str] = []
    for f in fields:
        c = nesting.root_of.get(f, f)
        if c not in out:
            out.append(c)
    return out


def import_parquet(src: str, url: str, *, progress: bool = False, storage_options: Any = None,
                   batch_rows: int | None = None) -> Store:
    """Create the store at ``url`` from a Parquet export at ``src`` (schema, streams, steps, resets).

    A foreign Parquet dataset (no manifest) is imported with a schema inferred
    from its Arrow types, hive partitions as streams. Every file's footer is
    checked against the schema before the store is created (each column present
    with the schema's Arrow type: nothing is reinterpreted). Reads one row group
    at a time and commits every 64 MiB of appended data. A failed import leaves
    nothing at ``url``.

    Parameters
    ----------
    src : str
        A local directory or fsspec URL.
    url : str
        Where to create the store (new, or an empty directory).
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    storage_options : mapping, optional
        Passed to fsspec for ``src`` and to the storage backend of ``url``.
    batch_rows : int, optional
        Records per batch (default: about 16 MiB worth).

    Returns
    -------
    Store
        The new store, opened and refreshed.

    Raises
    ------
    ImportSourceError
        A manifest or file that cannot be read (garbage, truncated), a column
        missing or of another type or width than the schema's, a malformed
        manifest entry or stream partition.
    StoreError
        ``src`` is not a directory or not a replaystore export.
    SchemaError
        A column type has no replaystore equivalent.
    ValidationError
        A batch does not conform to the table's schema (nulls, steps out of order, ...).
    StoreExistsError
        ``url`` is not new or empty.
    """
    src = expand_local(src)
    url = expand_local(url)
    fs, root = filesystem(src, storage_options)
    with _reading(src, "a directory"):
        is_dir = fs.get_file_info(root).type == pafs.FileType.Directory
    if not is_dir:
        raise StoreError(f"{src}: no such directory")
    with ImportDestination(url, storage_options) as dest:
        manifest = _read_manifest(fs, root)
        plan = _table_plan(fs, root, manifest)
        work = _check_source(fs, plan)  # every file's columns and types, before anything is created
        schemas = {name: schema for name, (schema, _, _) in plan.items()}
        capacity = manifest.get("capacity") if manifest else None
        st = dest.opened(open_store(url, schemas[DEFAULT_TABLE] if list(schemas) == [DEFAULT_TABLE] else schemas,
                                    mode="w", capacity=capacity, storage_options=storage_options))
        total = sum(int(info.get("records", 0)) for _, _, info in plan.values() if info) or None
        with st.writer() as w, progress_bar(total, "import parquet", progress) as bar:
            pending = 0
            for name, key, files, columns, present in work:
                schema = schemas[name]
                rows = chunk_rows(schema, batch_rows)
                for batch in _batches(fs, files, columns, rows, _sorted_check(fs, files)):
                    if not batch.num_rows:
                        continue
                    if schema.nesting is not None:
                        batch = flat_batch(batch)
                    cols = columns_from_arrow(schema, batch)
                    step = batch.column("step").to_numpy() if "step" in present else None
                    reset = (batch.column("reset").to_numpy(zero_copy_only=False).astype(bool)
                             if "reset" in present else None)
                    w.append(cols.arrays, stream=key, step=step, reset=reset, table=name)
                    bar.update(batch.num_rows)
                    pending += sum(a.nbytes for a in cols.arrays.values())
                    if pending >= COMMIT_BYTES:
                        w.commit()
                        pending = 0
        st.refresh()
    return st


def _same_type(want: pa.DataType, got: pa.DataType) -> bool:
    """Whether a column of type ``got`` holds what a column of type ``want`` does.

    Nullability aside; a ragged ``large_list`` may be read from a ``list``.
    """
    if pa.types.is_struct(want):
        return (pa.types.is_struct(got) and [f.name for f in want] == [f.name for f in got]
                and all(_same_type(a.type, b.type) for a, b in zip(want, got, strict=True)))
    if pa.types.is_fixed_size_list(want):
        return (pa.types.is_fixed_size_list(got) and got.list_size == want.list_size
                and _same_type(want.value_type, got.value_type))
    if pa.types.is_large_list(want) or pa.types.is_list(want):
        return (pa.types.is_large_list(got) or pa.types.is_list(got)) and _same_type(want.value_type, got.value_type)
    return bool(want.equals(got))


def _check_source(fs: pafs.FileSystem, plan: dict[str, tuple[Schema, str, dict[str, Any] | None]],
                  ) -> list[tuple[str, Any, list[str], list[str], set[str]]]:
    """``[(table, stream key, files, columns, index columns present)]`` of every stream to import.

    Reads each file's footer: every file must hold each column the table's schema needs, with the
    Arrow type the schema gives it (a string, list, struct or wrong-width column is refused, never
    reinterpreted), ``step`` as integers and ``reset`` as bools, the same index columns in every
    file of a stream. Raises ImportSourceError naming the file and column.
    """
    work = []
    for name, (schema, base, doc) in plan.items():
        parse = _key_parser(doc)
        fields = [f.name for f in schema.fields if not isinstance(f, BatchMeta)]
        stored = _stored_columns(schema, fields)
        want = schema_to_arrow(schema)
        if schema.nesting is not None:
            want = struct_schema(want, schema.nesting)
        try:
            partitions = _partitions(fs, base, parse)
        except ValueError as exc:
            raise ImportSourceError(f"{base}/stream=...", f"{(doc or {}).get('stream_type')} stream keys",
                                    f"a partition that is not one ({exc})") from None
        for key, files in partitions:
            if not files:
                continue
            present: set[str] | None = None
            for path in files:
                got = _file_schema(fs, path)
                index = {c for c in ("step", "reset") if c in got.names}
                if present is not None and index != present:
                    raise ImportSourceError("step/reset", f"columns {sorted(present)} as in {files[0]}",
                                            f"columns {sorted(index)}", path)
                present = index
                if "step" in index and not pa.types.is_integer(got.field("step").type):
                    raise ImportSourceError("step", "integer steps", str(got.field("step").type), path)
                if "reset" in index and not pa.types.is_boolean(got.field("reset").type):
                    raise ImportSourceError("reset", "bool", str(got.field("reset").type), path)
                for c in stored:
                    if c not in got.names:
                        raise ImportSourceError(c, f"a column of {want.field(c).type}", "none", path)
                    if not _same_type(want.field(c).type, got.field(c).type):
                        raise ImportSourceError(c, str(want.field(c).type), str(got.field(c).type), path)
            assert present is not None
            columns = [c for c in ("step", "reset") if c in present] + stored
            work.append((name, key, files, columns, present))
    return work
