"""Adapters that put a store behind the replay buffers of other trainers.

``replaystore.integrations.torchrl`` (extra ``replaystore[torchrl]``) and
``replaystore.integrations.sb3`` (extra ``replaystore[sb3]``) import their trainer
library when imported; this package imports neither. ``ReplayStoreHerBuffer`` and
``ReplayStoreNStepBuffer`` (from ``.sb3_her`` and ``.sb3_nstep``) are importable from here too,
imported with stable-baselines3 on first use.
"""

from typing import Any

_LAZY = {"ReplayStoreHerBuffer": "replaystore.integrations.sb3_her",
         "ReplayStoreNStepBuffer": "replaystore.integrations.sb3_nstep"}


def __getattr__(name: str) -> Any:
    """The SB3 HER and n-step twins, imported (with stable-baselines3) on first use.

    Parameters
    ----------
    name : str
        ``"ReplayStoreHerBuffer"`` or ``"ReplayStoreNStepBuffer"``.

    Returns
    -------
    type
        The class, from ``replaystore.integrations.sb3_her`` or ``.sb3_nstep``.

    Raises
    ------
    AttributeError
        Any other name.
    """
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'replaystore.integrations' has no attribute {name!r}")
