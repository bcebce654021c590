"""pytest plugin (conftest.py loads it): ``minari_root``, a Minari dataset root of the test's own.

A module whose tests export to or import from Minari says ``pytestmark =
pytest.mark.usefixtures("minari_root")``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``MINARI_DATASETS_PATH`` pointed at a fresh directory under ``tmp_path``, which is returned."""
    root = tmp_path / "minari-datasets"
    root.mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root
