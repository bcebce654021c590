"""Whether a writer is gone: it will never write again (docs/FORMAT.md, "Writer liveness").

A writer that closes creates ``writers/<W>/closed.json`` after its last commit. A writer
on a local filesystem also holds an exclusive advisory lock (``flock``) on its own
registration ``writers/<W>/writer.json`` from registering until it closes; the kernel
drops it when the process dies, however it dies. So a writer is gone when its
``closed.json`` exists, or when it registered on this host declaring the lock and the
lock can be taken. Anything else (another host, a registration without ``lock``, a
filesystem refusing locks, an unreadable document) counts as alive: being wrong that way
only keeps storage longer.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

from replaystore.errors import CorruptObjectError
from replaystore.store import layout, records
from replaystore.store.storage import Storage

LOCK = "flock"  # the registration's "lock" value: its writer holds a flock on it while alive


def registration(storage: Storage) -> dict[str, object]:
    """What a new writer's registration says besides its number: host, pid, time, lock."""
    doc: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid(), "time_ns": time.time_ns()}
    if storage.local_path(layout.WRITERS) is not None:
        doc["lock"] = LOCK
    return doc


def hold(storage: Storage, writer: int) -> int | None:
    """Take writer ``writer``'s lock; the descriptor to pass to :func:`release` (None: no lock).

    Blocks only while another process is testing the lock (microseconds). Where the
    filesystem refuses locks none is held; testers meet the same refusal and keep
    treating the writer as alive.
    """
    path = storage.local_path(layout.writer_record(writer))
    if path is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(storage: Storage, writer: int, fd: int | None) -> None:
    """Mark writer ``writer`` closed (after its last commit) and drop the lock :func:`hold` took
    (also when the marker could not be created: the writer is done either way)."""
    try:
        storage.create(layout.writer_closed(writer), records.encode({"writer": writer, "time_ns": time.time_ns()}))
    finally:
        if fd is not None:
            os.close(fd)


def _document(storage: Storage, path: str) -> dict[str, object] | None:
    try:
        return records.decode(path, storage.read(path))
    except (OSError, CorruptObjectError):
        return None


def is_gone(storage: Storage, writer: int) -> bool:
    """Whether writer ``writer`` closed, or died on this host holding its lock; False when unsure."""
    if storage.exists(layout.writer_closed(writer)):
        return _document(storage, layout.writer_closed(writer)) is not None
    path = storage.local_path(layout.writer_record(writer))
    doc = _document(storage, layout.writer_record(writer))
    if path is None or doc is None or doc.get("lock") != LOCK or doc.get("host") != socket.gethostname():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK): alive; anything else: unknown, so alive
        return False
    finally:
        os.close(fd)  # (and with it the lock just taken)
    return True
