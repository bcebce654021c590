"""A local disk cache of a remote store's chunk objects, memory-mapped by readers.

Each array is one chunk object (docs/FORMAT.md, "Fragments"), so a reader on S3 needs the
object whole. Without a cache every process keeps the objects it read in its own memory,
up to the whole store per DataLoader worker. With one, each object is downloaded once per
machine into a file that every process (workers, later runs) memory-maps: the bytes live
in the page cache, shared between processes and reclaimable by the kernel, and the
directory is kept under a byte budget by deleting its least recently used files (a reader
marks the files of fragments it saw leave the store as the least recently used).

This is sound because a committed data object is never modified (docs/FORMAT.md, "Reading
a store"): a path names the same bytes for the life of a store. Files are kept per store
identity (its URL and manifest, so a ``"w+"`` replace at the same URL is another store),
checked against the chunk's CRC32C before they are kept, and published by rename after an
fsync, so a crash leaves a file whole or absent. The cache is not part of the format.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import json
import mmap
import os
import shutil
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import numpy as np

from replaystore.errors import CorruptObjectError, StoreError
from replaystore.store.storage.base import Buffer, ObjectInfo, ObjectStream, Storage

DEFAULT_MAX_BYTES = 32 << 30
"""The default budget (bytes): this, or half the free space of the cache's disk if less."""
TMP = ".tmp-"
STALE_TMP_S = 3600.0  # temporary files older than this were left by a killed process


def default_directory() -> str:
    """The default cache directory.

    ``$REPLAYSTORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/replaystore``, else
    ``~/.cache/replaystore``.

    Returns
    -------
    str
        The directory path (not created here).
    """
    env = os.environ.get("REPLAYSTORE_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "replaystore")


class ChunkCache:
    """A directory of chunk objects of remote stores, shared by every process that names it.

    Each process counts the cache's size when it passes the budget by its own
    count and then prunes to seven eighths of it, so processes filling it at
    once may take it past the budget by up to an eighth each, until they count
    again. Files a process still maps survive their deletion until it unmaps
    them (closing, or refreshing past their eviction), so the disk may hold more
    meanwhile. Constructing one touches nothing on disk.

    Parameters
    ----------
    directory : str or os.PathLike, optional
        The cache's directory; None for :func:`default_directory`.
    max_bytes : int, optional
        The budget; None for :data:`DEFAULT_MAX_BYTES` or half the disk's free
        space when the cache first fills, whichever is less.

    Attributes
    ----------
    directory : str
        The absolute directory.
    max_bytes : int or None
        The budget (set on first use when None was given).

    Raises
    ------
    StoreError
        ``max_bytes`` is neither None nor a positive int.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                      or max_bytes <= 0):
            raise StoreError(f"cache max_bytes: expected None or a positive int, got {max_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory) if directory is not None else default_directory())
        self.max_bytes = max_bytes
        self._size: int | None = None  # bytes in the cache as this process last counted them, plus its files since

    def __repr__(self) -> str:
        """``ChunkCache(directory, max_bytes=...)``."""
        return f"ChunkCache({self.directory!r}, max_bytes={self.max_bytes!r})"

    def budget(self) -> int:
        """The byte budget in force.

        The first call without ``max_bytes`` creates the directory and measures its
        disk's free space.

        Returns
        -------
        int
            Bytes.
        """
        if self.max_bytes is None:
            os.makedirs(self.directory, exist_ok=True)
            self.max_bytes = min(DEFAULT_MAX_BYTES, shutil.disk_usage(self.directory).free // 2)
        return self.max_bytes

    def for_store(self, url: str, manifest: Mapping[str, Any]) -> StoreCache:
        """The part of the cache holding the objects of the store at ``url`` with ``manifest``.

        A store's identity is its URL and manifest, so a store replaced (``"w+"``)
        at the same URL gets another part.

        Parameters
        ----------
        url : str
            The store's URL.
        manifest : mapping
            The store's manifest document.

        Returns
        -------
        StoreCache
            The store's part of the cache.
        """
        identity = json.dumps({"url": url, "manifest": manifest}, sort_keys=True).encode()
        return StoreCache(self, os.path.join(self.directory, hashlib.sha256(identity).hexdigest()[:32]))

    def size(self) -> int:
        """Bytes of the files in the cache (temporary ones included).

        Cost: one walk of the directory tree.

        Returns
        -------
        int
            Bytes.
        """
        return sum(size for _, size, _ in _files(self.directory))

    def kept(self, size: int, keep: str) -> None:
        """Count a file of ``size`` bytes just kept, and prune when over budget.

        Prunes when this process's figure for the cache's size (from its last scan
        plus its own files since) passes the budget; that costs a walk of the
        directory tree.

        Parameters
        ----------
        size : int
            The file's size in bytes.
        keep : str
            The file's path, never deleted by this prune.
        """
        if self._size is not None and self._size + size <= self.budget():
            self._size += size
            return
        self._size = self.prune(keep, self.budget() - self.budget() // 8)  # room for the next files

    def prune(self, keep: str = "", target: int | None = None) -> int:
        """Delete least recently used files until the cache holds at most ``target`` bytes.

        Also deletes temporary files a killed process left (older than an hour).
        Cost: one walk of the directory tree and a sort of its files.

        Parameters
        ----------
        keep : str, optional
            A file never deleted.
        target : int, optional
            Bytes to keep at most; None: the budget.

        Returns
        -------
        int
            The bytes left.
        """
        files = _files(self.directory)
        budget = self.budget() if target is None else target
        stale = time.time_ns() - int(STALE_TMP_S * 1e9)
        total = 0
        kept = []
        for mtime, size, path in files:
            if os.path.basename(path).startswith(TMP) and mtime < stale:
                _unlink(path)
            else:
                total += size
                kept.append((mtime, size, path))
        for _, size, path in sorted(kept):
            if total <= budget:
                break
            if path != keep and not os.path.basename(path).startswith(TMP):
                _unlink(path)
                total -= size
        return total


def choose(cache: Any, remote: bool) -> ChunkCache | None:
    """The cache ``open_store(..., cache=)`` asks for.

    None (the default): a :class:`ChunkCache` in the default directory for
    remote stores, none otherwise; True: one for any backend without local
    files; a path: a ChunkCache there; a ChunkCache: itself; False: none.

    Parameters
    ----------
    cache : Any
        ``open_store``'s ``cache`` argument.
    remote : bool
        Whether the store is remote (S3).

    Returns
    -------
    ChunkCache or None
        The cache to use.

    Raises
    ------
    StoreError
        ``cache`` is none of the accepted kinds.
    """
    if cache is None:
        return ChunkCache() if remote else None
    if cache is True:
        return ChunkCache()
    if cache is False:
        return None
    if isinstance(cache, ChunkCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return ChunkCache(cache)
    raise StoreError(f"cache: expected None, a bool, a directory or a ChunkCache, got {cache!r}")


class StoreCache:
    """One store's objects in a :class:`ChunkCache` (files under ``root``, named by object path).

    Parameters
    ----------
    cache : ChunkCache
        The cache it belongs to.
    root : str
        Its directory.
    """

    def __init__(self, cache: ChunkCache, root: str) -> None:
        self.cache = cache
        self.root = root
        self.warned = False  # about objects it could not keep (once per store handle)

    def size(self) -> int:
        """Bytes of this store's files in the cache.

        Returns
        -------
        int
            Bytes.
        """
        return sum(size for _, size, _ in _files(self.root))

    def forget(self, prefixes: list[str]) -> None:
        """Mark the files under these object prefixes least recently used.

        A reader saw their fragments leave the store's visible records: pruning
        deletes them first. Not deleted now, for processes with an older view that
        may still read them.

        Parameters
        ----------
        prefixes : list of str
            Object path prefixes (fragment directories).
        """
        for prefix in prefixes:
            for _, _, path in _files(os.path.join(self.root, *prefix.split("/"))):
                if not os.path.basename(path).startswith(TMP):  # (another process's download in flight)
                    with contextlib.suppress(OSError):
                        os.utime(path, ns=(0, 0))

    def open(self, path: str, storage: Storage, size: int | None = None,
             check: Callable[[Any], str | None] | None = None) -> IO[bytes] | bytes:
        """An open file holding object ``path`` of ``storage``, downloaded if not cached.

        Marks the file used (its mtime). The download streams into the file
        (``Storage.download``): the object never sits whole in this process's
        memory; it is checked, fsynced and published by rename. Where the cache
        cannot keep it (directory not writable, disk full), the object's bytes
        instead, with a warning (once per store handle).

        Parameters
        ----------
        path : str
            The object's path in the store.
        storage : Storage
            The store's storage.
        size : int, optional
            The object's size, when known: a cached file of another size is replaced.
        check : callable, optional
            Returns what is wrong with an object's bytes, if anything.

        Returns
        -------
        file object or bytes
            The open cached file, or the object's bytes.

        Raises
        ------
        CorruptObjectError
            ``check`` found the download damaged (it is not kept), or the cache holds
            something other than a regular file for the object (a FIFO: refused, never
            waited on).
        OSError
            The download failed for another reason than a full disk.
        """
        local = os.path.join(self.root, *path.split("/"))
        with contextlib.suppress(OSError):  # absent (or the directory unusable: found out below)
            f: IO[bytes] = _open_regular(path, local)
            if size is None or os.fstat(f.fileno()).st_size == size:
                with contextlib.suppress(OSError):  # a read-only cache still serves
                    os.utime(f.fileno())
                return f
            f.close()  # damaged: fetched again below
        tmp = os.path.join(os.path.dirname(local), f"{TMP}{os.getpid()}-{uuid.uuid4().hex}")
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            open(tmp, "wb").close()
        except OSError as exc:
            return self._in_memory(path, storage, check, exc)
        try:
            storage.download(path, tmp)
            f = open(tmp, "r+b")  # noqa: SIM115 (returned open)
            try:
                _refuse_damaged(path, _check_file(f, check))
                os.fsync(f.fileno())
                os.replace(tmp, local)  # a concurrent filler of the same object wrote the same bytes
            except BaseException:
                f.close()
                raise
        except OSError as exc:
            _unlink(tmp)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # full (or past the file size limit)
                raise
            return self._in_memory(path, storage, check, exc)
        except BaseException:
            _unlink(tmp)
            raise
        self.cache.kept(os.fstat(f.fileno()).st_size, local)
        return f

    def _in_memory(self, path: str, storage: Storage, check: Callable[[Any], str | None] | None,
                   exc: OSError) -> bytes:
        """Object ``path`` read into memory, for a cache that cannot keep it (warned once)."""
        if not self.warned:
            self.warned = True
            warnings.warn(f"chunk cache {self.cache.directory}: cannot keep {path} ({exc}); "
                          "holding such objects in memory", RuntimeWarning, stacklevel=3)
        data = storage.read(path)
        _refuse_damaged(path, check(data) if check is not None else None)
        return data


def _open_regular(path: str, local: str) -> IO[bytes]:
    """The cached file ``local`` of object ``path``, open for reading; refused unless a regular file.

    Opened non-blocking and checked with ``fstat`` before use: a FIFO, a device or a
    directory put in a cache is refused at once, never waited on.
    """
    fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptObjectError(path, f"its chunk cache file {local} is not a regular file: remove it")
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _refuse_damaged(path: str, problem: str | None) -> None:
    """CorruptObjectError for a downloaded object ``path`` that ``problem`` says is damaged."""
    if problem is not None:
        raise CorruptObjectError(path, f"{problem} (as downloaded; run replaystore verify)")


def _check_file(f: IO[bytes], check: Callable[[Any], str | None] | None) -> str | None:
    """What ``check`` finds wrong with the bytes of the open file ``f`` (read through a map)."""
    if check is None:
        return None
    if not os.fstat(f.fileno()).st_size:
        return check(b"")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return check(m)


def _files(top: str) -> list[tuple[int, int, str]]:
    """``(mtime_ns, size, path)`` of every file under ``top``."""
    out = []
    for root, _, names in os.walk(top):
        for name in names:
            path = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile by another process
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size, path))
    return out


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class CachingStorage(Storage):
    """A backend whose chunk reads go through a :class:`StoreCache`; everything else is delegated.

    ``open_store`` wraps a backend without local files in one when a cache is asked
    for (S3 by default). The readers of chunk objects (``zarrio.read_array``, a
    segment's index) open them through :attr:`cache` and memory-map the cached
    file; every :class:`Storage` method goes to the wrapped backend unchanged, and
    so does any other attribute (``root``, ``fs``, ...). It declares the wrapped
    backend's flags, and ``supports_memory_map`` (cached chunks are files).

    Parameters
    ----------
    inner : Storage
        The wrapped backend.
    cache : StoreCache
        The store's part of a :class:`ChunkCache`.

    Attributes
    ----------
    inner : Storage
        As given.
    cache : StoreCache
        As given.
    """

    supports_memory_map = True

    def __init__(self, inner: Storage, cache: StoreCache) -> None:
        self.inner = inner
        self.cache = cache
        self.url = inner.url
        self.remote = inner.remote
        self.supports_atomic_create = inner.supports_atomic_create
        self.supports_consistent_listing = inner.supports_consistent_listing
        self.supports_local_paths = inner.supports_local_paths
        self.supports_in_place_writes = inner.supports_in_place_writes

    def __getattr__(self, name: str) -> Any:
        """The wrapped backend's attribute (called only for names this wrapper lacks)."""
        if name == "inner":  # (not set yet: unpickling, or a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        """``CachingStorage(inner, root)``."""
        return f"CachingStorage({self.inner!r}, {self.cache.root!r})"

    def read(self, path: str) -> bytes:
        # docstring inherited
        return self.inner.read(path)

    def download(self, path: str, local: str) -> None:
        # docstring inherited
        self.inner.download(path, local)

    def read_capped(self, path: str, limit: int) -> bytes:
        # docstring inherited
        return self.inner.read_capped(path, limit)

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        # docstring inherited
        return self.inner.read_many(paths)

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        # docstring inherited
        return self.inner.sizes(paths)

    def write(self, path: str, data: bytes | memoryview) -> None:
        # docstring inherited
        self.inner.write(path, data)

    def create(self, path: str, data: bytes) -> bool:
        # docstring inherited
        return self.inner.create(path, data)

    def create_sized(self, sizes: Mapping[str, int]) -> dict[str, int]:
        # docstring inherited
        return self.inner.create_sized(sizes)

    def create_after(self, path: str, data: bytes, fds: Sequence[int],
                     check: Callable[[], None] | None = None) -> bool:
        # docstring inherited
        return self.inner.create_after(path, data, fds, check)

    def exists(self, path: str) -> bool:
        # docstring inherited
        return self.inner.exists(path)

    def list(self, prefix: str) -> builtins.list[str]:
        # docstring inherited
        return self.inner.list(prefix)

    def list_changed(self, prefix: str, token: object) -> tuple[builtins.list[str] | None, object]:
        # docstring inherited
        return self.inner.list_changed(prefix, token)

    def delete(self, path: str) -> None:
        # docstring inherited
        self.inner.delete(path)

    def size(self, path: str) -> int:
        # docstring inherited
        return self.inner.size(path)

    def local_path(self, path: str) -> str | None:
        # docstring inherited
        return self.inner.local_path(path)

    def open_local(self, path: str) -> int | None:
        # docstring inherited
        return self.inner.open_local(path)

    def check_create(self) -> None:
        # docstring inherited
        self.inner.check_create()

    def sync_dirs(self, paths: builtins.list[str]) -> None:
        # docstring inherited
        self.inner.sync_dirs(paths)

    def open_stream(self, path: str) -> ObjectStream:
        # docstring inherited
        return self.inner.open_stream(path)

    def write_objects(self, objects: Mapping[str, Sequence[Buffer]], streams: Sequence[ObjectStream] = (),
                      created: Mapping[str, int] | None = None) -> None:
        # docstring inherited
        if created is None:
            self.inner.write_objects(objects, streams)
        else:
            self.inner.write_objects(objects, streams, created)

    def read_array(self, path: str, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        # docstring inherited
        return self.inner.read_array(path, dtype, shape, offset)

    def total_size(self, prefix: str = "") -> int:
        # docstring inherited
        return self.inner.total_size(prefix)

    def apparent_size(self, prefix: str = "") -> int:
        # docstring inherited
        return self.inner.apparent_size(prefix)

    def is_dir(self, path: str) -> bool:
        # docstring inherited
        return self.inner.is_dir(path)

    def delete_objects(self, paths: builtins.list[str]) -> None:
        # docstring inherited
        self.inner.delete_objects(paths)

    def walk(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        # docstring inherited
        return self.inner.walk(prefix)


def store_cache(storage: Storage) -> StoreCache | None:
    """The chunk cache ``storage`` reads through: a :class:`CachingStorage`'s, else None.

    Parameters
    ----------
    storage : Storage
        A store's storage.

    Returns
    -------
    StoreCache or None
        Its cache, if it is a caching wrapper.
    """
    return storage.cache if isinstance(storage, CachingStorage) else None
