"""Without its trainer library, an integration module fails to import with a typed error naming the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("replaystore.integrations.torchrl", "torchrl", "replaystore[torchrl]"),
    ("replaystore.integrations.torchrl", "tensordict", "replaystore[torchrl]"),
    ("replaystore.integrations.sb3", "stable_baselines3", "replaystore[sb3]"),
])
def test_missing_trainer_library_names_the_extra(module: str, blocked: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from replaystore.errors import MissingDependencyError\n"
            "import replaystore.integrations\n"
            "try:\n"
            f"    import {module}\n"
            "except MissingDependencyError as e:\n"
            "    print('missing', e, isinstance(e, ImportError))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("missing"), out.stdout + out.stderr
    assert extra in out.stdout and out.stdout.strip().endswith("True")
