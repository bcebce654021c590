"""Storage on a local filesystem.

A directory; create-if-absent by link(2); every write and directory entry made durable with
fsync.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar

from replaystore.errors import CorruptObjectError, UnsafeNameError
from replaystore.store.storage.base import Buffer, ObjectStream, Storage, _too_large, file_kind


def _raise_open_file_limit() -> None:
    """Lift the soft open-file limit to the hard one.

    Each memory map holds a descriptor (CPython's mmap keeps a dup), and a reader maps one
    object per column and fragment.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not permitted: keep the limit
        pass


class _FileStream(ObjectStream):
    """A local file written as the pieces come (into the page cache; the fsync at completion writes it back).

    For writing from memory maps (merges) without a copy.
    """

    def __init__(self, storage: LocalStorage, path: str) -> None:
        super().__init__(path)
        full = storage._inside(path)
        directory = os.path.dirname(full)
        storage._makedirs(directory)
        self.fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        storage._entry_made(directory)

    def write(self, pieces: Sequence[Buffer]) -> None:
        for piece in pieces:
            # numpy declares ndarray's buffer protocol (__buffer__) only for Python >= 3.12
            view = memoryview(piece).cast("B")  # type: ignore[arg-type]
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

    Durability of directory entries: a handle fsyncs a directory when it created
    an entry in it since its last fsync of it started (``_dirty``), or when a
    directory on the way to a written object is not known to have a durable
    entry in its parent (``_durable``: those whose parent this handle fsynced
    after seeing them). The store root and the levels above a fragment are
    therefore fsynced once per handle, not on every commit. Every path is
    checked to stay under the root (:class:`UnsafeNameError` otherwise).
    Construction touches nothing on disk but lifts the soft open-file limit to
    the hard one (each memory map holds a descriptor).

    Parameters
    ----------
    root : str
        The store's directory (need not exist yet).
    """

    supports_atomic_create = True
    supports_consistent_listing = True
    supports_local_paths = True
    supports_memory_map = True
    supports_in_place_writes = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.real_root = os.path.realpath(self.root)  # a store reached through a symlink is that directory
        self.url = self.root
        self._dir_lock = threading.Lock()
        self._dirty: dict[str, int] = {}  # directory -> entries created in it not yet covered by an fsync of it
        self._durable: set[str] = {self.root}  # directories whose entry in their parent is durable
        _raise_open_file_limit()

    def _p(self, path: str) -> str:
        """The file of ``path``, a '/'-separated path relative to the root.

        Refuses (with :class:`UnsafeNameError`) an absolute path, an empty, ``.`` or ``..``
        component and NUL, whatever the caller: nothing a store names can point above its root.
        Cost: a split.
        """
        if not path:
            return self.root
        parts = path.rstrip("/").split("/")
        if path[0] == "/" or "\x00" in path or any(p in ("", ".", "..") for p in parts) or (
                os.sep != "/" and os.sep in path):
            raise UnsafeNameError(path, "not a relative path inside the store (absolute, '..', '.', '//' or NUL)")
        return os.path.join(self.root, *parts)

    def _inside(self, path: str, follow_last: bool = True) -> str:
        """:meth:`_p`, checked also to stay under the root once symbolic links are followed.

        For every write, delete and data read (a link planted in a store cannot redirect them).
        ``follow_last=False`` checks only the directories on the way (a delete removes a link
        itself, never what it points to). Cost: one ``realpath`` (an lstat per path component).
        """
        full = self._p(path)
        real = os.path.realpath(full if follow_last or not path else os.path.dirname(full))
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            raise UnsafeNameError(path, f"leads outside the store root through a symbolic link (to {real})")
        return full

    def read(self, path: str) -> bytes:
        # docstring inherited:
        # The whole file; refused unread where ``path`` is not a regular file.
        #
        # Not a regular file: a FIFO, a device, a directory, a symlink to one. It is
        # opened non-blocking and checked with ``fstat`` first, so a FIFO never blocks
        # and ``/dev/zero`` is never read.
        return self.read_capped(path, None)

    def read_capped(self, path: str, limit: int | None) -> bytes:
        # docstring inherited:
        # :meth:`read`, refused before reading where the file is over ``limit`` bytes.
        fd = self.open_local(path)
        with open(fd, "rb", closefd=True) as f:
            size = os.fstat(fd).st_size
            if limit is not None and size > limit:
                raise _too_large(path, size, limit)
            return f.read()

    def open_local(self, path: str) -> int:
        # docstring inherited:
        # A read-only descriptor of ``path``'s file, checked to be a regular file; the caller closes it.
        #
        # Opened non-blocking and checked with ``fstat`` before anything reads or maps
        # it, so a FIFO, a socket, a device or a directory in place of an object is
        # refused at once (never waited on, never read); the check is on the opened
        # file itself, so nothing can swap the file between check and use. A symbolic
        # link is followed only where it stays inside the store root.
        try:
            fd = os.open(self._inside(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP, errno.ENODEV, errno.EISDIR):
                # a socket or a device without a driver (ENXIO, ENODEV), a loop of symbolic links
                raise CorruptObjectError(path, f"not a regular file ({exc.strerror}): refused unread") from None
            raise
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise CorruptObjectError(path, f"not a regular file ({file_kind(mode)}): refused unread")
        except BaseException:
            os.close(fd)
            raise
        return fd

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
        """The directories to fsync so that every entry from the root down to each of ``paths`` is durable.

        ``(directory, its dirty count now, its children to remember as durable)``.

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
        # docstring inherited
        full = self._inside(path)
        self._makedirs(os.path.dirname(full))
        self._write_synced(full, data)

    def open_stream(self, path: str) -> ObjectStream:
        # docstring inherited:
        # A local file written as the pieces come (no copy).
        #
        # Complete only once passed to :meth:`write_objects`.
        return _FileStream(self, path)

    def create_sized(self, sizes: Mapping[str, int]) -> dict[str, int]:
        # docstring inherited:
        # Sparse where the filesystem allows; durable, with their directory entries,
        # once passed to :meth:`write_objects` as ``created``. On error the files
        # created are closed and removed.
        fds: dict[str, int] = {}
        try:
            for path, size in sizes.items():
                full = self._inside(path)
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
        # docstring inherited:
        # Write objects and complete streams with concurrent fsyncs; durable when this returns.
        #
        # Hand each file stream's fsync to a thread pool, write each buffered stream
        # and object and hand its fsync over at once (the disk writes it back while
        # the next ones are written), then fsync the directories whose entries are not
        # yet durable (see the class) the same way; returns when every fsync has.
        # Concurrent fsyncs share journal commits, where one after another paid a
        # commit each. Nothing is referenced before this returns.
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
                full = self._inside(path)
                directory = os.path.dirname(full)
                self._makedirs(directory)
                f = open(full, "wb")  # noqa: SIM115 - closed below, once its fsync has ended
                files.append(f)
                self._entry_made(directory)
                # numpy declares ndarray's buffer protocol (__buffer__) only for Python >= 3.12
                f.writelines(parts)  # type: ignore[arg-type]
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
        # docstring inherited:
        # Make the directory entries of written ``paths`` durable.
        #
        # Their directories and the directories above them up to the root, where this
        # handle has not already (see the class). A write may have created directories
        # (a fragment's, its arrays'): the entry of each new directory lives in its
        # parent, so the parents must be synced too, or a power loss after the commit
        # record is durable could still lose the data it references.
        self._sync_entries(paths)

    def create(self, path: str, data: bytes) -> bool:
        # docstring inherited:
        # Create ``path`` atomically and durably if absent.
        return self.create_after(path, data, ())

    def create_after(self, path: str, data: bytes, fds: Sequence[int], check: Callable[[], None] | None = None) -> bool:
        # docstring inherited:
        # The fdatasyncs run concurrently with the new file's own fsync (one journal
        # commit can cover both), and ``check()`` must have returned (it may raise:
        # then nothing is created). The file is written under a temporary name and
        # published by ``link(2)``, atomic and failing if the name exists.
        full = self._inside(path)
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
        # docstring inherited
        return os.path.exists(self._p(path))

    def list(self, prefix: str) -> list[str]:
        # docstring inherited
        try:
            return sorted(n for n in os.listdir(self._p(prefix)) if not n.startswith(".tmp-"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_changed(self, prefix: str, token: object) -> tuple[builtins.list[str] | None, object]:
        # docstring inherited:
        # ``(list(prefix), token)``, or ``(None, token)`` where no subdirectory came or went.
        #
        # Where the filesystem counts a directory's subdirectories in its link count
        # (2 + their number: ext4, XFS, tmpfs; not btrfs, and not ext4 past 65,000), an
        # unchanged count means none came or went: the directory is stat'ed first,
        # then listed, and the count is a token only if it matches the listing (a
        # subdirectory made in between shows as a change next time).
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
        # docstring inherited
        import shutil

        full = self._inside(path, follow_last=False)
        if os.path.isdir(full) and not os.path.islink(full):  # a link is removed, never followed
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
        # docstring inherited
        st = os.stat(self._p(path))
        if not stat.S_ISREG(st.st_mode):
            raise CorruptObjectError(path, f"not a regular file ({file_kind(st.st_mode)})")
        return st.st_size

    def total_size(self, prefix: str = "") -> int:
        # docstring inherited:
        # Bytes ``prefix`` occupies on disk, counted as ``du -s --block-size=1`` counts them.
        #
        # Allocated blocks (``st_blocks * 512``, without following links) of ``prefix`` itself
        # and of every file, directory and link under it, a file with several links once. A
        # segment's chunk files are sparse past what was written: their holes take no blocks.
        return _du(self._p(prefix), apparent=False)

    def apparent_size(self, prefix: str = "") -> int:
        # docstring inherited:
        # Bytes ``prefix`` holds by the sizes of its entries, counted as ``du -s -b`` counts them.
        #
        # ``st_size`` (without following links) of ``prefix`` itself and of every file,
        # directory and link under it, a file with several links once. A sparse file's
        # unwritten tail counts; :meth:`total_size` counts allocated blocks.
        return _du(self._p(prefix), apparent=True)

    def is_dir(self, path: str) -> bool:
        # docstring inherited
        return os.path.isdir(self._p(path))

    def local_path(self, path: str) -> str | None:
        # docstring inherited:
        # The file of ``path`` under the store root (for memory-mapping).
        return self._inside(path)


def _du(top: str, apparent: bool) -> int:
    """What ``du -s`` counts under ``top``: allocated bytes, or (``apparent``) sizes, as ``du -s -b``.

    Every entry's ``lstat`` (``top`` itself, directories, files and links; links are not
    followed), an inode with several links counted once; entries deleted meanwhile count 0.
    """
    seen: set[tuple[int, int]] = set()

    def size(path: str) -> int:
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # deleted meanwhile
            return 0
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:
                return 0
            seen.add((st.st_dev, st.st_ino))
        return st.st_size if apparent else st.st_blocks * 512

    total = size(top)
    for directory, dirs, files in os.walk(top):
        total += sum(size(os.path.join(directory, name)) for name in (*dirs, *files))
    return total
