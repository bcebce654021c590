"""The README's main command: `replaystore demo DIR` runs end to end and shows what it promises."""

from __future__ import annotations

import re
import subprocess

from replaystore.store import open_store


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
    assert "next minibatch identical to the uninterrupted run: yes" in out
    assert "first_mover_result" in out  # the DuckDB summary
    st = open_store(str(tmp_path / "tictactoe-dqn"), mode="r")
    assert len(st) > 10_000 and len(st.streams()) == 8
    assert st.load_state("demo-per") is not None and st.load_state("demo-qnet") is not None
    assert any((tmp_path / "export-parquet").rglob("*.parquet"))
    assert (tmp_path / "export-minari" / "tictactoe" / "random-v0" / "data" / "metadata.json").exists()
