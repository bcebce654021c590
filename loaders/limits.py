"""Bounds of the samplers' size-like parameters (batch sizes, windows), checked before any allocation."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import SamplerParameterError

MAX_BATCH_SIZE = 1 << 24
"""The largest ``batch_size`` a sampler takes (records or windows per minibatch)."""
MAX_WINDOW = 1 << 16
"""The longest window a sampler takes: ``stack``, ``n_step``, a sequence's ``burn_in + length``."""


def check_size(name: str, value: Any, limit: int, lo: int = 1) -> int:
    """``value`` if it is an int in ``[lo, limit]``; SamplerParameterError naming ``name`` otherwise.

    A size-like sampler parameter never reaches an allocation unchecked: ``batch_size=10**12``
    is refused here, not met as a ``MemoryError`` at the first minibatch.

    Parameters
    ----------
    name : str
        The parameter, named in the error.
    value : Any
        The value given (``bool`` is no int here; numpy integers are).
    limit : int
        The largest value accepted.
    lo : int, optional
        The smallest value accepted.

    Returns
    -------
    int
        ``value`` as a Python int.

    Raises
    ------
    SamplerParameterError
        ``value`` is not an int in ``[lo, limit]``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= limit:
        raise SamplerParameterError(name, f"an int in [{lo}, {limit}]", repr(value))
    return int(value)
