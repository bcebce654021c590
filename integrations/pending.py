"""The pending (uncommitted) transitions of a store-backed trainer buffer, in RAM, and their commits.

Kept apart from the trainer-facing buffer classes (``replaystore.integrations.sb3``): this part
needs no trainer library.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaystore.schemas import Dense
from replaystore.store import Store, Table, Writer

__all__ = ["EPISODE_KEYS", "FramesLog", "PendingLog", "commit_collected", "orphan", "track"]

EPISODE_KEYS = ("stream", "first_step", "length", "return", "seed", "terminated", "truncated")
"""The columns of the per-commit ``episodes`` metadata (as ``replaystore.gym``'s recorders write it)."""

class PendingLog:
    """The pending (uncommitted) transitions of one buffer, in RAM, and the writer that commits them.

    Rows are laid out step-major (``n_envs`` rows per ``add``: row ``r`` is env ``r % n_envs``);
    each column is a preallocated array of ``rows`` records. Kept apart from the buffer object so
    that the pending rows can be committed after the buffer is collected, and at exit, without
    keeping the buffer alive (see :func:`track`, :func:`orphan`).

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
        self.pid = os.getpid()

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
        if self._append(self.n):
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

    def _append(self, n: int) -> bool:
        """Append the first ``n`` pending rows to the writer; whether anything was appended."""
        if not n:
            return False
        keys = self.stream_keys()
        assert self.writer is not None
        self.writer.append({name: a[:n] for name, a in self.arrays.items()},
                           stream=keys[np.arange(n) % self.n_envs], reset=self.reset[:n])
        return True

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


class FramesLog(PendingLog):
    """A :class:`PendingLog` whose store has the ``frames`` layout: each stacked frame stored once.

    The pending rows keep whole stacked observations (``obs<sfx>``/``next_obs<sfx>``, sampled
    from RAM as they are); a commit appends per row the newest frame of ``obs`` as ``frame<sfx>``
    with the row's other columns, and after the last row of an episode (:attr:`end`: it ended,
    or the next one was cut off) a frame-only record with the newest frame of its ``next_obs``.
    :meth:`close` closes every env's open episode that way, so its last transition can be drawn.

    Parameters
    ----------
    store : Store
        As :class:`PendingLog`.
    columns : mapping of str to Dense
        The columns of the pending rows (whole stacks).
    rows : int
        As :class:`PendingLog`.
    n_envs : int
        As :class:`PendingLog`.
    newest : mapping of str to tuple
        Per frame field: the stacked observation leaf's column suffix (``""`` for a flat
        observation) and the function giving the newest frame of each of ``[n, *obs_shape]``
        observations.

    Notes
    -----
    Cost: a commit copies the pending rows' newest frames and scalars once more.
    """

    def __init__(self, store: Store, columns: Mapping[str, Dense], rows: int, n_envs: int,
                 newest: Mapping[str, Any]) -> None:
        super().__init__(store, columns, rows, n_envs)
        self.newest = dict(newest)
        self.end = np.zeros(rows, dtype=bool)
        self.open = np.zeros(n_envs, dtype=bool)  # env's last appended row lacks its closing frame
        self.last: dict[str, np.ndarray | None] = dict.fromkeys(self.newest)  # its next_obs's newest frame
        self.closing = False
        self._stacked = {f"{base}{sfx}" for sfx, _ in self.newest.values() for base in ("obs", "next_obs")}

    def _append(self, n: int) -> bool:
        # docstring inherited
        ne = self.n_envs
        env = np.arange(n) % ne
        end = self.end[:n].copy()
        pre = np.zeros(n, dtype=bool)
        pre[:min(n, ne)] = self.reset[:min(n, ne)] & self.open[env[:ne]]  # an episode cut at the last commit
        if self.closing:
            end[max(0, n - ne):] = True
        tail = np.flatnonzero(self.open) if (self.closing and not n) else np.zeros(0, dtype=np.int64)
        if not n and not len(tail):
            return False
        count = pre.astype(np.int64) + 1 + end
        main = np.cumsum(count) - count + pre
        total = int(count.sum()) + len(tail)
        close_rows = main[end] + 1
        pre_rows = main[pre] - 1
        tail_rows = np.arange(total - len(tail), total)
        out: dict[str, np.ndarray] = {}
        for name, a in self.arrays.items():
            if name in self._stacked:
                continue
            col = np.zeros((total, *a.shape[1:]), dtype=a.dtype)
            col[main] = a[:n]
            out[name] = col
        for field, (sfx, newest) in self.newest.items():
            frames = newest(self.arrays[f"obs{sfx}"][:n])
            col = np.zeros((total, *frames.shape[1:]), dtype=frames.dtype)
            col[main] = frames
            if end.any():
                col[close_rows] = newest(self.arrays[f"next_obs{sfx}"][:n][end])
            last = self.last[field]
            if last is not None:
                col[pre_rows] = last[env[pre]]
                col[tail_rows] = last[tail]
            out[field] = col
            if n:
                self.last[field] = newest(self.arrays[f"next_obs{sfx}"][n - ne:n])
        streams = np.zeros(total, dtype=np.int64)
        streams[main] = env
        streams[close_rows] = env[end]
        streams[pre_rows] = env[pre]
        streams[tail_rows] = tail
        reset = np.zeros(total, dtype=bool)
        reset[main] = self.reset[:n]
        keys = self.stream_keys()
        assert self.writer is not None
        self.writer.append(out, stream=keys[streams], reset=reset)
        if n:
            self.open[:] = ~end[n - ne:n]
        if self.closing:
            self.open[:] = False
        return True

    def close(self) -> None:
        """Close every env's open episode with a frame-only record, commit, and release (idempotent)."""
        self.closing = True
        super().close()


_STOP = object()  # tells the flusher thread to finish

_state = threading.Lock()  # guards _flusher and _hooked (taken only in ordinary code, never in a finalizer)
_orphans: queue.SimpleQueue[Any] = queue.SimpleQueue()  # logs of collected buffers; Events; _STOP
_live: weakref.WeakSet[PendingLog] = weakref.WeakSet()  # every tracked log, for the exit hook
_flusher: threading.Thread | None = None
_hooked = False


def _after_fork_in_child() -> None:
    """A forked child starts with none of the parent's logs, its own lock and queue, and no flusher yet."""
    global _state, _orphans, _live, _flusher
    _state = threading.Lock()
    _orphans = queue.SimpleQueue()
    _live = weakref.WeakSet()
    _flusher = None


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def track(log: PendingLog) -> None:
    """Have ``log``'s pending rows committed when its buffer is collected and at interpreter exit.

    Starts the flusher thread (once per process) that commits the logs :func:`orphan` hands
    over, and registers one exit hook with ``threading``'s exit hooks, which run before the
    thread pools the writer syncs with are shut down (``atexit`` runs after them). Holds
    ``log`` weakly. Call it from ordinary code (it takes a lock and may start a thread),
    never from a finalizer.

    Parameters
    ----------
    log : PendingLog
        What to commit and close.

    Notes
    -----
    Cost: a set insertion; a thread start and a hook registration the first time.
    """
    global _flusher, _hooked
    with _state:
        _live.add(log)
        if _flusher is None or not _flusher.is_alive():  # (a forked child has no flusher thread)
            _flusher = threading.Thread(target=_flush_orphans, name="replaystore-pending-flush", daemon=True)
            _flusher.start()
        if not _hooked:
            register = getattr(threading, "_register_atexit", None)
            if register is not None:  # (CPython has it since 3.9)
                try:
                    register(_at_exit)
                    _hooked = True
                except RuntimeError:  # (the interpreter is already shutting down)
                    pass


def orphan(log: PendingLog) -> None:
    """Hand the log of a garbage-collected buffer to the flusher thread: the buffer's finalizer.

    Does no I/O and takes no lock, so it is safe at any allocation, which is where the cyclic
    garbage collector runs finalizers: committing there, on a thread that may be inside
    ``ThreadPoolExecutor.submit`` (holding its non-reentrant locks), would wait forever on
    those locks. The flusher thread commits and closes ``log`` soon after; at interpreter
    exit, the exit hook does what the flusher has not.

    Parameters
    ----------
    log : PendingLog
        The collected buffer's pending rows.

    Notes
    -----
    Cost: one ``queue.SimpleQueue.put`` (reentrant-safe, lock-free for the caller).
    """
    _orphans.put(log)


def commit_collected(timeout: float | None = None) -> bool:
    """Wait until the pending rows of every buffer collected so far are committed (or failed).

    Store-backed buffers that are garbage-collected with pending rows hand them to a
    background thread (see :func:`orphan`); this waits for that thread to finish what was
    handed over before the call. Buffers call it before opening a store, so a buffer
    reopening a URL (``DQN.load``) sees the rows of an earlier buffer that was collected.

    Parameters
    ----------
    timeout : float, optional
        Seconds to wait at most; None: until done.

    Returns
    -------
    bool
        True if everything handed over before the call is done.

    Notes
    -----
    Cost: a round trip to the flusher thread (microseconds) plus the commits still queued.
    """
    flusher = _flusher
    if flusher is None or not flusher.is_alive() or flusher is threading.current_thread():
        return _orphans.empty()
    done = threading.Event()
    _orphans.put(done)
    return done.wait(timeout)


def _close_reporting(log: PendingLog) -> None:
    """Close ``log`` (in the process that made it); a failure is reported on stderr, not raised."""
    if log.pid != os.getpid():  # (a forked child: the parent commits its own rows)
        return
    try:
        log.close()
    except Exception:
        sys.stderr.write(f"replaystore: committing the pending transitions of a buffer of {log.store.url} "
                         f"failed; they are lost:\n{traceback.format_exc()}")


def _flush_orphans() -> None:
    """The flusher thread: commit and close the logs of collected buffers, in order."""
    while True:
        item = _orphans.get()
        if item is _STOP:
            return
        if isinstance(item, threading.Event):
            item.set()
        else:
            _close_reporting(item)


def _at_exit() -> None:
    """Exit hook: stop the flusher, then commit and close every log still open."""
    flusher = _flusher
    if flusher is not None and flusher.is_alive():
        _orphans.put(_STOP)
        flusher.join()
    while True:
        try:
            item = _orphans.get_nowait()
        except queue.Empty:
            break
        if isinstance(item, threading.Event):
            item.set()
        elif item is not _STOP:
            _close_reporting(item)
    for log in list(_live):
        _close_reporting(log)
