"""DuckDB over a store: views, LIST/ARRAY columns, commits/appends, projection pushdown, errors."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from replaystore.schemas import deep_cfr_advantage, deep_cfr_strategy, dqn, ppo, treestrap
from replaystore.store import open_store
from replaystore.store.sql import QueryError, to_arrow
from support.batches import deep_cfr_batch, dqn_batch, ppo_batch


@pytest.fixture
def ppo_store(tmp_path):
    st = open_store(str(tmp_path / "s"), ppo(16, actions=9))
    rng = np.random.default_rng(0)
    batches = []
    with st.writer() as w:
        for i in range(4):
            b = ppo_batch(rng, 50, extra=0)
            batches.append(b)
            w.append(b, stream=f"env{i % 2}")
            w.commit(metadata={"iteration": i})
    return st, batches


def test_every_field_and_index_column_is_queryable(ppo_store):
    st, batches = ppo_store
    t = st.sql("SELECT * FROM records ORDER BY row")
    assert t.num_rows == 200
    assert t.column_names[:4] == ["row", "stream", "step", "reset"]
    assert set(st.schema.record_names) <= set(t.column_names)
    assert {"writer", "commit", "commit_time"} <= set(t.column_names)
    expected_obs = np.concatenate([b.obs for b in batches])
    got_obs = np.array(t.column("obs").to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(got_obs, expected_obs)
    legal = t.column("legal_ids").to_pylist()
    b0 = batches[0]
    assert legal[3] == b0.legal_ids[b0.legal_offsets[3]:b0.legal_offsets[4]].tolist()
    assert t.column("row").to_pylist() == st.row_ids().tolist()


def test_list_functions_on_ragged_fields(ppo_store):
    st, batches = ppo_store
    ids = np.concatenate([np.diff(b.legal_offsets) for b in batches])
    t = st.sql("SELECT len(legal_ids) AS n, list_contains(legal_ids, 3) AS has3 FROM records ORDER BY row")
    np.testing.assert_array_equal(np.array(t.column("n").to_pylist()), ids)
    has3 = []
    for b in batches:
        for i in range(len(b.obs)):
            has3.append(3 in b.legal_ids[b.legal_offsets[i]:b.legal_offsets[i + 1]])
    assert t.column("has3").to_pylist() == has3


def test_row_ids_from_sql_are_sampler_subsets(ppo_store):
    st, _ = ppo_store
    rows = st.sql("SELECT row FROM records WHERE stream = 'env1' AND step < 10").column("row").to_numpy()
    keys, steps, _ = st.default.index_of(rows)
    assert set(keys) == {"env1"} and steps.max() < 10 and len(rows) == 10


def test_multidimensional_dense_fields_come_through_as_arrays(tmp_path):
    st = open_store(str(tmp_path / "t"), treestrap(4, heads=2, actions=3))
    targets = np.arange(2 * 2 * 3, dtype=np.float64).reshape(2, 2, 3)
    with st.writer() as w:
        w.append({"obs": np.zeros((2, 4), np.float32), "players": np.array([0, 1]), "targets": targets,
                  "masks": np.ones((2, 2), np.float32), "telemetry": {"s": 1}})
    t = st.sql("SELECT targets, targets[2][3] AS last FROM records ORDER BY row")
    assert t.column("targets").to_pylist()[1] == targets[1].tolist()
    assert t.column("last").to_pylist() == [5.0, 11.0]


def test_commits_and_appends_views(ppo_store):
    st, _ = ppo_store
    # (close's right-sizing adds a compact record: the appends are the commits of kind 'append')
    commits = st.sql("SELECT commit, metadata->>'$.iteration' AS it, records FROM commits WHERE kind = 'append' "
                     "ORDER BY commit")
    assert commits.column("it").to_pylist() == ["0", "1", "2", "3"]
    assert commits.column("records").to_pylist() == [50, 50, 50, 50]
    tele = st.sql("SELECT telemetry->>'$.games' AS g FROM appends")
    assert tele.column("g").to_pylist() == ["4"] * 4
    joined = st.sql("SELECT c.metadata->>'$.iteration' AS it, count(*) AS n FROM records r "
                    "JOIN commits c ON r.writer = c.writer AND r.commit = c.commit GROUP BY 1 ORDER BY 1")
    assert joined.column("n").to_pylist() == [50, 50, 50, 50]


def test_each_table_of_a_multi_table_store_is_a_view(tmp_path):
    st = open_store(str(tmp_path / "cfr"), {"advantage": deep_cfr_advantage(16, actions=9),
                                             "strategy": deep_cfr_strategy(16, actions=9)})
    with st.writer() as w:
        w.append(deep_cfr_batch(np.random.default_rng(1), 30, 70), stream="traverser")
    t = st.sql("SELECT (SELECT count(*) FROM advantage) AS a, (SELECT count(*) FROM strategy) AS s")
    assert t.to_pylist() == [{"a": 30, "s": 70}]
    aligned = st.sql("SELECT bool_and(len(advantage_legal_ids) = len(advantage_targets)) AS ok FROM advantage")
    assert aligned.to_pylist() == [{"ok": True}]


def test_projection_pushdown_reads_only_the_columns_used(tmp_path):
    st = open_store(str(tmp_path / "d"), dqn(16, 2, actions=9))
    rng = np.random.default_rng(2)
    with st.writer() as w:
        for _ in range(3):
            w.append(dqn_batch(rng, 100), stream=0)
            w.commit()
    reader = st.default.reader
    reader._data.clear()
    st.sql("SELECT sum(rewards), max(discounts) FROM records WHERE step > 10")
    opened = {name for d in reader._data.values() for name in d._arrays}
    assert opened == {"rewards", "discounts", "_step"}


def test_duckdb_connection_is_handed_back(ppo_store):
    st, _ = ppo_store
    con = st.duckdb()
    assert con.sql("SELECT count(*) FROM records").fetchall() == [(200,)]
    rel = to_arrow(con.sql("SELECT stream, count(*) AS n FROM records GROUP BY 1 ORDER BY 1"))
    assert isinstance(rel, pa.Table) and rel.column("n").to_pylist() == [100, 100]


def test_bad_sql_is_a_typed_error(ppo_store):
    st, _ = ppo_store
    with pytest.raises(QueryError, match="syntax error"):
        st.sql("SELEC 1")
    with pytest.raises(QueryError, match="nosuch"):
        st.sql("SELECT nosuch FROM records")


def test_scans_stream_in_bounded_batches(ppo_store):
    st, _ = ppo_store
    batches = list(st.default.scan(["row", "obs"], batch_rows=16))
    assert max(b.num_rows for b in batches) == 16
    assert sum(b.num_rows for b in batches) == 200


@pytest.mark.parametrize("dtype", ["bool", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"])
def test_every_schema_dtype_is_queryable(tmp_path, dtype):
    from replaystore.schemas import Dense, Ragged, Schema

    schema = Schema("dtypes", [Dense("x", dtype, ()), Dense("v", dtype, (2,)),
                               Ragged("r", dtype, offsets="r_offsets")])
    st = open_store(str(tmp_path / "s"), schema)
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 2, 6) if dtype == "bool" else rng.integers(0, 100, 6)).astype(dtype)
    v = x.repeat(2).reshape(6, 2)
    with st.writer() as w:
        w.append({"x": x, "v": v, "r": x[:4], "r_offsets": np.array([0, 1, 1, 2, 3, 4, 4])}, stream=0)
        w.commit()
    t = st.sql("SELECT x, v, r FROM records ORDER BY row")
    assert np.array_equal(np.asarray(t.column("x").to_pylist(), dtype=dtype), x)
    assert np.array_equal(np.asarray(t.column("v").to_pylist(), dtype=dtype), v)
    assert [len(r) for r in t.column("r").to_pylist()] == [1, 0, 1, 1, 1, 0]
    assert st.sql("SELECT count(*) AS n FROM records WHERE x = x").column("n").to_pylist() == [6]


@pytest.mark.parametrize("sql", ["", "   \n", "-- nothing here\n", "/* c */ ;"])
def test_empty_query_is_a_typed_error(ppo_store, sql):
    st, _ = ppo_store
    with pytest.raises(QueryError, match="empty query"):
        st.sql(sql)


FORBIDDEN = [
    "COPY (SELECT * FROM records) TO '{out}/copy.parquet'",
    "COPY commits TO '{out}/copy.csv'",
    "ATTACH '{out}/attached.db'",
    "EXPORT DATABASE '{out}/exported'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM '{secret}'",
    "SELECT * FROM glob('{out}/*')",
    "SET enable_external_access = true",
    "SELECT * FROM ppo_store",
]


@pytest.mark.parametrize("template", FORBIDDEN)
def test_sql_is_read_only_by_default(ppo_store, tmp_path, template):
    st, _ = ppo_store
    out = tmp_path / "outside"
    out.mkdir()
    secret = tmp_path / "secret.csv"
    secret.write_text("a,b\n1,2\n")
    with pytest.raises(QueryError):
        st.sql(template.format(out=out, secret=secret))
    assert list(out.iterdir()) == []
    con = st.duckdb()
    with pytest.raises(duckdb.Error):
        con.sql(template.format(out=out, secret=secret)).fetchall()
    assert list(out.iterdir()) == []


def test_file_access_is_an_explicit_opt_in(ppo_store, tmp_path):
    st, _ = ppo_store
    out = tmp_path / "rows.parquet"
    st.sql(f"COPY (SELECT row FROM records) TO '{out}' (FORMAT parquet)", unsafe=True)
    t = st.sql(f"SELECT count(*) AS n FROM read_parquet('{out}')", unsafe=True)
    assert t.column("n").to_pylist() == [200]


def _ten_fragments(tmp_path):
    """Ten commits of 100 records with a zstd field (its blocks are checksummed when decoded)."""
    from replaystore.schemas import Dense, Schema

    st = open_store(str(tmp_path / "d"), Schema("s", [Dense("obs", np.float32, (16,), codec="zstd"),
                                                      Dense("rewards", np.float32)]))
    rng = np.random.default_rng(4)
    with st.writer() as w:
        for _ in range(10):
            w.append({"obs": rng.standard_normal((100, 16)).astype(np.float32),
                      "rewards": rng.standard_normal(100).astype(np.float32)}, stream=0)
            w.commit()
    return st


def test_a_query_that_stops_early_reads_no_further(tmp_path):
    """A scan reads a batch only when DuckDB asks for it: nothing is read ahead, during or after the query."""
    st = _ten_fragments(tmp_path)
    fragments, records = len(st.default.view().fragments), len(st.row_ids())
    assert fragments > 1
    reader = st.default.reader
    for sql in ("SELECT obs FROM records LIMIT 1", "SELECT obs FROM records WHERE step >= 0 LIMIT 3"):
        reader._data.clear()
        assert st.sql(sql).num_rows in (1, 3)
        assert sum("obs" in d._arrays for d in reader._data.values()) == 1, sql
    reader._data.clear()
    got = st.sql("SELECT count(*) AS n FROM records WHERE list_max(obs) > -1e9").column("n").to_pylist()
    assert got == [records]
    assert sum("obs" in d._arrays for d in reader._data.values()) == fragments


def test_a_damaged_chunk_met_by_a_query_is_the_stores_typed_error(tmp_path):
    from replaystore.errors import CorruptObjectError
    from replaystore.tools.cli import EXIT_CORRUPT
    from replaystore.tools.cli import main as cli_main

    st = _ten_fragments(tmp_path)
    chunk = max(p for p in (tmp_path / "d").rglob("*") if p.is_file() and "/obs/" in str(p) and p.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptObjectError) as exc:
        st.sql("SELECT sum(list_sum(obs)) FROM records")
    assert "/obs/" in exc.value.path and str(chunk).endswith(exc.value.path)
    assert st.sql("SELECT rewards FROM records LIMIT 1").num_rows == 1  # other columns still read
    assert cli_main(["query", str(tmp_path / "d"), "SELECT max(list_max(obs)) FROM records"]) == EXIT_CORRUPT
