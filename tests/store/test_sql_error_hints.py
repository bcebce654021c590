"""SQL mistakes name what is there: an unknown column lists the columns of the tables queried, an unknown
table lists the tables; the store is unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replaystore.schemas import Dense, Schema, transitions
from replaystore.store import open_store
from replaystore.store.sql import QueryError

RECORDS = "row, stream, step, reset, obs, action, reward, next_obs, terminated, writer, commit, commit_time"


@pytest.fixture
def st(tmp_path: Path):
    st = open_store(str(tmp_path / "s"), transitions(obs_shape=2), mode="w")
    with st.writer() as w:
        w.append({"obs": np.zeros((3, 2), np.float32), "action": np.arange(3), "reward": np.ones(3, np.float32),
                  "next_obs": np.zeros((3, 2), np.float32), "terminated": np.array([False, False, True])})
    return st


def test_an_unknown_column_lists_the_queried_tables_columns(st) -> None:
    with pytest.raises(QueryError) as err:
        st.sql("SELECT sum(rewrd) FROM records")
    msg = str(err.value)
    assert 'column "rewrd" not found' in msg
    assert f"available columns: records: {RECORDS})" in msg
    assert "commits:" not in msg and "appends:" not in msg


def test_an_aliased_table_and_a_built_in_view(st) -> None:
    with pytest.raises(QueryError, match=rf"available columns: records: {RECORDS}\)"):
        st.sql("SELECT r.rewrd FROM records AS r")
    with pytest.raises(QueryError, match=r"available columns: commits: writer, commit, commit_time, kind"):
        st.sql("SELECT writr FROM commits")
    assert len(st) == 3 and st.sql("SELECT count(*) AS n FROM records").to_pylist() == [{"n": 3}]


def test_a_join_lists_both_tables(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "m"), {"a": Schema("a", [Dense("x", np.float32)]),
                                            "b": Schema("b", [Dense("y", np.int64)])},
                    mode="w")
    with pytest.raises(QueryError) as err:
        st.sql('SELECT a.z FROM a JOIN "b" ON a.row = b.row')
    msg = str(err.value)
    assert "a: row, stream, step, reset, x, writer" in msg and "b: row, stream, step, reset, y, writer" in msg


def test_an_unknown_table_lists_the_tables(st) -> None:
    with pytest.raises(QueryError, match=r"nosuch does not exist.*\(tables: records, commits, appends\)"):
        st.sql("SELECT * FROM nosuch")
