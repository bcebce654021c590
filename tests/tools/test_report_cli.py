"""``replaystore report STORE [-o FILE] [--table T] [--quiet]``: writes the HTML file, prints one human line.

The progress bar shows on a terminal (a pseudo-terminal here) and never in a pipe or with ``--quiet``.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

from replaystore.schemas import Dense, Schema, transitions
from replaystore.store import open_store
from replaystore.tools.cli import EXIT_NOT_FOUND, EXIT_STORAGE, EXIT_USAGE, main

LINE = re.compile(r"wrote (?P<path>.+) \((?P<size>[\d.]+ (B|KiB|MiB))\) in (?P<s>\d+\.\d) s")


def make_store(url: str, tables: bool = False) -> None:
    schema = ({"steps": transitions(obs_shape=2), "side": Schema("side", [Dense("x", np.float32)])} if tables
              else transitions(obs_shape=2))
    st = open_store(url, schema, mode="x")
    batch = {"obs": np.arange(12, dtype=np.float32).reshape(6, 2), "action": np.arange(6) % 2,
             "reward": np.ones(6, np.float32), "next_obs": np.zeros((6, 2), np.float32),
             "terminated": np.arange(6) % 3 == 2}
    with st.writer() as w:
        w.append({**batch, "x": np.zeros(6, np.float32)} if tables else batch, stream="actor")


def console() -> list[str]:
    here = Path(sys.executable).parent / "replaystore"
    found = str(here) if here.exists() else shutil.which("replaystore")
    assert found, "the replaystore console script is not installed (pip install -e .)"
    return [found]


def test_writes_the_file_and_prints_one_human_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "runs")
    make_store(url)
    out = tmp_path / "look.html"
    assert main(["report", url, "-o", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    m = LINE.fullmatch(lines[0])
    assert m and m.group("path") == str(out)
    assert out.exists() and out.read_text("utf-8").startswith("<!DOCTYPE html>")


def test_default_output_is_the_store_name_in_the_working_directory(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "stores" / "pendulum")
    make_store(url)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["report", url]) == 0
    assert (here / "pendulum-report.html").is_file()
    assert LINE.fullmatch(capsys.readouterr().out.strip()).group("path") == "pendulum-report.html"  # type: ignore[union-attr]


def test_table_of_a_multi_table_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "two")
    make_store(url, tables=True)
    assert main(["report", url, "-o", str(tmp_path / "no.html")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("replaystore report: error:") and "side" in err and "steps" in err
    assert not (tmp_path / "no.html").exists()
    assert main(["report", url, "--table", "side", "-o", str(tmp_path / "side.html")]) == 0
    assert (tmp_path / "side.html").is_file()


def test_errors_are_one_line_with_their_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nothing")]) == EXIT_NOT_FOUND
    assert len(capsys.readouterr().err.splitlines()) == 1
    url = str(tmp_path / "s")
    make_store(url)
    assert main(["report", url, "-o", str(tmp_path / "no" / "dir" / "r.html")]) == EXIT_STORAGE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "r.html" in err and ".tmp" not in err


def test_no_progress_in_a_pipe(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    make_store(url)
    proc = subprocess.run([*console(), "report", url, "-o", str(tmp_path / "r.html")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and LINE.fullmatch(proc.stdout.strip())


def _on_a_terminal(args: list[str]) -> tuple[int, str]:
    """Run ``args`` with stderr on a pseudo-terminal; its return code and what the terminal showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a size
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=follower, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=120), shown.decode("utf-8", "replace")


def test_progress_on_a_terminal_unless_quiet(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    make_store(url)
    code, shown = _on_a_terminal([*console(), "report", url, "-o", str(tmp_path / "a.html")])
    assert code == 0 and "report:" in shown and "step" in shown, shown
    code, shown = _on_a_terminal([*console(), "report", url, "-o", str(tmp_path / "b.html"), "--quiet"])
    assert code == 0 and shown == "", shown
