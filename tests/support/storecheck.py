"""Helpers shared by the store test suite: backends, expected columns, bit-identical comparison."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.schemas import Columns, Schema
from replaystore.schemas.columns import concat_columns
from replaystore.store import Store, open_store
from replaystore.store.format import layout, records
from replaystore.store.storage import Storage, open_storage


@dataclass(frozen=True)
class Backend:
    """Where a test's store lives: ``url`` plus the fsspec ``storage_options`` that reach it."""

    url: str
    storage_options: dict[str, Any] | None = None

    def __iter__(self):  # ``url, options = backend``
        return iter((self.url, self.storage_options))

    @property
    def kind(self) -> str:
        if self.url.startswith("s3://"):
            return "s3"
        if self.url.startswith("memory://"):
            return "memory"
        return "local"

    def open(self, schema: Any = None, **kwargs: Any) -> Store:
        return open_store(self.url, schema, storage_options=self.storage_options, **kwargs)

    def sibling(self, tag: str | None = None) -> Backend:
        """Another, empty location on the same backend."""
        return Backend(f"{self.url}-{tag or uuid.uuid4().hex[:8]}", self.storage_options)

    def storage(self) -> Storage:
        return open_storage(self.url, self.storage_options)

    def open_fragments(self, schema: Any, **kwargs: Any) -> Store:
        """A new store whose writers write a fragment per commit on every backend (compaction
        rewrites them): a version-1 store (docs/FORMAT.md; version 2 puts the records of local
        stores in segments)."""
        storage = self.open(schema, mode="w", **kwargs).storage
        body = records.decode(layout.MANIFEST, storage.read(layout.MANIFEST))
        storage.write(layout.MANIFEST, records.encode({**body, "format_version": 1}))
        return self.open(mode="a")


def columns_of(schema: Schema, batches: list[Any]) -> Columns:
    """What a store should hold after appending ``batches`` (validated, concatenated, in order)."""
    return concat_columns([schema.validate(b) for b in batches])


def assert_same(got: dict[str, np.ndarray], want: Columns | dict[str, np.ndarray], what: str = "") -> None:
    """Every array bit-identical: same names, dtypes, shapes and bytes."""
    want_arrays = dict(want.arrays) if isinstance(want, Columns) else want
    assert set(got) == set(want_arrays), (what, sorted(got), sorted(want_arrays))
    for name, expected in want_arrays.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, (what, name, actual.dtype, expected.dtype)
        assert actual.shape == expected.shape, (what, name, actual.shape, expected.shape)
        assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes(), (what, name)


def snapshot(st: Store, table: str | None = None) -> dict[str, Any]:
    """Everything a reader sees of one table: count, rows, content, streams and their steps."""
    t = st.table(table) if table else st.default
    rows = t.row_ids()
    streams = t.streams()
    return {
        "len": len(t),
        "rows": rows.tolist(),
        "data": {k: v.tobytes() for k, v in t.read(rows).items()},
        "streams": sorted(streams, key=repr),
        "per_stream": {repr(s): [a.tolist() for a in t.rows(s)] for s in streams},
    }


def segments_on_disk(root: str | Path, table: str = "records") -> set[tuple[int, str]]:
    """``(writer, segment or fragment name)`` of every data directory of ``table`` in a local store."""
    found = set()
    for wdir in (Path(root) / layout.WRITERS).iterdir():
        data = wdir / "data" / table
        if data.is_dir():
            found |= {(int(wdir.name), name) for name in os.listdir(data)}
    return found


def segments_retained(st: Store, table: str = "records") -> set[tuple[int, str]]:
    """Segments backing a fragment with a record among the newest capacity + grace (the reclamation
    rule of docs/FORMAT.md): what a capped local store must still hold once reclamation ran."""
    st.refresh()
    reader = st.table(table).reader
    evicted = {(f.writer, f.name) for f in reader.evicted_fragments(max(st.capacity // 4, 1))}
    return {(f.writer, f.segment.name) for f in reader.all_fragments
            if f.segment is not None and (f.writer, f.name) not in evicted}


def descriptors_under(root: str | Path) -> int:
    """Descriptors of this process open on files under ``root`` (other tests' leftovers that
    the collector closes meanwhile do not count)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{root}{os.sep}")
        except OSError:  # (closed since listed)
            pass
    return count
