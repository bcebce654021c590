"""numba kernels: which compiled modules this process uses.

numba is a dependency, but every kernel module has a numpy twin in the code that calls it
that computes the same values, used where numba cannot load (a Python or numpy that the
installed numba does not support) or is turned off, so results are the same bit for bit with
or without numba; only the cost differs. The first kernel a
process calls costs ~0.5-1 s (numba's import and machine-code load from its on-disk cache;
~2 s to compile, once per machine). ``REPLAYSTORE_NUMBA=0`` turns the kernels off.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def kernels(module: str) -> ModuleType | None:
    """The kernel module ``module`` (e.g. ``"replaystore.store.csrkernels"``), or None: numba is
    not installed, cannot load with this numpy, or ``REPLAYSTORE_NUMBA=0``. Cheap to call again."""
    if os.environ.get("REPLAYSTORE_NUMBA", "1") == "0":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
