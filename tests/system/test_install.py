"""Installing as the README says: the kernel cache stays out of the installed package, and the
README's two set-up commands work one after the other in one environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def kernel_files(top: Path) -> set[str]:
    """numba cache files (index and data) under ``top``."""
    return {str(p) for p in top.rglob("*") if p.suffix in (".nbi", ".nbc")}


def test_kernels_are_cached_in_the_user_cache_directory(tmp_path) -> None:
    import replaystore.loaders
    import replaystore.store

    package_dirs = [Path(replaystore.store.__file__).parent, Path(replaystore.loaders.__file__).parent]
    before = set().union(*(kernel_files(d) for d in package_dirs))
    code = ("import numpy as np\n"
            "from replaystore.compiled import kernels\n"
            "csr = kernels('replaystore.store.read.csrkernels')\n"
            "out = np.empty(3, np.int64)\n"
            "ok, idx = csr.csr_index(np.array([0, 2, 5], np.int64), np.array([1, 0], np.int64),\n"
            "                        np.empty(0, np.int64), 5, out)\n"
            "assert ok and idx.tolist() == [2, 3, 4, 0, 1], idx\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["REPLAYSTORE_KERNEL_CACHE_DIR"] = str(tmp_path / "kernels")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert kernel_files(tmp_path / "kernels"), "numba wrote no cache where replaystore points it"
    assert set().union(*(kernel_files(d) for d in package_dirs)) == before


def readme_commands() -> tuple[str, str]:
    """The README's two set-up commands: install and run the demo; install and run the tests."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(pip install [^\n]*)\n```", text)
    demo = next(b for b in blocks if b.endswith("replaystore demo"))
    tests = next(b for b in blocks if "python -m pytest" in b)
    return demo, tests


@pytest.mark.slow
def test_readme_commands_one_after_the_other_in_one_environment(tmp_path) -> None:
    """A fresh virtual environment (seeing this machine's packages, so nothing is downloaded
    but the build backend), a copy of the repository, then the demo command and the test
    command exactly as the README gives them (lint and type checks included; the test run stopped at
    collection, which is where a shadowed package failed). Nothing may be written into the installed package."""
    demo, tests = readme_commands()
    checkout = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_symlink():  # mypy's module map (.typecheck/) links to the package folders
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv),
               XDG_CACHE_HOME=str(tmp_path / "cache"), REPLAYSTORE_CACHE_DIR=str(tmp_path / "cache" / "chunks"))
    env.pop("REPLAYSTORE_KERNEL_CACHE_DIR", None)
    demo_dir = tmp_path / "demo"
    r = subprocess.run(f"{demo} {demo_dir}", shell=True, cwd=checkout, env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", purelib],
                               capture_output=True, text=True, check=True).stdout.strip())
    installed = site / "replaystore"
    assert installed.is_dir() and not kernel_files(installed)
    assert kernel_files(tmp_path / "cache" / "replaystore-kernels")
    collect = tests.replace("python -m pytest", "python -m pytest --collect-only -q -p no:cacheprovider")
    r = subprocess.run(collect, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert re.search(r"\d+ tests? collected", r.stdout), r.stdout[-2000:]
    assert not installed.exists() or not any(p.is_file() for p in installed.rglob("*"))
