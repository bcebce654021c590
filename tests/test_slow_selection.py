"""The ``slow`` marker's selection (tests/support/slow_selection.py), checked on real pytest runs of a
tiny test file in a subprocess: deselected by default, run under ``CI=true``, ``--run-slow`` or ``-m``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

TINY = '''
import pytest

def test_fast():
    pass

@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2])
def test_heavy(n):
    pass

@pytest.mark.slow
class TestSoak:
    def test_soak(self):
        pass
'''

INI = "[pytest]\nmarkers =\n    slow: heavier soak and fault runs\naddopts = --strict-markers\n"


def run_tiny(tmp_path: Path, *args: str, ci: str | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run pytest on :data:`TINY` with the plugin loaded; its exit status and verbose output."""
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items()  # nothing of this run's own pytest(-xdist) reaches the tiny one
           if k not in ("CI", "PYTEST_ADDOPTS") and not k.startswith("PYTEST_XDIST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    if ci is not None:
        env["CI"] = ci
    # only the plugins the tiny run needs, and no stdin: with the outer run's stdin inherited, the tiny xdist run
    # took 72-119 s in a full run of this file (under 1 s with -s or alone)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    plugins = ["-p", "xdist.plugin"] if "-n" in args else []
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugins, "-p", "support.slow_selection",
                           "-p", "no:cacheprovider", "-v", "-rA", *args], check=False, cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def ran(output: str) -> set[str]:
    """Names of the tests the run reported a result for (any outcome)."""
    return set(re.findall(r"test_tiny\.py::(\S+) (?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", output))


ALL = {"test_fast", "test_heavy[1]", "test_heavy[2]", "TestSoak::test_soak"}


@pytest.mark.parametrize("ci", [None, "false"])
def test_slow_tests_are_deselected_by_default(tmp_path: Path, ci: str | None) -> None:
    rc, out = run_tiny(tmp_path, ci=ci)
    assert rc == 0, out
    assert ran(out) == {"test_fast"}, out  # the slow ones are neither passed nor skipped
    assert "SKIPPED" not in out and "1 passed, 3 deselected" in out, out
    assert "3 slow tests deselected" in out and "--run-slow" in out and "CI=true" in out, out


@pytest.mark.parametrize("ci", ["TRUE", "1"])
def test_ci_runs_slow_tests(tmp_path: Path, ci: str) -> None:
    rc, out = run_tiny(tmp_path, ci=ci)
    assert rc == 0, out
    assert ran(out) == ALL and "4 passed" in out and "deselected" not in out, out


def test_run_slow_option_runs_them(tmp_path: Path) -> None:
    rc, out = run_tiny(tmp_path, "--run-slow")
    assert rc == 0, out
    assert ran(out) == ALL and "4 passed" in out and "deselected" not in out, out


@pytest.mark.parametrize(("expr", "want"), [("slow", ALL - {"test_fast"}), ("not slow", {"test_fast"})])
def test_explicit_marker_expression_decides(tmp_path: Path, expr: str, want: set[str]) -> None:
    rc, out = run_tiny(tmp_path, "-m", expr)
    assert rc == 0, out
    assert ran(out) == want, out
    assert "slow tests deselected" not in out, out  # -m did the selecting, the plugin stayed out of it


def test_under_xdist_the_slow_tests_are_deselected_and_counted(tmp_path: Path) -> None:
    """The README's command runs the suite in pytest-xdist workers: the controller still reports the count."""
    rc, out = run_tiny(tmp_path, "-n", "2", timeout=300)  # two worker interpreters start: slower on a loaded VM
    assert rc == 0, out
    assert set(re.findall(r"PASSED test_tiny\.py::(\S+)", out)) == {"test_fast"}, out
    assert "1 passed" in out and "3 slow tests deselected" in out, out
