"""Codecs of compressed dense fields: one class each, found by name in a registry.

A dense field declared with ``codec="zstd:3"`` is stored as shards of small blocks, each
block encoded by the field's codec (docs/FORMAT.md, "Compressed fields"). A codec is a
subclass of :class:`Codec` registered with :func:`register_codec` (zarr-python's
``register_codec`` shape); the schema layer checks a field's codec name and level
against the registry, and the store asks the codec object to encode, decode and check
each block. Adding a codec touches no store module (docs/INTERNALS.md, "Adding a codec").

The registry lives here, below both the schemas and the store, because both consult it:
the schemas to accept a registered name, the store to encode and decode. A codec class in
full is in tests/store/test_codec_registry.py (zlib, in one class).
"""

from __future__ import annotations

import abc
import inspect
import re
import threading
from typing import Any, ClassVar

import numpy as np

from replaystore.errors import CodecRegistrationError, SchemaError, UnknownCodecError

__all__ = ["FORMAT_CODECS", "Codec", "LZ4Codec", "ZstdCodec", "codec_class", "get_codec", "register_codec",
           "registered_codecs"]

FORMAT_CODECS = ("zstd", "lz4")
"""The codec names the format defines (docs/FORMAT.md, "Compressed fields"); any other
registered name is a writer's extension that readers may refuse."""

_NAME = re.compile(r"[a-z][a-z0-9_.]{0,63}")


class Codec(abc.ABC):
    """A block codec of compressed dense fields (subclass it and :func:`register_codec` the class).

    An instance is the codec at one level. A subclass sets the class attributes and
    implements the four abstract methods; every method gets bytes of one block and must
    be safe to call from several threads at once.

    Parameters
    ----------
    level : int, optional
        The level (default :attr:`default_level`), in :attr:`levels`.

    Attributes
    ----------
    name : str
        The name a schema's ``codec`` spells (``"zstd"`` in ``"zstd:3"``): lowercase
        letters, digits, ``_`` and ``.``, starting with a letter, unique in the registry.
    default_level : int
        The level of a codec given without one.
    levels : tuple of int
        ``(lowest, highest)`` level accepted.
    level : int
        This instance's level.

    Raises
    ------
    SchemaError
        ``level`` is not an int in :attr:`levels`.
    """

    name: ClassVar[str]
    default_level: ClassVar[int]
    levels: ClassVar[tuple[int, int]]
    block_records: int = 8
    """Records per block (a shard's inner chunk): 8 for the byte codecs; a video codec's GOP."""

    def __init__(self, level: int | None = None) -> None:
        level = self.default_level if level is None else level
        lo, hi = self.levels
        if not isinstance(level, (int, np.integer)) or isinstance(level, bool) or not lo <= level <= hi:
            raise SchemaError(f"codec {self.name!r} level must be an int in [{lo}, {hi}], got {level!r}")
        self.level = int(level)

    @classmethod
    def from_spec(cls, options: str, field: str | None = None) -> Codec:
        """The codec of a schema's ``codec`` string, given what follows ``"<name>:"``.

        The default reads a level (``"3"`` in ``"zstd:3"``; ``""``: the default level).
        A codec with more options than a level (the video codec) overrides it; its
        :attr:`spec` must give back the same codec.

        Parameters
        ----------
        options : str
            The part after the name and its colon (empty when there is none).
        field : str, optional
            The field asking, named by the errors.

        Returns
        -------
        Codec
            A new instance.

        Raises
        ------
        SchemaError
            The options are malformed.
        """
        try:
            return cls(int(options) if options else None)
        except ValueError as exc:
            raise SchemaError(str(exc)) from None

    def for_field(self, dtype: np.dtype, shape: tuple[int, ...], field: str | None = None) -> Codec:
        """The codec bound to a field's records (``dtype`` and record ``shape``); checks they fit.

        The byte codecs take any records and give themselves; a codec that needs the record
        layout (the video codec: frame height, width, channels) gives a bound copy.

        Parameters
        ----------
        dtype : numpy.dtype
            The field's dtype.
        shape : tuple of int
            One record's shape.
        field : str, optional
            The field, named by the errors.

        Returns
        -------
        Codec
            The codec to encode and decode this field's blocks with.

        Raises
        ------
        SchemaError
            The codec cannot store such records.
        """
        return self

    @property
    def spec(self) -> str:
        """The normalised codec a schema keeps, ``"<name>:<level>"``."""
        return f"{self.name}:{self.level}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.level})"

    @abc.abstractmethod
    def zarr_metadata(self) -> dict[str, Any]:
        """The codec's entry in a Zarr v3 ``codecs`` list (between ``bytes`` and ``crc32c``).

        Returns
        -------
        dict
            ``{"name": ..., "configuration": {...}}``, as zarr-python spells the codec.
        """

    @abc.abstractmethod
    def encode(self, raw: np.ndarray) -> bytes:
        """One block, encoded.

        Parameters
        ----------
        raw : numpy.ndarray
            The block's records as bytes, little-endian, C order (uint8, 1-d, C-contiguous:
            anything that takes a buffer, such as ``zlib.compress``, takes it).

        Returns
        -------
        bytes
            The encoded block (its checksum is added by the store). Its header must let
            :meth:`declared_size` tell the decoded size.
        """

    @abc.abstractmethod
    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        """Decode one block into ``out``, filling it exactly.

        Called only after :meth:`declared_size` returned ``out.size``.

        Parameters
        ----------
        data : numpy.ndarray
            The encoded block (uint8, 1-d), its checksum verified.
        out : numpy.ndarray
            Where the block's bytes go (uint8, 1-d, C-contiguous).

        Raises
        ------
        Exception
            ``data`` does not decode into exactly ``out.size`` bytes (any exception; the
            store reports it as a damaged block, naming the shard and the block).
        """

    @abc.abstractmethod
    def declared_size(self, data: np.ndarray) -> int | None:
        """The decoded size an encoded block's header declares, read before decoding.

        The store refuses a block whose declared size is not exactly one block's bytes,
        so a forged block never makes the decoder allocate or write more.

        Parameters
        ----------
        data : numpy.ndarray
            The encoded block (uint8, 1-d).

        Returns
        -------
        int or None
            Bytes, or None when the header declares none that can be trusted.
        """

    def decode_rows_into(self, data: np.ndarray, out: np.ndarray, rows: list[int]) -> None:
        """Decode one block into ``out``, of which only records ``rows`` need to be filled.

        What a read calls when it wants some records of a block and the codec overrides
        this method (the video codec: it decodes a GOP up to the last record wanted and
        converts only those). The default decodes the whole block (:meth:`decode_into`).

        Parameters
        ----------
        data : numpy.ndarray
            The encoded block (uint8, 1-d), its checksum and declared size verified.
        out : numpy.ndarray
            The block's bytes (uint8, 1-d, C-contiguous, :attr:`block_records` records).
        rows : list of int
            The records wanted (sorted, distinct, inside the block); the others may be left as they were.

        Raises
        ------
        Exception
            ``data`` does not decode (any exception; the store names the damaged block).
        """
        self.decode_into(data, out)

    def decode_blocks(self, raw: np.ndarray, spans: list[tuple[int, int]], out: np.ndarray) -> None:
        """Decode several blocks of one shard: ``raw[start:start + size]`` into ``out[i]`` for ``spans[i]``.

        What a read calls for the blocks it needs, each block's checksum and declared size
        checked first. The default calls :meth:`decode_into` per block; a codec overrides it
        where a call per block costs more than the decoding (the result must be the same).

        Parameters
        ----------
        raw : numpy.ndarray
            The shard's bytes (uint8, 1-d, C-contiguous).
        spans : list of tuple of int
            ``(start, size)`` of each encoded block in ``raw``.
        out : numpy.ndarray
            uint8 ``(len(spans), block bytes)``, C-contiguous.

        Raises
        ------
        Exception
            A block does not decode into exactly its row of ``out`` (the store then decodes
            the blocks one by one to name the damaged one).
        """
        for i, (start, size) in enumerate(spans):
            self.decode_into(raw[start:start + size], out[i])

    def max_encoded_bytes(self, raw: int) -> int:
        """The most bytes :meth:`encode` gives for ``raw`` bytes (what a shard may take).

        The default is what zstd and LZ4 add to incompressible data: under 1/128 of
        it plus a few hundred bytes. A shard larger than its blocks' bound is refused
        unread.

        Parameters
        ----------
        raw : int
            Bytes of one block.

        Returns
        -------
        int
            Bytes.
        """
        return raw + raw // 128 + 1024


_REGISTRY: dict[str, type[Codec]] = {}
_LOCK = threading.Lock()


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Register a codec class under its ``name`` (usable as a class decorator).

    Parameters
    ----------
    cls : type
        A concrete subclass of :class:`Codec`.

    Returns
    -------
    type
        ``cls``.

    Raises
    ------
    CodecRegistrationError
        ``cls`` is not a concrete :class:`Codec` subclass, its ``name``, ``default_level``
        or ``levels`` is missing or malformed, or another class has its name (the
        registry is left as it was).
    """
    if not isinstance(cls, type) or not issubclass(cls, Codec):
        raise CodecRegistrationError(f"codec class {cls!r}: expected a subclass of replaystore.codecs.Codec")
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise CodecRegistrationError(f"codec class {cls.__qualname__}: abstract methods {missing} not implemented")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CodecRegistrationError(f"codec class {cls.__qualname__}: name {name!r} must be lowercase letters, "
                                     "digits, '_' and '.', starting with a letter (at most 64 characters)")
    levels = getattr(cls, "levels", None)
    default = getattr(cls, "default_level", None)
    if (not isinstance(levels, tuple) or len(levels) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in levels) or levels[0] > levels[1]):
        raise CodecRegistrationError(f"codec class {cls.__qualname__}: levels {levels!r} must be a tuple "
                                     "(lowest, highest) of ints")
    if not isinstance(default, int) or isinstance(default, bool) or not levels[0] <= default <= levels[1]:
        raise CodecRegistrationError(f"codec class {cls.__qualname__}: default_level {default!r} must be an int "
                                     f"in {list(levels)}")
    with _LOCK:
        if name in _REGISTRY:
            raise CodecRegistrationError(f"codec class {cls.__qualname__}: name {name!r} is taken by "
                                         f"{_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
    return cls


def registered_codecs() -> list[str]:
    """The names of the codecs registered in this process.

    Returns
    -------
    list of str
        Sorted.
    """
    return sorted(_REGISTRY)


def codec_class(name: str, field: str | None = None) -> type[Codec]:
    """The codec class registered as ``name``.

    Parameters
    ----------
    name : str
        A codec name (``"zstd"``, no level).
    field : str, optional
        The field asking, named by the error.

    Returns
    -------
    type
        The :class:`Codec` subclass.

    Raises
    ------
    UnknownCodecError
        No codec of that name is registered in this process.
    """
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownCodecError(field, name, list(_REGISTRY))
    return cls


def get_codec(codec: str, field: str | None = None) -> Codec:
    """The codec object of a field's ``codec`` (``"zstd:3"``; ``"zstd"``: its default level).

    Parameters
    ----------
    codec : str
        A codec, as a schema keeps it.
    field : str, optional
        The field asking, named by the errors.

    Returns
    -------
    Codec
        A new instance at the level.

    Raises
    ------
    UnknownCodecError
        The name is not registered in this process.
    SchemaError
        The level is not an int the codec accepts.
    """
    name, _, level = codec.partition(":")
    cls = codec_class(name, field)
    try:
        return cls.from_spec(level, field)
    except UnknownCodecError:  # (a codec whose library is missing says so itself)
        raise
    except (SchemaError, ValueError) as exc:
        where = f"field {field!r}: " if field is not None else ""
        raise SchemaError(f"{where}codec {codec!r}: {exc}") from None


class ZstdCodec(Codec):
    """Zstandard (zarr-python's ``zstd``).

    Parameters
    ----------
    level : int, optional
        From 1 to 22; default 3.
    """

    name = "zstd"
    default_level = 3
    levels = (1, 22)

    def __init__(self, level: int | None = None) -> None:
        # docstring inherited
        import numcodecs  # type: ignore[import-untyped]  # (imported with the first codec object)

        super().__init__(level)
        self._impl = numcodecs.Zstd(level=self.level)

    def zarr_metadata(self) -> dict[str, Any]:
        # docstring inherited
        return {"name": "zstd", "configuration": {"level": self.level, "checksum": False}}

    def encode(self, raw: np.ndarray) -> bytes:
        # docstring inherited
        return bytes(self._impl.encode(raw))

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        # docstring inherited
        contexts = _zstd_contexts()
        if contexts is None:
            self._impl.decode(data, out=out)
        else:
            contexts.decode_into(data, out)

    def decode_blocks(self, raw: np.ndarray, spans: list[tuple[int, int]], out: np.ndarray) -> None:
        # docstring inherited
        contexts = _zstd_contexts()
        if contexts is None:
            super().decode_blocks(raw, spans, out)
        else:
            contexts.decode_blocks(raw, spans, out)

    def declared_size(self, data: np.ndarray) -> int | None:
        # docstring inherited: the frame header's content size (a frame without one declares none)
        head = data[:18].tobytes()
        if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
            return None
        descriptor = head[4]
        fcs_flag, single, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
        if descriptor & 0x08:  # reserved bit
            return None
        fcs = (single, 2, 4, 8)[fcs_flag]
        if not fcs:
            return None
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        if len(head) < pos + fcs:
            return None
        value = int.from_bytes(head[pos:pos + fcs], "little")
        return value + 256 if fcs == 2 else value


class _ZstdContexts:
    """zstd decompression through a reused context per thread (ctypes over numcodecs' own zstd library).

    ``numcodecs.Zstd.decode`` creates and frees a decompression context on every call,
    which costs ~3x the decoding of a block of 8 Atari frames; a context kept per
    thread (``ZSTD_decompressDCtx``) decodes the same bytes with the same library.
    The call releases the GIL (ctypes), so threads decode in parallel.

    Parameters
    ----------
    lib : ctypes.CDLL
        A library exporting ``ZSTD_createDCtx``, ``ZSTD_freeDCtx``,
        ``ZSTD_decompressDCtx``, ``ZSTD_isError`` and ``ZSTD_getErrorName``.
    """

    def __init__(self, lib: Any) -> None:
        import ctypes

        size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
        lib.ZSTD_createDCtx.restype, lib.ZSTD_createDCtx.argtypes = ptr, []
        lib.ZSTD_freeDCtx.restype, lib.ZSTD_freeDCtx.argtypes = size_t, [ptr]
        lib.ZSTD_decompressDCtx.restype = size_t
        lib.ZSTD_decompressDCtx.argtypes = [ptr, ptr, size_t, ptr, size_t]
        lib.ZSTD_isError.restype, lib.ZSTD_isError.argtypes = ctypes.c_uint, [size_t]
        lib.ZSTD_getErrorName.restype, lib.ZSTD_getErrorName.argtypes = ctypes.c_char_p, [size_t]
        self._lib = lib
        self._decompress = lib.ZSTD_decompressDCtx
        self._local = threading.local()

    def _context(self) -> int:
        held = getattr(self._local, "held", None)
        if held is None:
            ctx = self._lib.ZSTD_createDCtx()
            if not ctx:
                raise MemoryError("zstd: no decompression context")
            held = self._local.held = _Context(self._lib, ctx)
        return held.ctx

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        """Decode one zstd frame into ``out``, which it must fill exactly.

        Parameters
        ----------
        data : numpy.ndarray
            The frame (uint8, 1-d, C-contiguous).
        out : numpy.ndarray
            Where its bytes go (C-contiguous); never written past its end.

        Raises
        ------
        ValueError
            ``data`` is not a zstd frame of exactly ``out.nbytes`` decoded bytes.
        """
        data = np.ascontiguousarray(data)  # (a no-op for a block sliced from a shard)
        if not out.flags.c_contiguous:
            raise ValueError("zstd: the output must be C-contiguous")
        n = self._decompress(self._context(), out.ctypes.data, out.nbytes, data.ctypes.data, data.nbytes)
        if self._lib.ZSTD_isError(n):
            raise ValueError(f"zstd: {self._lib.ZSTD_getErrorName(n).decode()}")
        if n != out.nbytes:
            raise ValueError(f"zstd: decoded {n} bytes, expected {out.nbytes}")


    def decode_blocks(self, raw: np.ndarray, spans: list[tuple[int, int]], out: np.ndarray) -> None:
        """Decode ``raw[start:start + size]`` into ``out[i]`` for each ``spans[i]`` (one pointer look-up in all).

        Parameters
        ----------
        raw : numpy.ndarray
            The frames' bytes (uint8, 1-d, C-contiguous).
        spans : list of tuple of int
            ``(start, size)`` of each frame, inside ``raw``.
        out : numpy.ndarray
            ``(len(spans), bytes)``, C-contiguous: each row filled exactly.

        Raises
        ------
        ValueError
            A span outside ``raw``, or a frame that does not decode into exactly its row.
        """
        if not raw.flags.c_contiguous or not out.flags.c_contiguous or out.ndim != 2 or len(out) != len(spans):
            raise ValueError("zstd: raw and out must be C-contiguous, out one row per block")
        total, row = raw.nbytes, out.shape[1] * out.itemsize
        src, dst = raw.ctypes.data, out.ctypes.data
        ctx, decompress, is_error = self._context(), self._decompress, self._lib.ZSTD_isError
        for i, (start, size) in enumerate(spans):
            if start < 0 or size < 0 or start + size > total:
                raise ValueError(f"zstd: block [{start}, +{size}) outside {total} bytes")
            n = decompress(ctx, dst + i * row, row, src + start, size)
            if n != row:
                raise ValueError(f"zstd: {self._lib.ZSTD_getErrorName(n).decode()}" if is_error(n)
                                 else f"zstd: decoded {n} bytes, expected {row}")


class _Context:
    """One thread's zstd decompression context, freed with the thread's locals."""

    def __init__(self, lib: Any, ctx: int) -> None:
        self.lib, self.ctx = lib, ctx

    def __del__(self) -> None:
        ctx, self.ctx = self.ctx, 0
        if ctx and self.lib is not None:
            self.lib.ZSTD_freeDCtx(ctx)


_CONTEXTS: list[_ZstdContexts | None] = []


def _zstd_contexts() -> _ZstdContexts | None:
    """The process's zstd contexts, or None where numcodecs' zstd library exports no symbols.

    Asked once: then decoding goes through ``numcodecs.Zstd`` (the same library, a context per call).
    """
    if not _CONTEXTS:
        with _LOCK:
            if not _CONTEXTS:
                got: _ZstdContexts | None = None
                try:
                    import ctypes

                    import numcodecs.zstd  # type: ignore[import-untyped]

                    got = _ZstdContexts(ctypes.CDLL(numcodecs.zstd.__file__))
                except (OSError, AttributeError, ImportError):  # (a build that hides its symbols)
                    got = None
                _CONTEXTS.append(got)
    return _CONTEXTS[0]


class LZ4Codec(Codec):
    """LZ4 (zarr-python's ``numcodecs.lz4``).

    Parameters
    ----------
    level : int, optional
        The acceleration, from 1 to 65537; default 1.
    """

    name = "lz4"
    default_level = 1
    levels = (1, 65537)

    def __init__(self, level: int | None = None) -> None:
        # docstring inherited
        import numcodecs

        super().__init__(level)
        self._impl = numcodecs.LZ4(acceleration=self.level)

    def zarr_metadata(self) -> dict[str, Any]:
        # docstring inherited
        return {"name": "numcodecs.lz4", "configuration": {"acceleration": self.level}}

    def encode(self, raw: np.ndarray) -> bytes:
        # docstring inherited
        return bytes(self._impl.encode(raw))

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        # docstring inherited
        self._impl.decode(data, out=out)

    def declared_size(self, data: np.ndarray) -> int | None:
        # docstring inherited: numcodecs' 4-byte little-endian size prefix
        head = data[:4].tobytes()
        return int.from_bytes(head, "little") if len(head) >= 4 else None


register_codec(ZstdCodec)
register_codec(LZ4Codec)

import replaystore.video  # noqa: E402, F401  (registers the video codec; it imports PyAV only when used)
