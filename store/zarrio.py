"""Zarr v3 arrays written and read directly: one uncompressed chunk per array, crc32c-checked.

Each array's ``zarr.json`` declares a regular chunk grid whose single chunk covers
the whole array and the codec chain ``bytes(little) -> crc32c``. The chunk object
is therefore the raw C-order bytes followed by a 4-byte little-endian CRC32C, so
the hot path reads rows by offset arithmetic (memory maps locally) while
zarr-python reads the same arrays unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import google_crc32c
import numpy as np

from replaystore.errors import StaleReadError
from replaystore.store.storage import Buffer, Storage

CRC_BYTES = 4


def _data_type(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else dtype.name


def chunk_path(array_path: str, ndim: int) -> str:
    return f"{array_path}/c/" + "/".join(["0"] * ndim)


def array_metadata(dtype: np.dtype, shape: tuple[int, ...]) -> dict:
    fill: bool | int | float = False if dtype == np.bool_ else (0.0 if dtype.kind == "f" else 0)
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": _data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [max(shape[0], 1), *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "attributes": {},
    }


def chunk_buffers(pieces: Sequence[np.ndarray]) -> list[Buffer]:
    """The chunk object of an array that is ``pieces`` concatenated along axis 0, as buffers to
    write one after another (no copy of the data): the pieces' little-endian bytes, then the
    4-byte CRC32C of all of them."""
    out: list[Buffer] = []
    crc = 0
    for piece in pieces:
        if not piece.size:
            continue
        raw = np.ascontiguousarray(piece).astype(piece.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8)
        crc = google_crc32c.extend(crc, raw)
        out.append(raw)
    out.append(np.uint32(crc).astype("<u4").tobytes())
    return out


def array_objects(path: str, dtype: np.dtype, shape: tuple[int, ...],
                  pieces: Sequence[np.ndarray]) -> dict[str, list[Buffer]]:
    """The objects of a Zarr v3 array at ``path`` holding ``pieces`` concatenated along axis 0."""
    objects: dict[str, list[Buffer]] = {
        f"{path}/zarr.json": [json.dumps(array_metadata(dtype, shape)).encode()]}
    if shape[0]:
        objects[chunk_path(path, len(shape))] = chunk_buffers(pieces)
    return objects


def group_object(path: str, attributes: dict) -> dict[str, list[Buffer]]:
    """The ``zarr.json`` object of a Zarr v3 group at ``path``."""
    return {f"{path}/zarr.json": [json.dumps({"zarr_format": 3, "node_type": "group",
                                              "attributes": attributes}).encode()]}


def read_array(storage: Storage, path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array's data, memory-mapped where the backend allows (checksum not verified)."""
    if not shape[0]:
        return np.zeros(shape, dtype=dtype)
    cpath = chunk_path(path, len(shape))
    try:
        return storage.read_array(cpath, dtype, shape)
    except FileNotFoundError:
        # a live commit referenced it, so it was reclaimed after this reader's view was taken
        raise StaleReadError(f"{cpath}: missing; its records were evicted and reclaimed since this view was "
                             "taken (call refresh()), or the store is damaged (run replaystore verify)") from None


def verify_chunk(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """None if ``data`` is an intact chunk of ``shape``; else what is wrong."""
    expected = int(np.prod(shape)) * dtype.itemsize + CRC_BYTES
    if len(data) != expected:
        return f"size {len(data)} bytes, expected {expected}"
    stored = bytes(data[-CRC_BYTES:])
    computed = np.uint32(google_crc32c.value(bytes(data[:-CRC_BYTES]))).tobytes()
    if stored != computed:
        return "crc32c checksum mismatch"
    return None
