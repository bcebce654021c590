"""The public read interface: immutable table views, ``read(columns=)``, ``scan``."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from replaystore.errors import StaleReadError, StoreError, UnknownFieldError
from replaystore.schemas import ppo
from replaystore.store import ChunkCache, FragmentInfo, TableView, open_store
from support.batches import ppo_batch

SCHEMA = ppo(16, actions=9)


def _fill(url: str, commits: int, rows: int = 20, seed: int = 0, **kwargs: object) -> None:
    st = open_store(url, SCHEMA, mode="a", **kwargs)
    rng = np.random.default_rng(seed)
    with st.writer() as w:
        for i in range(commits):
            w.append(ppo_batch(rng, rows, extra=0), stream=f"env{i % 2}")
            w.commit()


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_view_is_a_snapshot_a_refresh_never_changes(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url, 3)
    reader = open_store(url, mode="r")
    table = reader.default
    old = table.view()
    assert isinstance(old, TableView) and table.view() is old  # the same object until a change
    rows, frags, version = old.row_ids(), old.fragments, old.version
    records = old.read(rows)
    _fill(url, 2, seed=1)
    assert reader.refresh()
    new = table.view()
    assert new is not old and new is table.view() and new.version > version
    assert len(new) == len(rows) + 40 and len(old) == len(rows)
    np.testing.assert_array_equal(old.row_ids(), rows)
    assert [(f.writer, f.name, f.visible_from) for f in old.fragments] == [
        (f.writer, f.name, f.visible_from) for f in frags]
    _same(old.read(rows), records)  # the old view still reads its records
    _same(new.read(rows), records)
    assert old.current is False and new.current is True


def test_a_view_cannot_be_changed(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url, 2)
    view = open_store(url, mode="r").default.view()
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.version = 7  # type: ignore[misc]
    for arr in (view.first_ids, view.visible_from, view.ends, view.cum):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1
    info = view.fragments[0]
    assert isinstance(info, FragmentInfo)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rows = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        info.nnz["legal_offsets"] = 0  # type: ignore[index]
    assert info.descriptor() == FragmentInfo.from_descriptor(info.writer, info.table, info.descriptor()).descriptor()


def test_positions_and_intervals_describe_the_visible_rows(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url, 4, capacity=50)  # eviction: the oldest fragment is partly visible
    view = open_store(url, mode="r").default.view()
    rows = view.row_ids()
    assert len(rows) == len(view) == 50
    np.testing.assert_array_equal(view.rows_at(np.arange(len(view))), rows)
    iv = view.intervals()
    assert int((iv[:, 1] - iv[:, 0]).sum()) == 50
    assert np.all(np.isin(rows, np.concatenate([np.arange(lo, hi) for lo, hi in iv])))
    frag_i, local = view.locate(rows)
    firsts = np.array([f.first_id for f in view.fragments])
    np.testing.assert_array_equal(firsts[frag_i] + local, rows)


def test_the_stream_index_is_the_current_views_only(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url, 2)
    reader = open_store(url, mode="r")
    old = reader.default.view()
    assert old.stream_index() is reader.default.stream_index()
    _fill(url, 1, seed=2)
    reader.refresh()
    with pytest.raises(StaleReadError, match="older than the table's"):
        old.stream_index()
    idx = reader.default.view().stream_index()
    assert sorted(idx.streams()) == ["env0", "env1"]


@pytest.mark.parametrize("contiguous", [True, False])
def test_read_columns_reads_only_the_named_ones(tmp_path: Path, contiguous: bool) -> None:
    url = str(tmp_path / "st")
    _fill(url, 3)
    table = open_store(url, mode="r").default
    if not contiguous:
        table.reader._layouts = {}  # the per-fragment path
    rows = np.random.default_rng(0).permutation(table.row_ids())[:25]
    full = table.read(rows)
    got = table.read(rows, columns=["returns", "legal_ids"])
    assert set(got) == {"returns", "legal_ids", "legal_offsets"}
    _same(got, {k: full[k] for k in got})
    assert set(table.read(rows, columns=("obs",))) == {"obs"}
    assert set(table.read(rows[:0], columns=["legal_ids"])) == {"legal_ids", "legal_offsets"}
    cols = table.read_columns(rows, columns=["obs"])
    np.testing.assert_array_equal(cols["obs"], full["obs"])
    with pytest.raises(UnknownFieldError, match="'nope'"):
        table.read(rows, columns=["obs", "nope"])
    with pytest.raises(UnknownFieldError, match="'telemetry'"):  # batch metadata is not per record
        table.read(rows, columns=["telemetry"])


def test_read_columns_on_object_storage_fetches_only_those_arrays(tmp_path: Path) -> None:
    url = f"memory://view-{uuid.uuid4().hex}"
    _fill(url, 3)
    table = open_store(url, mode="r", cache=ChunkCache(tmp_path / "cache")).default
    got = table.read(table.row_ids()[::3], columns=["returns"])
    assert set(got) == {"returns"}
    opened = {name for d in table.reader._data.values() for name in d._arrays}
    assert opened == {"returns"}


def test_scan_streams_the_visible_records_of_the_view(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url, 3)
    reader = open_store(url, mode="r")
    table = reader.default
    batches = list(table.scan(["row", "stream", "returns"], batch_rows=16))
    assert max(b.num_rows for b in batches) == 16
    got = pa.Table.from_batches(batches)
    assert got.column_names == ["row", "stream", "returns"]
    want = reader.sql("SELECT row, stream, returns FROM records ORDER BY row")
    assert got.to_pylist() == want.to_pylist()
    assert table.scan_schema(["row", "returns"]).names == ["row", "returns"]
    assert table.scan_schema().names[:4] == ["row", "stream", "step", "reset"]
    with pytest.raises(StoreError, match="nope"):
        table.scan(["row", "nope"])
    with pytest.raises(StoreError, match="batch_rows"):
        table.scan(batch_rows=0)
    old = table.view()
    _fill(url, 1, seed=3)
    reader.refresh()
    assert sum(b.num_rows for b in old.scan(["row"])) == 60  # the old view scans its own records
    assert sum(b.num_rows for b in table.scan(["row"])) == 80
