"""The storage protocol the format needs (docs/FORMAT.md, "Storage guarantees").

Whole-object writes that become visible atomically or not at all to readers that only follow
commit records; create-if-absent for commit records; read-after-write consistency for objects
and listings; delete. Paths are '/'-separated and relative to the store root.
"""

from __future__ import annotations

import abc
import builtins
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from replaystore.errors import CorruptObjectError, ReplayStoreError

T = TypeVar("T")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for error messages ("a FIFO", "a directory", ...).

    Parameters
    ----------
    mode : int
        Its ``st_mode`` (from ``stat``/``fstat``).

    Returns
    -------
    str
        The kind, with its article.
    """
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"

class StorageError(ReplayStoreError):
    """The storage backend failed or lacks a guarantee the format needs.

    Raised when a URL names a filesystem without create-if-absent, when an S3
    endpoint ignores conditional PUT, and by the subclasses below.
    """


class StorageURLError(StorageError, ValueError):
    """A URL or its storage options cannot be opened.

    An unknown protocol, a filesystem package that is not installed, options the
    filesystem does not take. Raised by ``open_store`` (through
    :func:`open_storage`). It is also a ``ValueError``.
    """


class StorageUnavailableError(StorageError, OSError):
    """The storage backend could not be reached or refused the request.

    No credentials, an unreachable endpoint, a denied permission, a timeout.
    Raised by any S3 operation; an ``OSError``, as a failed local write is. The
    operation that met it changed nothing visible.
    """


def _each_or_none(get: Callable[[str], T], paths: Sequence[str]) -> list[T | None]:
    """``get(path)`` for each path, None where it raises FileNotFoundError."""
    out: list[T | None] = []
    for path in paths:
        try:
            out.append(get(path))
        except FileNotFoundError:
            out.append(None)
    return out


def _too_large(path: str, size: int, limit: int) -> CorruptObjectError:
    return CorruptObjectError(path, f"{size} bytes: larger than any record document ({limit} bytes at most)")


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its path under the store root, size and last modification (storage clock).

    Attributes
    ----------
    path : str
        The '/'-separated path relative to the store root.
    size : int
        Bytes.
    mtime_ns : int
        Last modification (S3: LastModified; files: mtime), in ns.
    """

    path: str
    size: int
    mtime_ns: int


Buffer = bytes | memoryview | np.ndarray
"""Bytes to write: ``bytes``, or any C-contiguous buffer (a uint8 view of an array)."""


class ObjectStream:
    """A data object written piece by piece (appended to, truncated back).

    Completed and made durable by :meth:`Storage.write_objects`; nothing
    references it before. This base keeps copies of the pieces in memory and the
    object is written whole at completion (a buffered stream;
    :meth:`Storage.open_stream` may instead write the pieces as they come).

    Parameters
    ----------
    path : str
        The object's path relative to the store root.

    Attributes
    ----------
    path : str
        As given.
    size : int
        Bytes written so far.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self._pieces: list[bytes] = []

    def write(self, pieces: Sequence[Buffer]) -> None:
        """Append ``pieces`` (copied or written out now: the caller may reuse its buffers).

        Parameters
        ----------
        pieces : sequence of Buffer
            Bytes to append.

        Raises
        ------
        OSError
            A file stream's write failed.
        """
        for piece in pieces:
            data = bytes(piece)
            self._pieces.append(data)
            self.size += len(data)

    def truncate(self, size: int) -> None:
        """Cut the object back to its first ``size`` bytes.

        Parameters
        ----------
        size : int
            Bytes to keep.
        """
        data = self.data()[:size]
        self._pieces, self.size = [data], len(data)

    def data(self) -> bytes:
        """Everything written so far.

        Returns
        -------
        bytes
            The concatenated pieces (a copy).
        """
        return b"".join(self._pieces)

    def pieces(self) -> list[bytes]:
        """Everything written so far, as the pieces kept (a buffered stream's).

        Returns
        -------
        list of bytes
            The pieces.
        """
        return self._pieces

    def close(self) -> None:
        """Release the stream's resources (after completion, or to abandon it)."""
        self._pieces = []


class Storage(abc.ABC):
    """A flat key space of immutable objects under one root.

    The protocol the format needs (docs/FORMAT.md, "Storage guarantees"); the
    backends are :class:`LocalStorage` and :class:`FsspecStorage`, made by
    :func:`open_storage`. A backend declares what it can do with the class-level
    ``supports_*`` flags below; the store reads them instead of probing. A custom
    backend is one subclass (``open_store`` accepts an instance), checked by
    subclassing ``replaystore.testing.StorageTests``.

    Every ``path`` a method takes is a key in that space, never a filesystem path:
    '/'-separated and relative to the store root. Each method's entry says which
    object (or, where it says so, which prefix) its path names. A ``prefix`` is such a
    key as well, the root being ''. A method that reads an object raises
    ``FileNotFoundError`` where none is stored at its path; any other failure of the
    backend is an ``OSError`` (:class:`StorageUnavailableError` where it cannot be
    reached).

    Attributes
    ----------
    url : str
        The store's URL (a local root path, or the fsspec URL).
    remote : bool
        True for object stores across a network (S3): readers cache their chunk
        objects locally by default and skip per-chunk size checks.
    supports_atomic_create : bool
        :meth:`create` is atomic create-if-absent. ``open_store`` refuses a backend
        without it.
    supports_consistent_listing : bool
        :meth:`list` and :meth:`exists` see every object written or deleted before
        (read-after-write). ``open_store`` refuses a backend without it.
    supports_local_paths : bool
        Objects are local files: :meth:`local_path` and :meth:`open_local` return
        them (never None), objects sit in directories, and :meth:`walk`'s default
        serves. Chunks are read in place (no chunk cache), compaction reads them one
        by one, vacuum finds empty fragment directories.
    supports_memory_map : bool
        Chunk objects can be memory-mapped (local files, or the files of a chunk
        cache): tables read through contiguous views.
    supports_in_place_writes : bool
        :meth:`create_sized` and :meth:`create_after` are implemented: the writer
        of a format-2 store appends into preallocated segments.
    """

    url: str
    remote: bool = False
    """True for object stores across a network (S3): readers cache their chunk objects locally."""
    supports_atomic_create: bool = False
    """:meth:`create` is atomic create-if-absent (``open_store`` refuses a backend without it)."""
    supports_consistent_listing: bool = False
    """Listings see every write and delete before them (``open_store`` refuses a backend without it)."""
    supports_local_paths: bool = False
    """Objects are local files: :meth:`local_path` and :meth:`open_local` return them."""
    supports_memory_map: bool = False
    """Chunk objects can be memory-mapped (local files or a chunk cache's): contiguous table views."""
    supports_in_place_writes: bool = False
    """:meth:`create_sized` and :meth:`create_after` work: format-2 writers append into segments."""

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """The whole object; FileNotFoundError if absent.

        Parameters
        ----------
        path : str
            The object to read (record documents are read through :meth:`read_capped`).

        Returns
        -------
        bytes
            Its content.

        Raises
        ------
        FileNotFoundError
            No object is stored at ``path``.
        """

    def download(self, path: str, local: str) -> None:
        """Write the object to the local file ``local`` (object stores stream it).

        Parameters
        ----------
        path : str
            The object to copy out of the store.
        local : str
            The local file to write: a filesystem path, unlike ``path``.

        Raises
        ------
        FileNotFoundError
            As :meth:`read`.
        """
        data = self.read(path)
        with open(local, "wb") as f:
            f.write(data)

    def read_capped(self, path: str, limit: int) -> bytes:
        """The whole object, refused if it is larger than ``limit`` bytes.

        For a record document: its readers never take an unbounded read. This default
        checks after reading; local storage checks before.

        Parameters
        ----------
        path : str
            The record document to read.
        limit : int
            The most bytes accepted.

        Returns
        -------
        bytes
            The document, at most ``limit`` bytes.

        Raises
        ------
        CorruptObjectError
            The object is larger than ``limit`` bytes.
        FileNotFoundError
            As :meth:`read`.
        """
        data = self.read(path)
        if len(data) > limit:
            raise _too_large(path, len(data), limit)
        return data

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        """Each object whole, None where absent (any other error raises).

        Object stores read them concurrently: a reader probing many writers' next commit
        records pays one round trip.

        Parameters
        ----------
        paths : sequence of str
            The objects to read; any of them may be absent.

        Returns
        -------
        list of bytes or None
            In the order of ``paths``.

        Raises
        ------
        OSError
            Any failure but absence (which gives None).
        """
        return _each_or_none(self.read, paths)

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        """Each object's size in bytes, None where absent (any other error raises).

        Object stores ask for them concurrently (one round trip for the lot).

        Parameters
        ----------
        paths : sequence of str
            The objects to measure.

        Returns
        -------
        list of int or None
            In the order of ``paths``.

        Raises
        ------
        OSError
            As :meth:`read_many`.
        """
        return _each_or_none(self.size, paths)

    @abc.abstractmethod
    def write(self, path: str, data: bytes | memoryview) -> None:
        """Write a data object durably (it is never referenced before this returns).

        Parameters
        ----------
        path : str
            The data object to write.
        data : bytes
            Its content.

        Raises
        ------
        OSError
            The write failed (nothing references the object).
        """

    @abc.abstractmethod
    def create(self, path: str, data: bytes) -> bool:
        """Create ``path`` atomically and durably if absent; False (writing nothing) if it exists.

        How the store's record documents are made: the manifest, writer, commit, state and
        checkpoint records (``supports_atomic_create``).

        Parameters
        ----------
        path : str
            The record to create.
        data : bytes
            Its content.

        Returns
        -------
        bool
            True if this call created it.

        Raises
        ------
        OSError
            The create failed (nothing was created).
        """

    def create_sized(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Create files of given sizes that read as zeros, and return read-write descriptors of them.

        Backends with ``supports_in_place_writes`` only. Sparse where the filesystem
        allows; durable, with their directory entries, once passed to
        :meth:`write_objects` as ``created``. On error the files created are closed
        and removed.

        Parameters
        ----------
        sizes : mapping of str to int
            Path of each file (none may exist) to its size in bytes.

        Returns
        -------
        dict of str to int
            Path to an open descriptor.

        Raises
        ------
        FileExistsError
            A file exists already.
        OSError
            Creating a file failed (a full disk, for instance).
        NotImplementedError
            The backend has no in-place writes.
        """
        raise NotImplementedError(f"{type(self).__name__} has no in-place writes")

    def create_after(self, path: str, data: bytes, fds: Sequence[int], check: Callable[[], None] | None = None) -> bool:
        """:meth:`create`, publishing ``path`` only once the descriptors ``fds`` are ``fdatasync``-ed.

        Backends with ``supports_in_place_writes`` only. ``check()`` must have
        returned (it may raise: then nothing is created) before the object is
        published atomically, failing if the name exists.

        Parameters
        ----------
        path : str
            The record to create once the files behind ``fds`` are durable.
        data : bytes
            Its content.
        fds : sequence of int
            Descriptors to ``fdatasync`` first.
        check : callable, optional
            Called after the syncs, before publishing.

        Returns
        -------
        bool
            As :meth:`create`.

        Raises
        ------
        OSError
            A write or sync failed (nothing was created).
        NotImplementedError
            The backend has no in-place writes.
        Exception
            Whatever ``check`` raises (nothing was created).
        """
        raise NotImplementedError(f"{type(self).__name__} has no in-place writes")

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an object exists at ``path``.

        Parameters
        ----------
        path : str
            The object, or the prefix, to look for.

        Returns
        -------
        bool
            True for an object, and for a prefix (a directory, where the backend has them).
        """

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names (not paths) directly under ``prefix``; empty if none.

        Parameters
        ----------
        prefix : str
            The prefix to list.

        Returns
        -------
        list of str
            Sorted names (temporary ``.tmp-`` names left out).
        """

    def list_changed(self, prefix: str, token: object) -> tuple[builtins.list[str] | None, object]:
        """``(list(prefix), token)``, or ``(None, token)`` where nothing changed.

        ``None`` where this storage can tell that no directory was added under
        ``prefix`` or removed from it since the listing that returned ``token``.
        Entries that are not directories may have changed. This default always lists.

        Parameters
        ----------
        prefix : str
            As for :meth:`list`.
        token : object
            What the previous call returned (None: none).

        Returns
        -------
        names : list of str or None
            The listing, or None where nothing changed.
        token : object
            Pass to the next call.
        """
        return self.list(prefix), None

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Remove an object or, recursively, a prefix; absent paths are ignored.

        Parameters
        ----------
        path : str
            The object or prefix to remove.

        Raises
        ------
        OSError
            A delete failed.
        """

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """The size of object ``path`` in bytes.

        Parameters
        ----------
        path : str
            The object to measure.

        Returns
        -------
        int
            Its size: what a read of it returns.

        Raises
        ------
        FileNotFoundError
            As :meth:`read`.
        """

    def local_path(self, path: str) -> str | None:
        """A filesystem path for memory-mapping, when the backend has one.

        Parameters
        ----------
        path : str
            The object (or prefix) to locate on the local filesystem.

        Returns
        -------
        str or None
            The file's path, or None for backends without local files.
        """
        return None

    def open_local(self, path: str) -> int | None:
        """A read-only descriptor of ``path``'s local file (checked to be a regular file), when the backend has one.

        For memory-mapping or reading a data object in place; the caller closes the
        descriptor. Backends with local files refuse, without blocking or reading,
        anything but a regular file (a FIFO, a device, a directory).

        Parameters
        ----------
        path : str
            The data object to open.

        Returns
        -------
        int or None
            An open descriptor, or None for backends without local files.

        Raises
        ------
        CorruptObjectError
            ``path`` is not a regular file (refused unread).
        FileNotFoundError
            As :meth:`read`.
        """
        return None

    def check_create(self) -> None:  # noqa: B027 (an optional hook; the default does nothing)
        """Refuse a storage that does not honour create-if-absent.

        A no-op where it always does.

        Raises
        ------
        StorageError
            The storage does not honour create-if-absent.
        """

    def sync_dirs(self, paths: builtins.list[str]) -> None:  # noqa: B027 (an optional hook; the default does nothing)
        """Make the directory entries of written ``paths`` durable (local filesystems only).

        Parameters
        ----------
        paths : sequence of str
            The objects just written.

        Raises
        ------
        OSError
            An fsync failed.
        """

    def open_stream(self, path: str) -> ObjectStream:
        """A data object to be written piece by piece.

        Complete only once passed to :meth:`write_objects`. This default is buffered
        (copies of the pieces in memory).

        Parameters
        ----------
        path : str
            The data object the stream writes.

        Returns
        -------
        ObjectStream
            The stream, empty.
        """
        return ObjectStream(path)

    def write_objects(self, objects: Mapping[str, Sequence[Buffer]], streams: Sequence[ObjectStream] = (),
                      created: Mapping[str, int] | None = None) -> None:
        """Write data objects and complete ``streams``, all durable when this returns.

        Each object is the concatenation of its buffers; each stream holds what was
        written to it; their directory entries are durable too. This default writes
        one after another.

        Parameters
        ----------
        objects : mapping of str to sequence of Buffer
            Object path to the buffers it concatenates.
        streams : sequence of ObjectStream, optional
            Streams to complete (each holding what was written to it).
        created : mapping of str to int, optional
            Files made by :meth:`create_sized` (path -> descriptor), made durable too
            (backends with ``supports_in_place_writes`` only).

        Raises
        ------
        OSError
            A write or sync failed (nothing references the objects).
        NotImplementedError
            ``created`` was given to a backend without in-place writes.
        """
        if created:
            raise NotImplementedError(f"{type(self).__name__} has no in-place writes (created=)")
        for path, parts in objects.items():
            # numpy declares ndarray's buffer protocol (__buffer__) only for Python >= 3.12
            data = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)  # type: ignore[arg-type]
            self.write(path, data)
        for stream in streams:
            self.write(stream.path, stream.data())
        self.sync_dirs([*objects, *(s.path for s in streams)])

    def read_array(self, path: str, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """``prod(shape)`` items of an object from byte ``offset`` as an array.

        Memory-mapped where the backend has local files; read whole otherwise.

        Parameters
        ----------
        path : str
            The data object holding the items (a chunk).
        dtype : numpy.dtype
            The items' dtype.
        shape : tuple of int
            The array's shape.
        offset : int, optional
            Byte offset of the first item.

        Returns
        -------
        numpy.ndarray
            The items (read-only where memory-mapped).

        Raises
        ------
        CorruptObjectError
            The object's local file is not a regular file (refused unread).
        FileNotFoundError
            As :meth:`read`.
        ValueError
            The object is shorter than the items asked for.
        """
        count = int(np.prod(shape))
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        fd = self.open_local(path)
        if fd is not None:
            with open(fd, "rb", closefd=True) as f:  # (the map holds a descriptor of its own)
                return np.memmap(f, dtype=dtype, mode="r", shape=shape, offset=offset)
        data = self.read(path)
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)

    def total_size(self, prefix: str = "") -> int:
        """Bytes stored under ``prefix`` (recursively).

        Parameters
        ----------
        prefix : str
            The prefix to measure.

        Returns
        -------
        int
            Bytes they occupy: allocated blocks where the backend has them (a sparse file's
            holes take none), else the objects' sizes.
        """
        total = 0
        for name in self.list(prefix):
            path = f"{prefix}/{name}" if prefix else name
            total += self.total_size(path) if self.is_dir(path) else self.size(path)
        return total

    def apparent_size(self, prefix: str = "") -> int:
        """Bytes of the objects under ``prefix`` as their sizes say.

        Equal to :meth:`total_size` where objects cannot be sparse.

        Parameters
        ----------
        prefix : str
            As for :meth:`total_size`.

        Returns
        -------
        int
            The sum of the objects' sizes.
        """
        return self.total_size(prefix)

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a prefix (directory) of objects.

        Parameters
        ----------
        path : str
            The prefix to test (on local storage, a directory).

        Returns
        -------
        bool
            False for an object, and where nothing is stored.
        """

    def delete_objects(self, paths: builtins.list[str]) -> None:
        """Remove these objects (not prefixes); absent ones are ignored.

        Backends may batch the requests.

        Parameters
        ----------
        paths : sequence of str
            The objects to remove.

        Raises
        ------
        OSError
            A delete failed (some may be removed).
        """
        for path in paths:
            self.delete(path)

    def walk(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Every object under ``prefix``, recursively, temporary (``.tmp-``) names included.

        This default serves backends with ``supports_local_paths``; others override it.

        Parameters
        ----------
        prefix : str
            The prefix to walk.

        Returns
        -------
        list of ObjectInfo
            Sorted by path.

        Raises
        ------
        NotImplementedError
            The backend cannot list objects with their times.
        """
        top = self.local_path(prefix) if self.supports_local_paths else None
        root = self.local_path("") if self.supports_local_paths else None
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
