"""Zarr v3 arrays written and read directly: one uncompressed chunk per array, crc32c-checked.

Each array's ``zarr.json`` declares a regular chunk grid whose single chunk covers
the whole array and the codec chain ``bytes(little) -> crc32c``. The chunk object
is therefore the raw C-order bytes followed by a 4-byte little-endian CRC32C, so
the hot path reads rows by offset arithmetic (memory maps locally) while
zarr-python reads the same arrays unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from typing import IO

import google_crc32c
import numpy as np

from replaystore.errors import CorruptObjectError, StaleReadError
from replaystore.store.storage import Buffer, ObjectStream, Storage
from replaystore.store.storage.base import file_kind
from replaystore.store.storage.cache import store_cache

CRC_BYTES = 4


def _data_type(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else dtype.name


def chunk_path(array_path: str, ndim: int) -> str:
    """The path of an array's single chunk object: ``<array>/c/0/0...``.

    Returns
    -------
    str
        The chunk's path.
    """
    return f"{array_path}/c/" + "/".join(["0"] * ndim)


def array_metadata(dtype: np.dtype, shape: tuple[int, ...], checksum: bool = True) -> dict:
    """A Zarr v3 array's metadata: one chunk covering the array; ``bytes`` then (with ``checksum``) ``crc32c``.

    Parameters
    ----------
    dtype : numpy.dtype
        The array's dtype.
    shape : tuple of int
        The array's shape.
    checksum : bool, optional
        Whether the codec chain ends in ``crc32c`` (segments' arrays have none).

    Returns
    -------
    dict
        The ``zarr.json`` document.
    """
    codecs: list[dict] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if checksum:
        codecs.append({"name": "crc32c"})
    fill: bool | int | float = False if dtype == np.bool_ else (0.0 if dtype.kind == "f" else 0)
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": _data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [max(shape[0], 1), *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": {},
    }


def array_object(path: str, dtype: np.dtype, shape: tuple[int, ...], checksum: bool = True) -> dict[str, list[Buffer]]:
    """The ``zarr.json`` object of the Zarr v3 array ``path`` of ``dtype`` and ``shape`` (chunk: :class:`ChunkWriter`).

    Parameters
    ----------
    checksum : bool, optional
        See :func:`array_metadata`.

    Returns
    -------
    dict of str to list of Buffer
        Object path to its bytes, for ``Storage.write_objects``.
    """
    return {f"{path}/zarr.json": [json.dumps(array_metadata(dtype, shape, checksum)).encode()]}


def raw_bytes(piece: np.ndarray) -> np.ndarray:
    """``piece``'s little-endian C-order bytes as a flat uint8 array (a view where it already is).

    Parameters
    ----------
    piece : numpy.ndarray
        Any array.

    Returns
    -------
    numpy.ndarray
        uint8 bytes.
    """
    return np.ascontiguousarray(piece).astype(piece.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8)


class ChunkWriter:
    """The chunk object of an array written piece by piece along axis 0.

    Each piece's bytes are kept (``buffered``: copies, written at completion) or
    go to storage as they come (:meth:`Storage.open_stream`); the CRC32C of all
    of them is extended on the way and appended by :meth:`finish`. The object is
    opened by the first non-empty piece: an array of length 0 has none.

    Parameters
    ----------
    buffered : bool, optional
        Keep the pieces in memory until :meth:`finish`.
    """

    def __init__(self, storage: Storage, array_path: str, ndim: int, buffered: bool = False) -> None:
        self.storage = storage
        self.path = chunk_path(array_path, ndim)
        self.buffered = buffered
        self.stream: ObjectStream | None = None
        self.size = 0  # data bytes (without the checksum)
        self.crc = 0

    def append(self, piece: np.ndarray) -> None:
        """Append a piece (rows along axis 0) to the chunk.

        Cost: one conversion to little-endian bytes (a view where it already is),
        one write and one CRC32C extension.

        Parameters
        ----------
        piece : numpy.ndarray
            Rows of the array.

        Raises
        ------
        OSError
            The storage failed (a full disk, for instance).
        """
        if not piece.size:
            return
        raw = raw_bytes(piece)
        if self.stream is None:
            self.stream = ObjectStream(self.path) if self.buffered else self.storage.open_stream(self.path)
        self.stream.write([raw])
        self.size += raw.size
        self.crc = google_crc32c.extend(self.crc, raw)

    def mark(self) -> tuple[int, int]:
        """The state to :meth:`rollback` to.

        Returns
        -------
        tuple of int
            ``(size, crc)``.
        """
        return self.size, self.crc

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget what was appended after ``mark``.

        Parameters
        ----------
        mark : tuple of int
            A :meth:`mark`.
        """
        self.size, self.crc = mark
        if self.stream is not None and self.stream.size != self.size:
            self.stream.truncate(self.size)

    def finish(self) -> ObjectStream | None:
        """The chunk object, its checksum written after the data (again, after a failed completion).

        Completed by ``Storage.write_objects``.

        Returns
        -------
        ObjectStream or None
            The object, or None for an empty array.
        """
        if self.stream is None:
            return None
        if self.stream.size != self.size:
            self.stream.truncate(self.size)
        self.stream.write([np.uint32(self.crc).astype("<u4").tobytes()])
        return self.stream

    def close(self) -> None:
        """Close the object's stream, if any (an unfinished object is discarded)."""
        if self.stream is not None:
            self.stream.close()


def group_object(path: str, attributes: dict) -> dict[str, list[Buffer]]:
    """The ``zarr.json`` object of a Zarr v3 group at ``path``.

    Parameters
    ----------
    path : str
        The group's directory.
    attributes : dict
        The group's attributes.

    Returns
    -------
    dict of str to list of Buffer
        Object path to its bytes.
    """
    return {f"{path}/zarr.json": [json.dumps({"zarr_format": 3, "node_type": "group",
                                              "attributes": attributes}).encode()]}


def read_array(storage: Storage, path: str, dtype: np.dtype, shape: tuple[int, ...], first: int = 0, *,
               checksum: bool = True, cached: bool = True) -> np.ndarray:
    """Rows ``[first, first + shape[0])`` of the array.

    Memory-mapped where the backend allows, or (``cached``) through the
    storage's chunk cache (checksum not verified here; a cache checks what it
    downloads when ``checksum``, i.e. the chunk holds exactly ``shape`` and its
    CRC32C).

    Parameters
    ----------
    path : str
        The array's directory.
    dtype : numpy.dtype
        The array's dtype.
    shape : tuple of int
        The shape of the rows wanted.
    first : int, optional
        The first row.
    checksum : bool, optional
        Whether the chunk carries a CRC32C (a fragment's does; a segment's not).
    cached : bool, optional
        Read through the storage's chunk cache (when it has one).

    Returns
    -------
    numpy.ndarray
        The rows (a read-only memory map where possible).

    Raises
    ------
    StaleReadError
        The chunk is gone: reclaimed after the reader's view was taken.
    CorruptObjectError
        The chunk is shorter than declared, or a download fails its check.
    """
    if not shape[0]:
        return np.zeros(shape, dtype=dtype)
    cpath = chunk_path(path, len(shape))
    offset = first * (int(np.prod(shape[1:])) * dtype.itemsize)
    if not cached or store_cache(storage) is None:
        try:
            return storage.read_array(cpath, dtype, shape, offset)
        except FileNotFoundError:
            raise missing_chunk(cpath) from None
        except ValueError:  # the object is shorter than its commit record says (mmap, frombuffer)
            raise CorruptObjectError(cpath, f"shorter than the {shape[0]} rows from row {first} its commit record "
                                            "declares (run replaystore verify)") from None
    got = open_cached(storage, cpath, dtype, shape, checksum)
    if isinstance(got, bytes):  # the cache could not keep it
        return np.frombuffer(got, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
    with got:
        return np.memmap(got, dtype=dtype, mode="r", shape=shape, offset=offset)


def open_cached(storage: Storage, cpath: str, dtype: np.dtype, shape: tuple[int, ...],
                checksum: bool = True) -> IO[bytes] | bytes:
    """The chunk object ``cpath`` through the storage's chunk cache.

    With ``checksum`` the object holds exactly ``shape`` rows and its CRC32C,
    and a download is checked against both (a fragment's chunk; a segment's has
    no checksum and more rows than its fragments).

    Parameters
    ----------
    storage : Storage
        The store's storage (a caching wrapper).
    dtype : numpy.dtype
        The array's dtype.
    shape : tuple of int
        The array's shape.
    checksum : bool, optional
        Check size and CRC32C of a download.

    Returns
    -------
    file object or bytes
        An open file, or its bytes where the cache cannot keep it.

    Raises
    ------
    StaleReadError
        The chunk is gone.
    CorruptObjectError
        A download fails its check.
    """
    cache = store_cache(storage)
    assert cache is not None
    size = int(np.prod(shape)) * dtype.itemsize + CRC_BYTES if checksum else None
    try:
        return cache.open(cpath, storage, size,
                                  (lambda data: verify_chunk(data, dtype, shape)) if checksum else None)
    except FileNotFoundError:
        raise missing_chunk(cpath) from None


def chunk_size(storage: Storage, cpath: str) -> int | None:
    """The size of chunk ``cpath`` in bytes, without opening it; None on object storage.

    Returns
    -------
    int or None
        Its size (local storage and ``memory://``: one ``stat``); None where storage is remote.

    Raises
    ------
    StaleReadError
        The chunk is gone.
    CorruptObjectError
        It is not a regular file (a FIFO, a directory: refused unopened).
    UnsafeNameError
        Its path leads outside the store through a symbolic link.
    """
    if storage.remote:
        return None
    local = storage.local_path(cpath)
    try:
        if local is None:
            return storage.size(cpath)
        st = os.stat(local)
    except (FileNotFoundError, NotADirectoryError):
        raise missing_chunk(cpath) from None
    if not stat.S_ISREG(st.st_mode):
        raise CorruptObjectError(cpath, f"not a regular file ({file_kind(st.st_mode)}): refused unread")
    return st.st_size


def check_chunk_size(storage: Storage, cpath: str, expected: int) -> None:
    """Refuse chunk ``cpath`` unless it is a regular file of exactly ``expected`` bytes.

    What a commit record declares of a fragment (its rows, a segment's capacity) fixes the size
    of each of its chunks: a chunk of another size (truncated, extended, another array's bytes)
    is damage, and is refused before it is mapped or read rather than read as rows it does not
    hold. On local storage and ``memory://``; on object storage nothing here (a download through
    the chunk cache is checked against the same size). Cost: one ``stat``.

    Parameters
    ----------
    expected : int
        Its size in bytes: the data and, for a fragment's chunk, its 4-byte CRC32C.

    Raises
    ------
    StaleReadError
        The chunk is gone.
    CorruptObjectError
        It is not a regular file, or not of ``expected`` bytes.
    UnsafeNameError
        Its path leads outside the store through a symbolic link.
    """
    size = chunk_size(storage, cpath)
    if size is not None and size != expected:
        raise CorruptObjectError(cpath, f"{size} bytes, but its commit record declares {expected} (run replaystore "
                                        "verify)")


def missing_chunk(cpath: str) -> StaleReadError:
    """The error for a chunk a live commit referenced that is gone.

    It was reclaimed after the reader's view was taken (or the store is damaged).

    Returns
    -------
    StaleReadError
        The error, to raise.
    """
    return StaleReadError(f"{cpath}: missing; its records were evicted and reclaimed since this view was "
                          "taken (call refresh()), or the store is damaged (run replaystore verify)")


def verify_chunk(data: Buffer, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """What is wrong with a chunk of ``shape``, if anything.

    Cost: one CRC32C over the chunk.

    Parameters
    ----------
    data : Buffer
        Bytes, or any buffer (a memory map).
    dtype : numpy.dtype
        The array's dtype.
    shape : tuple of int
        The array's shape.

    Returns
    -------
    str or None
        None for an intact chunk, else the problem (size or checksum).
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    expected = int(np.prod(shape)) * dtype.itemsize + CRC_BYTES
    if len(raw) != expected:
        return f"size {len(raw)} bytes, expected {expected}"
    stored = raw[-CRC_BYTES:].tobytes()
    computed = np.uint32(google_crc32c.value(raw[:-CRC_BYTES])).tobytes()
    if stored != computed:
        return "crc32c checksum mismatch"
    return None
