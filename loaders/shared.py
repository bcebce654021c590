"""Large arrays of a worker's minibatch handed to the main process in shared memory instead of the pipe.

A forked DataLoader worker pickles its minibatch through a pipe; an array of a megabyte
(32 stacked 84x84 frames) then costs the main process a few reads, a buffer and two
copies, ~2 ms a minibatch on 2 cores. Torch's own tensor sharing creates a shared-memory
segment per batch and passes its descriptor over a socket, which costs more. Instead
:func:`make_loader`'s persistent forked workers write the minibatch's large arrays into a
*slot* of a region of shared memory (:class:`SharedSlots`: an unnamed memfd, mapped by
the main process and by each worker, forked or handed its descriptor as it is spawned) and
send only where they are; the main process wraps the slot's bytes as numpy arrays without
a copy.

A slot is used by one minibatch at a time: a worker takes a free one of its own slots,
and the main process frees it when the last array viewing it is garbage (a
``weakref.finalize`` per array: tensors made from them, and their views, keep them
alive). A worker with no free slot, or a minibatch whose large arrays do not fit one,
goes through the pipe as before: the minibatches are the same either way.
"""

from __future__ import annotations

import itertools
import mmap
import os
import weakref
from typing import Any

import numpy as np

SLOT_BYTES = 16 << 20
"""Bytes of one slot: the most the large arrays of one minibatch may take to use shared memory."""

MIN_BYTES = 64 << 10
"""Arrays of at least this many bytes go through a slot; smaller ones are pickled."""

_ALIGN = 64
_STATES = 4096  # the slots' state bytes come first, then the slots
_tokens = itertools.count()
_LIVE: weakref.WeakValueDictionary[tuple[int, int], SharedSlots] = weakref.WeakValueDictionary()


class SharedSlots:
    """Slots of anonymous shared memory, ``per_worker`` for each of ``workers`` forked workers.

    Made in the main process before the workers start (forked workers inherit the mapping,
    spawned ones get the descriptor with the dataset; the memory is allocated as slots are
    first written, and freed with the last process that maps it).

    Parameters
    ----------
    workers : int
        DataLoader workers.
    per_worker : int
        Slots per worker: the minibatches of one worker that may be in flight or held at once.
    slot_bytes : int, optional
        Bytes of a slot.
    fd : int, optional
        In a worker: the descriptor of the main process's slots (kept, closed with them).
    token : tuple of int, optional
        With ``fd``: the main process's slots' token.
    """

    def __init__(self, workers: int, per_worker: int, slot_bytes: int = SLOT_BYTES, *, fd: int | None = None,
                 token: tuple[int, int] | None = None) -> None:
        self.workers, self.per_worker, self.slot_bytes = workers, per_worker, slot_bytes
        if fd is None:  # new slots, in the main process
            self.token = (os.getpid(), next(_tokens))
            self._fd = _shared_file(self._size())
            _LIVE[self.token] = self
        else:  # the main process's slots, in a worker
            assert token is not None
            self.token, self._fd = token, fd
        self._map()

    def _size(self) -> int:
        return _STATES + self.workers * self.per_worker * self.slot_bytes

    def _map(self) -> None:
        self._data = mmap.mmap(self._fd, self._size())  # (MAP_SHARED: one memory in every process)
        self.states = np.frombuffer(self._data, dtype=np.uint8, count=self.workers * self.per_worker)
        """Per slot: 1 while a minibatch uses it, 0 when free (written by the worker, then the main process)."""

    def __reduce__(self) -> tuple[Any, ...]:
        """To a spawned (or forkserver) worker as it starts: the shared file's descriptor travels with it.

        Raises
        ------
        RuntimeError
            Outside a worker's start (slots are never pickled otherwise).
        """
        from multiprocessing.context import get_spawning_popen
        from multiprocessing.reduction import DupFd

        if get_spawning_popen() is None:
            raise RuntimeError("SharedSlots travel only to the workers being started")
        return _attach, (self.token, self.workers, self.per_worker, self.slot_bytes, DupFd(self._fd))

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def put(self, worker: int, arrays: dict[str, Any]) -> tuple[Any, ...] | None:
        """Copy the large arrays of ``arrays`` into a free slot of ``worker`` (in the worker process).

        Parameters
        ----------
        worker : int
            The worker's id (``get_worker_info().id``).
        arrays : dict of str to Any
            The minibatch.

        Returns
        -------
        tuple or None
            ``(token, slot, layout)`` to send instead of those arrays, ``layout`` a list of
            ``(name, offset, dtype, shape)``; None where nothing is large, the large arrays do
            not fit a slot or no slot of the worker is free.
        """
        big = [(k, v) for k, v in arrays.items()
               if isinstance(v, np.ndarray) and v.nbytes >= MIN_BYTES and not v.dtype.hasobject]
        if not big or sum(-(-v.nbytes // _ALIGN) * _ALIGN for _, v in big) > self.slot_bytes:
            return None
        first = worker * self.per_worker
        free = np.flatnonzero(self.states[first:first + self.per_worker] == 0)
        if not len(free):
            return None
        slot = first + int(free[0])
        self.states[slot] = 1
        layout, at = [], _STATES + slot * self.slot_bytes
        for k, v in big:
            np.ndarray(v.shape, dtype=v.dtype, buffer=self._data, offset=at)[...] = v
            layout.append((k, at, v.dtype, v.shape))
            at += -(-v.nbytes // _ALIGN) * _ALIGN
        return self.token, slot, layout

    def take(self, slot: int, layout: list[tuple[str, int, np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
        """The arrays a worker put in ``slot``, as views of it (in the main process).

        The slot is freed when the last of them (and of arrays or tensors viewing them) is garbage.

        Parameters
        ----------
        slot : int
            The slot.
        layout : list of tuple
            ``(name, offset, dtype, shape)`` per array, as :meth:`put` gave.

        Returns
        -------
        dict of str to numpy.ndarray
            Name to array.
        """
        out: dict[str, np.ndarray] = {}
        left = [len(layout)]
        for k, at, dtype, shape in layout:
            # (its base is the mapping, not an array: every view of it keeps it, and so the slot, alive)
            arr = np.ndarray(shape, dtype=dtype, buffer=self._data, offset=at)
            weakref.finalize(arr, _release, self.states, slot, left)
            out[k] = arr
        return out


def _shared_file(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory, unnamed (a memfd, else an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("replaystore-slots", os.MFD_CLOEXEC)
    else:  # (macOS: a deleted file's pages, in /dev/shm where there is one)
        import tempfile

        with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, delete=False) as f:
            fd = os.dup(f.fileno())
        os.unlink(f.name)
    try:
        os.ftruncate(fd, size)  # (sparse: memory is taken as slots are written)
    except OSError:
        os.close(fd)
        raise
    return fd


def _attach(token: tuple[int, int], workers: int, per_worker: int, slot_bytes: int, fd: Any) -> SharedSlots:
    """The slots in a started worker, over the descriptor the main process passed."""
    return SharedSlots(workers, per_worker, slot_bytes, fd=fd.detach() if hasattr(fd, "detach") else int(fd),
                       token=token)


def _release(states: np.ndarray, slot: int, left: list[int]) -> None:
    left[0] -= 1
    if not left[0]:
        states[slot] = 0


def from_slot(token: tuple[int, int], slot: int, layout: list[Any], rest: dict[str, Any]) -> dict[str, Any]:
    """A minibatch whose large arrays a worker put in a slot, with the rest, in the original order.

    Parameters
    ----------
    token : tuple of int
        The :class:`SharedSlots`' token.
    slot : int
        The slot.
    layout : list of tuple
        As :meth:`SharedSlots.put` gave.
    rest : dict of str to Any
        The minibatch without the large arrays, ``None`` in their places.

    Returns
    -------
    dict of str to Any
        The minibatch.

    Raises
    ------
    RuntimeError
        The slots are not this process's (never for :func:`make_loader`'s workers).
    """
    slots = _LIVE.get(tuple(token))  # type: ignore[arg-type]
    if slots is None:
        raise RuntimeError("a worker's minibatch names shared slots this process does not have")
    got = slots.take(slot, layout)
    return {k: got[k] if k in got else v for k, v in rest.items()}
