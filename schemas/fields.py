"""The three kinds of field a schema is made of: dense, ragged (CSR) and batch metadata."""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.codecs import Codec, codec_class, get_codec, registered_codecs
from replaystore.errors import SchemaError, UnknownCodecError

_KINDS = "biuf"  # bool, signed int, unsigned int, float: fixed-width numeric only

FIELD_NAME_BYTES = 200
"""The longest field name (a nested leaf's whole path, ``obs__image``) or offsets name, in UTF-8
bytes: each is one path component of a stored fragment (docs/FORMAT.md, "Schema limits")."""


def shown_name(name: object, limit: int = 512) -> str:
    """``repr(name)``, cut to its first ``limit`` characters (and its length) when longer.

    Parameters
    ----------
    name : object
        A name, as given or read.
    limit : int, optional
        The most characters shown.

    Returns
    -------
    str
        The name for an error message.
    """
    if isinstance(name, str) and len(name) > limit:
        return f"{name[:limit]!r}... ({len(name)} characters)"
    return repr(name)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise SchemaError(f"field name {shown_name(name)}: expected a Python identifier")
    if name.startswith("_"):
        raise SchemaError(f"field name {shown_name(name)}: names starting with '_' are reserved")
    size = len(name.encode())
    if size > FIELD_NAME_BYTES:
        raise SchemaError(f"field name {shown_name(name)}: {size} bytes in UTF-8, over the limit of "
                          f"{FIELD_NAME_BYTES} bytes")


def _check_dtype(name: str, dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise SchemaError(f"field {name!r}: dtype {dtype!r} is not a numpy dtype") from exc
    if dt.kind not in _KINDS or dt.shape or dt.names:
        raise SchemaError(f"field {name!r}: expected a fixed-width numeric or bool dtype, got {dt}")
    native: np.dtype = dt.newbyteorder("=") if dt.byteorder == ">" else dt
    return native


def _check_codec(name: str, codec: Any) -> str | None:
    """``codec`` as ``"<name>:<level>"`` (``"zstd"``, ``"zstd:5"``, ``("lz4", 1)`` ...), or None.

    The name must be a codec registered in this process (``replaystore.codecs``), the
    level an int in the range its class declares.
    """
    if codec is None:
        return None
    if isinstance(codec, Codec):
        codec = codec.spec
    if isinstance(codec, str) and codec.partition(":")[0] in registered_codecs():
        cls = codec_class(codec.partition(":")[0], field=name)
        if cls.from_spec.__func__ is not Codec.from_spec.__func__:  # type: ignore[attr-defined]
            return get_codec(codec, field=name).spec  # (a codec with options, the video codec: its own spelling)
    if isinstance(codec, tuple) and len(codec) == 2:
        cname, level = codec
    elif isinstance(codec, str):
        cname, _, lv = codec.partition(":")
        try:
            level = int(lv) if lv else None
        except ValueError:
            level = lv
    else:
        cname, level = codec, None
    if not isinstance(cname, str):
        raise UnknownCodecError(name, repr(codec), registered_codecs())
    cls = codec_class(cname, field=name)
    default, (lo, hi) = cls.default_level, cls.levels
    level = default if level is None else level
    if not isinstance(level, (int, np.integer)) or isinstance(level, bool) or not lo <= level <= hi:
        raise SchemaError(f"field {name!r}: codec {cname!r} level must be an int in [{lo}, {hi}], got {level!r}")
    return f"{cname}:{int(level)}"


def _shape_tuple(name: str, shape: Any) -> tuple[Any, ...]:
    """``shape`` as a tuple: an int is one dimension (``84`` is ``(84,)``); SchemaError if not iterable."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        return (shape,)
    try:
        return tuple(shape)
    except TypeError:
        raise SchemaError(f"field {name!r}: shape must be an int or a tuple of positive ints, "
                          f"got {shape!r}") from None


def _check_bound(name: str, dt: np.dtype, id_bound: int | None) -> None:
    if id_bound is None:
        return
    if dt.kind not in "iu":
        raise SchemaError(f"field {name!r}: id_bound needs an integer dtype, got {dt}")
    if not isinstance(id_bound, int) or id_bound <= 0:
        raise SchemaError(f"field {name!r}: id_bound must be a positive int, got {id_bound!r}")


@dataclass(frozen=True)
class Dense:
    """A fixed-shape value per record: an array shaped ``(records, *shape)``.

    Construction checks every argument; it costs nothing at run time beyond that.

    Parameters
    ----------
    name : str
        Field name: a Python identifier not starting with ``_``, at most ``FIELD_NAME_BYTES``
        (200) bytes in UTF-8.
    dtype : numpy.dtype or str or type
        A fixed-width numeric or bool dtype; big-endian dtypes are stored as native.
    shape : int or tuple of int, optional
        Trailing shape of one record (positive ints); ``()`` for a scalar.
    finite : bool, optional
        Reject NaN/inf at append; default true for float dtypes, false otherwise.
    id_bound : int, optional
        For integer dtypes, reject values outside ``[0, id_bound)`` at append.
    description : str, optional
        Free text kept in the schema document.
    codec : str or tuple, optional
        Compress the field: ``"zstd"`` or ``"lz4"``, optionally with a level as
        ``"zstd:5"`` or ``("zstd", 5)`` (zstd 1-22, default 3; lz4 acceleration, default
        1), or the name of another codec registered with
        ``replaystore.codecs.register_codec``. Kept as ``"<name>:<level>"``. Records are compressed in small blocks
        (docs/FORMAT.md, "Compressed fields"); None (default) stores them raw. Frames (uint8
        ``(height, width, 3)`` or ``(height, width)``) may be video-coded: ``"video:av1"``,
        ``"video:h264"``, ``"video:ffv1"`` (lossless), with options (``"video:av1:crf=30:gop=16"``)
        or a ``replaystore.video.VideoCodec``; kept as its ``spec`` (docs/GUIDE.md, "Video-coded frames").

    Raises
    ------
    SchemaError
        A bad name, a dtype that is not fixed-width numeric or bool, a shape that
        is not positive ints, an ``id_bound`` that is not a positive int on an
        integer dtype, or an unknown codec or level (the error names the field;
        an unregistered codec name raises its subclass ``UnknownCodecError``).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    finite: bool | None = None
    id_bound: int | None = None
    description: str = ""
    codec: str | None = None

    def __post_init__(self) -> None:
        """Check the arguments and normalise ``dtype``, ``shape``, ``finite`` and ``codec``."""
        _check_name(self.name)
        dt = _check_dtype(self.name, self.dtype)
        object.__setattr__(self, "dtype", dt)
        shape = _shape_tuple(self.name, self.shape)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d > 0
                   for d in shape):
            raise SchemaError(f"field {self.name!r}: shape must be positive ints, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.finite is None:
            object.__setattr__(self, "finite", dt.kind == "f")
        _check_bound(self.name, dt, self.id_bound)
        object.__setattr__(self, "codec", _check_codec(self.name, self.codec))
        if self.codec is not None:  # a codec bound to the records checks them (the video codec: frames)
            cls = codec_class(self.codec.partition(":")[0], field=self.name)
            if cls.for_field is not Codec.for_field:
                get_codec(self.codec, field=self.name).for_field(dt, self.shape, field=self.name)

    kind = "dense"


@dataclass(frozen=True)
class Ragged:
    """A variable-length list per record, stored as CSR.

    The values array has dtype ``dtype``; the int64 ``offsets`` array (named by
    ``offsets``, length records + 1) delimits each record's slice. Ragged fields
    naming the same ``offsets`` are aligned: they share one offsets array and
    must hold the same number of values.

    Parameters
    ----------
    name : str
        Field name: a Python identifier not starting with ``_``, at most ``FIELD_NAME_BYTES``
        (200) bytes in UTF-8.
    dtype : numpy.dtype or str or type
        Dtype of the values: fixed-width numeric or bool.
    offsets : str
        Name of the CSR offsets array (an identifier other than ``name``).
    finite : bool, optional
        Reject NaN/inf at append; default true for float dtypes, false otherwise.
    id_bound : int, optional
        For integer dtypes, reject values outside ``[0, id_bound)`` at append.
    description : str, optional
        Free text kept in the schema document.

    Raises
    ------
    SchemaError
        A bad name or offsets name, ``offsets == name``, a dtype that is not
        fixed-width numeric or bool, or a bad ``id_bound``.
    """

    name: str
    dtype: np.dtype
    offsets: str
    finite: bool | None = None
    id_bound: int | None = None
    description: str = ""

    def __post_init__(self) -> None:
        """Check the arguments and normalise ``dtype`` and ``finite``."""
        _check_name(self.name)
        _check_name(self.offsets)
        if self.offsets == self.name:
            raise SchemaError(f"field {self.name!r}: offsets must have a name of its own")
        dt = _check_dtype(self.name, self.dtype)
        object.__setattr__(self, "dtype", dt)
        if self.finite is None:
            object.__setattr__(self, "finite", dt.kind == "f")
        _check_bound(self.name, dt, self.id_bound)

    kind = "ragged"
    shape: tuple[int, ...] = field(default=(), init=False)


@dataclass(frozen=True)
class BatchMeta:
    """A JSON document per append (e.g. ``telemetry``), kept with the commit, never per record.

    Parameters
    ----------
    name : str
        Field name: a Python identifier not starting with ``_``, at most ``FIELD_NAME_BYTES``
        (200) bytes in UTF-8.
    description : str, optional
        Free text kept in the schema document.

    Raises
    ------
    SchemaError
        The name is not an identifier, or starts with ``_``.
    """

    name: str
    description: str = ""

    def __post_init__(self) -> None:
        """Check the name."""
        _check_name(self.name)

    kind = "meta"


Field = Dense | Ragged | BatchMeta

OFFSETS_DTYPE = np.dtype(np.int64)
