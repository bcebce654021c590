"""The store commands of the real console script: info, verify, query; user mistakes are one line."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest

from replaystore.schemas import dqn
from replaystore.store import open_store
from support.batches import dqn_batch
from support.storecheck import Backend


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["replaystore", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("cli") / "store")
    st = open_store(url, dqn(16, 2, actions=9), capacity=10_000)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for i in range(3):
            w.append(dqn_batch(rng, 40, extra=0), stream=f"actor{i}")
            w.commit(metadata={"round": i})
    return url


def test_info_names_schema_records_streams_writers_capacity_size_version(store_url):
    r = run("info", store_url)
    assert r.returncode == 0, r.stderr
    for needle in ("format    version 2, capacity 10000", "writers   1 (1 closed), 4 commits",  # (3 appends and
                   "records   120 in 3 streams", "allocated on disk", "schema dqn (version 1)",  # close's right-sizing)
                   "legal_ids"):
        assert needle in r.stdout
    assert "log checkpoint" not in r.stdout  # the internals: --verbose
    r = run("info", "--verbose", store_url)
    assert r.returncode == 0, r.stderr
    for needle in ("format    version 2", "log checkpoint  none", "120 records, 3 streams", "size on disk",
                   "state slots     none"):
        assert needle in r.stdout


def test_verify_passes_on_an_intact_store(store_url):
    r = run("verify", store_url)
    assert r.returncode == 0 and r.stdout.startswith("ok:")


@pytest.mark.parametrize("fragments", [False, True], ids=["segment", "fragment"])
def test_verify_names_a_damaged_chunk(tmp_path, fragments):
    url = str(tmp_path / "s")
    backend = Backend(url)
    st = backend.open_fragments(dqn(16, 2, actions=9)) if fragments else backend.open(dqn(16, 2, actions=9))
    with st.writer() as w:
        w.append(dqn_batch(np.random.default_rng(1), 30, extra=0))
    st.refresh()
    (frag,) = st.table("records").reader.fragments
    assert (frag.segment is None) == fragments  # a version-2 local store's records are in a segment
    name = f"{frag.path.rsplit('/', 1)[-1]}/rewards/c/0"
    chunk = tmp_path / "s" / frag.path / "rewards/c/0"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0x40
    chunk.write_bytes(bytes(data))
    r = run("verify", url)
    assert r.returncode == 1
    assert name in r.stdout and "crc32c" in r.stdout
    chunk.write_bytes(bytes(data[:10]))
    r = run("verify", url)
    assert r.returncode == 1 and "size 10 bytes" in r.stdout


def test_query_prints_a_table(store_url):
    r = run("query", store_url, "SELECT stream, count(*) AS n FROM records GROUP BY 1 ORDER BY 1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["stream", "n"]
    assert lines[2].split() == ["actor0", "40"] and lines[-1] == "(3 rows)"


def test_query_writes_csv_json_parquet(store_url, tmp_path):
    r = run("query", store_url, "SELECT row, step FROM records ORDER BY row LIMIT 3", "--format", "csv")
    assert r.stdout.splitlines() == ['"row","step"', "0,0", "1,1", "2,2"]
    r = run("query", store_url, "SELECT row, legal_ids FROM records ORDER BY row LIMIT 2", "--format", "json")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["row"] for row in rows] == [0, 1] and isinstance(rows[0]["legal_ids"], list)
    out = tmp_path / "q.parquet"
    r = run("query", store_url, "SELECT row, obs FROM records", "--format", "parquet", "-o", str(out))
    assert r.returncode == 0 and pq.read_table(out).num_rows == 120


@pytest.mark.parametrize("args, needle", [
    (("query", "{url}", "SELEC nothing"), "syntax error"),
    (("query", "{url}", "SELECT 1", "--format", "parquet"), "--output"),
    (("info", "{missing}"), "no replaystore store here"),
    (("verify", "{missing}"), "no replaystore store here"),
    (("info", "{url}", "--storage-options", "{{not json"), "--storage-options"),
])
def test_user_mistakes_are_one_clear_line(store_url, tmp_path, args, needle):
    r = run(*[a.format(url=store_url, missing=str(tmp_path / "nothing")) for a in args])
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_every_subcommand_has_help():
    for cmd in ("info", "verify", "query", "export", "import", "demo", "schemas", "bench"):
        r = run(cmd, "--help")
        assert r.returncode == 0 and "usage: replaystore" in r.stdout


def test_bench_lists_the_checkout_benchmarks_on_a_bad_name():
    r = run("bench", "nosuch")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "available:" in r.stderr and "store" in r.stderr
