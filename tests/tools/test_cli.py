"""The installed ``replaystore`` console script, run as a user would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore import __version__
from replaystore.schemas import BatchMeta, Dense, Ragged
from replaystore.schemas.builtin import BUILTINS, EXAMPLE_ARGS


def console_script() -> str:
    """The ``replaystore`` entry point installed next to this interpreter (else the one on PATH)."""
    here = Path(sys.executable).parent / "replaystore"
    if here.exists():
        return str(here)
    found = shutil.which("replaystore")
    assert found, "the replaystore console script is not installed (pip install -e .)"
    return found


def run(*args: str, module: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "replaystore.tools.cli", *args] if module else [console_script(), *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def sections(stdout: str) -> dict[str, str]:
    """``replaystore schemas`` output split into one block per schema, keyed by name."""
    out: dict[str, str] = {}
    for block in stdout.strip().split("\n\n"):
        header, _, body = block.partition("\n")
        match = re.fullmatch(r"(\w+)\((.*)\)", header)
        assert match, f"unexpected header line {header!r}"
        out[match.group(1)] = body
    return out


def test_help() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: replaystore")
    assert "schemas" in proc.stdout and "demo" in proc.stdout
    assert proc.stderr == ""


def test_no_command_prints_help() -> None:
    proc = run()
    assert proc.returncode == 0
    assert "usage: replaystore" in proc.stdout


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"replaystore {__version__}"


def test_module_entry_point() -> None:
    proc = run("--help", module=True)
    assert proc.returncode == 0, proc.stderr
    assert "usage: replaystore" in proc.stdout
    proc = run("schemas", "ppo", module=True)
    assert proc.returncode == 0 and list(sections(proc.stdout)) == ["ppo"]


def test_schemas_lists_every_builtin_with_its_fields() -> None:
    proc = run("schemas")
    assert proc.returncode == 0, proc.stderr
    listed = sections(proc.stdout)
    assert list(listed) == list(BUILTINS)
    assert len(listed) == 10
    for name, body in listed.items():
        schema = BUILTINS[name](**EXAMPLE_ARGS[name])
        lines = {line.split()[0]: line for line in body.splitlines() if not line.startswith("  metadata:")}
        assert list(lines) == list(schema.names), name
        for f in schema.fields:
            line = lines[f.name]
            if isinstance(f, Dense):
                assert line.split()[1:3] == ["dense", f.dtype.name]
                assert "(" + ", ".join(["records", *map(str, f.shape)]) + ")" in line
            elif isinstance(f, Ragged):
                assert line.split()[1:3] == ["ragged", f.dtype.name]
                assert repr(f.offsets) in line
            else:
                assert isinstance(f, BatchMeta)
                assert line.split()[1] == "meta"


def test_schemas_shows_example_sizes() -> None:
    proc = run("schemas", "treestrap")
    assert proc.stdout.splitlines()[0] == "treestrap(observation_size=16, heads=2, actions=9)"
    assert "(records, 2, 9)" in proc.stdout  # targets: heads x actions
    assert '"actions": 9' in proc.stdout  # schema metadata line


def test_schemas_only_the_named_ones() -> None:
    proc = run("schemas", "dqn", "deep_cfr_strategy")
    assert proc.returncode == 0, proc.stderr
    assert list(sections(proc.stdout)) == ["dqn", "deep_cfr_strategy"]


@pytest.mark.parametrize("args", [("schemas", "nosuch"), ("schemas", "DQN")])
def test_unknown_schema_is_one_error_line(args: tuple[str, ...]) -> None:
    proc = run(*args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("replaystore schemas: error: unknown schema")
    assert repr(args[1]) in lines[0]
    for name in BUILTINS:  # the message lists what does exist
        assert name in lines[0]


def test_unknown_command_is_a_usage_error() -> None:
    proc = run("frobnicate")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "invalid choice" in proc.stderr
