"""``replaystore bench``: run the benchmark scripts of a source checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from replaystore.errors import ReplayStoreError


def bench_dir() -> Path:
    """``bench/`` of the checkout this package runs from (editable install), or of the current directory."""
    for candidate in (Path(__file__).resolve().parents[1] / "bench", Path.cwd() / "bench"):
        if candidate.is_dir() and any(candidate.glob("*_bench.py")):
            return candidate
    raise ReplayStoreError("no bench/ directory with *_bench.py scripts found: run from a source checkout "
                           "(git clone, then pip install -e '.[bench]')")


def run_bench(which: list[str], quick: bool) -> int:
    """Run ``bench/<name>_bench.py`` for each name (all of them by default); returns the worst exit code."""
    directory = bench_dir()
    available = {p.name[:-len("_bench.py")]: p for p in sorted(directory.glob("*_bench.py"))}
    names = which or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ReplayStoreError(f"unknown benchmark(s) {unknown}; available: {', '.join(available)}")
    worst = 0
    for name in names:
        print(f"== {name}: {available[name]}", flush=True)
        cmd = [sys.executable, str(available[name])] + (["--quick"] if quick else [])
        worst = max(worst, subprocess.run(cmd, env=os.environ.copy()).returncode)
    return worst
