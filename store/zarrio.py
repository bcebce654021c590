"""Zarr v3 arrays written and read directly: one uncompressed chunk per array, crc32c-checked.

Each array's ``zarr.json`` declares a regular chunk grid whose single chunk covers
the whole array and the codec chain ``bytes(little) -> crc32c``. The chunk object
is therefore the raw C-order bytes followed by a 4-byte little-endian CRC32C, so
the hot path reads rows by offset arithmetic (memory maps locally) while
zarr-python reads the same arrays unchanged.
"""

from __future__ import annotations

import json
from typing import IO

import google_crc32c
import numpy as np

from replaystore.errors import CorruptObjectError, StaleReadError
from replaystore.store.storage import Buffer, ObjectStream, Storage

CRC_BYTES = 4


def _data_type(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else dtype.name


def chunk_path(array_path: str, ndim: int) -> str:
    return f"{array_path}/c/" + "/".join(["0"] * ndim)


def array_metadata(dtype: np.dtype, shape: tuple[int, ...], checksum: bool = True) -> dict:
    """A Zarr v3 array's metadata: one chunk covering the array; ``bytes`` then (with ``checksum``) ``crc32c``."""
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
    """The ``zarr.json`` object of a Zarr v3 array at ``path`` (its chunk: :class:`ChunkWriter`)."""
    return {f"{path}/zarr.json": [json.dumps(array_metadata(dtype, shape, checksum)).encode()]}


def raw_bytes(piece: np.ndarray) -> np.ndarray:
    """``piece``'s little-endian C-order bytes as a flat uint8 array (a view where it already is)."""
    return np.ascontiguousarray(piece).astype(piece.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8)


class ChunkWriter:
    """The chunk object of an array written piece by piece along axis 0.

    Each piece's bytes are kept (``buffered``: copies, written at completion) or go to storage as they come
    (:meth:`Storage.open_stream`); the CRC32C of all of them is extended on the way and appended by :meth:`finish`. The
    object is opened by the first non-empty piece: an array of length 0 has none.
    """

    def __init__(self, storage: Storage, array_path: str, ndim: int, buffered: bool = False) -> None:
        self.storage = storage
        self.path = chunk_path(array_path, ndim)
        self.buffered = buffered
        self.stream: ObjectStream | None = None
        self.size = 0  # data bytes (without the checksum)
        self.crc = 0

    def append(self, piece: np.ndarray) -> None:
        if not piece.size:
            return
        raw = raw_bytes(piece)
        if self.stream is None:
            self.stream = ObjectStream(self.path) if self.buffered else self.storage.open_stream(self.path)
        self.stream.write([raw])
        self.size += raw.size
        self.crc = google_crc32c.extend(self.crc, raw)

    def mark(self) -> tuple[int, int]:
        """The state to :meth:`rollback` to."""
        return self.size, self.crc

    def rollback(self, mark: tuple[int, int]) -> None:
        """Forget what was appended after ``mark``."""
        self.size, self.crc = mark
        if self.stream is not None and self.stream.size != self.size:
            self.stream.truncate(self.size)

    def finish(self) -> ObjectStream | None:
        """The chunk object, its checksum written after the data (again, after a failed completion).

        None for an empty array. Completed by ``Storage.write_objects``.
        """
        if self.stream is None:
            return None
        if self.stream.size != self.size:
            self.stream.truncate(self.size)
        self.stream.write([np.uint32(self.crc).astype("<u4").tobytes()])
        return self.stream

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def group_object(path: str, attributes: dict) -> dict[str, list[Buffer]]:
    """The ``zarr.json`` object of a Zarr v3 group at ``path``."""
    return {f"{path}/zarr.json": [json.dumps({"zarr_format": 3, "node_type": "group",
                                              "attributes": attributes}).encode()]}


def read_array(storage: Storage, path: str, dtype: np.dtype, shape: tuple[int, ...], first: int = 0, *,
               checksum: bool = True, cached: bool = True) -> np.ndarray:
    """Rows ``[first, first + shape[0])`` of the array.

    Rows ``[first, first + shape[0])`` of the array, memory-mapped where the backend allows or (``cached``) through the
    storage's chunk cache (checksum not verified; a cache checks what it downloads when ``checksum``, i.e. the chunk
    holds exactly ``shape`` and its CRC32C).
    """
    if not shape[0]:
        return np.zeros(shape, dtype=dtype)
    cpath = chunk_path(path, len(shape))
    offset = first * (int(np.prod(shape[1:])) * dtype.itemsize)
    if storage.cache is None or not cached:
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

    An open file, or its bytes where the cache cannot keep it. With ``checksum`` the object holds exactly ``shape`` rows
    and its CRC32C, and a download is checked against both (a fragment's chunk; a segment's has no checksum and more
    rows than its fragments).
    """
    assert storage.cache is not None
    size = int(np.prod(shape)) * dtype.itemsize + CRC_BYTES if checksum else None
    try:
        return storage.cache.open(cpath, storage, size,
                                  (lambda data: verify_chunk(data, dtype, shape)) if checksum else None)
    except FileNotFoundError:
        raise missing_chunk(cpath) from None


def missing_chunk(cpath: str) -> StaleReadError:
    """The error for a chunk a live commit referenced that is gone: reclaimed after the reader's view was taken."""
    return StaleReadError(f"{cpath}: missing; its records were evicted and reclaimed since this view was "
                          "taken (call refresh()), or the store is damaged (run replaystore verify)")


def verify_chunk(data: Buffer, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """None if ``data`` (bytes, or any buffer: a memory map) is an intact chunk of ``shape``; else what is wrong."""
    raw = np.frombuffer(data, dtype=np.uint8)
    expected = int(np.prod(shape)) * dtype.itemsize + CRC_BYTES
    if len(raw) != expected:
        return f"size {len(raw)} bytes, expected {expected}"
    stored = raw[-CRC_BYTES:].tobytes()
    computed = np.uint32(google_crc32c.value(raw[:-CRC_BYTES])).tobytes()
    if stored != computed:
        return "crc32c checksum mismatch"
    return None
