"""The pending (uncommitted) transitions of a store-backed trainer buffer, in RAM, and their commits.

Kept apart from the trainer-facing buffer classes (``replaystore.integrations.sb3``): this part
needs no trainer library.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaystore.schemas import Dense
from replaystore.store import Store, Table, Writer

__all__ = ["EPISODE_KEYS", "PendingLog", "commit_at_exit"]

EPISODE_KEYS = ("stream", "first_step", "length", "return", "seed", "terminated", "truncated")
"""The columns of the per-commit ``episodes`` metadata (as ``replaystore.gym``'s recorders write it)."""

class PendingLog:
    """The pending (uncommitted) transitions of one buffer, in RAM, and the writer that commits them.

    Rows are laid out step-major (``n_envs`` rows per ``add``: row ``r`` is env ``r % n_envs``);
    each column is a preallocated array of ``rows`` records. Kept apart from the buffer object so
    that a finalizer can commit the pending rows at exit without keeping the buffer alive.

    Parameters
    ----------
    store : Store
        The open store (one table); closed by :meth:`close`.
    columns : mapping of str to Dense
        The table's dense fields (leaf columns of nested fields under their column names).
    rows : int
        Records held before a commit is due (``commit_every * n_envs``).
    n_envs : int
        Environments; env ``j`` writes stream ``"w<writer>-<j>"``.

    Notes
    -----
    Cost: the arrays of ``rows`` records, allocated once.
    """

    def __init__(self, store: Store, columns: Mapping[str, Dense], rows: int, n_envs: int) -> None:
        self.store = store
        self.table: Table = store.default
        self.rows = rows
        self.n = 0
        self.arrays = {name: np.zeros((rows, *f.shape), dtype=f.dtype) for name, f in columns.items()}
        self.reset = np.zeros(rows, dtype=bool)
        self.n_envs = n_envs
        self.writer: Writer | None = None
        self.keys: np.ndarray | None = None
        self.ended: dict[str, list[Any]] = {k: [] for k in EPISODE_KEYS}
        self.appended = False  # records appended to the writer and not committed yet
        self.closed = False

    def stream_keys(self) -> np.ndarray:
        """One stream key per env index, ``"w<writer>-<env>"`` (the recorders' convention).

        Returns
        -------
        numpy.ndarray
            The keys (str). Cost: registers the writer on the first call.
        """
        if self.writer is None:
            self.writer = self.store.writer()
            self.keys = np.array([f"w{self.writer.id}-{j}" for j in range(self.n_envs)])
        assert self.keys is not None
        return self.keys

    def commit(self) -> None:
        """Append the pending rows and commit them with the episodes ended since the last commit.

        Cost: one concatenation-free append of the pending rows, one commit (file syncs).
        """
        if self.closed:
            return
        if self.n:
            keys = self.stream_keys()
            assert self.writer is not None
            n = self.n
            self.writer.append({name: a[:n] for name, a in self.arrays.items()},
                               stream=keys[np.arange(n) % self.n_envs], reset=self.reset[:n])
            self.n = 0  # (the writer holds them now: a failed commit below leaves them pending there)
            self.appended = True
        if not self.appended and not self.ended["stream"]:
            return
        self.stream_keys()
        assert self.writer is not None
        ended = self.ended if self.ended["stream"] else None
        self.writer.commit(metadata={"episodes": ended} if ended is not None else None)
        self.appended = False
        self.ended = {k: [] for k in EPISODE_KEYS}

    def close(self) -> None:
        """Commit what is pending and release the writer and the store (idempotent)."""
        if self.closed:
            return
        try:
            self.commit()
        finally:
            self.closed = True
            try:
                if self.writer is not None:
                    self.writer.close()
            finally:
                self.store.close()


def commit_at_exit(log: PendingLog) -> None:
    """Have ``log`` committed and closed when the interpreter exits normally.

    Registered with ``threading``'s exit hooks, which run before the thread pools the writer
    syncs with are shut down (``atexit`` runs after them). Holds ``log`` weakly.

    Parameters
    ----------
    log : PendingLog
        What to commit and close.

    Notes
    -----
    Cost: one registration; at exit, :meth:`PendingLog.close`.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it since 3.9
        return
    ref = weakref.ref(log)

    def close() -> None:
        live = ref()
        if live is not None:
            live.close()

    try:
        register(close)
    except RuntimeError:  # (the interpreter is already shutting down)
        pass
