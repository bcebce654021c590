"""The README's main command: `replaystore demo DIR` runs end to end and shows what it promises.

The whole command (its 2,200 training minibatches and the learning it shows) is marked ``slow``; the default
run keeps the same pipeline in process with short training and evaluation (its collection by two writer
processes, the resume check, DuckDB and both exports at full size), without the learning check."""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
from pathlib import Path

import pytest

from replaystore.store import open_store
from replaystore.tools import demo


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    r = subprocess.run(["replaystore", "demo", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "committed by 2 writers" in out
    pattern = r"\): (?:the Q-network )?wins (\d+)% moving first, (\d+)% moving second"
    rates = [(int(a), int(b)) for a, b in re.findall(pattern, out)]
    baseline = re.search(r"random play wins (\d+)% moving first, (\d+)% moving second", out)
    assert baseline and len(rates) == 2
    random_first, random_second = int(baseline.group(1)), int(baseline.group(2))
    trained_first, trained_second = rates[0]
    assert trained_first > random_first + 10 and trained_second > random_second + 10
    check_demo_store(tmp_path, out)


def check_demo_store(tmp_path: Path, out: str) -> None:
    """What the demo promises besides the learning: the resume check, the summary, the store, the exports."""
    assert "next minibatch identical to the uninterrupted run: yes" in out
    assert "first_mover_result" in out  # the DuckDB summary
    # what a newcomer reads: where the code is, one "shows:" line per stage, a short store summary, the columns
    assert f"the code is replaystore.tools.demo ({demo.__file__})" in out
    assert out.count("   shows: ") == 4
    assert re.search(r"committed by 2 writers in \d+ commits: 2400 games", out)
    # replaystore info's short summary: counts, size, the schema as a table, metadata, episodes and returns
    assert re.search(r"\| records   \d+ in 8 streams\n", out)
    assert re.search(r"\| size      [\d.]+ \w+ allocated on disk \(as du counts it\)", out)
    assert re.search(r"\|   legal_ids +ragged +int64 +variable \(legal_offsets\)", out)
    assert "|     env_id: tictactoe" in out
    assert re.search(r"\|   episodes  4800: 4800 ended, 0 open\n", out)
    assert re.search(r"\|   returns   mean \S+, min -1, max 1", out)
    assert "tails: records whose TD target does not bootstrap" in out
    assert "first_mover_result: the first mover's mean game result" in out
    assert "mean_legal_actions: the mean number of legal moves" in out
    assert "episodes: one ends at each of the 2 dones a game" in out
    assert "log checkpoint" not in out and "fragments" not in out  # the internals stay in `info --verbose`
    assert re.search(r"done in \d+ s \(collect \d+ s, train \d+ s, resume \d+ s, query and export \d+ s\)", out)
    st = open_store(str(tmp_path / "tictactoe-dqn"), mode="r")
    assert len(st) > 10_000 and len(st.streams()) == 8
    assert st.load_state("demo-per") is not None and st.load_state("demo-qnet") is not None
    assert any((tmp_path / "export-parquet").rglob("*.parquet"))
    assert (tmp_path / "export-minari" / "tictactoe" / "random-v0" / "data" / "metadata.json").exists()


def test_demo_pipeline_with_short_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's pipeline in process, with 40 + 20 minibatches and 20 evaluation games a seat."""
    monkeypatch.setattr(demo, "TRAIN_STEPS", 40)
    monkeypatch.setattr(demo, "RESUME_STEPS", 20)
    monkeypatch.setattr(demo, "win_rate", functools.partial(demo.win_rate, games=20))
    assert demo.run_demo(argparse.Namespace(dir=str(tmp_path))) == 0
    out = capsys.readouterr().out
    assert "committed by 2 writers" in out
    assert "after 40 prioritized minibatches" in out and "after 20 more minibatches" in out
    check_demo_store(tmp_path, out)
