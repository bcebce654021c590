"""Compressed fields: a fragment's chunk of a compressed field is a Zarr v3 shard of small blocks.

A field declared with ``codec=`` (``"zstd:3"``, ``"lz4:1"``) is stored as a Zarr v3 array
whose single chunk is a ``sharding_indexed`` shard: the records are cut into inner chunks
of :data:`BLOCK` records (the last one padded with zeros), each compressed on its own
(``bytes`` -> the codec -> ``crc32c``), followed by the shard index (per block its byte
offset and length, little-endian uint64) and that index's CRC32C (docs/FORMAT.md,
"Compressed fields"). A read decodes only the blocks holding the rows it wants;
zarr-python reads the same arrays unchanged.

The codecs themselves are classes in the registry of :mod:`replaystore.codecs`; this
module asks a field's :class:`~replaystore.codecs.Codec` object for every step that
depends on the codec and never branches on a codec's name. A field's :class:`ChunkEncoding`
(:class:`RawChunks` or :class:`Shards`, chosen once per field by :func:`encoding_of`) is
where a table's arrays split into raw ones and sharded ones: staging, reading, verifying
and size accounting ask it.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import google_crc32c
import numpy as np

from replaystore.codecs import Codec, get_codec
from replaystore.errors import CorruptObjectError, StaleReadError, UnknownCodecError
from replaystore.store.format.zarrio import (
    CRC_BYTES,
    ChunkWriter,
    array_object,
    check_chunk_size,
    chunk_path,
    missing_chunk,
    open_cached,
    raw_bytes,
    read_array,
    verify_chunk,
)
from replaystore.store.storage import Buffer, ObjectStream, Storage
from replaystore.store.storage.cache import store_cache

BLOCK = 8
"""Records per compressed block (inner chunk) of the byte codecs (a codec's ``block_records``;
a video codec's is its GOP). Measured on Atari frames (docs/PERFORMANCE.md): 3-4x the ratio
of one record per block, at about the decode cost of one record."""

_CRC = 4
_INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64


def compressor(codec: str) -> Codec:
    """The codec object of a field's ``codec`` (``"zstd:3"``, ``"lz4:1"``).

    Parameters
    ----------
    codec : str
        A normalised codec (:class:`~replaystore.schemas.Dense`'s ``codec``).

    Returns
    -------
    Codec
        The codec (``encode`` of one block's bytes, ``decode_into``, ``declared_size``).

    Raises
    ------
    UnknownCodecError
        The codec's name is not registered in this process.
    """
    return get_codec(codec)


def shard_metadata(dtype: np.dtype, shape: tuple[int, ...], codec: Codec) -> dict:
    """The ``zarr.json`` of a compressed fragment array: one shard of :data:`BLOCK`-record blocks.

    Parameters
    ----------
    dtype : numpy.dtype
        The field's dtype.
    shape : tuple of int
        The array's shape ``(rows, *record shape)``.
    codec : Codec
        The field's codec.

    Returns
    -------
    dict
        The document.
    """
    from replaystore.store.format.zarrio import array_metadata

    meta = array_metadata(dtype, shape)
    block = codec.block_records
    blocks = max(1, math.ceil(shape[0] / block))
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [blocks * block, *shape[1:]]
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    meta["codecs"] = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [block, *shape[1:]],
        "codecs": [little, codec.zarr_metadata(), {"name": "crc32c"}],
        "index_codecs": [little, {"name": "crc32c"}],
        "index_location": "end"}}]
    return meta


class ShardWriter:
    """The shard of a compressed array written piece by piece along axis 0 (always buffered).

    Full blocks are compressed as they come; the last, partial one is kept raw until
    :meth:`finish`, which pads it with zeros. Same interface as
    :class:`~replaystore.store.format.zarrio.ChunkWriter`.

    Parameters
    ----------
    codec : Codec
        The field's codec.
    """

    def __init__(self, array_path: str, ndim: int, codec: Codec) -> None:
        self.path = chunk_path(array_path, ndim)
        self._codec = codec
        self._block = codec.block_records
        self.blocks: list[bytes] = []  # compressed blocks, each followed by its CRC32C
        self.pending: list[np.ndarray] = []  # rows not yet a full block (copies)
        self.size = 0  # records appended
        self.stream: ObjectStream | None = None

    def _encode(self, rows: np.ndarray) -> bytes:
        data = self._codec.encode(raw_bytes(rows))
        return bytes(data) + np.uint32(google_crc32c.value(bytes(data))).astype("<u4").tobytes()

    def append(self, piece: np.ndarray) -> None:
        """Append rows; every block they complete is compressed now.

        Cost: one compression per :data:`BLOCK` records (a copy of the rest).

        Parameters
        ----------
        piece : numpy.ndarray
            Rows of the array.
        """
        if not len(piece):
            return
        held = sum(len(p) for p in self.pending)
        rows = np.concatenate([*self.pending, piece]) if self.pending else piece
        block = self._block
        full = (held + len(piece)) // block * block
        for i in range(0, full, block):
            self.blocks.append(self._encode(rows[i:i + block]))
        self.pending = [np.array(rows[full:])] if full < len(rows) else []
        self.size += len(piece)

    def mark(self) -> tuple[int, list[np.ndarray], int]:
        """The state to :meth:`rollback` to.

        Returns
        -------
        tuple
            ``(blocks, pending rows, records)``.
        """
        return len(self.blocks), list(self.pending), self.size

    def rollback(self, mark: tuple[int, list[np.ndarray], int]) -> None:
        """Forget what was appended after ``mark``.

        Parameters
        ----------
        mark : tuple
            A :meth:`mark`.
        """
        blocks, pending, size = mark
        del self.blocks[blocks:]
        self.pending, self.size = list(pending), size

    def finish(self) -> ObjectStream | None:
        """The shard object (blocks, index, index CRC32C); again after a failed completion.

        Returns
        -------
        ObjectStream or None
            The object, or None for an empty array.
        """
        if not self.size:
            return None
        blocks = list(self.blocks)
        if self.pending:
            rows = np.concatenate(self.pending)
            padded = np.zeros((self._block, *rows.shape[1:]), dtype=rows.dtype)
            padded[:len(rows)] = rows
            blocks.append(self._encode(padded))
        sizes = np.array([len(b) for b in blocks], dtype=np.uint64)
        index = np.empty((len(blocks), 2), dtype="<u8")
        index[:, 1] = sizes
        index[:, 0] = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.uint64)
        raw = index.tobytes()
        self.stream = ObjectStream(self.path)
        self.stream.write([*blocks, raw, np.uint32(google_crc32c.value(raw)).astype("<u4").tobytes()])
        return self.stream

    def close(self) -> None:
        """Release the object (nothing is open: the object is written at completion)."""
        self.stream = None


def max_shard_bytes(rows: int, record_bytes: int, codec: Codec) -> int:
    """The most bytes a shard of ``rows`` records of ``record_bytes`` each can take.

    Each block at most what the codec gives for its raw bytes
    (:meth:`~replaystore.codecs.Codec.max_encoded_bytes`), and its checksum; then the index.

    Parameters
    ----------
    rows : int
        The array's records.
    record_bytes : int
        Bytes of one record.
    codec : Codec
        The field's codec.

    Returns
    -------
    int
        Bytes.
    """
    blocks = max(1, math.ceil(rows / codec.block_records))
    raw = codec.block_records * record_bytes
    return blocks * (codec.max_encoded_bytes(raw) + _CRC + _INDEX_ENTRY) + _CRC


def _index(raw: np.ndarray, rows: int, path: str, block: int = BLOCK) -> np.ndarray:
    """The shard index ``(blocks, 2)`` of ``raw``, checked: CRC32C, and the blocks tile the data in order.

    Block 0 starts at byte 0, each next one where the previous ends, the last where the
    index starts (docs/FORMAT.md, "Compressed fields"): no entry overlaps another, lies
    outside the shard or overflows. Cost: O(blocks).
    """
    blocks = max(1, math.ceil(rows / block))
    size = blocks * _INDEX_ENTRY
    if len(raw) < size + _CRC:
        raise CorruptObjectError(path, f"shard of {len(raw)} bytes, shorter than its index ({size + _CRC} bytes)")
    tail = raw[len(raw) - size - _CRC:]
    if google_crc32c.value(tail[:-_CRC].tobytes()) != int(tail[-_CRC:].view("<u4")[0]):
        raise CorruptObjectError(path, "shard index crc32c checksum mismatch")
    entries = tail[:-_CRC].view("<u8").reshape(blocks, 2)
    data_end = len(raw) - size - _CRC
    offsets, lengths = entries[:, 0], entries[:, 1]
    # compared as uint64, each term at most the shard's size: no sum below can wrap
    bad = np.flatnonzero((offsets > data_end) | (lengths > data_end) | (lengths <= _CRC))
    if not len(bad):
        ends = offsets + lengths
        starts = np.concatenate(([np.uint64(0)], ends[:-1]))
        bad = np.flatnonzero((offsets != starts) | (ends > data_end))
        if not len(bad) and int(ends[-1]) != data_end:
            raise CorruptObjectError(path, f"shard index: the blocks end at byte {int(ends[-1])}, the index "
                                           f"starts at byte {data_end}")
    if len(bad):
        k = int(bad[0])
        raise CorruptObjectError(path, f"shard index: block {k} at [{int(offsets[k])}, +{int(lengths[k])}) is not "
                                       f"where the blocks before it end (overlapping, outside the shard "
                                       f"or overflowing)")
    return entries.astype(np.int64)


class CompressedArray:
    """A fragment's compressed array, read as rows: decodes only the blocks a read touches.

    Supports what reads use of an ndarray: ``shape``, ``dtype``, ``len``, ``take`` along
    axis 0, slicing along axis 0 and ``numpy.asarray`` (decodes everything).

    Parameters
    ----------
    dtype : numpy.dtype
        The field's dtype.
    shape : tuple of int
        ``(rows, *record shape)``.
    codec : Codec
        The field's codec.
    cached : bool, optional
        Read through the storage's chunk cache (when it has one): the cache holds the
        compressed shard.

    Attributes
    ----------
    blocks_decoded : int
        Blocks decoded by every instance so far (class-wide; what a read costs).
    """

    blocks_decoded = 0

    def __init__(self, storage: Storage, array_path: str, dtype: np.dtype, shape: tuple[int, ...], codec: Codec,
                 cached: bool = True) -> None:
        self.storage, self.dtype, self.shape = storage, np.dtype(dtype), tuple(shape)
        self.ndim = len(shape)
        self.path = chunk_path(array_path, len(shape))
        self._codec = codec
        self._block = codec.block_records
        # (a codec that decodes some records of a block for less than all of them: the video codec)
        self._partial = type(codec).decode_rows_into is not Codec.decode_rows_into
        self._cached = cached
        self.max_bytes = max_shard_bytes(self.shape[0], self.dtype.itemsize * int(np.prod(self.shape[1:])), codec)
        self._raw: np.ndarray | None = None
        self._index: np.ndarray | None = None

    def __len__(self) -> int:
        """The number of records."""
        return self.shape[0]

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self._raw is None:
            st = self.storage
            try:
                raw: np.ndarray
                fd = st.open_local(self.path)  # (a regular file, or refused: never a FIFO waited on)
                if fd is not None:
                    with open(fd, "rb", closefd=True) as f:
                        size = os.fstat(fd).st_size
                        self._check_size(size)
                        # (mapped: nothing is allocated from the size; a 0-byte file cannot be mapped)
                        raw = np.memmap(f, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
                elif self._cached and store_cache(st) is not None:
                    got = open_cached(st, self.path, np.dtype(np.uint8), (0,), checksum=False)
                    if isinstance(got, bytes):
                        raw = np.frombuffer(got, dtype=np.uint8)
                    else:
                        with got:
                            raw = np.memmap(got, dtype=np.uint8, mode="r")
                else:
                    raw = np.frombuffer(st.read(self.path), dtype=np.uint8)
            except FileNotFoundError:
                raise missing_chunk(self.path) from None
            self._check_size(len(raw))
            self._index = _index(raw, self.shape[0], self.path, self._block)
            self._raw = np.asarray(raw)  # (a plain ndarray: np.memmap's slicing costs microseconds)
        assert self._index is not None
        return self._raw, self._index

    def _check_size(self, size: int) -> None:
        if size > self.max_bytes:
            raise CorruptObjectError(self.path, f"size {size} bytes, more than a shard of {self.shape[0]} records "
                                                f"can take ({self.max_bytes})")

    def _decode(self, block: int, out: np.ndarray) -> None:
        """Decode ``block`` into ``out`` (:data:`BLOCK` records, C-contiguous), checked (:meth:`_decode_blocks`)."""
        self._decode_blocks([block], out[None])

    def _decode_blocks(self, blocks: list[int], out: np.ndarray, rows: list[list[int]] | None = None) -> None:
        """Decode ``blocks[i]`` into ``out[i]`` (each :data:`BLOCK` records; ``out`` C-contiguous), checked.

        Per block its CRC32C, then the decoded size its header declares (exactly one
        block's bytes: a shorter block would leave part of ``out`` as it was), then the
        decoder's own checks; any failure is a CorruptObjectError naming the shard and
        the block. Cost: one decompression per block, nothing per record. With ``rows``
        (per block the records wanted), the codec's ``decode_rows_into`` fills only those.
        """
        raw, index = self._load()
        dest = out.view(np.uint8).reshape(len(blocks), -1)
        codec, path, expected = self._codec, self.path, dest.shape[1]
        crc, declared_size = google_crc32c.value, codec.declared_size
        spans = [(off, n - _CRC) for off, n in index[blocks].tolist()]
        for i, (off, n) in enumerate(spans):
            data = raw[off:off + n]
            if crc(data) != int.from_bytes(raw[off + n:off + n + _CRC], "little"):
                raise CorruptObjectError(path, f"crc32c checksum mismatch in block {blocks[i]}")
            declared = declared_size(data)
            if declared != expected:
                got = "no size" if declared is None else f"{declared} bytes"
                raise CorruptObjectError(path, f"block {blocks[i]} declares {got} decoded, expected {expected} "
                                               f"({codec.name}; run replaystore verify)")
        if rows is not None:
            for i, (off, n) in enumerate(spans):
                try:
                    codec.decode_rows_into(raw[off:off + n], dest[i], rows[i])
                except UnknownCodecError:  # (a codec whose library is missing: not damage)
                    raise
                except Exception as exc:
                    raise CorruptObjectError(path, f"block {blocks[i]} does not decode as {codec.name} "
                                                   f"({exc})") from None
            CompressedArray.blocks_decoded += len(spans)
            return
        try:
            codec.decode_blocks(raw, spans, dest)
        except UnknownCodecError:  # (a codec whose library is missing: not damage)
            raise
        except Exception:  # (whatever a codec's decoder raises on damaged data): name the block
            for i, (off, n) in enumerate(spans):
                try:
                    codec.decode_into(raw[off:off + n], dest[i])
                except UnknownCodecError:
                    raise
                except Exception as exc:
                    raise CorruptObjectError(path, f"block {blocks[i]} does not decode as {codec.name} "
                                                   f"({exc})") from None
            raise
        CompressedArray.blocks_decoded += len(spans)

    def check(self) -> None:
        """Decode every block, one at a time into one block's buffer (what ``verify`` runs).

        Raises
        ------
        CorruptObjectError
            The shard's index or a block is damaged (the first found).
        StaleReadError
            The shard is gone.
        """
        _, index = self._load()
        buf = np.empty((self._block, *self.shape[1:]), dtype=self.dtype.newbyteorder("<"))
        for block in range(len(index)):
            self._decode(block, buf)

    def take(self, indices: Any, axis: int = 0, out: np.ndarray | None = None, mode: str = "raise") -> np.ndarray:
        """Rows ``indices`` (like ``numpy.take`` along axis 0), decoding each block touched once.

        Parameters
        ----------
        indices : array_like of int
            Rows (any order, repeats allowed).
        axis : int, optional
            Must be 0.
        out : numpy.ndarray, optional
            Where to put the rows.
        mode : str, optional
            ``"raise"`` (default) or ``"clip"``, as ``numpy.take``.

        Returns
        -------
        numpy.ndarray
            The rows.

        Raises
        ------
        IndexError
            A row out of range (``mode="raise"``).
        CorruptObjectError
            The shard or a block fails its checksum.
        StaleReadError
            The shard is gone (reclaimed since the view was taken).

        Notes
        -----
        Cost: one decompression per distinct block of :data:`BLOCK` records touched.
        """
        assert axis == 0
        idx = np.asarray(indices, dtype=np.int64)
        n = self.shape[0]
        if mode == "clip":
            idx = np.clip(idx, 0, max(n - 1, 0))
        elif idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"{self.path}: row out of range for {n} records")
        idx = np.where(idx < 0, idx + n, idx)
        flat = idx.reshape(-1)
        rest = self.shape[1:]
        res = np.empty((len(flat), *rest), dtype=self.dtype) if out is None else out
        if len(flat):
            block = self._block
            blocks, inv = np.unique(flat // block, return_inverse=True)
            decoded = np.empty((len(blocks) * block, *rest), dtype=self.dtype.newbyteorder("<"))
            wanted = None
            if self._partial:  # per block the records wanted (sorted, distinct)
                pairs = np.unique(inv.reshape(-1).astype(np.int64) * block + flat % block)
                cuts = np.searchsorted(pairs, np.arange(1, len(blocks)) * block)
                wanted = [(p % block).tolist() for p in np.split(pairs, cuts)]
            self._decode_blocks(blocks.tolist(), decoded.reshape(len(blocks), block, *rest), wanted)
            rows = inv.reshape(-1) * block + flat % block
            if res.flags.c_contiguous and res.dtype == decoded.dtype:  # each row copied once, into the result
                np.take(decoded, rows, axis=0, out=res.reshape(len(flat), *rest), mode="clip")  # (unbuffered)
            else:
                res.reshape(len(flat), *rest)[...] = decoded[rows]
        return res if out is not None else res.reshape(*idx.shape, *rest)

    def __getitem__(self, key: Any) -> np.ndarray:
        """Rows by a slice, an int or an index array along axis 0 (decoded copies).

        Parameters
        ----------
        key : slice or int or array_like
            Along axis 0.

        Returns
        -------
        numpy.ndarray
            The rows.
        """
        if isinstance(key, slice):
            return self.take(np.arange(*key.indices(self.shape[0])))
        if isinstance(key, (int, np.integer)):
            return self.take(np.array([key]))[0]
        return self.take(key)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every record, decoded (cost: every block)."""
        arr = self.take(np.arange(self.shape[0]))
        return arr if dtype is None else arr.astype(dtype)

    def stored_bytes(self) -> int:
        """The shard's size in bytes (compressed blocks, index and checksums).

        Returns
        -------
        int
            Bytes.
        """
        return len(self._load()[0])


class ChunkEncoding:
    """How a field's array is stored in a fragment of its own: raw chunks or shards.

    Chosen once per field (:func:`encoding_of`); staging,
    reading, verifying and size accounting ask it instead of branching on the codec.
    Segment-backed fragments are raw (compressed tables do not use segments).

    Every method takes the same arguments: ``storage`` the store's storage; ``array_path``
    the array's directory in the fragment; ``ndim`` its number of dimensions; ``dtype``
    its dtype; ``shape`` ``(rows, *record shape)`` (values: the value count), as the
    fragment's descriptor implies. A missing chunk raises ``FileNotFoundError`` or
    ``StaleReadError``.
    """

    def writer(self, storage: Storage, array_path: str, ndim: int, buffered: bool) -> Any:
        """The writer of the array's chunk object, appended along axis 0.

        ``buffered``: keep copies until completion (raw chunks; a shard always buffers).

        Returns
        -------
        ChunkWriter or ShardWriter
            The writer.
        """
        raise NotImplementedError

    def metadata(self, array_path: str, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, list[Buffer]]:
        """The array's ``zarr.json`` object.

        Returns
        -------
        dict of str to list of Buffer
            Object path to its bytes, for ``Storage.write_objects``.
        """
        raise NotImplementedError

    def read(self, storage: Storage, array_path: str, dtype: np.dtype, shape: tuple[int, ...], *,
             cached: bool) -> Any:
        """The array, its chunk's size checked first (``cached``: through the storage's chunk cache).

        Returns
        -------
        numpy.ndarray or CompressedArray
            The rows (a shard's decoded as they are read).
        """
        raise NotImplementedError

    def check(self, storage: Storage, array_path: str, dtype: np.dtype,
              shape: tuple[int, ...]) -> tuple[str | None, Buffer | None]:
        """What is wrong with the array's non-empty chunk, if anything: size first, then content.

        Returns
        -------
        tuple
            The problem (None if intact) and the chunk's bytes where they were read whole
            (raw chunks; None for shards, decoded block by block).
        """
        raise NotImplementedError

    def stored_bytes(self, storage: Storage, array_paths: list[str], ndim: int, raw: int) -> int:
        """The bytes the chunks at ``array_paths`` take (non-empty fragments'), whose records take ``raw`` raw.

        Returns
        -------
        int
            Bytes.
        """
        raise NotImplementedError


class RawChunks(ChunkEncoding):
    """A raw chunk: the records' little-endian bytes and a CRC32C (docs/FORMAT.md)."""

    codec = None

    def writer(self, storage: Storage, array_path: str, ndim: int, buffered: bool) -> Any:
        # docstring inherited
        return ChunkWriter(storage, array_path, ndim, buffered)

    def metadata(self, array_path: str, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, list[Buffer]]:
        # docstring inherited
        return array_object(array_path, dtype, shape)

    def read(self, storage: Storage, array_path: str, dtype: np.dtype, shape: tuple[int, ...], *,
             cached: bool) -> Any:
        # docstring inherited
        if shape[0]:  # (an empty array has no chunk) the exact size its descriptor implies
            check_chunk_size(storage, chunk_path(array_path, len(shape)),
                             shape[0] * int(np.prod(shape[1:])) * dtype.itemsize + CRC_BYTES)
        return np.asarray(read_array(storage, array_path, dtype, shape, cached=cached))

    def check(self, storage: Storage, array_path: str, dtype: np.dtype,
              shape: tuple[int, ...]) -> tuple[str | None, Buffer | None]:
        # docstring inherited
        cpath = chunk_path(array_path, len(shape))
        size, expected = storage.size(cpath), int(np.prod(shape)) * dtype.itemsize + CRC_BYTES
        if size != expected:  # size-checked before it is read (mapped where local)
            return f"size {size} bytes, expected {expected}", None
        data = storage.read_array(cpath, np.dtype(np.uint8), (size,))
        return verify_chunk(data, dtype, shape), data

    def stored_bytes(self, storage: Storage, array_paths: list[str], ndim: int, raw: int) -> int:
        # docstring inherited
        return raw


class Shards(ChunkEncoding):
    """A shard of compressed blocks (see the module docstring).

    Parameters
    ----------
    codec : Codec
        The field's codec.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    def writer(self, storage: Storage, array_path: str, ndim: int, buffered: bool) -> Any:
        # docstring inherited
        return ShardWriter(array_path, ndim, self.codec)

    def metadata(self, array_path: str, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, list[Buffer]]:
        # docstring inherited
        return {f"{array_path}/zarr.json": [json.dumps(shard_metadata(np.dtype(dtype), shape, self.codec)).encode()]}

    def read(self, storage: Storage, array_path: str, dtype: np.dtype, shape: tuple[int, ...], *,
             cached: bool) -> Any:
        # docstring inherited
        return CompressedArray(storage, array_path, dtype, shape, self.codec, cached=cached)

    def check(self, storage: Storage, array_path: str, dtype: np.dtype,
              shape: tuple[int, ...]) -> tuple[str | None, Buffer | None]:
        # docstring inherited
        # The size against what the records can take before anything is read; then the index
        # (checksum, blocks tiling the data), and each block in turn (checksum, declared size,
        # decoding) into one block's buffer: memory stays bounded by one block (plus the shard
        # itself on object storage, read whole).
        shard = CompressedArray(storage, array_path, dtype, shape, self.codec, cached=False)
        try:
            size = storage.size(shard.path)
            if size > shard.max_bytes:
                return (f"size {size} bytes, more than a shard of {shape[0]} records can take "
                        f"({shard.max_bytes}): refused unread"), None
            shard.check()
        except CorruptObjectError as exc:
            return str(exc).split(": ", 1)[-1], None
        except StaleReadError:  # (how a read names a missing chunk)
            raise FileNotFoundError(shard.path) from None
        return None, None

    def stored_bytes(self, storage: Storage, array_paths: list[str], ndim: int, raw: int) -> int:
        # docstring inherited
        stored = 0
        for array_path in array_paths:
            path = chunk_path(array_path, ndim)
            try:
                stored += storage.size(path)
            except FileNotFoundError:
                raise missing_chunk(path) from None
        return stored


RAW = RawChunks()
"""The encoding of every array without a codec (index arrays, CSR arrays, raw dense fields)."""


def encoding_of(schema: Any, name: str) -> ChunkEncoding:
    """The encoding of ``schema``'s array ``name`` (any array of a fragment, index arrays too).

    Parameters
    ----------
    name : str
        The array.

    Returns
    -------
    ChunkEncoding
        :class:`Shards` of its codec for a compressed field, else :data:`RAW`.

    Raises
    ------
    UnknownCodecError
        The field's codec is not registered in this process (the error names the field).
    """
    codec = schema.compressed.get(name)
    if codec is None:
        return RAW
    f = schema.field(name)
    return Shards(get_codec(codec, field=name).for_field(f.dtype, f.shape, field=name))


def column_bytes(storage: Storage, schema: Any, frags: Any) -> dict[str, dict[str, Any]]:
    """Per field of a table: bytes stored, bytes raw and codec, over fragments ``frags``.

    Raw bytes are records x record bytes; a raw field stores exactly that, a compressed
    one the sizes of its shards (blocks, index and checksums). A ragged field (stored
    raw) counts its values, and the first field of each CSR group its offsets array too
    (one int64 per record).

    Parameters
    ----------
    frags : sequence of Fragment
        The table's live fragments.

    Returns
    -------
    dict
        ``{field: {"stored": int, "raw": int, "codec": str or None}}``.

    Raises
    ------
    StaleReadError
        A shard is gone (reclaimed since the fragments were listed).

    Notes
    -----
    Cost: one size request per fragment and compressed field.
    """
    out: dict[str, dict[str, Any]] = {}
    rows = sum(f.rows for f in frags)
    for f in schema.dense_fields:
        raw = rows * np.dtype(f.dtype).itemsize * int(np.prod(f.shape))
        paths = [f"{frag.path}/{f.name}" for frag in frags if frag.rows]
        out[f.name] = {"stored": encoding_of(schema, f.name).stored_bytes(storage, paths, 1 + len(f.shape), raw),
                       "raw": raw, "codec": f.codec}
    for offsets, names in schema.offsets_groups.items():
        values = sum(frag.nnz.get(offsets, 0) for frag in frags)
        for i, name in enumerate(names):
            raw = values * np.dtype(schema.field(name).dtype).itemsize + (rows * 8 if i == 0 else 0)
            out[name] = {"stored": raw, "raw": raw, "codec": None}
    return out
