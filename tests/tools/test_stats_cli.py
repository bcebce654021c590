"""``replaystore stats``: LeRobot's stats.json on stdout or in a file, progress on a terminal only."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

from replaystore.report import field_stats, lerobot_stats
from replaystore.schemas import deep_cfr_advantage, deep_cfr_strategy, transitions
from replaystore.store import open_store
from replaystore.tools.cli import EXIT_NOT_FOUND, EXIT_STORAGE, EXIT_USAGE, main

KEYS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = str(tmp_path / "t")
    rng = np.random.default_rng(0)
    n = 500
    st = open_store(url, transitions(3, actions=4), mode="w")
    with st.writer() as w:
        w.append({"obs": rng.standard_normal((n, 3)).astype(np.float32), "action": rng.integers(0, 4, n),
                  "reward": rng.standard_normal(n).astype(np.float32),
                  "next_obs": rng.standard_normal((n, 3)).astype(np.float32), "terminated": rng.random(n) < 0.05})
        w.commit()
    return url


def test_stdout_is_lerobot_stats_json(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", store]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""  # no bar when stderr is not a terminal, no summary line on stdout
    assert list(doc) == ["obs", "action", "reward", "next_obs", "terminated"]
    for feature in doc.values():
        assert set(feature) == KEYS and feature["count"] == [500]
    assert np.shape(doc["obs"]["mean"]) == (3,) and np.shape(doc["reward"]["q50"]) == (1,)
    expected = lerobot_stats(field_stats(open_store(store, mode="r")))
    assert doc == json.loads(json.dumps(expected))


def test_output_file(store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "stats.json"
    assert main(["stats", store, "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote the statistics of 5 fields to {out}\n"
    assert set(json.loads(out.read_text())) == {"obs", "action", "reward", "next_obs", "terminated"}
    assert main(["stats", store, "-o", str(tmp_path / "again.json"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert (tmp_path / "again.json").read_text() == out.read_text()


def test_errors(store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(tmp_path / "nothing")]) == EXIT_NOT_FOUND
    assert main(["stats", store, "-o", str(tmp_path / "no" / "dir.json")]) == EXIT_STORAGE
    assert main(["stats", store, "--table", "nope"]) == EXIT_USAGE
    assert "table 'nope'" in capsys.readouterr().err
    url = str(tmp_path / "cfr")
    open_store(url, {"advantage": deep_cfr_advantage(4), "strategy": deep_cfr_strategy(4)}, mode="w").close()
    assert main(["stats", url]) == EXIT_USAGE
    assert "this store has tables ['advantage', 'strategy']: choose one with --table" in capsys.readouterr().err
    assert main(["stats", url, "--table", "strategy"]) == 0
    assert "strategy_probs" in json.loads(capsys.readouterr().out)


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run ``replaystore`` with stderr on a pseudo-terminal; (exit code, stdout, what the terminal showed)."""
    main_fd, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", *args], stdout=subprocess.PIPE,
                          stderr=sub, timeout=120, check=False)
    os.close(sub)
    shown = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_fd)
    return proc.returncode, proc.stdout.decode(), shown.decode(errors="replace")


def test_progress_on_a_terminal_only(store: str, tmp_path: Path) -> None:
    code, out, shown = _on_a_terminal("stats", store, "-o", str(tmp_path / "s.json"))
    assert code == 0 and out.startswith("wrote the statistics")
    assert "stats:   0%|" in shown and "0/5" in shown and "field/s" in shown
    code, out, shown = _on_a_terminal("stats", store, "-o", str(tmp_path / "q.json"), "--quiet")
    assert code == 0 and out == "" and shown == ""
    proc = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "stats", store], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stderr == "" and set(json.loads(proc.stdout)) >= {"obs"}
