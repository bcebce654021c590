"""N-step returns at sampling time: windows over the stream/step index, returns computed where rows are gathered.

The sampler (main process) turns each drawn start row into a window of up to ``n`` rows of
the same stream with consecutive steps and no reset after the start, as the sampler's view
of the stream index shows them (:class:`WindowIndex`). The rows travel in the
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


class WindowIndex:
    """Finds n-step windows of start rows in one table's current view (:meth:`windows`).

    Parameters
    ----------
    table : Table
        The table the sampler draws from.
    n : int
        The longest window.
    """

    def __init__(self, table: Table, n: int) -> None:
        self.table, self.n = table, n
        self._version = -1
        self._iv = np.zeros((0, 2), dtype=np.int64)

    def _visible(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row id is visible (the view's intervals, cached per view version)."""
        view = self.table.view()
        if view.version != self._version:
            self._version, self._iv = view.version, view.intervals()
        iv = self._iv
        at = np.searchsorted(iv[:, 0], rows, side="right") - 1
        return (at >= 0) & (rows < iv[np.maximum(at, 0), 1])

    def windows(self, rows: np.ndarray) -> np.ndarray:
        """The n-step windows starting at ``rows``, as the table's current view of the stream index shows them.

        Window ``i`` holds ``rows[i]`` and then the rows of the same stream at steps ``step + 1,
        step + 2, ...`` up to ``n`` rows in all, ending before the first step that is not
        visible (a gap: eviction, a missing step, the stream's visible end) or that carries a
        reset. Fast path: a writer stores a stream's consecutive steps at consecutive row ids,
        so the rows after each start are checked first (one ``index_of`` for all); windows
        that break there without a reset look their stream up in the stream index.

        Parameters
        ----------
        rows : numpy.ndarray
            int64 visible start row ids, ``[batch]``.

        Returns
        -------
        numpy.ndarray
            int64 ``[batch, n]``: row ids, ``-1`` after each window's end. Cost: one
            ``index_of`` of the start rows and the ``n - 1`` row ids after each; then, for
            windows not laid out that way, a binary search per slot in their stream and one
            more ``index_of`` of the rows found.
        """
        n, table = self.n, self.table
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        b = len(rows)
        out = np.full((b, n), -1, dtype=np.int64)
        out[:, 0] = rows
        if n == 1 or not b:
            return out
        ahead = np.arange(1, n, dtype=np.int64)
        cand = rows[:, None] + ahead
        vis = self._visible(cand)
        keys, steps, resets = table.index_of(np.concatenate([rows, cand[vis]]))
        key0, step0 = keys[:b], steps[:b]
        same = np.zeros(cand.shape, dtype=bool)
        reset = np.zeros(cand.shape, dtype=bool)
        same[vis] = (keys[b:] == np.repeat(key0, n - 1)[vis.reshape(-1)]) \
            & (steps[b:] == (step0[:, None] + ahead)[vis])
        reset[vis] = resets[b:]
        run = np.logical_and.accumulate(same & ~reset, axis=1)
        out[:, 1:] = np.where(run, cand, -1)
        # a window that stops at a slot not holding its next step (nor a reset of it) looks it up
        at, first_off = np.arange(b), np.argmin(run, axis=1)  # the first slot out of the run (0 if none)
        slow = ~run.all(axis=1) & ~(same[at, first_off] & reset[at, first_off])
        if slow.any():
            self._lookup(out, np.flatnonzero(slow), key0, step0, ahead)
        return out

    def _lookup(self, out: np.ndarray, which: np.ndarray, key0: np.ndarray, step0: np.ndarray,
                ahead: np.ndarray) -> None:
        """Fill windows ``which`` of ``out`` from the stream index (binary searches per stream)."""
        index = self.table.stream_index()
        groups: dict[Any, list[int]] = {}
        for i, key in zip(which.tolist(), key0[which].tolist(), strict=True):
            groups.setdefault(key, []).append(i)
        for key, members in groups.items():
            sel = np.asarray(members, dtype=np.int64)
            out[sel, 1:] = index.lookup(key, step0[sel, None] + ahead)
        later = out[which, 1:]
        keep = later >= 0
        if keep.any():
            _, _, resets = self.table.index_of(later[keep])
            flags = np.zeros(later.shape, dtype=bool)
            flags[keep] = ~resets
            keep = flags
        keep = np.logical_and.accumulate(keep, axis=1)  # a gap or a reset ends the window
        later[~keep] = -1
        out[which, 1:] = later


@dataclass
class NStepWindows:
    """The n-step windows of one minibatch, applied where its rows are gathered.

    Attributes
    ----------
    rows : numpy.ndarray
        int64 ``[batch, n]`` window rows from :meth:`WindowIndex.windows` (column 0: the start rows).
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
        trunc = "truncated" in table.schema
        rew = np.zeros((b, n), dtype=np.float64)
        flag = np.zeros((b, n), dtype=np.uint8)  # bit 0: terminated, bit 1: truncated
        reward_dtype = np.asarray(batch["reward"]).dtype
        rew[:, 0] = batch["reward"]
        flag[:, 0] = batch["terminated"]
        if trunc:
            flag[:, 0] |= np.asarray(batch["truncated"], dtype=np.uint8) << 1
        tail = w[:, 1:]
        later = tail >= 0
        if later.any():
            data = table.read(tail[later], columns=["reward", "terminated", *(["truncated"] if trunc else [])])
            rew[:, 1:][later] = data["reward"]
            f = data["terminated"].astype(np.uint8)
            if trunc:
                f |= data["truncated"].astype(np.uint8) << 1
            flag[:, 1:][later] = f
        keep = w >= 0
        keep[:, 1:] &= ~np.logical_or.accumulate(flag[:, :-1] != 0, axis=1)  # an earlier record ended the episode
        k = keep.sum(axis=1)
        powers = self.gamma ** np.arange(n, dtype=np.float64)
        batch["reward"] = (np.where(keep, rew, 0.0) @ powers).astype(reward_dtype)
        at, last = np.arange(b), k - 1
        end = flag[at, last]
        batch["terminated"] = (end & 1).astype(bool)
        if trunc:
            batch["truncated"] = (end & 2).astype(bool)
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
