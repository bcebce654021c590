"""The storage protocol the format needs, and its backends (local files, any fsspec filesystem).

The format asks four things of storage (docs/FORMAT.md, "Storage guarantees"):
whole-object writes that become visible atomically or not at all to readers that
only follow commit records; create-if-absent for commit records; read-after-write
consistency for objects and listings; delete. Paths are '/'-separated and relative
to the store root.
"""

from __future__ import annotations

import abc
import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from replaystore.errors import ReplayStoreError
from replaystore.store.chunkcache import StoreCache


class StorageError(ReplayStoreError):
    """The storage backend failed or lacks a guarantee the format needs."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its path under the store root, size and last modification (storage clock)."""

    path: str
    size: int
    mtime_ns: int


Buffer = bytes | memoryview | np.ndarray
"""Bytes to write: ``bytes``, or any C-contiguous buffer (a uint8 view of an array)."""


class ObjectStream:
    """A data object written piece by piece (appended to, truncated back), completed and made
    durable by :meth:`Storage.write_objects`; nothing references it before. This base keeps
    copies of the pieces in memory and the object is written whole at completion (a buffered
    stream; :meth:`Storage.open_stream` may instead write the pieces as they come)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self._pieces: list[bytes] = []

    def write(self, pieces: Sequence[Buffer]) -> None:
        """Append ``pieces`` (copied or written out now: the caller may reuse its buffers)."""
        for piece in pieces:
            data = bytes(piece)
            self._pieces.append(data)
            self.size += len(data)

    def truncate(self, size: int) -> None:
        """Cut the object back to its first ``size`` bytes."""
        data = self.data()[:size]
        self._pieces, self.size = [data], len(data)

    def data(self) -> bytes:
        """Everything written so far."""
        return b"".join(self._pieces)

    def pieces(self) -> list[bytes]:
        """Everything written so far, as the pieces kept (a buffered stream's)."""
        return self._pieces

    def close(self) -> None:
        """Release the stream's resources (after completion, or to abandon it)."""
        self._pieces = []


class Storage(abc.ABC):
    """A flat key space of immutable objects under one root."""

    url: str
    remote: bool = False
    """True for object stores across a network (S3): readers cache their chunk objects locally."""
    cache: StoreCache | None = None
    """Where chunk reads (``zarrio.read_array``) go through a local disk cache; set by ``open_store``."""

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """The whole object; FileNotFoundError if absent."""

    def download(self, path: str, local: str) -> None:
        """Write the object to the local file ``local`` (object stores stream it); FileNotFoundError if absent."""
        data = self.read(path)
        with open(local, "wb") as f:
            f.write(data)

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        """Each object whole, None where absent (any other error raises). Object stores read them
        concurrently: a reader probing many writers' next commit records pays one round trip."""
        out: list[bytes | None] = []
        for path in paths:
            try:
                out.append(self.read(path))
            except FileNotFoundError:
                out.append(None)
        return out

    @abc.abstractmethod
    def write(self, path: str, data: bytes | memoryview) -> None:
        """Write a data object durably (it is never referenced before this returns)."""

    @abc.abstractmethod
    def create(self, path: str, data: bytes) -> bool:
        """Create ``path`` atomically and durably if absent; False (writing nothing) if it exists."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names (not paths) directly under ``prefix``; empty if none."""

    def list_changed(self, prefix: str, token: object) -> tuple[list[str] | None, object]:
        """``(list(prefix), token)``, or ``(None, token)`` where this storage can tell that no
        directory was added under ``prefix`` or removed from it since the listing that returned
        ``token`` (None: no such listing). Entries that are not directories may have changed."""
        return self.list(prefix), None

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Remove an object or, recursively, a prefix; absent paths are ignored."""

    @abc.abstractmethod
    def size(self, path: str) -> int: ...

    def local_path(self, path: str) -> str | None:
        """A filesystem path for memory-mapping, when the backend has one."""
        return None

    def check_create(self) -> None:
        """Raise StorageError if this storage does not honour create-if-absent (a no-op where it always does)."""

    def sync_dirs(self, paths: list[str]) -> None:
        """Make the directory entries of written ``paths`` durable (local filesystems only)."""

    def open_stream(self, path: str) -> ObjectStream:
        """A data object to be written piece by piece, complete only once passed to
        :meth:`write_objects`. This default is buffered (copies of the pieces in memory)."""
        return ObjectStream(path)

    def write_objects(self, objects: Mapping[str, Sequence[Buffer]], streams: Sequence[ObjectStream] = ()) -> None:
        """Write data objects, each the concatenation of its buffers, and complete ``streams``
        (each holding what was written to it); all of them (and their directory entries) are
        durable when this returns. This default writes one after another."""
        for path, parts in objects.items():
            self.write(path, parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts))
        for stream in streams:
            self.write(stream.path, stream.data())
        self.sync_dirs([*objects, *(s.path for s in streams)])

    def read_array(self, path: str, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """``prod(shape)`` items of an object from byte ``offset`` as an array (memory-mapped where possible)."""
        count = int(np.prod(shape))
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        local = self.local_path(path)
        if local is not None:
            return np.memmap(local, dtype=dtype, mode="r", shape=shape, offset=offset)
        data = self.read(path)
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)

    def total_size(self, prefix: str = "") -> int:
        """Bytes stored under ``prefix`` (recursively)."""
        total = 0
        for name in self.list(prefix):
            path = f"{prefix}/{name}" if prefix else name
            total += self.total_size(path) if self.is_dir(path) else self.size(path)
        return total

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool: ...

    def delete_objects(self, paths: list[str]) -> None:
        """Remove these objects (not prefixes); absent ones are ignored. Backends may batch the requests."""
        for path in paths:
            self.delete(path)

    def walk(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix``, recursively, temporary (``.tmp-``) names included.

        This default serves backends with a local path (``local_path``); others override it.
        """
        top = self.local_path(prefix)
        root = self.local_path("")
        if top is None or root is None:
            raise NotImplementedError(f"{type(self).__name__} cannot list objects with their times")
        out = []
        for directory, _, files in os.walk(top):
            for name in files:
                full = os.path.join(directory, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # deleted since the listing
                    continue
                out.append(ObjectInfo(os.path.relpath(full, root).replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
        return sorted(out, key=lambda o: o.path)


def _raise_open_file_limit() -> None:
    """Lift the soft open-file limit to the hard one: each memory map holds a descriptor
    (CPython's mmap keeps a dup), and a reader maps one object per column and fragment."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not permitted: keep the limit
        pass


class _FileStream(ObjectStream):
    """A local file written as the pieces come (into the page cache; the fsync at completion
    writes it back): for writing from memory maps (merges) without a copy."""

    def __init__(self, storage: LocalStorage, path: str) -> None:
        super().__init__(path)
        full = storage._p(path)
        directory = os.path.dirname(full)
        storage._makedirs(directory)
        self.fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        storage._entry_made(directory)

    def write(self, pieces: Sequence[Buffer]) -> None:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            while view:
                n = os.pwrite(self.fd, view, self.size)
                view = view[n:]
                self.size += n

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LocalStorage(Storage):
    """A directory on a local filesystem. Commit records use link(2) for create-if-absent.

    Durability of directory entries: a handle fsyncs a directory when it created an entry in
    it since its last fsync of it started (``_dirty``), or when a directory on the way to a
    written object is not known to have a durable entry in its parent (``_durable``: those
    whose parent this handle fsynced after seeing them). The store root and the levels above
    a fragment are therefore fsynced once per handle, not on every commit.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self._dir_lock = threading.Lock()
        self._dirty: dict[str, int] = {}  # directory -> entries created in it not yet covered by an fsync of it
        self._durable: set[str] = {self.root}  # directories whose entry in their parent is durable
        _raise_open_file_limit()

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path) if path else self.root

    def read(self, path: str) -> bytes:
        with open(self._p(path), "rb") as f:
            return f.read()

    def _fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _entry_made(self, directory: str) -> None:
        """Note that an entry was just created in ``directory`` (after creating it: see _unsynced)."""
        with self._dir_lock:
            self._dirty[directory] = self._dirty.get(directory, 0) + 1

    def _makedirs(self, directory: str) -> None:
        """``os.makedirs(directory, exist_ok=True)``, noting each directory it creates in its parent."""
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        if parent != directory:
            self._makedirs(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:  # made concurrently: its entry counts as unknown (not in _durable)
            if not os.path.isdir(directory):
                raise
            return
        self._entry_made(parent)

    def _unsynced(self, paths: Iterable[str]) -> list[tuple[str, int, list[str]]]:
        """The directories to fsync so that every entry from the root down to each of ``paths``
        is durable: ``(directory, its dirty count now, its children to remember as durable)``.

        Counts are read after the entries were created, so an fsync that starts later covers
        them; an entry created concurrently after the read keeps its directory dirty.
        """
        need: dict[str, list[str]] = {}
        with self._dir_lock:
            for path in paths:
                d = os.path.dirname(self._p(path))
                while True:
                    if d in self._dirty:
                        need.setdefault(d, [])
                    if d == self.root or not d.startswith(self.root + os.sep):
                        break
                    parent = os.path.dirname(d)
                    if d not in self._durable and parent not in self._dirty:
                        need.setdefault(parent, []).append(d)  # an existing directory of unknown durability
                    d = parent
            return [(d, self._dirty.get(d, 0), children) for d, children in need.items()]

    def _synced(self, directory: str, count: int, children: list[str]) -> None:
        """Record a completed fsync of ``directory`` that started after ``count`` entries were noted."""
        with self._dir_lock:
            left = self._dirty.get(directory, 0) - count
            if left > 0:
                self._dirty[directory] = left
            else:
                self._dirty.pop(directory, None)
            self._durable.update(children)

    def _write_synced(self, full: str, data: bytes | memoryview) -> None:
        with open(full, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._entry_made(os.path.dirname(full))

    def write(self, path: str, data: bytes | memoryview) -> None:
        full = self._p(path)
        self._makedirs(os.path.dirname(full))
        self._write_synced(full, data)

    def open_stream(self, path: str) -> ObjectStream:
        return _FileStream(self, path)

    def create_sized(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Create each file ``path`` (none may exist) of ``sizes[path]`` bytes that read as zeros
        (sparse where the filesystem allows) and return read-write descriptors of them; durable,
        with their directory entries, once passed to :meth:`write_objects` as ``created``.
        On error the files created are closed and removed."""
        fds: dict[str, int] = {}
        try:
            for path, size in sizes.items():
                full = self._p(path)
                directory = os.path.dirname(full)
                self._makedirs(directory)
                fds[path] = fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                self._entry_made(directory)
                os.ftruncate(fd, size)
        except BaseException:
            for path, fd in fds.items():
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._p(path))
            raise
        return fds

    def write_objects(self, objects: Mapping[str, Sequence[Buffer]], streams: Sequence[ObjectStream] = (),
                      created: Mapping[str, int] | None = None) -> None:
        """Hand each file stream's fsync to a thread pool, write each buffered stream and object
        and hand its fsync over at once (the disk writes it back while the next ones are
        written), then fsync the directories whose entries are not yet durable (see the class)
        the same way; returns when every fsync has. Concurrent fsyncs share journal commits,
        where one after another paid a commit each. Nothing is referenced before this returns.
        ``created``: files made by :meth:`create_sized` (path -> descriptor), made durable too."""
        pool = self._fsync_pool()
        files: list[Any] = []
        created = created or {}
        syncs: list[Future[None]] = [pool.submit(os.fsync, fd) for fd in created.values()]
        whole: list[tuple[str, Sequence[Buffer]]] = []
        for stream in streams:
            if isinstance(stream, _FileStream):
                syncs.append(pool.submit(os.fsync, stream.fd))
            else:
                whole.append((stream.path, stream.pieces()))
        try:
            for path, parts in [*whole, *objects.items()]:
                full = self._p(path)
                directory = os.path.dirname(full)
                self._makedirs(directory)
                f = open(full, "wb")  # noqa: SIM115 - closed below, once its fsync has ended
                files.append(f)
                self._entry_made(directory)
                f.writelines(parts)
                f.flush()
                syncs.append(pool.submit(os.fsync, f.fileno()))
            for job in self._unsynced([*objects, *(s.path for s in streams), *created]):
                syncs.append(pool.submit(self._sync_path, *job))
        finally:
            wait(syncs)  # every fsync ends before any descriptor is closed
            for f in files:
                f.close()
        for sync in syncs:
            sync.result()  # raises the first error

    _pool: ClassVar[tuple[int, ThreadPoolExecutor] | None] = None  # (owning pid, pool): rebuilt after fork
    _pool_lock: ClassVar[threading.Lock] = threading.Lock()
    FSYNC_THREADS: ClassVar[int] = 8

    @classmethod
    def _fsync_pool(cls) -> ThreadPoolExecutor:
        with cls._pool_lock:
            if cls._pool is None or cls._pool[0] != os.getpid():
                cls._pool = (os.getpid(), ThreadPoolExecutor(cls.FSYNC_THREADS, thread_name_prefix="replaystore-fsync"))
            return cls._pool[1]

    def _sync_entries(self, paths: Iterable[str]) -> None:
        """fsync, concurrently, the directories that make the entries of ``paths`` durable (see the class)."""
        jobs = self._unsynced(paths)
        for _ in self._fsync_pool().map(lambda job: self._sync_path(*job), jobs):
            pass

    def _sync_path(self, directory: str, count: int, children: list[str]) -> None:
        self._fsync_dir(directory)
        self._synced(directory, count, children)

    def sync_dirs(self, paths: list[str]) -> None:
        """Make the directory entries of written ``paths`` durable: their directories and the
        directories above them up to the root, where this handle has not already (see the class).

        A write may have created directories (a fragment's, its arrays'): the entry of each new
        directory lives in its parent, so the parents must be synced too, or a power loss after
        the commit record is durable could still lose the data it references.
        """
        self._sync_entries(paths)

    def create(self, path: str, data: bytes) -> bool:
        return self.create_after(path, data, ())

    def create_after(self, path: str, data: bytes, fds: Sequence[int], check: Callable[[], None] | None = None) -> bool:
        """:meth:`create`, publishing ``path`` only once the descriptors ``fds`` are ``fdatasync``ed
        (concurrently with the new file's own fsync: one journal commit can cover both) and
        ``check()`` has returned (it may raise: then nothing is created)."""
        full = self._p(path)
        directory = os.path.dirname(full)
        new_root = not os.path.isdir(self.root)
        self._makedirs(directory)
        if new_root:  # the store's own directory entry
            self._fsync_dir(os.path.dirname(self.root))
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        try:
            syncs = [self._fsync_pool().submit(os.fdatasync, fd) for fd in fds]
            self._write_synced(tmp, data)
            for done in syncs:
                done.result()
            if check is not None:
                check()
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        try:
            os.link(tmp, full)  # atomic, fails if the name exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
            # the record's entry, and those of directories made for it (concurrently, as in write_objects)
            self._sync_entries([path])

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._p(prefix)) if not n.startswith(".tmp-"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_changed(self, prefix: str, token: object) -> tuple[list[str] | None, object]:
        """Where the filesystem counts a directory's subdirectories in its link count (2 + their
        number: ext4, XFS, tmpfs; not btrfs, and not ext4 past 65,000), an unchanged count means none
        came or went: the directory is stat'ed first, then listed, and the count is a token only if
        it matches the listing (a subdirectory made in between shows as a change next time)."""
        full = self._p(prefix)
        try:
            links = os.stat(full).st_nlink
        except (FileNotFoundError, NotADirectoryError):
            return [], None
        if token is not None and token == links:
            return None, token
        try:
            with os.scandir(full) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return [], None
        dirs = sum(d for _, d in entries)
        return sorted(n for n, _ in entries if not n.startswith(".tmp-")), (links if links == dirs + 2 else None)

    def delete(self, path: str) -> None:
        import shutil

        full = self._p(path)
        if os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
            with self._dir_lock:  # a directory made again at this path has an entry of unknown durability
                gone = [d for d in (*self._durable, *self._dirty) if d == full or d.startswith(full + os.sep)]
                self._durable.difference_update(gone)
                for d in gone:
                    self._dirty.pop(d, None)
        else:
            try:
                os.unlink(full)
            except FileNotFoundError:
                pass

    def size(self, path: str) -> int:
        return os.path.getsize(self._p(path))

    def total_size(self, prefix: str = "") -> int:
        """Bytes the files under ``prefix`` occupy on disk (allocated blocks: a segment's chunk
        files are sparse past what was written)."""
        total = 0
        for directory, _, files in os.walk(self._p(prefix)):
            for name in files:
                try:
                    total += os.stat(os.path.join(directory, name)).st_blocks * 512
                except FileNotFoundError:  # deleted meanwhile
                    pass
        return total

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))

    def local_path(self, path: str) -> str | None:
        return self._p(path)


_MEMORY_LOCK = threading.RLock()


def _new_memory_lock() -> None:
    """In a forked child (a DataLoader worker, say) no thread holds the lock: a parent thread
    inside a ``memory://`` call at the fork would otherwise leave the child's copy held forever."""
    global _MEMORY_LOCK
    _MEMORY_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_memory_lock)

CONFLICT_RETRIES = 12
CONFLICT_BACKOFF_S = 0.02
CONFLICT_BACKOFF_MAX_S = 2.0
_CONDITIONAL_PUT_CHECKED: set[tuple[str, str]] = set()  # (endpoint options, bucket) that honoured it
_CHECK_LOCK = threading.Lock()
PROBE_PREFIX = ".tmp-create-probe-"


class _Serialized:
    """An fsspec filesystem whose every call runs under one lock. fsspec's ``memory://`` keeps
    all files in one process-wide dict and walks it unlocked (``find``, ``rm``, ``ls``); a
    thread writing meanwhile (a writer's I/O threads, a DataLoader's) can make that walk
    raise "dictionary changed size during iteration"."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with _MEMORY_LOCK:
                return attr(*args, **kwargs)
        return call


class FsspecStorage(Storage):
    """``s3://`` and ``memory://`` through fsspec. Create-if-absent: S3 conditional PUT
    (``If-None-Match: *``, checked to be honoured before the first create through an
    endpoint); ``memory://`` checks and writes under the process lock that every
    ``memory://`` call takes (it is process-local anyway). Any other fsspec filesystem is
    refused with StorageError when opened."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = root.rstrip("/")
        self.conflict_retries = CONFLICT_RETRIES  # attempts of a conditional PUT answered 409 (see _conditional_put)
        self.conflict_backoff_s = CONFLICT_BACKOFF_S
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if "memory" in protocols:
            self._create_mode = "lock"
            self.fs = _Serialized(self.fs)
        elif {"s3", "s3a"} & set(protocols):
            self._create_mode = "conditional-put"
            self.remote = True
        else:
            raise StorageError(
                f"{url}: fsspec filesystem {protocols[0]!r} offers no known create-if-absent primitive; "
                "replaystore refuses it rather than risk lost commits (local paths, memory:// and s3:// work)")

    def _p(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._p(path))

    def download(self, path: str, local: str) -> None:
        self.fs.get_file(self._p(path), local)  # s3fs: one GET, the body copied in 64 KiB pieces

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        if len(paths) < 2:
            return super().read_many(paths)
        full = [self._p(p) for p in paths]
        got = self.fs.cat(full, on_error="return")  # s3fs: concurrent GETs on its event loop
        out: list[bytes | None] = []
        for f in full:
            value = got[f]
            if isinstance(value, FileNotFoundError):
                out.append(None)
            elif isinstance(value, BaseException):
                raise value
            else:
                out.append(value)
        return out

    def write(self, path: str, data: bytes | memoryview) -> None:
        self.fs.pipe_file(self._p(path), bytes(data))

    def create(self, path: str, data: bytes) -> bool:
        full = self._p(path)
        if self._create_mode == "lock":
            with _MEMORY_LOCK:
                if self.fs.exists(full):
                    return False
                self.fs.pipe_file(full, data)
                return True
        self.check_create()
        return self._conditional_put(full, data)

    def check_create(self) -> None:
        """Refuse an S3-API endpoint that ignores ``If-None-Match: *`` (checked once per endpoint and bucket).

        Before the first create-if-absent through an endpoint, create a fresh probe
        object twice: the second create must fail. A server that overwrites instead
        would let two writers both take one commit number (one commit lost), so the
        store is refused with StorageError before anything else is created.
        """
        if self._create_mode != "conditional-put":
            return
        key = (repr(sorted(self.storage_options.items())), self.root.split("/", 1)[0])
        with _CHECK_LOCK:
            if key in _CONDITIONAL_PUT_CHECKED:
                return
            probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"  # a temporary name: readers ignore it (FORMAT.md)
            try:
                honoured = self._conditional_put(self._p(probe), b"1") and not self._conditional_put(
                    self._p(probe), b"2")
            finally:
                self.delete(probe)
            if not honoured:
                raise StorageError(
                    f"{self.url}: the S3 endpoint ignores conditional writes (PUT If-None-Match: * overwrote an "
                    "existing object); replaystore refuses it rather than risk lost commits. Use an S3 service "
                    "that supports conditional writes (AWS S3 does)")
            _CONDITIONAL_PUT_CHECKED.add(key)

    def _conditional_put(self, full: str, data: bytes) -> bool:
        """``PUT If-None-Match: *``: True on 200, False on 412; 409 is retried with backoff.

        S3 answers 409 ConditionalRequestConflict while another conditional write to the
        same key is in flight; that attempt wrote nothing, so it is repeated (exponential
        backoff with jitter, ``conflict_retries`` attempts in all) until the answer is
        definitive. A 412 is checked by reading the object back: if it holds our bytes, an
        earlier attempt of ours landed but its answer was lost (s3fs and botocore repeat a
        request after a 5xx or a dropped connection), and the create is ours.
        """
        delay = self.conflict_backoff_s
        for attempt in range(self.conflict_retries):
            if attempt:
                time.sleep(delay * (0.5 + random.random()))  # backoff between attempts, not synchronisation
                delay = min(delay * 2, CONFLICT_BACKOFF_MAX_S)
            try:
                self.fs.pipe_file(full, data, mode="create")
                return True
            except FileExistsError:
                return self._holds(full, data)
            except OSError as exc:
                code, status = _s3_error(exc)
                if code == "PreconditionFailed" or status == 412:
                    return self._holds(full, data)
                if code != "ConditionalRequestConflict" and status != 409:
                    raise
        raise StorageError(f"{full}: conditional create still answered 409 ConditionalRequestConflict after "
                           f"{self.conflict_retries} attempts; the key is contended or the endpoint is stuck")

    def _holds(self, full: str, data: bytes) -> bool:
        """Whether the object at ``full`` (which a 412 said exists) holds exactly ``data``."""
        try:
            return bool(self.fs.cat_file(full) == data)
        except FileNotFoundError:  # deleted in between: not ours to claim
            return False

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._p(path))

    def list(self, prefix: str) -> list[str]:
        full = self._p(prefix)
        try:
            entries = self.fs.ls(full, detail=False, refresh=True) if self._create_mode != "lock" \
                else self.fs.ls(full, detail=False)
        except FileNotFoundError:
            return []
        names = {e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != full.lstrip("/")
                 and e.rstrip("/") != full}
        return sorted(n for n in names if not n.startswith(".tmp-"))

    def delete(self, path: str) -> None:
        full = self._p(path)
        try:
            if self.fs.isdir(full):
                self.fs.rm(full, recursive=True)
            else:
                self.fs.rm_file(full)
        except FileNotFoundError:
            pass

    def size(self, path: str) -> int:
        return int(self.fs.size(self._p(path)))

    def is_dir(self, path: str) -> bool:
        return bool(self.fs.isdir(self._p(path)))

    def delete_objects(self, paths: list[str]) -> None:
        """One bulk request per 1000 objects on S3 (s3fs ``rm`` of a list)."""
        if paths:
            try:
                self.fs.rm([self._p(p) for p in paths])
            except FileNotFoundError:
                pass

    def walk(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` with its size and modification time (S3: LastModified)."""
        full = self._p(prefix)
        if self._create_mode != "lock":
            self.fs.invalidate_cache(full)
        try:
            found = self.fs.find(full, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        base = self.fs._strip_protocol(self.root).rstrip("/")
        out = []
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = name.lstrip("/")[len(base.lstrip("/")):].lstrip("/")
            out.append(ObjectInfo(rel, int(info.get("size") or 0), _mtime_ns(info)))
        return sorted(out, key=lambda o: o.path)


def _s3_error(exc: BaseException) -> tuple[str, int | None]:
    """The S3 error code and HTTP status behind an s3fs exception (its cause is botocore's ClientError)."""
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return (str(response.get("Error", {}).get("Code", "")),
                    response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    text = repr(exc)  # some s3fs versions keep only the message
    for code, status in (("PreconditionFailed", 412), ("ConditionalRequestConflict", 409)):
        if code in text:
            return code, status
    return "", None


def _mtime_ns(info: Mapping[str, Any]) -> int:
    """An fsspec entry's modification time in ns (s3fs: ``LastModified``; memory: ``created``)."""
    value = info.get("LastModified", info.get("mtime", info.get("created")))
    if value is None:
        raise StorageError(f"{info.get('name')}: the backend reports no modification time")
    if hasattr(value, "timestamp"):
        value = value.timestamp()
    return int(float(value) * 1e9)


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """A backend for a local path, ``file://`` URL or any supported fsspec URL."""
    if not isinstance(url, (str, os.PathLike)):
        raise StorageError(f"url: expected a path or URL string, got {type(url).__name__}")
    url = os.fspath(url)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        return LocalStorage(url)
    return FsspecStorage(url, storage_options)
