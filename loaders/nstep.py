"""N-step returns at sampling time: windows over the stream/step index, returns computed in the sampler.

The sampler (main process) keeps each visible row's n-step window summarised
(:class:`WindowIndex`): the discounted reward, the window's length, its last row and that
row's terminated/truncated flags, followed across the changes of its table's view at the cost
of the change (vectorised passes over the stream slices touched and one read of the
``reward``/``terminated``(/``truncated``) columns of the records appended). A minibatch's
windows are then a few gathers; they travel in the
:class:`~replaystore.loaders.base.Request` as n-step's payload (``parts["n_step"]``), an
:class:`NStepWindows`, and where the
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
from replaystore.loaders.follow import EntryFollower
from replaystore.loaders.limits import MAX_WINDOW, check_size
from replaystore.schemas import Schema
from replaystore.store import StreamIndex, Table

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
    last of them (highest row id). For every visible row it keeps (for the current ``gamma``)
    its window's discounted reward, last row id, and one code for its length and last row's
    terminated/truncated bits, so a minibatch costs a few gathers. The summary follows the
    table (:class:`_Windows`): after a commit of k records it reads those records' rewards and
    flags and recomputes the windows of the records appended and of the ``n`` before them in
    each stream touched (O(k * n)); an eviction of the oldest records costs O(k); results are
    those of a summary built afresh.

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
        self._gamma = -1.0
        # a window of one keeps its next_obs; stacked windows get theirs from the stacker
        self._names = next_fields(table.schema) if n > 1 and not stacked else []
        self._follow: _Windows | None = None
        # per code: k, terminated, truncated, discount (gamma ** k, 0 where terminated)
        codes = np.arange(4 * (n + 1))
        self._k_of = (codes % (n + 1)).astype(np.int64)
        self._term_of = (codes // (n + 1) & 1).astype(bool)
        self._trunc_of = (codes // (n + 1) & 2).astype(bool)
        self._discount_of = np.zeros(len(codes), dtype=np.float64)

    def _refresh(self, gamma: float) -> None:
        """Bring the per-row summaries up to the table's current view (and ``gamma``).

        Cost: nothing when unchanged; after commits and evictions, O(n) per record appended
        and O(1) per record evicted, plus one read of the ``reward``/``terminated``
        (/``truncated``) columns of the records appended (see :class:`_Windows`); a new
        ``gamma`` (or the first call) builds the summary of every visible row afresh.
        """
        if self._follow is None or gamma != self._gamma:
            self._follow = _Windows(self.table, self.n, self.stacked, gamma)
            self._discount_of = np.where(self._term_of, 0.0, gamma ** self._k_of.astype(np.float64))
            self._gamma = gamma
        self._follow.sync()

    def _start_positions(self, rows: np.ndarray) -> np.ndarray:
        """Row slots of start row ids; ``RowError`` unless every one is visible in the current view."""
        assert self._follow is not None
        slots, found = self._follow.slots.lookup(rows)
        if not found.all():
            raise RowError(f"table {self.table.name!r}: start rows {rows[~found][:8].tolist()} are not visible "
                           "records (never written or evicted)")
        return slots

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
            batch (a binary search per row over the row slots' segments when there are
            several); after a change of the view, following it (see :meth:`_refresh`).

        Raises
        ------
        RowError
            A start row is not visible in the table's current view.
        """
        gamma = float(gamma)
        self._refresh(gamma)
        assert self._follow is not None
        pos = self._start_positions(np.asarray(rows, dtype=np.int64).reshape(-1))
        cols = self._follow.cols
        code = cols["code"][pos]
        return NStepWindows(cols["last"][pos], cols["reward"][pos], self._k_of[code], self._term_of[code],
                            self._trunc_of[code], self._discount_of[code], self._names)


class _Windows(EntryFollower):
    """Per visible row: its n-step window's discounted reward, last row id and code, followed (WindowIndex)."""

    columns = {"rew": (np.float64, 0.0), "flag": (np.uint8, 0), "reward": (np.float64, 0.0),
               "last": (np.int64, -1), "code": (np.int32, 0)}

    def __init__(self, table: Table, n: int, stacked: bool, gamma: float) -> None:
        self.n, self.stacked, self.gamma = n, stacked, gamma
        super().__init__(table)

    def _added(self, rows: np.ndarray, slots: np.ndarray) -> None:
        names = ["reward", "terminated", *(["truncated"] if "truncated" in self.table.schema else [])]
        data = self.table.read(rows, columns=names)
        self.cols["rew"][slots] = data["reward"]
        flag = np.asarray(data["terminated"]).astype(np.uint8)
        if "truncated" in data:
            flag |= np.asarray(data["truncated"]).astype(np.uint8) << 1
        self.cols["flag"][slots] = flag

    def _first(self, index: StreamIndex, s: np.ndarray, lo: np.ndarray, old_hi: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray]:
        first = np.maximum(old_hi - self.n, lo)  # windows that may reach the appended entries
        return first, first

    def _compute(self, jid: np.ndarray, bounds: np.ndarray, has_ctx: np.ndarray, rows: np.ndarray,
                 steps: np.ndarray, resets: np.ndarray, slots: np.ndarray, rel: np.ndarray,
                 write: np.ndarray) -> None:
        size = len(rows)
        rew = np.zeros(size + 1, dtype=np.float64)  # position ``size``: the sentinel (no row)
        flag = np.zeros(size + 1, dtype=np.uint8)
        rew[:size] = self.cols["rew"][slots]
        flag[:size] = self.cols["flag"][slots]
        nxt = np.full(size + 1, size, dtype=np.int64)  # the next step's position; the sentinel if none
        if size > 1:
            succ = _successors(jid, steps)
            ok = succ >= 0
            s = np.where(ok, succ, 0)
            ok &= (steps[s] == steps + 1) & ~resets[s]
            if self.stacked:  # the successor must have a next frame itself
                ok &= ok[s]
            ok &= flag[:size] == 0  # a terminal or truncated record ends its window
            nxt[:size] = np.where(ok, s, size)
        # windows of up to m + 1 rows from those of up to m rows, m = 1 .. n - 1
        k = np.ones(size + 1, dtype=np.int64)
        k[size] = 0
        reward, last_flag = rew.copy(), flag.copy()
        last = np.append(np.arange(size, dtype=np.int64), size)  # the last row's position
        stop = nxt == size
        gamma = self.gamma
        for _ in range(1, self.n):
            k = 1 + k[nxt]
            k[size] = 0
            reward = rew + gamma * reward[nxt]
            last_flag = flag | last_flag[nxt]
            last = np.where(stop, last, last[nxt])
        w = slots[write]
        self.cols["reward"][w] = reward[:size][write]
        self.cols["code"][w] = (k[:size][write] + (self.n + 1) * last_flag[:size][write].astype(np.int64))
        self.cols["last"][w] = rows[last[:size][write]]


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

    def reads(self) -> tuple[str, ...]:
        """The record fields the plain gather leaves to :meth:`apply`: none.

        Returns
        -------
        tuple of str
            Empty.
        """
        return ()

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
