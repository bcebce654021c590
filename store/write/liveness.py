"""Whether a writer died: its liveness lock is free (docs/FORMAT.md, "Writer liveness").

A writer on a local filesystem holds an exclusive advisory lock (``flock``) on its own
registration ``writers/<W>/writer.json`` from registering until it has closed; the kernel
drops the lock when the process dies, however it dies. A writer that closed says so in
the log (its ``close`` record); one that was killed is known dead only this way: it
registered on this host declaring the lock, and the lock can be taken. Anything short of
that (another host, a registration without ``lock``, a filesystem refusing locks, an
unreadable registration) counts as alive: being wrong that way only keeps storage longer.

:func:`register` creates a new writer's registration and so takes its number.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

from replaystore.errors import CorruptObjectError
from replaystore.store.format import bodies, layout, records
from replaystore.store.storage import Storage

LOCK = "flock"  # the registration's "lock" value: its writer holds a flock on it while alive


def registration(storage: Storage) -> dict[str, object]:
    """What a new writer's registration says besides its number: host, pid, time, lock."""
    doc: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(), "time_ns": time.time_ns()}
    if storage.local_path(layout.WRITERS) is not None:
        doc["lock"] = LOCK
    return doc


def register(storage: Storage, capacity: int | None, generation: str) -> int:
    """Take the next free writer number: create its registration (create-if-absent), return the number.

    The registration records the capacity the writer works under and the store's generation.
    CorruptObjectError, registering nothing, where ``capacity`` differs from one an earlier
    writer registered under (:func:`~replaystore.store.format.bodies.check_capacity`).
    """
    names = storage.list(layout.WRITERS)
    bodies.check_capacity(storage, capacity, names, generation)
    n = len(names)
    doc = {**registration(storage), "capacity": capacity, "generation": generation}
    while True:
        if storage.create(layout.writer_record(n), records.encode({"writer": n, **doc})):
            return n
        n += 1


def hold(storage: Storage, writer: int) -> int | None:
    """Take writer ``writer``'s lock; the descriptor to close once it has closed (None: no lock).

    Blocks only while another process is testing the lock (microseconds). Where the
    filesystem refuses locks none is held; testers meet the same refusal and keep
    treating the writer as alive.
    """
    path = storage.local_path(layout.writer_record(writer))
    if path is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (never waits on a FIFO)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def is_dead(storage: Storage, writer: int) -> bool:
    """Whether writer ``writer`` registered on this host with a lock that nobody holds; False when unsure."""
    path = storage.local_path(layout.writer_record(writer))
    if path is None:
        return False
    try:
        doc = records.decode(layout.writer_record(writer), records.read(storage, layout.writer_record(writer)))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (never waits on a FIFO)
    except (OSError, CorruptObjectError):
        return False
    try:
        if doc.get("lock") != LOCK or doc.get("host") != socket.gethostname():
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK): alive; anything else: unknown, so alive
        return False
    finally:
        os.close(fd)  # (and with it the lock just taken)
    return True
