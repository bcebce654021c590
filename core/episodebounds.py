"""How a stream's records split into episodes: the one rule ``iter_episodes`` and the report share.

Only numpy: importing it costs nothing (``replaystore.loaders`` brings torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from replaystore.schemas import Schema


def end_fields(schema: Schema) -> tuple[str, ...]:
    """The fields whose flags end an episode of ``schema``'s records.

    Parameters
    ----------
    schema : Schema
        A table's schema.

    Returns
    -------
    tuple of str
        ``("terminated", "truncated")``, ``("terminated",)`` or ``("dones",)``; ``()``
        when the schema has neither ``terminated`` nor ``dones``. Cost: O(1).
    """
    if "terminated" in schema:
        return ("terminated", "truncated") if "truncated" in schema else ("terminated",)
    if "dones" in schema:
        return ("dones",)
    return ()


def episode_spans(steps: np.ndarray, resets: np.ndarray, ended: np.ndarray,
                  first: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split records in stream and step order into episodes, the way :func:`iter_episodes` does.

    An episode starts at a stream's first record, at a reset, after a record whose end
    flag is set, or after a step gap; it ends where the next one starts.

    Parameters
    ----------
    steps : numpy.ndarray
        int64 step of each record; records of one stream are consecutive, in step order.
    resets : numpy.ndarray
        bool reset flag of each record.
    ended : numpy.ndarray
        bool per record: an end flag (terminated, truncated or dones) is set.
    first : numpy.ndarray, optional
        bool per record: the first record of its stream (default: only record 0, one stream).

    Returns
    -------
    tuple of numpy.ndarray
        ``(lo, hi, began)``: each episode's records ``[lo, hi)`` (int64) and whether it
        begins the episode (bool): at a reset, at step 0, or right after an episode
        end at the previous step (not after a gap left by retention or missing steps).
        Cost: O(records), vectorised.
    """
    n = len(steps)
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=bool)
    resets = np.asarray(resets, dtype=bool)
    ended = np.asarray(ended, dtype=bool)
    follows = np.zeros(n, dtype=bool)  # the record right after the previous step of its stream
    follows[1:] = np.diff(steps) == 1
    if first is not None:
        follows &= ~np.asarray(first, dtype=bool)
    after_end = np.zeros(n, dtype=bool)
    after_end[1:] = ended[:-1]
    start = resets | after_end | ~follows
    start[0] = True
    lo = np.flatnonzero(start)
    hi = np.r_[lo[1:], n].astype(np.int64)
    began = resets[lo] | (steps[lo] == 0) | (after_end[lo] & follows[lo])
    return lo.astype(np.int64), hi, began
