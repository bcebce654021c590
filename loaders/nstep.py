"""N-step returns at sampling time: windows over the stream/step index, returns computed in the sampler.

The sampler (main process) keeps, per version of its table's view, each visible row's n-step
window summarised (:class:`WindowIndex`): the discounted reward, the window's length, its last
row and that row's terminated/truncated flags, built with vectorised passes over the stream
index and one read of the ``reward``/``terminated``(/``truncated``) columns after each change
of the view. A minibatch's windows are then a few gathers; they travel in the
:class:`~replaystore.loaders.base.Request` as an :class:`NStepWindows`, and where the
minibatch is gathered (a DataLoader worker or the main process) :meth:`NStepWindows.apply`
replaces ``reward``, ``terminated``, ``truncated``, reads ``next_obs`` of the windows' last
rows and adds ``discount`` and ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import RowError, SamplerParameterError
from replaystore.loaders.limits import MAX_WINDOW, check_size
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
    n_step = check_size("n_step", n_step, MAX_WINDOW)
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
    row by its position in the view, its window's discounted reward, last row id, and one code
    for its length and last row's terminated/truncated bits (20 bytes a row), so a minibatch
    costs a few gathers.

    Parameters
    ----------
    table : Table
        The table the sampler draws from.
    n : int
        The longest window.
    stacked : bool, optional
        Frame stacking (``stack=``): a window also ends before a row without a next frame in
        its episode, so that its last row has one (the stack after it is ``next_obs``), and no
        ``next_obs`` field is read (the sampler's stacker gives it).
    """

    def __init__(self, table: Table, n: int, stacked: bool = False) -> None:
        self.table, self.n, self.stacked = table, n, stacked
        self._version, self._gamma = -1, -1.0
        # a window of one keeps its next_obs; stacked windows get theirs from the stacker
        self._names = next_fields(table.schema) if n > 1 and not stacked else []
        self._lo = np.zeros(1, dtype=np.int64)  # first row id of each visible interval
        self._hi = np.zeros(1, dtype=np.int64)  # its end
        self._off = np.zeros(1, dtype=np.int64)  # view position of each interval's first row
        self._reward = np.zeros(0, dtype=np.float64)  # per view position: discounted reward sum
        self._last = np.zeros(0, dtype=np.int64)  # the last row's id
        self._code = np.zeros(0, dtype=np.int32)  # k + (n + 1) * (the last row's terminated + 2 * truncated)
        # per code: k, terminated, truncated, discount (gamma ** k, 0 where terminated)
        codes = np.arange(4 * (n + 1))
        self._k_of = (codes % (n + 1)).astype(np.int64)
        self._term_of = (codes // (n + 1) & 1).astype(bool)
        self._trunc_of = (codes // (n + 1) & 2).astype(bool)
        self._discount_of = np.zeros(len(codes), dtype=np.float64)

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
            if self.stacked:  # the successor must have a next frame itself
                has_next = np.zeros(size + 1, dtype=bool)
                has_next[pos] = ok
                ok &= has_next[pos[s]]
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
        self._reward = reward[:size]
        self._code = (k[:size] + (self.n + 1) * last_flag[:size].astype(np.int64)).astype(np.int32)
        self._last = row[last[:size]] if size else row
        self._discount_of = np.where(self._term_of, 0.0, gamma ** self._k_of.astype(np.float64))
        self._version, self._gamma = view.version, gamma

    def _start_positions(self, rows: np.ndarray) -> np.ndarray:
        """View positions of start row ids; ``RowError`` unless every one is visible in the current view."""
        lo, hi, off = self._lo, self._hi, self._off
        if len(lo) == 1:
            pos = rows - lo[0]
            if not len(pos) or int(pos.view(np.uint64).max()) < hi[0] - lo[0]:  # a negative one wraps to > 2**63
                return pos
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
        code = self._code[pos]
        return NStepWindows(self._last[pos], self._reward[pos], self._k_of[code], self._term_of[code],
                            self._trunc_of[code], self._discount_of[code], self._names)


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
    reward : numpy.ndarray
        float64 ``[batch]``: the discounted sum of each window's rewards.
    k : numpy.ndarray
        int64 ``[batch]``: each window's length.
    terminated, truncated : numpy.ndarray
        bool ``[batch]``: those of each window's last record.
    discount : numpy.ndarray
        float64 ``[batch]``: ``gamma ** k``, 0 where ``terminated``.
    names : list of str
        The fields holding the successor observation (:func:`next_fields`) to read from the
        last rows; empty for windows of one row.
    """

    last: np.ndarray
    reward: np.ndarray
    k: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    discount: np.ndarray
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
            (rewards, flags and discounts come with the windows).

        Raises
        ------
        RowError, StaleReadError
            As ``Table.read``.
        """
        batch["reward"] = self.reward.astype(np.asarray(batch["reward"]).dtype)
        batch["terminated"] = self.terminated
        if "truncated" in table.schema:
            batch["truncated"] = self.truncated
        batch["discount"] = self.discount
        batch["n"] = self.k
        if self.names:
            batch.update(table.read(self.last, columns=self.names))
        return batch
