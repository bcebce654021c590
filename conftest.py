"""Repository-wide pytest setup: the ``slow`` marker's default deselection (tests/support/slow_selection.py),
a chunk cache directory of the test session's own (store/storage/cache.py), not the user's, and Ray's
loopback settings (tests/support/raylocal.py) before any test module can import Ray."""

import os
import shutil
import tempfile

import pytest

# Ray reads these when it is first imported (by a test module or by replaystore.tools.ray_data
# through the docstring checks), so they are set before collection starts.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

pytest_plugins = ["support.slow_selection"]


def pytest_configure(config: pytest.Config) -> None:
    """Point S3 stores' default chunk cache at a fresh directory (inherited by child processes)."""
    config._rs_cache_dir = tempfile.mkdtemp(prefix="replaystore-cache-")  # type: ignore[attr-defined]
    os.environ["REPLAYSTORE_CACHE_DIR"] = config._rs_cache_dir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(getattr(config, "_rs_cache_dir", ""), ignore_errors=True)
