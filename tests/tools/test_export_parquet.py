"""Parquet export/import: hive partitions by stream, exact round trips, DuckDB and pyarrow.dataset read it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from replaystore.errors import StoreError, StoreExistsError
from replaystore.schemas import Schema, deep_cfr_advantage, deep_cfr_strategy, dqn, transitions
from replaystore.store import open_store
from replaystore.tools.export import EXPORT_FORMATS, export_store
from replaystore.tools.importer import IMPORT_FORMATS, import_store
from support.batches import deep_cfr_batch, dqn_batch, transitions_batch


def assert_same_table(a, b) -> None:
    """Same schema, same streams (with key types), and per stream the same steps, resets and values."""
    assert a.schema == b.schema
    assert sorted(map(repr, a.streams())) == sorted(map(repr, b.streams()))
    for key in a.streams():
        rows_a, steps_a = a.rows(key)
        rows_b, steps_b = b.rows(key)
        np.testing.assert_array_equal(steps_a, steps_b)
        np.testing.assert_array_equal(a.index_of(rows_a)[2], b.index_of(rows_b)[2])
        da, db = a.read(rows_a), b.read(rows_b)
        assert da.keys() == db.keys()
        for name in da:
            assert da[name].dtype == db[name].dtype, name
            assert da[name].tobytes() == db[name].tobytes(), name  # bit-identical


@pytest.fixture
def dqn_store(tmp_path: Path):
    """A DQN replay: int and str streams, several commits, two writers, one stream written out of
    row order (the second writer's rows hold the earlier steps)."""
    rng = np.random.default_rng(1)
    st = open_store(str(tmp_path / "dqn"), dqn(8, 2, actions=5, metadata={"env_id": "Toy-v0"}), mode="w")
    late, early = st.writer(), st.writer()  # writer ids 0 and 1: row ids of `late` sort first
    for s in range(3):
        early.append(dqn_batch(rng, 40, observation_size=8, actions=5, extra=0), stream=s, reset=True)
    early.append(dqn_batch(rng, 10, observation_size=8, actions=5, extra=0), stream="shared")
    early.commit()
    late.append(dqn_batch(rng, 12, observation_size=8, actions=5, extra=0), stream="shared")
    late.append(dqn_batch(rng, 25, observation_size=8, actions=5, extra=0), stream=1, reset=np.arange(25) % 7 == 0)
    late.commit()
    early.append(dqn_batch(rng, 30, observation_size=8, actions=5, extra=0), stream=2)
    early.commit()
    return st


def test_round_trip_is_bit_identical(dqn_store, tmp_path: Path) -> None:
    summary = export_store(dqn_store, str(tmp_path / "out"), "parquet")
    assert summary["records"] == len(dqn_store) and summary["streams"] == 4
    back = import_store(str(tmp_path / "out"), str(tmp_path / "back"), "parquet")
    assert_same_table(dqn_store.default, back.default)
    assert back.schema.metadata["env_id"] == "Toy-v0"
    assert 1 in back.streams() and "1" not in back.streams() and "shared" in back.streams()
    assert back.capacity is None


def test_layout_is_hive_partitioned_by_stream_with_metadata(dqn_store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export_store(dqn_store, str(out), "parquet")
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == ["stream=0", "stream=1", "stream=2", "stream=shared"]
    manifest = json.loads((out / "_replaystore.json").read_text())
    assert manifest["tables"]["records"]["stream_type"] == "mixed"
    assert sorted(manifest["tables"]["records"]["int_streams"]) == [0, 1, 2]
    files = list(out.glob("stream=*/*.parquet"))
    arrow_schema = pa.parquet.read_schema(files[0])
    assert Schema.from_arrow(arrow_schema) == dqn_store.schema
    assert json.loads(arrow_schema.metadata[b"replaystore.export"])["stream_type"] == "mixed"
    assert arrow_schema.names[:3] == ["row", "step", "reset"] and "stream" not in arrow_schema.names
    assert pa.types.is_large_list(arrow_schema.field("legal_ids").type)
    # rows go out in row-id order: the stream two writers shared has its later steps first
    steps = pa.parquet.read_table(out / "stream=shared").column("step").to_pylist()
    assert steps == list(range(10, 22)) + list(range(10))


def test_duckdb_reads_the_export(dqn_store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export_store(dqn_store, str(out), "parquet")
    got = duckdb.sql(f"""
        SELECT stream, count(*) AS n, sum(len(legal_ids)) AS ids, bool_or(list_contains(legal_ids, 4)) AS has4
        FROM read_parquet('{out}/**/*.parquet', hive_partitioning=true) GROUP BY stream ORDER BY stream
    """).fetchall()
    expected = []
    for key in sorted(dqn_store.streams(), key=str):
        data = dqn_store.read(dqn_store.rows(key)[0])
        expected.append((str(key), len(data["obs"]), len(data["legal_ids"]), bool(np.any(data["legal_ids"] == 4))))
    assert got == expected
    row = duckdb.sql(f"SELECT obs, step FROM read_parquet('{out}/**/*.parquet', hive_partitioning=true) "
                     f"WHERE stream = 'shared' ORDER BY step LIMIT 1").fetchall()[0]
    rows, _ = dqn_store.rows("shared")
    np.testing.assert_allclose(row[0], dqn_store.read(rows[:1])["obs"][0])
    assert row[1] == 0


def test_int_streams_come_back_as_integers_in_duckdb_and_pyarrow(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    st = open_store(str(tmp_path / "t"), transitions(4, actions=3), mode="w")
    with st.writer() as w:
        for s in (3, 10, 7):
            w.append(transitions_batch(rng, 11 + s), stream=s)
    out = tmp_path / "out"
    export_store(st, str(out), "parquet")
    rel = duckdb.sql(f"SELECT stream, count(*) FROM read_parquet('{out}/**/*.parquet', hive_partitioning=true) "
                     f"GROUP BY stream ORDER BY stream")
    assert str(rel.types[0]) == "BIGINT" and rel.fetchall() == [(3, 14), (7, 18), (10, 21)]
    dataset = ds.dataset(str(out), partitioning="hive", format="parquet")
    assert pa.types.is_integer(dataset.schema.field("stream").type)
    table = dataset.to_table(filter=ds.field("stream") == 7)
    assert table.num_rows == 18 and table.column("step").to_pylist() == list(range(18))
    assert Schema.from_arrow(dataset.schema) == st.schema  # the replaystore schema rides along
    back = import_store(str(out), str(tmp_path / "back"), "parquet")
    assert back.streams() == [3, 7, 10]
    assert_same_table(st.default, back.default)


def test_odd_string_keys_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    st = open_store(str(tmp_path / "t"), transitions(2), mode="w")
    keys = ["actor/3", "a b", "x=1", "ünï", "007"]
    with st.writer() as w:
        for k in keys:
            w.append(transitions_batch(rng, 4, obs_dim=2), stream=k)
    export_store(st, str(tmp_path / "out"), "parquet")
    got = duckdb.sql(f"SELECT DISTINCT stream FROM read_parquet('{tmp_path}/out/**/*.parquet', "
                     f"hive_partitioning=true) ORDER BY 1").fetchall()
    assert [g[0] for g in got] == sorted(keys)
    back = import_store(str(tmp_path / "out"), str(tmp_path / "back"), "parquet")
    assert sorted(back.streams()) == sorted(keys)  # "007" stays a str
    assert_same_table(st.default, back.default)


def test_more_streams_than_open_files_roll_over_to_numbered_parts(tmp_path: Path, monkeypatch) -> None:
    """Streams written in turn past the open-file limit: each reopening starts the stream's next
    part file, numbered so that natural order is step order, and the round trip is exact."""
    import replaystore.tools.formats.parquet as parquet_format

    monkeypatch.setattr(parquet_format, "MAX_OPEN_FILES", 2)
    rng = np.random.default_rng(8)
    st = open_store(str(tmp_path / "t"), transitions(2), mode="w")
    with st.writer() as w:
        for turn in range(12):
            for key in ("a", "b", "c"):
                w.append(transitions_batch(rng, 3, obs_dim=2), stream=key, reset=turn == 0)
            w.commit()
    report = parquet_format.export_parquet(st, str(tmp_path / "out"), batch_rows=3)
    parts = sorted(p.name for p in (tmp_path / "out" / "stream=b").iterdir())
    assert len(parts) == 12 and "part-11.parquet" in parts  # 3 streams through 2 slots: reopened every turn
    assert report["files"] == 3 * 12 + 1  # and the manifest
    steps = pa.parquet.read_table(tmp_path / "out" / "stream=b" / "part-10.parquet").column("step").to_pylist()
    assert steps == list(range(30, 33))
    back = import_store(str(tmp_path / "out"), str(tmp_path / "back"), "parquet")
    assert_same_table(st.default, back.default)


def test_capacity_gaps_and_resets_survive(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    st = open_store(str(tmp_path / "replay"), transitions(3), mode="w", capacity=120)
    with st.writer() as w:
        for i in range(8):
            w.append(transitions_batch(rng, 30, obs_dim=3), stream=i % 3, reset=i % 2 == 0)
            w.commit()
    assert len(st) == 120
    export_store(st, str(tmp_path / "out"), "parquet")
    back = import_store(str(tmp_path / "out"), str(tmp_path / "back"), "parquet")
    assert back.capacity == 120 and len(back) == 120
    assert_same_table(st.default, back.default)


def test_multi_table_store_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    schemas = {"advantage": deep_cfr_advantage(6, actions=4), "strategy": deep_cfr_strategy(6, actions=4)}
    st = open_store(str(tmp_path / "cfr"), schemas, mode="w")
    with st.writer() as w:
        for it in range(3):
            w.append(deep_cfr_batch(rng, 20 + it, 9 + it, observation_size=6, actions=4, iteration=it),
                     stream=f"traverser-{it % 2}")
    out = tmp_path / "out"
    summary = export_store(st, str(out), "parquet")
    assert summary["tables"] == ["advantage", "strategy"]
    assert (out / "advantage" / "stream=traverser-0").is_dir() and (out / "strategy").is_dir()
    n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/strategy/**/*.parquet', hive_partitioning=true)")
    assert n.fetchall() == [(len(st.table("strategy")),)]
    back = import_store(str(out), str(tmp_path / "back"), "parquet")
    assert sorted(back.tables) == ["advantage", "strategy"]
    for name in schemas:
        assert_same_table(st.table(name), back.table(name))
    # one table of it, on its own
    export_store(st, str(tmp_path / "one"), "parquet", table="strategy")
    one = import_store(str(tmp_path / "one"), str(tmp_path / "one-back"), "parquet")
    assert one.tables == ["strategy"]
    assert_same_table(st.table("strategy"), one.table("strategy"))


def test_empty_table_and_memory_urls(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "empty"), transitions(2), mode="w")
    export_store(st, "memory://rs-export-test/empty", "parquet")
    back = import_store("memory://rs-export-test/empty", str(tmp_path / "back"), "parquet")
    assert len(back) == 0 and back.schema == st.schema
    rng = np.random.default_rng(6)
    with st.writer() as w:
        w.append(transitions_batch(rng, 9, obs_dim=2), stream=1)
    export_store(st, "memory://rs-export-test/full", "parquet")
    back = import_store("memory://rs-export-test/full", "memory://rs-export-test/store", "parquet")
    assert_same_table(st.default, back.default)


def test_refuses_to_overwrite_and_reports_formats(dqn_store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="not empty"):
        export_store(dqn_store, str(out), "parquet")
    assert (out / "keep.txt").read_text() == "mine"
    assert EXPORT_FORMATS == ("parquet", "minari", "minari-hdf5", "d4rl", "lerobot")
    assert IMPORT_FORMATS == ("parquet", "minari", "minari-hdf5", "d4rl", "lerobot")
    with pytest.raises(StoreError, match=r"unknown export format 'csv': expected one of parquet, minari"):
        export_store(dqn_store, str(tmp_path / "x"), "csv")
    with pytest.raises(StoreError, match=r"unknown import format 'rlds'"):
        import_store(str(out), str(tmp_path / "y"), "rlds")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    with pytest.raises(StoreError, match="no Parquet files"):
        import_store(str(out), str(tmp_path / "y"), "parquet")


def test_plain_parquet_without_replaystore_metadata_imports(tmp_path: Path) -> None:
    src = tmp_path / "plain"
    src.mkdir()
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    table = pa.table({"obs": pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), 2),
                      "reward": pa.array(np.linspace(0, 1, 6))})
    pa.parquet.write_table(table, src / "data.parquet")
    st = import_store(str(src), str(tmp_path / "st"), "parquet")
    assert st.schema.names == ("obs", "reward") and st.schema.field("obs").shape == (2,)
    assert st.streams() == [0]
    rows, steps = st.rows(0)
    np.testing.assert_array_equal(steps, np.arange(6))
    np.testing.assert_array_equal(st.read(rows)["obs"], obs)
    with pytest.raises(StoreExistsError):
        import_store(str(src), str(tmp_path / "st"), "parquet")
    assert len(open_store(str(tmp_path / "st"), mode="r")) == 6


def test_tilde_paths_are_the_home_directory(dqn_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    export_store(dqn_store, "~/out", "parquet")
    back = import_store("~/out", "~/back", "parquet")
    assert (home / "out").is_dir() and back.url == str(home / "back")
    assert_same_table(dqn_store.default, back.default)
    assert list(cwd.iterdir()) == []  # no directory literally named "~"
