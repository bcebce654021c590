"""A writer's step bookkeeping: each stream's last step and done flag, per table.

An append's steps and done flags are staged while it is checked (:meth:`StepBook.begin`),
become the streams' last ones once it is accepted (:meth:`StepBook.accept`), are kept for
good by a commit (:meth:`StepBook.commit`) and undone by a discard (:meth:`StepBook.rollback`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from replaystore.errors import StepOrderError
from replaystore.schemas.validate import to_numpy
from replaystore.store.format.streamkeys import Coded, StreamKey, group_positions
from replaystore.store.format.streamkeys import check_step_range as _check_range
from replaystore.store.write.context import Tables

Key = tuple[str, StreamKey]
"""A stream of a table: ``(table, stream key)``."""
V = TypeVar("V")


def _keep(undo: dict[Key, V | None], now: dict[Key, V], changes: dict[Key, V]) -> None:
    """Apply ``changes`` to ``now``, first noting in ``undo`` what a key held (None: absent) unless noted."""
    for key in changes.keys() - undo.keys():
        undo[key] = now.get(key)
    now.update(changes)


def _restore(undo: dict[Key, V | None], now: dict[Key, V]) -> None:
    """Put back into ``now`` what ``undo`` noted."""
    for key, old in undo.items():
        if old is None:
            now.pop(key, None)
        else:
            now[key] = old


class StepBook:
    """The last step and done flag of every stream one writer appended to, with undo to the last commit.

    Runs on the thread that appends (the writer's caller). A stream this writer has not
    written yet is looked up in a current view of the store, once per append. A stream is
    named by its table and its key: the methods take them as ``table`` and ``key``.

    Parameters
    ----------
    tables : Tables
        The store's tables: their readers, and the refresh (for streams this writer has not
        written).
    """

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.last_step: dict[Key, int] = {}
        self.last_done: dict[Key, bool] = {}
        # what the appends since the last commit replaced in those two maps (None: absent), so that
        # rollback() restores them at the cost of the streams appended to, not of all streams written
        self._undo: tuple[dict[Key, int | None], dict[Key, bool | None]] = ({}, {})
        self._fresh = False  # whether this append already refreshed the store (see known_last)
        self._staged: dict[Key, int] = {}  # the last step per stream of the append being checked
        self._done: dict[Key, bool] = {}  # the done flag per stream it leaves (rollouts)

    def begin(self) -> None:
        """Start checking an append: nothing of it is staged, the store not yet refreshed for it.

        Cost: O(1).
        """
        self._fresh = False
        self._staged, self._done = {}, {}

    def accept(self) -> None:
        """The append checked since :meth:`begin` was accepted.

        Its steps and done flags become the streams' last ones (undone by :meth:`rollback`
        until :meth:`commit`).

        Cost: O(streams of the append).
        """
        _keep(self._undo[0], self.last_step, self._staged)
        _keep(self._undo[1], self.last_done, self._done)
        self._staged, self._done = {}, {}

    def commit(self) -> None:
        """The accepted appends were committed: their steps stay.

        Cost: O(1).
        """
        self._undo = ({}, {})

    def rollback(self) -> None:
        """The accepted appends were discarded.

        Restores each stream's last step and done flag as of the last commit.

        Cost: O(streams appended to since the last commit).
        """
        _restore(self._undo[0], self.last_step)
        _restore(self._undo[1], self.last_done)
        self._undo = ({}, {})

    def carried_done(self, table: str, key: StreamKey) -> bool | None:
        """The done flag a rollout slot's last step left (None: no rollout of it yet).

        Parameters
        ----------
        table : str
            The rollout's table.
        key : StreamKey
            The slot's stream key.

        Returns
        -------
        bool or None
            Whether the slot's last episode ended.

        Cost: O(1).
        """
        return self.last_done.get((table, key))

    def note_done(self, table: str, key: StreamKey, done: bool) -> None:
        """Stage the done flag the append being checked leaves in a stream (see :meth:`accept`).

        Parameters
        ----------
        table : str
            The table appended to.
        key : StreamKey
            The stream it leaves ``done`` in.
        done : bool
            Whether its last record ends an episode.

        Cost: O(1).
        """
        self._done[(table, key)] = done

    def known_last(self, table: str, key: StreamKey, staged: bool = True) -> int | None:
        """The last step of a stream: staged by this append, written by this writer, or stored.

        A current view is read once per append for a stream not written yet.

        Parameters
        ----------
        table : str
            The table the stream is in.
        key : StreamKey
            The stream's key.
        staged : bool
            Whether the steps the append being checked takes count.

        Returns
        -------
        int or None
            The step, or None for a stream with no records.

        Raises
        ------
        StoreError
            If refreshing the store fails (e.g. StaleReadError).

        Cost: O(1), or a refresh of the store and an index lookup for a stream not written yet.
        """
        if staged and (table, key) in self._staged:
            return self._staged[(table, key)]
        if (table, key) in self.last_step:
            return self.last_step[(table, key)]
        if not self._fresh:
            # A stream this writer has not written yet: ask a current view, once per append. The
            # handle's view may predate another writer's commits to this stream (auto steps would
            # then repeat stored steps) or reference fragments reclaimed since (StaleReadError).
            self.tables.refresh()
            self._fresh = True
        reader = self.tables.reader(table)
        last = reader.index.last_step(key) if reader.lists_stream(key) else None
        if last is not None:
            self.last_step[(table, key)] = last
        return last

    def steps(self, table: str, coded: Coded, step: Any) -> np.ndarray:
        """Each record's step, checked and staged as its stream's last (see :meth:`accept`).

        Parameters
        ----------
        table : str
            The table the records go to.
        coded : Coded
            The records' stream codes and the keys they code.
        step : None, int or array-like
            None (auto-increment per stream), the first step of a one-stream batch, or one
            step per record.

        Returns
        -------
        numpy.ndarray
            int64 steps, one per record.

        Raises
        ------
        StepOrderError
            If steps are not integers, not strictly increasing per stream, not after the
            stream's last step, negative, or past the step range.

        Cost: O(records), plus :meth:`known_last` per stream.
        """
        codes, uniq = coded
        n = len(codes)
        groups = group_positions(codes, len(uniq))
        staged = self._staged
        if step is None:
            steps = np.empty(n, dtype=np.int64)
            for k, pos in zip(uniq, groups, strict=True):
                last = self.known_last(table, k)
                start = 0 if last is None else last + 1
                _check_range(start, start + len(pos) - 1, k)
                steps[pos] = np.arange(start, start + len(pos))
                staged[(table, k)] = start + len(pos) - 1
            return steps
        if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
            if len(uniq) != 1:
                raise StepOrderError("step", "one step per record when a batch spans several streams", "a scalar")
            _check_range(int(step), int(step) + n - 1, uniq[0] if uniq else None)
            steps = np.arange(int(step), int(step) + n, dtype=np.int64)
        else:
            steps = to_numpy("step", step)
            if steps.dtype.kind not in "iu" or steps.shape != (n,):
                raise StepOrderError("step", f"{n} integer steps", f"{steps.dtype} of shape {steps.shape}")
            if n:  # before the cast: a uint64 step past the int64 range would wrap negative
                _check_range(int(steps.min()), int(steps.max()), None)
            steps = steps.astype(np.int64)
        for k, pos in zip(uniq, groups, strict=True):
            s = steps[pos]
            if len(s) > 1 and np.any(np.diff(s) <= 0):
                i = int(np.flatnonzero(np.diff(s) <= 0)[0])
                raise StepOrderError("step", f"strictly increasing steps in stream {k!r}",
                                     f"step {s[i + 1]} after {s[i]}")
            last = self.known_last(table, k)
            if last is not None and s[0] <= last:
                raise StepOrderError("step", f"steps after {last} in stream {k!r}", f"step {s[0]}")
            if s[0] < 0:
                raise StepOrderError("step", "non-negative steps", f"step {s[0]}")
            staged[(table, k)] = int(s[-1])
        return steps
