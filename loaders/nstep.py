"""N-step returns at sampling time: windows over the stream/step index, returns computed where rows are gathered.

The sampler (main process) turns each drawn start row into a window of up to ``n`` rows of
the same stream with consecutive steps and no reset after the start, as the sampler's view
of the stream index shows them (:func:`index_windows`). The rows travel in the
:class:`~replaystore.loaders.base.Request` as an :class:`NStepWindows`; where the minibatch
is gathered (a DataLoader worker or the main process) :meth:`NStepWindows.apply` reads the
windows' ``reward`` and ``terminated`` (and ``truncated``) columns, cuts each window after
its first terminal or truncated record, and replaces ``reward``, ``next_obs``,
``terminated``, ``truncated`` and adds ``discount`` and ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import SamplerParameterError
from replaystore.schemas import Schema
from replaystore.store import Table

REQUIRED = ("reward", "terminated")
"""The fields a table's schema needs for n-step returns."""


def next_fields(schema: Schema) -> list[str]:
    """The dense fields that hold the successor observation: ``next_obs`` and its nested parts.

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    list of str
        Field names (``next_obs``, or ``next_obs.``/``next_obs/``-prefixed parts). Cost: the fields.
    """
    return [f.name for f in schema.dense_fields
            if f.name == "next_obs" or f.name.startswith(("next_obs.", "next_obs/"))]


def check_nstep(schema: Schema, n_step: Any, gamma: Any) -> tuple[int, float]:
    """Validate n-step parameters against a table's schema.

    Parameters
    ----------
    schema : Schema
        The schema of the table the sampler draws from.
    n_step : Any
        Wanted: an int >= 1.
    gamma : Any
        Wanted: a real number in [0, 1].

    Returns
    -------
    tuple of (int, float)
        ``(n_step, gamma)``. Cost: O(fields).

    Raises
    ------
    SamplerParameterError
        ``n_step`` is not an int >= 1, ``gamma`` not a real in [0, 1] (each named), or the
        schema lacks ``reward``/``terminated`` (named ``n_step``).
    """
    if isinstance(n_step, bool) or not isinstance(n_step, (int, np.integer)) or n_step < 1:
        raise SamplerParameterError("n_step", "an int >= 1", repr(n_step))
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(gamma)) or not 0.0 <= float(gamma) <= 1.0:
        raise SamplerParameterError("gamma", "a real number in [0, 1]", repr(gamma))
    missing = [name for name in REQUIRED if name not in schema]
    if missing:
        raise SamplerParameterError("n_step", f"a table whose schema has dense fields {list(REQUIRED)} "
                                    f"(schema {schema.name!r} lacks {missing})", repr(n_step))
    return int(n_step), float(gamma)


def index_windows(table: Table, rows: np.ndarray, n: int) -> np.ndarray:
    """The n-step windows starting at ``rows``, as the table's current view of the stream index shows them.

    Window ``i`` holds ``rows[i]`` and then the rows of the same stream at steps ``step + 1,
    step + 2, ...`` up to ``n`` rows in all, ending before the first step that is not visible
    (a gap: eviction, a missing step, the stream's visible end) or that carries a reset.

    Parameters
    ----------
    table : Table
        The table the rows belong to.
    rows : numpy.ndarray
        int64 visible start row ids, ``[batch]``.
    n : int
        The longest window.

    Returns
    -------
    numpy.ndarray
        int64 ``[batch, n]``: row ids, ``-1`` after each window's end. Cost: the start rows'
        index entries, a binary search per window slot in its stream, and the index entries
        of the following rows (one read of the index arrays per fragment touched).
    """
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    out = np.full((len(rows), n), -1, dtype=np.int64)
    out[:, 0] = rows
    if n == 1 or not len(rows):
        return out
    keys, steps, _ = table.index_of(rows)
    index = table.stream_index()
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys.tolist()):
        groups.setdefault(key, []).append(i)
    ahead = np.arange(1, n, dtype=np.int64)
    for key, members in groups.items():
        sel = np.asarray(members, dtype=np.int64)
        out[sel, 1:] = index.lookup(key, steps[sel, None] + ahead)
    later = out[:, 1:]
    keep = later >= 0
    if keep.any():
        _, _, resets = table.index_of(later[keep])
        flags = np.zeros(later.shape, dtype=bool)
        flags[keep] = ~resets
        keep = flags
    keep = np.logical_and.accumulate(keep, axis=1)  # a gap or a reset ends the window
    later[~keep] = -1
    return out


@dataclass
class NStepWindows:
    """The n-step windows of one minibatch, applied where its rows are gathered.

    Attributes
    ----------
    rows : numpy.ndarray
        int64 ``[batch, n]`` window rows from :func:`index_windows` (column 0: the start rows).
    gamma : float
        The discount per step.
    """

    rows: np.ndarray
    gamma: float

    def apply(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        """Replace the minibatch's one-step targets by n-step ones.

        For window rows ``t .. t+m-1`` the window is cut after its first terminal or
        truncated record, giving ``k`` rows: ``reward`` = sum of ``gamma**i * r[t+i]`` for
        ``i < k`` (summed in float64, cast to the reward field's dtype); ``next_obs`` (and
        nested ``next_obs`` parts) of row ``t+k-1``; ``discount`` = ``gamma**k``, or 0 when
        row ``t+k-1`` is terminal (float64, as DqnBatch's ``discounts``); ``n`` = ``k``
        (int64); ``terminated`` / ``truncated`` those of row ``t+k-1``.

        Parameters
        ----------
        table : Table
            The table to read (this process's handle).
        batch : dict of str to Any
            The gathered start rows' minibatch (numpy arrays); changed in place.

        Returns
        -------
        dict of str to Any
            ``batch``. Cost: one read of ``reward``/``terminated``(/``truncated``) for the
            windows' rows after their starts, and one read of the ``next_obs`` fields of the
            windows' last rows where ``k > 1``.

        Raises
        ------
        RowError, StaleReadError
            As ``Table.read``.
        """
        w = self.rows
        b, n = w.shape
        done_cols = ["terminated"] + (["truncated"] if "truncated" in table.schema else [])
        reward_dtype = np.asarray(batch["reward"]).dtype
        rew = np.zeros((b, n), dtype=np.float64)
        rew[:, 0] = batch["reward"]
        ends = {c: np.zeros((b, n), dtype=bool) for c in done_cols}
        for c in done_cols:
            ends[c][:, 0] = batch[c]
        valid = w >= 0
        later = valid[:, 1:]
        if later.any():
            data = table.read(w[:, 1:][later], columns=["reward", *done_cols])
            rew[:, 1:][later] = data["reward"]
            for c in done_cols:
                ends[c][:, 1:][later] = data[c]
        stop = ends["terminated"].copy()
        if "truncated" in ends:
            stop |= ends["truncated"]
        before = np.zeros((b, n), dtype=bool)  # an earlier record of the window ended the episode
        before[:, 1:] = np.logical_or.accumulate(stop[:, :-1], axis=1)
        keep = valid & ~before
        k = keep.sum(axis=1)
        powers = self.gamma ** np.arange(n, dtype=np.float64)
        batch["reward"] = (np.where(keep, rew, 0.0) @ powers).astype(reward_dtype)
        last = k - 1
        at = np.arange(b)
        for c in done_cols:
            batch[c] = ends[c][at, last]
        batch["discount"] = np.where(batch["terminated"], 0.0, self.gamma ** k.astype(np.float64))
        batch["n"] = k.astype(np.int64)
        moved = k > 1
        if moved.any():
            names = next_fields(table.schema)
            fresh = table.read(w[at, last][moved], columns=names)
            for c in names:
                col = np.array(batch[c], copy=True)
                col[moved] = fresh[c]
                batch[c] = col
        return batch
