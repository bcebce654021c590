"""Repository-wide pytest setup: the ``slow`` marker's default deselection (tests/support/slow_selection.py), the
``minari_root`` fixture (tests/support/minariroot.py),
a chunk cache directory of the test session's own (store/storage/cache.py), not the user's, Ray's
loopback settings (tests/support/raylocal.py) before any test module can import Ray, and each test's
``memory://`` files removed after it."""

import os
import shutil
import tempfile
from collections.abc import Iterator

import fsspec
import pytest

# Ray reads these when it is first imported (by a test module or by replaystore.tools.ray_data
# through the docstring checks), so they are set before collection starts.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

pytest_plugins = ["support.slow_selection", "support.minariroot"]


def pytest_configure(config: pytest.Config) -> None:
    """Point S3 stores' default chunk cache at a fresh directory (inherited by child processes)."""
    config._rs_cache_dir = tempfile.mkdtemp(prefix="replaystore-cache-")  # type: ignore[attr-defined]
    os.environ["REPLAYSTORE_CACHE_DIR"] = config._rs_cache_dir  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _memory_filesystem_kept_to_the_test() -> Iterator[None]:
    """Remove the ``memory://`` files a test leaves behind.

    fsspec's memory filesystem is one process-wide dict that every ``ls`` and ``find`` walks
    whole: stores left there by earlier tests made a listing-heavy test 30x slower late in a
    session than alone. Fixtures of a wider scope are set up before this one, so what they
    hold is kept.
    """
    fs = fsspec.filesystem("memory")
    files, dirs = set(fs.store), set(fs.pseudo_dirs)
    yield
    for path in [p for p in fs.store if p not in files]:
        fs.store.pop(path, None)
    fs.pseudo_dirs[:] = [p for p in fs.pseudo_dirs if p in dirs]


# the policy this process started on (a module-scoped fixture that encodes runs before a test's own fixtures)
_SCHEDULING = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None


@pytest.fixture(autouse=True)
def _scheduling_kept_normal() -> Iterator[None]:
    """Fail a test that leaves its process on a real-time scheduling policy, after putting it back.

    SVT-AV1, opened by root, moves the process to ``SCHED_FIFO``; everything a test worker started
    afterwards inherited it, and a child that polled starved the machine (runs hung for tens of
    minutes). ``replaystore.video.kept_scheduling`` undoes it where the package encodes or muxes.
    """
    yield
    if _SCHEDULING is not None and os.sched_getscheduler(0) != _SCHEDULING:
        os.sched_setscheduler(0, _SCHEDULING, os.sched_param(0))  # (the thread later tests and their children run on)
        pytest.fail("the test left its process on a real-time scheduling policy (see replaystore.video."
                    "kept_scheduling)", pytrace=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(getattr(config, "_rs_cache_dir", ""), ignore_errors=True)
