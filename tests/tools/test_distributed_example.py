"""examples/distributed_actors.py runs end to end with one command (``--quick``): actor processes
write one S3 store on a loopback moto server, a learner trains from it, Ray Data exports a
snapshot to Parquet, and the server is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "distributed_actors.py"
TIMEOUT_S = 240


def answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def test_distributed_actors_example_quick(tmp_path: Path) -> None:
    out, summary_path = tmp_path / "parquet", tmp_path / "summary.json"
    with subprocess.Popen([sys.executable, str(EXAMPLE), "--quick", "--out", str(out), "--summary",
                           str(summary_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the example stops its actors and its S3 server on SIGTERM
            stdout, stderr = proc.communicate(timeout=60)
            raise AssertionError(
                f"the example did not finish in {TIMEOUT_S} s:\n{stdout[-4000:]}{stderr[-4000:]}") from None
    assert proc.returncode == 0, stdout[-4000:] + stderr[-8000:]
    summary = json.loads(summary_path.read_text())
    print(stdout)

    # the S3 server was on loopback, and the example stopped it
    assert summary["endpoint"].startswith("http://127.0.0.1:")
    assert not answers(summary["endpoint"])

    # two actor processes, each its own writer; every record they committed is in the store
    actors = summary["actors"]
    assert [a["actor"] for a in actors] == [0, 1]
    assert sorted(a["writer"] for a in actors) == summary["store_writers"] and len(summary["store_writers"]) == 2
    assert all(a["records"] > 0 and a["commits"] >= 2 for a in actors)
    assert summary["store_records"] == sum(a["records"] for a in actors)

    # the learner trained while the actors wrote: its view of the store grew between refreshes
    learner = summary["learner"]
    assert learner["steps"] == 200
    seen = learner["records_seen"]
    assert seen == sorted(seen) and seen[-1] > seen[0], seen
    assert np.isfinite(learner["loss_last"]) and 0.0 <= learner["win_rate_first"] <= 1.0

    # the Ray export is a snapshot taken while the actors were still writing, one read task per fragment
    export = summary["export"]
    assert 0 < export["rows"] <= summary["store_records"] and export["tasks"] >= 2
    table = pq.read_table(out)
    assert table.num_rows == export["rows"] and len(list(out.glob("*.parquet"))) == export["files"]
    rows = table.column("row").to_numpy()
    assert len(np.unique(rows)) == len(rows)
    assert set(np.unique(rows >> 40).tolist()) <= set(summary["store_writers"])
    streams = set(table.column("stream").to_pylist())
    assert streams <= {f"actor{a}/game{s}" for a in range(2) for s in range(4)} and len(streams) >= 4
    assert "3. Ray Data exported a snapshot" in stdout
