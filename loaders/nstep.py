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

    Per view version it keeps ``next_row``: for each visible row (by its position in the view)
    the row id of its stream's next step, ``-1`` where the next step is not visible (a gap:
    eviction, a missing step, the stream's visible end) or carries a reset. A window is then
    ``n - 1`` hops through that array.

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
        self._lo = np.zeros(0, dtype=np.int64)  # first row id of each visible interval
        self._off = np.zeros(0, dtype=np.int64)  # view position of each interval's first row
        self._next = np.full(1, -1, dtype=np.int64)  # next_row by view position, then a -1 sentinel

    def _refresh(self) -> None:
        """Rebuild ``next_row`` if the table's view changed.

        Cost: when it changed, a few vectorised passes over the stream index's dense views (which
        the index builds on first use after a change: O(visible rows)); else one ``Table.view()``.
        """
        view = self.table.view()
        if view.version == self._version:
            return
        iv = view.intervals()
        self._lo = iv[:, 0].copy()
        self._off = np.zeros(len(iv), dtype=np.int64)
        np.cumsum(iv[:-1, 1] - iv[:-1, 0], out=self._off[1:])
        index = view.stream_index()
        rows, steps, resets, sids = index.rows, index.steps, index.resets, index.stream_ids
        m = len(rows)
        nxt = np.full(len(view) + 1, -1, dtype=np.int64)
        if m > 1:
            # entries are sorted by (stream, step, row id); a (stream, step) repeated keeps its last row
            new = np.empty(m, dtype=bool)
            new[0] = True
            np.not_equal(sids[1:], sids[:-1], out=new[1:])
            new[1:] |= steps[1:] != steps[:-1]
            starts = np.flatnonzero(new)
            ends = np.append(starts[1:], m) - 1  # each group's last entry
            group = np.cumsum(new) - 1
            succ = np.append(ends[1:], -1)[group]  # the next group's last entry per entry
            ok = succ >= 0
            s = np.where(ok, succ, 0)
            ok &= (sids[s] == sids) & (steps[s] == steps + 1) & ~resets[s]
            nxt[self._positions(rows)] = np.where(ok, rows[s], -1)
        self._next = nxt
        self._version = view.version

    def _positions(self, rows: np.ndarray) -> np.ndarray:
        """View positions of visible row ids (no check)."""
        if len(self._lo) == 1:
            return rows - self._lo[0]
        at = np.searchsorted(self._lo, rows, side="right") - 1
        return rows - self._lo[at] + self._off[at]

    def windows(self, rows: np.ndarray) -> np.ndarray:
        """The n-step windows starting at ``rows``, as the table's current view of the stream index shows them.

        Window ``i`` holds ``rows[i]`` and then the rows of the same stream at steps ``step + 1,
        step + 2, ...`` up to ``n`` rows in all, ending before the first step that is not
        visible (a gap: eviction, a missing step, the stream's visible end) or that carries a
        reset. A step held by several visible rows resolves to the last of them (highest row id).

        Parameters
        ----------
        rows : numpy.ndarray
            int64 visible start row ids, ``[batch]``.

        Returns
        -------
        numpy.ndarray
            int64 ``[batch, n]``: row ids, ``-1`` after each window's end. Cost: ``n - 1``
            vectorised hops (a gather each, plus a binary search over the view's intervals when
            it has several); after a change of the view, a rebuild of ``next_row`` (see
            :meth:`_refresh`: about 25 ms per million visible rows).
        """
        n = self.n
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.full((len(rows), n), -1, dtype=np.int64)
        out[:, 0] = rows
        if n == 1 or not len(rows):
            return out
        self._refresh()
        nxt, end = self._next, len(self._next) - 1
        cur = rows
        for j in range(1, n):
            pos = self._positions(cur)
            pos[cur < 0] = end  # the sentinel: stays -1
            cur = nxt[pos]
            out[:, j] = cur
        return out


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
