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

from replaystore.errors import RowError, SamplerParameterError
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
    """Finds the n-step windows of start rows in one table's current view, with their returns (:meth:`nstep`).

    A row's window holds the row and then the rows of its stream at steps ``step + 1, step + 2,
    ...`` up to ``n`` rows in all, ending before the first step that is not visible (a gap:
    eviction, a missing step, the stream's visible end) or that carries a reset, and after its
    first terminal or truncated record. A step held by several visible rows resolves to the
    last of them (highest row id). Per view version (and ``gamma``) it keeps, for every visible
    row by its position in the view, its window's length, discounted reward, last row id and
    that row's terminated/truncated bits (about 19 bytes a row), so a minibatch costs four gathers.

    Parameters
    ----------
    table : Table
        The table the sampler draws from.
    n : int
        The longest window.
    """

    def __init__(self, table: Table, n: int) -> None:
        self.table, self.n = table, n
        self._version, self._gamma = -1, -1.0
        self._names = next_fields(table.schema)
        self._lo = np.zeros(1, dtype=np.int64)  # first row id of each visible interval
        self._hi = np.zeros(1, dtype=np.int64)  # its end
        self._off = np.zeros(1, dtype=np.int64)  # view position of each interval's first row
        self._k = np.ones(0, dtype=np.int64)  # per view position: window length
        self._reward = np.zeros(0, dtype=np.float64)  # discounted reward sum
        self._flag = np.zeros(0, dtype=np.uint8)  # the last row's bit 0: terminated, bit 1: truncated
        self._last = np.zeros(0, dtype=np.int64)  # the last row's id

    def _refresh(self, gamma: float) -> None:
        """Rebuild the per-position arrays if the table's view (or ``gamma``) changed.

        Cost: when it changed, one read of the ``reward``/``terminated``(/``truncated``) columns
        of every visible row, a few vectorised passes over the stream index's dense views (which
        the index builds on first use after a change) and ``n - 1`` passes over the rows:
        O(n * visible rows); else one ``Table.view()``.
        """
        view = self.table.view()
        if view.version == self._version and gamma == self._gamma:
            return
        iv = view.intervals()
        lo, hi = iv[:, 0].copy(), iv[:, 1].copy()
        off = np.zeros(len(iv), dtype=np.int64)
        np.cumsum(iv[:-1, 1] - iv[:-1, 0], out=off[1:])
        size = len(view)
        names = ["reward", "terminated", *(["truncated"] if "truncated" in view.schema else [])]
        row = view.row_ids()
        data = view.read(row, columns=names) if size else {}
        rew = np.zeros(size + 1, dtype=np.float64)  # position ``size``: the sentinel (no row)
        flag = np.zeros(size + 1, dtype=np.uint8)
        if size:
            rew[:size] = data["reward"]
            flag[:size] = data["terminated"]
            if "truncated" in data:
                flag[:size] |= data["truncated"].astype(np.uint8) << 1
        index = view.stream_index()
        rows, steps, resets, sids = index.rows, index.steps, index.resets, index.stream_ids
        nxt = np.full(size + 1, size, dtype=np.int64)  # the next step's position; the sentinel if none
        if len(rows) > 1:
            succ = _successors(sids, steps)
            ok = succ >= 0
            s = np.where(ok, succ, 0)
            ok &= (steps[s] == steps + 1) & ~resets[s]
            pos = _positions(rows, lo, off)
            ok &= flag[pos] == 0  # a terminal or truncated record ends its window
            nxt[pos] = np.where(ok, pos[s], size)
        # windows of up to m + 1 rows from those of up to m rows, m = 1 .. n - 1
        k = np.ones(size + 1, dtype=np.int64)
        k[size] = 0
        reward, last_flag = rew.copy(), flag.copy()
        last = np.append(np.arange(size, dtype=np.int64), size)  # the last row's position
        stop = nxt == size
        for _ in range(1, self.n):
            k = 1 + k[nxt]
            k[size] = 0
            reward = rew + gamma * reward[nxt]
            last_flag = flag | last_flag[nxt]
            last = np.where(stop, last, last[nxt])
        self._lo, self._hi, self._off = lo, hi, off
        self._k, self._reward, self._flag = k[:size], reward[:size], last_flag[:size]
        self._last = row[last[:size]] if size else row
        self._version, self._gamma = view.version, gamma

    def _start_positions(self, rows: np.ndarray) -> np.ndarray:
        """View positions of start row ids; ``RowError`` unless every one is visible in the current view."""
        lo, hi, off = self._lo, self._hi, self._off
        if len(lo) == 1:
            pos = rows - lo[0]
            bad = (rows < lo[0]) | (rows >= hi[0])
        else:
            at = np.searchsorted(lo, rows, side="right") - 1
            bad = (at < 0) | (rows >= hi[np.maximum(at, 0)])
            pos = rows - lo[at] + off[at]
        if bad.any():
            raise RowError(f"table {self.table.name!r}: start rows {rows[bad][:8].tolist()} are not visible "
                           "records (never written or evicted)")
        return pos

    def nstep(self, rows: np.ndarray, gamma: float) -> NStepWindows:
        """The windows of start ``rows``: their lengths, discounted rewards, last rows and end flags.

        Parameters
        ----------
        rows : numpy.ndarray
            int64 visible start row ids, ``[batch]``.
        gamma : float
            The discount per step.

        Returns
        -------
        NStepWindows
            For :meth:`NStepWindows.apply`. Cost: a handful of vectorised operations on the
            batch (one binary search over the view's intervals when it has several); after a
            change of the view, a rebuild (see :meth:`_refresh`).

        Raises
        ------
        RowError
            A start row is not visible in the table's current view.
        """
        gamma = float(gamma)
        self._refresh(gamma)
        pos = self._start_positions(np.asarray(rows, dtype=np.int64).reshape(-1))
        return NStepWindows(self._last[pos], gamma, self._reward[pos], self._flag[pos], self._k[pos], self._names)


def _positions(rows: np.ndarray, lo: np.ndarray, off: np.ndarray) -> np.ndarray:
    """View positions of visible row ids, given the view's interval starts ``lo`` and their positions ``off``."""
    if len(lo) == 1:
        return rows - lo[0]
    at = np.searchsorted(lo, rows, side="right") - 1
    return rows - lo[at] + off[at]


def _successors(sids: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per entry of the (stream, step, row id)-sorted index, the entry holding its stream's next step: -1 if none.

    The next step is that of the next entry; where a (stream, step) repeats, the last entry of
    the next (stream, step) group. Cost: a few passes over the entries.
    """
    m = len(sids)
    same = sids[1:] == sids[:-1]
    if not (same & (steps[1:] == steps[:-1])).any():  # the usual case: no step held twice
        return np.append(np.where(same, np.arange(1, m, dtype=np.int64), -1), -1)
    new = np.empty(m, dtype=bool)
    new[0] = True
    np.logical_or(~same, steps[1:] != steps[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], m) - 1  # each group's last entry
    succ = np.append(ends[1:], -1)[np.cumsum(new) - 1]  # the next group's last entry
    ok = succ >= 0
    return np.where(ok & (sids[np.where(ok, succ, 0)] == sids), succ, -1)


@dataclass
class NStepWindows:
    """The n-step windows of one minibatch, applied where its rows are gathered.

    Attributes
    ----------
    last : numpy.ndarray
        int64 ``[batch]``: each window's last row id (the start row where ``k`` is 1).
    gamma : float
        The discount per step.
    reward : numpy.ndarray
        float64 ``[batch]``: the discounted sum of each window's rewards.
    flags : numpy.ndarray
        uint8 ``[batch]``: each window's last record's terminated (bit 0) and truncated (bit 1).
    k : numpy.ndarray
        int64 ``[batch]``: each window's length.
    names : list of str
        The fields holding the successor observation (:func:`next_fields`).
    """

    last: np.ndarray
    gamma: float
    reward: np.ndarray
    flags: np.ndarray
    k: np.ndarray
    names: list[str]

    def apply(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        """Replace the minibatch's one-step targets by n-step ones.

        For a window of ``k`` rows ``t .. t+k-1``: ``reward`` = sum of ``gamma**i * r[t+i]``
        (summed in float64, cast to the reward field's dtype); ``next_obs`` (and nested
        ``next_obs`` parts) of row ``t+k-1``; ``discount`` = ``gamma**k``, or 0 when row
        ``t+k-1`` is terminal (float64, as DqnBatch's ``discounts``); ``n`` = ``k`` (int64);
        ``terminated`` / ``truncated`` those of row ``t+k-1``.

        Parameters
        ----------
        table : Table
            The table to read (this process's handle).
        batch : dict of str to Any
            The gathered start rows' minibatch (numpy arrays); changed in place.

        Returns
        -------
        dict of str to Any
            ``batch``. Cost: one read of the ``next_obs`` fields of the windows' last rows
            where ``k > 1`` (rewards and flags come with the windows).

        Raises
        ------
        RowError, StaleReadError
            As ``Table.read``.
        """
        k = self.k
        batch["reward"] = self.reward.astype(np.asarray(batch["reward"]).dtype)
        terminated = (self.flags & 1).astype(bool)
        batch["terminated"] = terminated
        if "truncated" in table.schema:
            batch["truncated"] = (self.flags & 2).astype(bool)
        batch["discount"] = np.where(terminated, 0.0, self.gamma ** k.astype(np.float64))
        batch["n"] = k
        moved = np.flatnonzero(k > 1)
        if len(moved):
            fresh = table.read(self.last[moved], columns=self.names)
            for c in self.names:
                col = np.array(batch[c], copy=True)
                col[moved] = fresh[c]
                batch[c] = col
        return batch
