"""Ray Data reads a store: ``read_replaystore`` on a local Ray cluster (2 CPUs, loopback).

The stores are written by 4 writer *processes* at once (support.procs ``stream-writer``),
on local disk and on S3 (a moto server on loopback). The Ray dataset must hold exactly
the store's visible records, bit for bit (checked against ``st.read``, a separate read
path from the scan the read tasks use), with the scan's Arrow types; a ``map_batches``
aggregate must match the same SQL through DuckDB; read tasks are the fragments and
carry no data.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# isort: off
from support.raylocal import local_ray  # first: Ray must be imported with its loopback settings
# isort: on

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from replaystore.errors import StaleReadError, StoreError
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.storage import open_storage
from replaystore.tools.ray_data import ReplayStoreDatasource, read_replaystore
from support.batches import dqn_batch
from support.procs import Child, batch_size, same_records, schema, stream_batch, stream_totals, take_rows
from support.s3 import S3Server, moto_s3

WRITERS = 4
STREAMS = 3
SEED = 31
RUN_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_s3("replaystore-ray") as server:
        yield server


def write_with_processes(url: str, storage_options: dict[str, Any] | None, commits: int) -> int:
    """Create the store, then let WRITERS processes (each its own client) write it at once."""
    open_store(url, schema(), mode="w", storage_options=storage_options)
    with ExitStack() as stack:
        children = [stack.enter_context(Child("stream-writer", url=url, storage_options=storage_options, seed=SEED,
                                              i=i, streams=STREAMS, commits=commits)) for i in range(WRITERS)]
        ids = [json.loads(c.finish(RUN_TIMEOUT_S)[-1])["writer"] for c in children]
    assert len(set(ids)) == WRITERS
    return sum(batch_size(i, j) * n for i in range(WRITERS) for j, n in stream_totals(i, STREAMS, commits).items())


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    url = str(tmp_path_factory.mktemp("ray") / "store")
    return url, write_with_processes(url, None, commits=6)


def collect(ds: Any) -> pa.Table:
    """The dataset's rows as one Arrow table, sorted by row id."""
    tables = ray.get(ds.to_arrow_refs())
    return pa.concat_tables(tables).sort_by("row")


def arrays_of(table: pa.Table, sch: Any) -> dict[str, np.ndarray]:
    """Schema fields of an Arrow table in ``st.read``'s layout (dense arrays; ragged values + offsets)."""
    n = table.num_rows
    out: dict[str, np.ndarray] = {}
    for f in sch.dense_fields:
        col = table.column(f.name).combine_chunks()
        while pa.types.is_fixed_size_list(col.type):
            col = col.flatten()
        out[f.name] = col.to_numpy(zero_copy_only=False).reshape((n, *f.shape))
    for off_name, names in sch.offsets_groups.items():
        counts = pc.list_value_length(table.column(names[0]).combine_chunks()).to_numpy(zero_copy_only=False)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        out[off_name] = offsets
        for name in names:
            col = table.column(name).combine_chunks()
            assert np.array_equal(pc.list_value_length(col).to_numpy(zero_copy_only=False), counts)
            out[name] = col.flatten().to_numpy(zero_copy_only=False)
    return out


def check_identical(got: pa.Table, url: str, storage_options: dict[str, Any] | None, total: int) -> None:
    """``got`` (sorted by row) holds exactly the store's visible records, bit for bit."""
    st = open_store(url, mode="r", storage_options=storage_options)
    table = st.table("records")
    assert got.num_rows == len(st) == total
    rows = st.row_ids()
    assert np.array_equal(got.column("row").to_numpy(), rows)
    # the fields, against st.read (the gather path, not the scan the read tasks use)
    bad = same_records(arrays_of(got, st.schema), st.read(rows))
    assert not bad, f"fields {bad} differ between Ray Data and the store"
    keys, steps, resets = table.index_of(rows)
    assert got.column("stream").to_pylist() == keys.tolist()
    assert np.array_equal(got.column("step").to_numpy(), steps)
    assert np.array_equal(got.column("reset").to_numpy(zero_copy_only=False), resets)
    assert np.array_equal(got.column("writer").to_numpy(), rows >> 40)
    # and against what the writers wrote: each record is a pure function of (writer, stream, step)
    arrays = arrays_of(got, st.schema)
    for key in set(keys.tolist()):
        i, j = (int(x) for x in key[1:].split("-"))
        size = batch_size(i, j)
        positions = np.flatnonzero(keys == key)
        assert np.array_equal(arrays["obs"][positions, :3],
                              np.stack([np.full(len(positions), i), np.full(len(positions), j), steps[positions]],
                                       axis=1).astype(np.float32))
        for b in np.unique(steps[positions] // size):
            at = positions[steps[positions] // size == b]
            want = take_rows(st.schema, stream_batch(SEED, i, j, int(b)), steps[at] % size)
            assert not same_records(take_rows(st.schema, arrays, at), want), (key, b)
    # and the whole table, columns and types, against the store's own scan
    want = pa.Table.from_batches(list(table.scan()), schema=table.scan_schema())
    assert got.schema.equals(want.schema, check_metadata=False)
    assert got.equals(want), "Ray Data's table differs from the store's scan"


def test_round_trip_four_writer_processes(ray_cluster: None, local_store: tuple[str, int]) -> None:
    url, total = local_store
    ds = read_replaystore(url)
    full = open_store(url, mode="r").default.scan_schema()
    # the store's Arrow types: ragged fields as large_list, [8]-vectors as fixed_size_list
    assert ds.schema().base_schema.equals(full, check_metadata=False)
    assert pa.types.is_large_list(full.field("legal_ids").type)
    assert pa.types.is_fixed_size_list(full.field("obs").type)
    assert ds.count() == total
    check_identical(collect(ds), url, None, total)


def test_read_tasks_are_the_fragments_and_carry_no_data(local_store: tuple[str, int]) -> None:
    url, total = local_store
    reader = open_store(url, mode="r").default.reader
    source = ReplayStoreDatasource(url)
    tasks = source.get_read_tasks(parallelism=10_000)
    assert len(reader.fragments) >= WRITERS and len(tasks) == len(reader.fragments)
    assert [t.metadata.num_rows for t in tasks] == [f.rows - int(v) for f, v in
                                                     zip(reader.fragments, reader.vis_from, strict=True)]
    assert source.estimate_inmemory_data_size() == sum(t.metadata.size_bytes for t in tasks)
    # fewer tasks than fragments when Ray asks for fewer: runs of whole fragments, every row once
    two = source.get_read_tasks(parallelism=2)
    assert len(two) == 2 and sum(t.metadata.num_rows for t in two) == total
    rows = np.concatenate([pa.concat_tables(list(t())).column("row").to_numpy() for t in two])
    assert np.array_equal(rows, open_store(url, mode="r").row_ids())


def test_a_read_task_is_a_descriptor_not_data(tmp_path: Path) -> None:
    """What the driver ships per task does not grow with the fragment: 1 record or 30 000."""
    url = str(tmp_path / "sizes")
    st = open_store(url, schema(), mode="w")
    w = st.writer()
    for n in (1, 30_000):
        batch = dqn_batch(np.random.default_rng(n), n, observation_size=8, heads=2, actions=9, extra=0)
        w.append(batch, stream="s")
        w.commit()
    # (read while the writer is open: its close right-sizes the segment into one fragment, test_sizes.py)
    tasks = ReplayStoreDatasource(url).get_read_tasks(parallelism=8)
    assert [t.metadata.num_rows for t in tasks] == [1, 30_000]
    small, big = (len(pickle.dumps(t)) for t in tasks)
    assert tasks[1].metadata.size_bytes > 3_000_000  # ~100 bytes a record + legal ids
    assert abs(big - small) < 64 and big < 16_384, (small, big)
    assert sum(len(pa.concat_tables(list(t()))) for t in tasks) == 30_001
    w.close()


def test_map_batches_aggregate_matches_sql(ray_cluster: None, local_store: tuple[str, int]) -> None:
    url, _ = local_store

    def per_stream(batch: pa.Table) -> pa.Table:
        batch = batch.append_column("n_legal", pc.list_value_length(batch.column("legal_ids")))
        return batch.group_by("stream").aggregate([("stream", "count"), ("actions", "sum"), ("n_legal", "sum"),
                                                   ("rewards", "sum"), ("step", "max")])

    fragments = len(open_store(url, mode="r").default.reader.fragments)
    # one read task per fragment (Ray would merge this small store's fragments into one task)
    ds = read_replaystore(url, ["stream", "actions", "legal_ids", "rewards", "step"], batch_rows=16,
                          override_num_blocks=fragments)
    mapped = ds.map_batches(per_stream, batch_format="pyarrow", batch_size=16)
    partial = pa.concat_tables(ray.get(mapped.to_arrow_refs()))
    assert partial.num_rows > STREAMS * WRITERS  # several partial results per stream were combined below
    got = partial.group_by("stream").aggregate([("stream_count", "sum"), ("actions_sum", "sum"),
                                                ("n_legal_sum", "sum"), ("rewards_sum", "sum"),
                                                ("step_max", "max")]).sort_by("stream")
    want = open_store(url, mode="r").sql(
        "SELECT stream, count(*) AS n, sum(actions) AS actions, sum(len(legal_ids)) AS legal, "
        "sum(rewards) AS rewards, max(step) AS last FROM records GROUP BY stream ORDER BY stream")
    assert got.column("stream").to_pylist() == want.column("stream").to_pylist()
    assert len(want) == WRITERS * STREAMS
    assert got.column("stream_count_sum").to_pylist() == want.column("n").to_pylist()
    assert got.column("actions_sum_sum").to_pylist() == want.column("actions").to_pylist()
    assert got.column("n_legal_sum_sum").to_pylist() == want.column("legal").to_pylist()
    assert got.column("step_max_max").to_pylist() == want.column("last").to_pylist()
    np.testing.assert_allclose(got.column("rewards_sum_sum").to_numpy(), want.column("rewards").to_numpy(),
                               rtol=1e-12)


def test_column_projection(ray_cluster: None, local_store: tuple[str, int]) -> None:
    url, total = local_store
    full = collect(read_replaystore(url))
    picked = read_replaystore(url, ["row", "legal_ids", "obs", "commit_time"])
    assert picked.schema().names == ["row", "legal_ids", "obs", "commit_time"]
    got = collect(picked)
    assert got.num_rows == total
    assert got.equals(full.select(["row", "legal_ids", "obs", "commit_time"]))
    # a projection after the read is pushed into the read tasks and gives the same columns
    pushed = read_replaystore(url).select_columns(["rewards", "row"])
    assert pushed.schema().names == ["rewards", "row"]
    assert collect(pushed).equals(full.select(["rewards", "row"]))
    with pytest.raises(StoreError, match="no column"):
        read_replaystore(url, ["row", "nope"])


def test_capacity_store_reads_only_visible_records(ray_cluster: None, tmp_path: Path) -> None:
    """With a capacity, the fragments' evicted heads are not read (each task starts at vis_from)."""
    url = str(tmp_path / "cap")
    st = open_store(url, schema(), mode="w", capacity=40)
    w = st.writer()
    for b in range(16):  # 48 records, 3 per commit: the oldest visible fragment is cut
        w.append(stream_batch(SEED, 0, 1, b), stream="w0-1")  # 3 records per batch
        w.commit()
    w.close()
    st = open_store(url, mode="r")
    assert len(st) == 40 and any(v > 0 for v in st.default.reader.vis_from)
    check_identical(collect(read_replaystore(url)), url, None, 40)


def test_snapshot_survives_compaction_of_its_fragments(ray_cluster: None, tmp_path: Path) -> None:
    """Fragments compacted away after the snapshot (and deleted, as their writer does 30 s later)
    are read from the merged fragment: the same records, row ids and commit columns."""
    url = str(tmp_path / "compact")
    st = open_store(url, schema(), mode="w")
    w = st.writer()
    for b in range(7):
        w.append(stream_batch(SEED, 0, 0, b), stream="w0-0")
        w.commit()
    table = open_store(url, mode="r").default
    before = pa.Table.from_batches(list(table.scan()), schema=table.scan_schema())
    source = ReplayStoreDatasource(url)
    assert len(source.fragments) == 7
    w.append(stream_batch(SEED, 0, 0, 7), stream="w0-0")
    w.close()  # commits the 8th small fragment; close() waits for the merge of all eight (background)
    # the merge of the eight, then close's right-sizing of their segment (tests/store/test_sizes.py)
    merge, rightsized = open_store(url, mode="r").commits()[-2:]
    assert merge["kind"] == "compact" and len(merge["tables"]["records"]["remove"]) == 8
    assert rightsized["kind"] == "compact" and len(rightsized["tables"]["records"]["remove"]) == 1
    storage = open_storage(url)
    for name in merge["tables"]["records"]["remove"]:
        storage.delete(layout.fragment_dir(w.id, "records", name))
    storage.delete(layout.fragment_dir(w.id, "records", "s0000000000"))  # the original, as vacuum deletes it
    tasks = source.get_read_tasks(parallelism=100)
    got = pa.concat_tables([t for task in tasks for t in task()])
    assert got.equals(before)
    assert collect(ray.data.read_datasource(source)).equals(before)


def test_snapshot_of_reclaimed_records_fails_clearly(tmp_path: Path) -> None:
    url = str(tmp_path / "reclaimed")
    st = open_store(url, schema(), mode="w", capacity=4)
    w = st.writer()
    w.append(stream_batch(SEED, 0, 2, 0), stream="w0-2")  # 4 records
    w.commit()
    source = ReplayStoreDatasource(url)
    first = source.fragments[0][1]["name"]
    for b in range(1, 4):
        w.append(stream_batch(SEED, 0, 2, b), stream="w0-2")
        w.commit()
    assert not open_storage(url).exists(layout.fragment_dir(w.id, "records", first) + "/zarr.json")
    with pytest.raises(StaleReadError, match="evicted and their storage reclaimed"):
        [t for task in source.get_read_tasks(parallelism=4) for t in task()]


def test_empty_store(ray_cluster: None, tmp_path: Path) -> None:
    url = str(tmp_path / "empty")
    open_store(url, schema(), mode="w")
    ds = read_replaystore(url, ["row", "legal_ids"])
    assert ds.count() == 0
    assert ds.schema().names == ["row", "legal_ids"]


def test_s3_store_written_by_four_processes(ray_cluster: None, s3: S3Server) -> None:
    url = s3.url("ray-four-writers")
    total = write_with_processes(url, s3.storage_options, commits=3)
    ds = read_replaystore(url, storage_options=s3.storage_options)
    assert ds.count() == total
    check_identical(collect(ds), url, s3.storage_options, total)


def test_missing_ray_is_a_clear_import_error() -> None:
    code = ("import sys; sys.modules['ray'] = None\n"
            "try:\n    import replaystore.tools.ray_data\n"
            "except ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install 'replaystore[ray]'" in out.stdout, out.stdout + out.stderr
