"""A local disk cache of a remote store's chunk objects, memory-mapped by readers.

Each array is one chunk object (docs/FORMAT.md, "Arrays"), so a reader on S3 needs the
object whole. Without a cache every process keeps the objects it read in its own memory,
up to the whole store per DataLoader worker. With one, each object is downloaded once per
machine into a file that every process (workers, later runs) memory-maps: the bytes live
in the page cache, shared between processes and reclaimable by the kernel, and the
directory is kept under a byte budget by deleting its least recently used files.

This is sound because a committed data object is never modified (docs/FORMAT.md, "Commit
protocol"): a path names the same bytes for the life of a store. Files are kept per store
identity (its URL and manifest, so a ``"w+"`` replace at the same URL is another store),
checked against the chunk's CRC32C before they are kept, and published by rename after an
fsync, so a crash leaves a file whole or absent. The cache is not part of the format.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import IO, Any

from replaystore.errors import CorruptObjectError, StoreError

DEFAULT_MAX_BYTES = 32 << 30
"""The default budget (bytes): this, or half the free space of the cache's disk if less."""
TMP = ".tmp-"
STALE_TMP_S = 3600.0  # temporary files older than this were left by a killed process


def default_directory() -> str:
    """``$REPLAYSTORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/replaystore``, else ``~/.cache/replaystore``."""
    env = os.environ.get("REPLAYSTORE_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "replaystore")


class ChunkCache:
    """A directory of chunk objects of remote stores, shared by every process that names it.

    ``directory``: None for :func:`default_directory`. ``max_bytes``: the budget; None for
    :data:`DEFAULT_MAX_BYTES` or half the disk's free space when the cache first fills,
    whichever is less. Files a process still maps survive their deletion until it unmaps
    them (closing or refreshing past their eviction), so the disk may briefly hold more.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, max_bytes: int | None = None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                      or max_bytes <= 0):
            raise StoreError(f"cache max_bytes: expected None or a positive int, got {max_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory) if directory is not None else default_directory())
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"ChunkCache({self.directory!r}, max_bytes={self.max_bytes!r})"

    def budget(self) -> int:
        """The byte budget in force."""
        if self.max_bytes is None:
            os.makedirs(self.directory, exist_ok=True)
            self.max_bytes = min(DEFAULT_MAX_BYTES, shutil.disk_usage(self.directory).free // 2)
        return self.max_bytes

    def for_store(self, url: str, manifest: Mapping[str, Any]) -> StoreCache:
        """The part of the cache holding the objects of the store at ``url`` with ``manifest``."""
        identity = json.dumps({"url": url, "manifest": manifest}, sort_keys=True).encode()
        return StoreCache(self, os.path.join(self.directory, hashlib.sha256(identity).hexdigest()[:32]))

    def size(self) -> int:
        """Bytes of the files in the cache (temporary ones included)."""
        return sum(size for _, size, _ in self._files())

    def _files(self) -> list[tuple[int, int, str]]:
        """``(mtime_ns, size, path)`` of every file in the cache."""
        out = []
        for root, _, names in os.walk(self.directory):
            for name in names:
                path = os.path.join(root, name)
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile by another process
                    st = os.stat(path)
                    out.append((st.st_mtime_ns, st.st_size, path))
        return out

    def prune(self, keep: str = "") -> None:
        """Delete least recently used files (never ``keep``) until the cache fits its budget,
        and temporary files a killed process left."""
        files = self._files()
        budget = self.budget()
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


def choose(cache: Any, remote: bool) -> ChunkCache | None:
    """The cache ``open_store(..., cache=)`` asks for: None (the default) or True, a
    :class:`ChunkCache` in the default directory for remote stores (True: for any backend
    without local files); a path, a ChunkCache there; False, none."""
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
    """One store's objects in a :class:`ChunkCache` (files under ``root``, named by object path)."""

    def __init__(self, cache: ChunkCache, root: str) -> None:
        self.cache = cache
        self.root = root
        self.warned = False  # about objects it could not keep (once per store handle)

    def open(self, path: str, fetch: Callable[[], bytes], size: int | None = None,
             check: Callable[[bytes], str | None] | None = None) -> IO[bytes] | bytes:
        """An open file holding object ``path``, downloaded with ``fetch`` if not cached.

        ``size`` (when known) is the object's size: a cached file of another size is
        replaced. ``check`` returns what is wrong with downloaded bytes, if anything: such
        bytes raise CorruptObjectError and are not kept. Marks the file used (its mtime).
        Where the cache cannot keep the object (disk full, directory not writable), the
        downloaded bytes themselves, with a warning.
        """
        local = os.path.join(self.root, *path.split("/"))
        with contextlib.suppress(OSError):  # absent (or the directory unusable: warned below)
            f = open(local, "rb")  # noqa: SIM115 (returned open)
            if size is None or os.fstat(f.fileno()).st_size == size:
                with contextlib.suppress(OSError):  # a read-only cache still serves
                    os.utime(f.fileno())
                return f
            f.close()  # damaged: fetched again below
        data = fetch()
        problem = check(data) if check is not None else None
        if problem is not None:
            raise CorruptObjectError(path, f"{problem} (as downloaded; run replaystore verify)")
        try:
            f = self._keep(local, data)
        except OSError as exc:
            if not self.warned:
                self.warned = True
                warnings.warn(f"chunk cache {self.cache.directory}: cannot keep {path} ({exc}); "
                              "holding such objects in memory", RuntimeWarning, stacklevel=2)
            return data
        self.cache.prune(keep=local)
        return f

    @staticmethod
    def _keep(local: str, data: bytes) -> IO[bytes]:
        """``data`` as the file ``local`` (whole or absent after a crash), open."""
        os.makedirs(os.path.dirname(local), exist_ok=True)
        tmp = os.path.join(os.path.dirname(local), f"{TMP}{os.getpid()}-{uuid.uuid4().hex}")
        f = open(tmp, "w+b")  # noqa: SIM115 (returned open)
        try:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, local)  # a concurrent filler of the same object wrote the same bytes
        except BaseException:
            f.close()
            _unlink(tmp)
            raise
        return f


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
