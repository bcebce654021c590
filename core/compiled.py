"""numba kernels: which compiled modules this process uses.

numba is a dependency, but every kernel module has a numpy twin in the code that calls it
that computes the same values, used where numba cannot load (a Python or numpy that the
installed numba does not support) or is turned off, so results are the same bit for bit with
or without numba; only the cost differs. The first kernel a
process calls costs ~0.5-1 s (numba's import and machine-code load from its on-disk cache;
~2 s to compile, once per machine). ``REPLAYSTORE_NUMBA=0`` turns the kernels off.

numba's on-disk cache of the compiled kernels goes to :func:`kernel_cache_directory`, never
next to the kernels' source: that is inside the installed package, where files left behind
would outlive an uninstall and shadow a later install of the package.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType


def kernel_cache_directory() -> str:
    """Where numba keeps replaystore's compiled kernels.

    ``$REPLAYSTORE_KERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/replaystore-kernels``,
    else ``~/.cache/replaystore-kernels`` (beside the chunk cache's default
    directory, not inside it: the chunk cache prunes what it holds).
    ``NUMBA_CACHE_DIR``, when set, wins over all of these, as numba documents.

    Returns
    -------
    str
        The directory path (not created here).
    """
    env = os.environ.get("REPLAYSTORE_KERNEL_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "replaystore-kernels")


@contextlib.contextmanager
def _kernel_cache() -> Iterator[None]:
    """Point numba's cache at :func:`kernel_cache_directory` while a kernel module is imported.

    Its functions are decorated then, which is when numba picks a cache location. Not
    when the user set ``NUMBA_CACHE_DIR``; restored afterwards, so other numba code is
    not affected.
    """
    from numba.core import config

    # numba's config module sets its attributes from the environment at import; its stubs declare none of them
    if config.CACHE_DIR:  # type: ignore[attr-defined]
        yield
        return
    config.CACHE_DIR = kernel_cache_directory()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        config.CACHE_DIR = ""  # type: ignore[attr-defined]


def kernels(module: str) -> ModuleType | None:
    """The kernel module ``module``, or None when the kernels cannot or may not be used.

    None when numba is not installed, cannot load with this numpy, or
    ``REPLAYSTORE_NUMBA=0``. Cheap to call again (the first call in a process
    costs numba's import and load, ~0.5-1 s).

    Parameters
    ----------
    module : str
        Dotted module name, e.g. ``"replaystore.store.read.csrkernels"``.

    Returns
    -------
    types.ModuleType or None
        The imported kernel module.
    """
    if os.environ.get("REPLAYSTORE_NUMBA", "1") == "0":
        return None
    try:
        with _kernel_cache():
            return importlib.import_module(module)
    except ImportError:
        return None
