"""Video-coded frame fields: a block of a compressed field is one GOP of compressed video packets.

A dense ``uint8`` field of frames declared with ``codec="video:av1"`` (or ``"video:h264"``,
``"video:ffv1"``) is stored like any compressed field (shards of blocks, docs/FORMAT.md,
"Compressed fields"), with two differences: a block holds :attr:`VideoCodec.gop` records
(the codec's ``block_records``), and a block is one keyframe-aligned group of pictures
(GOP): the packets an encoder gives for those frames, starting with a keyframe, framed by
:func:`pack_gop` (docs/FORMAT.md, "Video-coded fields"). A block decodes on its own, so a
random frame decodes at most one GOP.

The packets are what an encoder or an MP4 demuxer gives, in decode order: an importer
copies a demuxed stream's packets into blocks without re-encoding
(:meth:`VideoCodec.from_stream` carries the stream's parameters). PyAV (``av``, FFmpeg
bindings) encodes and decodes; it is the optional extra ``replaystore[video]`` and is
imported only when a video field is built, encoded or decoded.

What comes back: ``"video:h264_lossless"`` and ``"video:ffv1"`` are lossless (a read gives the frames written, bit for
bit); ``"video:av1"`` and ``"video:h264"`` are lossy (a read gives the decoder's frames:
PyAV's decode of the stored packets, converted to RGB24 as ``VideoFrame.to_ndarray``
does; grayscale frames travel as the luma plane, chroma flat at 128, and come back as the
decoded luma plane).
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import numpy as np

from replaystore.codecs import Codec, register_codec
from replaystore.errors import SchemaError, VideoUnavailableError

__all__ = ["VIDEO_CODECS", "VideoCodec", "kept_scheduling", "pack_gop", "unpack_gop"]

VIDEO_CODECS = {
    # name: (encoder, decoder, lossless, pix_fmt of RGB frames, pix_fmt of grayscale frames)
    "av1": ("libsvtav1", "libdav1d", False, "yuv420p", "yuv420p"),
    "h264": ("libx264", "h264", False, "yuv420p", "yuv420p"),
    "ffv1": ("ffv1", "ffv1", True, "bgr0", "gray"),
    # H.264 at qp 0 in 4:4:4, the RGB planes G, B, R carried as Y, U, V (as libx264rgb does): lossless
    "h264_lossless": ("libx264", "h264", True, "yuv444p", "yuv444p"),
}
"""The stream codecs a video field names (``"video:<name>"``): their PyAV encoder and decoder."""

_DEFAULT_CRF = {"av1": 30, "h264": 23}
_DEFAULT_PRESET = {"av1": "8", "h264": "veryfast", "h264_lossless": "medium"}
_DEFAULT_GOP = 16

_MAGIC = b"RSVG"
_VERSION = 1
_HEAD = struct.Struct("<4sBBxxI")  # magic, version, timestamp mode, 2 reserved zero bytes, packets
_MAX_PACKETS = 1 << 16
_THREAD = threading.local()  # per thread: its decoders (by decoder, extradata and size) and its RGB converter
_TS_NONE, _TS_ALL, _TS_SOME = 0, 1, 2  # no packet has pts/dts; every packet has both; per packet


def _varint(value: int, out: bytearray) -> None:
    """Append ``value`` (>= 0) as an unsigned LEB128 varint."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 varint at ``pos`` and the position after it (ValueError past the end or over 64 bits)."""
    value = shift = 0
    while True:
        if pos >= len(raw):
            raise ValueError("a GOP block's packet table runs past its end")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a GOP block's packet table holds a varint over 64 bits")


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63) if value < 0 else value << 1


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def pack_gop(packets: list[tuple[bytes, int | None, int | None, bool]]) -> bytes:
    """One GOP's packets framed as one block (docs/FORMAT.md, "Video-coded fields").

    Parameters
    ----------
    packets : list of tuple
        ``(data, pts, dts, keyframe)`` per packet, in decode order, as an encoder or a
        demuxer gives them (``pts``/``dts`` may be None; kept as given).

    Returns
    -------
    bytes
        A 12-byte header (``"RSVG"``, version 1, the timestamp mode, two zero bytes, the
        packet count as uint32 little-endian), the packet table (varints: per packet its
        size times 2 plus its keyframe bit, then its timestamps as the mode says), then
        the packets' bytes one after the other.

    Raises
    ------
    ValueError
        No packets, more than 65536, or a packet that is not bytes.
    """
    if not packets or len(packets) > _MAX_PACKETS:
        raise ValueError(f"a GOP holds 1 to {_MAX_PACKETS} packets, got {len(packets)}")
    stamps = [(pts, dts) for _, pts, dts, _ in packets]
    if all(p is None and d is None for p, d in stamps):
        mode = _TS_NONE
    elif all(p is not None and d is not None for p, d in stamps):
        mode = _TS_ALL
    else:
        mode = _TS_SOME
    table = bytearray()
    body = []
    prev_pts = prev_dts = 0
    for data, pts, dts, key in packets:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ValueError(f"a packet's data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        _varint(len(data) << 1 | (1 if key else 0), table)
        if mode == _TS_SOME:
            table.append((pts is not None) | (dts is not None) << 1)
        if mode != _TS_NONE:
            if pts is not None:  # (deltas from the previous packet's: small numbers, a byte or two)
                _varint(_zigzag(int(pts) - prev_pts), table)
                prev_pts = int(pts)
            if dts is not None:
                _varint(_zigzag(int(dts) - prev_dts), table)
                prev_dts = int(dts)
        body.append(data)
    return b"".join([_HEAD.pack(_MAGIC, _VERSION, mode, len(packets)), bytes(table), *body])


def gop_packets(block: bytes | np.ndarray) -> int:
    """The packet count a framed GOP declares (its header only; ValueError if it is not one).

    Parameters
    ----------
    block : bytes or numpy.ndarray
        A block as :func:`pack_gop` gives it.

    Returns
    -------
    int
        Packets.

    Raises
    ------
    ValueError
        The block does not start with a version-1 GOP header.
    """
    head = bytes(block[:_HEAD.size])
    if len(head) < _HEAD.size:
        raise ValueError(f"a GOP block starts with a {_HEAD.size}-byte header, got {len(head)} bytes")
    magic, version, mode, count = _HEAD.unpack(head)
    if magic != _MAGIC or version != _VERSION or mode > _TS_SOME or head[6:8] != b"\0\0":
        raise ValueError(f"not a version-{_VERSION} GOP block (magic {magic!r}, version {version}, "
                         f"timestamp mode {mode})")
    return int(count)


def unpack_gop(block: bytes | np.ndarray) -> list[tuple[bytes, int | None, int | None, bool]]:
    """The packets of a block :func:`pack_gop` framed (the inverse).

    Parameters
    ----------
    block : bytes or numpy.ndarray
        The block (uint8).

    Returns
    -------
    list of tuple
        ``(data, pts, dts, keyframe)`` per packet, in decode order.

    Raises
    ------
    ValueError
        A malformed block: wrong magic, version or timestamp mode, a packet count of 0 or
        over 65536, a packet table or sizes that do not add up to the block's length exactly.
    """
    raw = bytes(block)
    count = gop_packets(raw)
    if not 1 <= count <= _MAX_PACKETS:
        raise ValueError(f"a GOP block declares {count} packets (1 to {_MAX_PACKETS})")
    mode = raw[4 + 1]
    pos = _HEAD.size
    entries = []
    prev_pts = prev_dts = 0
    for i in range(count):
        word, pos = _read_varint(raw, pos)
        has_pts = has_dts = mode == _TS_ALL
        if mode == _TS_SOME:
            if pos >= len(raw) or raw[pos] > 3:
                raise ValueError(f"packet {i}: malformed timestamp flags")
            has_pts, has_dts = bool(raw[pos] & 1), bool(raw[pos] & 2)
            pos += 1
        pts = dts = None
        if has_pts:
            delta, pos = _read_varint(raw, pos)
            pts = prev_pts = prev_pts + _unzigzag(delta)
        if has_dts:
            delta, pos = _read_varint(raw, pos)
            dts = prev_dts = prev_dts + _unzigzag(delta)
        entries.append((word >> 1, pts, dts, bool(word & 1)))
    out: list[tuple[bytes, int | None, int | None, bool]] = []
    for i, (size, pts, dts, key) in enumerate(entries):
        if pos + size > len(raw):
            raise ValueError(f"packet {i} of {size} bytes runs past the block's end")
        out.append((raw[pos:pos + size], pts, dts, key))
        pos += size
    if pos != len(raw):
        raise ValueError(f"a GOP block of {len(raw)} bytes holds {pos} bytes of packets and table")
    return out


def _scheduling() -> tuple[int, int] | None:
    """The calling thread's scheduling policy and priority (None where the platform has no such call)."""
    try:
        return os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    except (AttributeError, OSError):
        return None


@contextmanager
def kept_scheduling() -> Iterator[None]:
    """Run the block, then put every thread of this process back on the caller's scheduling policy.

    SVT-AV1, opened by root (an encoder, or a muxer whose stream opens one), moves the
    calling thread and its own threads to real-time ``SCHED_FIFO`` at priority 99; processes
    started after that inherit it, and one that busy-waits then starves everything else on
    the machine. Wrap every PyAV encoder or muxer use in this. Cost: two system calls, and a
    listing of /proc/self/task when a policy changed.

    Yields
    ------
    None
    """
    saved = _scheduling()
    try:
        yield
    finally:
        if saved is not None:
            _restore_scheduling(saved)


def _restore_scheduling(saved: tuple[int, int]) -> None:
    """Put every thread of this process that left ``saved``'s policy back on it."""
    if _scheduling() == saved and not _THREAD.__dict__.get("rt_seen"):
        return
    _THREAD.rt_seen = True  # (SVT's own threads may be moved after the calling thread was put back)
    policy, priority = saved
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    for tid in tasks:
        try:
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(priority))
        except OSError:  # (a thread that ended meanwhile)
            continue


def _av(field: str | None, spec: str) -> Any:
    """The ``av`` module, or VideoUnavailableError naming the field and the extra."""
    try:
        import av
    except ImportError:
        raise VideoUnavailableError(field, spec) from None
    return av


class VideoCodec(Codec):
    """Video coding of frame fields: each block one GOP, encoded and decoded by PyAV.

    Schema spelling: ``codec="video:av1"``, ``"video:h264"``, ``"video:h264_lossless"`` or
    ``"video:ffv1"`` (both lossless),
    with options after colons, ``"video:av1:crf=30:gop=16:preset=8"``; or an instance,
    ``codec=VideoCodec("av1", crf=30, gop=16)``. The field must be ``uint8`` frames shaped
    ``(height, width, 3)`` (RGB), ``(height, width)`` or ``(height, width, 1)`` (grayscale);
    the lossy codecs need an even height and width (4:2:0 chroma).

    Parameters
    ----------
    codec : str, optional
        ``"av1"`` (SVT-AV1 encoder, dav1d decoder; default), ``"h264"`` (x264, FFmpeg's
        decoder), ``"h264_lossless"`` (x264 at qp 0 in 4:4:4, the RGB planes carried as
        Y, U, V: lossless, inter-coded, fast to decode) or ``"ffv1"`` (lossless, intra-only).
    crf : int, optional
        Constant rate factor of the lossy codecs (0-63; default 30 for AV1, 23 for
        H.264); ignored by the lossless codecs.
    gop : int, optional
        Frames per group of pictures, which is also the records per block (1-1024;
        default 16). The first frame of each block is a keyframe.
    preset : str, optional
        The encoder's speed preset (SVT-AV1 ``"0"``-``"13"``, default ``"8"``; x264
        ``"ultrafast"``...``"placebo"``, default ``"veryfast"``; ``"medium"`` for
        ``h264_lossless``).
    pix_fmt : str, optional
        The stream's pixel format (default: ``yuv420p`` for the lossy codecs; ``bgr0`` or
        ``gray`` for ffv1). Given by :meth:`from_stream` for an imported stream.
    width, height : int, optional
        The frame size; set when the codec is bound to a field (:meth:`for_field`) or
        read from a stream.
    time_base : str, optional
        The stream's time base, ``"1/30"`` (default ``"1/30"``).
    extradata : bytes, optional
        The stream's codec extradata (an MP4's ``avcC``/``av1C`` payload), given to the
        decoder of every block.

    Attributes
    ----------
    block_records : int
        ``gop``.
    lossless : bool
        Whether a read gives back exactly the frames written.

    Raises
    ------
    SchemaError
        An unknown codec name or an option out of range.
    """

    name = "video"
    default_level = 30
    levels = (0, 63)

    def __init__(self, codec: str = "av1", crf: int | None = None, gop: int = _DEFAULT_GOP,
                 preset: str | None = None, pix_fmt: str | None = None, width: int | None = None,
                 height: int | None = None, time_base: str = "1/30", extradata: bytes | None = None) -> None:
        if codec not in VIDEO_CODECS:
            raise SchemaError(f"video codec must be one of {sorted(VIDEO_CODECS)}, got {codec!r}")
        self.codec = codec
        lossless = VIDEO_CODECS[codec][2]
        if crf is None:
            crf = _DEFAULT_CRF.get(codec)
        if lossless:
            crf = None
        elif not isinstance(crf, (int, np.integer)) or isinstance(crf, bool) or not 0 <= crf <= 63:
            raise SchemaError(f"video crf must be an int in [0, 63], got {crf!r}")
        self.crf = None if crf is None else int(crf)
        if not isinstance(gop, (int, np.integer)) or isinstance(gop, bool) or not 1 <= gop <= 1024:
            raise SchemaError(f"video gop must be an int in [1, 1024], got {gop!r}")
        self.gop = self.block_records = int(gop)
        self.preset = (None if codec not in _DEFAULT_PRESET
                       else str(preset if preset is not None else _DEFAULT_PRESET[codec]))
        for what, text in (("pix_fmt", pix_fmt), ("preset", self.preset)):
            if text is not None and (not text or not all(c.isalnum() or c in "_-" for c in text)):
                raise SchemaError(f"video {what} must be letters, digits, '_' and '-', got {text!r}")
        self.pix_fmt = pix_fmt
        for what, value in (("width", width), ("height", height)):
            if value is not None and (not isinstance(value, (int, np.integer)) or not 1 <= value <= 1 << 14):
                raise SchemaError(f"video {what} must be an int in [1, 16384], got {value!r}")
        self.width = None if width is None else int(width)
        self.height = None if height is None else int(height)
        try:
            tb = Fraction(str(time_base))
        except (ValueError, ZeroDivisionError):
            raise SchemaError(f"video time_base must be a fraction like '1/30', got {time_base!r}") from None
        if tb <= 0:
            raise SchemaError(f"video time_base must be positive, got {time_base!r}")
        self.time_base = f"{tb.numerator}/{tb.denominator}"
        if extradata is not None and not isinstance(extradata, (bytes, bytearray)):
            raise SchemaError(f"video extradata must be bytes, got {type(extradata).__name__}")
        self.extradata = None if not extradata else bytes(extradata)
        self.level = self.crf if self.crf is not None else 0
        self.lossless = lossless
        self.channels: int | None = None  # (set by for_field: 3 for RGB, 1 for grayscale)

    # -- configuration ------------------------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The stream parameters as JSON-able values (what :attr:`spec` spells).

        Returns
        -------
        dict
            ``codec``, ``crf``, ``gop``, ``preset``, ``pix_fmt``, ``width``, ``height``,
            ``time_base`` and ``extradata`` (hex), those that are set.
        """
        out: dict[str, Any] = {"codec": self.codec}
        for key in ("crf", "gop", "preset", "pix_fmt", "width", "height"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.time_base != "1/30":
            out["time_base"] = self.time_base
        if self.extradata is not None:
            out["extradata"] = self.extradata.hex()
        return out

    @property
    def spec(self) -> str:
        """``"video:<codec>:<key>=<value>:..."``, the normalised codec a schema keeps."""
        parts = [f"{k}={v}" for k, v in self.config.items() if k != "codec"]
        return ":".join(["video", self.codec, *parts])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items() if k != "codec")
        return f"VideoCodec({self.codec!r}, {args})"

    @classmethod
    def from_spec(cls, options: str, field: str | None = None) -> VideoCodec:
        # docstring inherited
        _av(field, f"video:{options}")
        name, *rest = options.split(":") if options else ["av1"]
        kwargs: dict[str, Any] = {}
        ints = {"crf", "gop", "width", "height"}
        strs = {"preset", "pix_fmt", "time_base"}
        for item in rest:
            key, eq, value = item.partition("=")
            if not eq or key in kwargs or key not in ints | strs | {"extradata"}:
                raise SchemaError(f"video codec option {item!r}: expected one of "
                                  f"{sorted(ints | strs | {'extradata'})} as key=value, each once")
            if key in ints:
                try:
                    kwargs[key] = int(value)
                except ValueError:
                    raise SchemaError(f"video codec option {key}={value!r}: expected an int") from None
            elif key == "extradata":
                try:
                    kwargs[key] = bytes.fromhex(value)
                except ValueError:
                    raise SchemaError("video codec option extradata: expected hex digits") from None
            else:
                kwargs[key] = value
        return cls(name or "av1", **kwargs)

    @classmethod
    def from_stream(cls, stream: Any, gop: int | None = None) -> VideoCodec:
        """The codec of a demuxed PyAV video stream: its codec, frame size, pixel format, time base and extradata.

        Parameters
        ----------
        stream : av.video.stream.VideoStream
            A stream of a container opened for reading (``av.open(path).streams.video[0]``).
        gop : int, optional
            Frames per block (default 16); the importer cuts the
            stream's packets into blocks of this many frames, each starting at a keyframe.

        Returns
        -------
        VideoCodec
            The codec (its ``crf`` and ``preset`` are the defaults: the stream is not re-encoded).

        Raises
        ------
        SchemaError
            The stream's codec is not one of :data:`VIDEO_CODECS`.
        """
        ctx = stream.codec_context
        name = stream.codec_context.codec.name
        aliases = {"libdav1d": "av1", "libaom-av1": "av1", "libsvtav1": "av1", "av1": "av1", "h264": "h264",
                   "libx264": "h264", "ffv1": "ffv1"}
        if name not in aliases:
            raise SchemaError(f"video stream codec {name!r} is not one of {sorted(VIDEO_CODECS)}")
        tb = stream.time_base
        return cls(aliases[name], gop=_DEFAULT_GOP if gop is None else gop, pix_fmt=ctx.pix_fmt,
                   width=ctx.width, height=ctx.height,
                   time_base=f"{tb.numerator}/{tb.denominator}" if tb is not None else "1/30",
                   extradata=bytes(ctx.extradata) if ctx.extradata else None)

    def for_field(self, dtype: np.dtype, shape: tuple[int, ...], field: str | None = None) -> VideoCodec:
        # docstring inherited
        where = f"field {field!r}: " if field is not None else ""
        _av(field, self.spec)
        if np.dtype(dtype) != np.uint8:
            raise SchemaError(f"{where}codec {self.spec!r} stores uint8 frames, got dtype {np.dtype(dtype)}")
        shape = tuple(shape)
        if len(shape) == 3 and shape[2] in (1, 3):
            channels = shape[2]
        elif len(shape) == 2:
            channels = 1
        else:
            raise SchemaError(f"{where}codec {self.spec!r} stores frames shaped (height, width, 3), (height, width) "
                              f"or (height, width, 1), got {shape}")
        height, width = shape[0], shape[1]
        if (self.width, self.height) not in ((None, None), (width, height)):
            raise SchemaError(f"{where}codec {self.spec!r} is a {self.width}x{self.height} stream, the field's "
                              f"frames are {width}x{height}")
        if not self.lossless and (height % 2 or width % 2):
            raise SchemaError(f"{where}codec {self.spec!r} needs an even height and width (4:2:0 chroma), "
                              f"got {height}x{width}")
        bound = VideoCodec(self.codec, crf=self.crf, gop=self.gop, preset=self.preset, pix_fmt=self.pix_fmt,
                           width=width, height=height, time_base=self.time_base, extradata=self.extradata)
        bound.channels = channels
        return bound

    def zarr_metadata(self) -> dict[str, Any]:
        # docstring inherited
        return {"name": "replaystore.video", "configuration": self.config}

    # -- encoding -----------------------------------------------------------------------------------------

    def _frame_shape(self) -> tuple[int, int, int]:
        if self.width is None or self.height is None or self.channels is None:
            raise ValueError("video codec not bound to a field's frames (VideoCodec.for_field)")
        return self.height, self.width, self.channels

    def _stream_pix_fmt(self) -> str:
        _, _, _, rgb, gray = VIDEO_CODECS[self.codec]
        if self.pix_fmt is not None:
            return self.pix_fmt
        return rgb if self._frame_shape()[2] == 3 else gray

    def _to_video_frame(self, av: Any, frame: np.ndarray, pix_fmt: str) -> Any:
        h, w, c = self._frame_shape()
        if self.codec == "h264_lossless":  # planes G, B, R (or the gray frame, chroma flat) as Y, U, V
            img = frame.reshape(h, w, c)
            if c == 3:
                planes = np.stack([img[..., 1], img[..., 2], img[..., 0]])
            else:
                planes = np.full((3, h, w), 128, np.uint8)
                planes[0] = img[..., 0]
            return av.VideoFrame.from_ndarray(planes, format="yuv444p")
        if c == 3:
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame.reshape(h, w, 3)), format="rgb24")
            return vf if pix_fmt == "rgb24" else vf.reformat(format=pix_fmt)
        gray = np.ascontiguousarray(frame.reshape(h, w))
        if pix_fmt == "gray":
            return av.VideoFrame.from_ndarray(gray, format="gray")
        if pix_fmt != "yuv420p":
            raise ValueError(f"grayscale frames travel as gray or yuv420p, not {pix_fmt}")
        # the luma plane carries the frame; chroma is flat (no range conversion touches luma)
        planes = np.full((h * 3 // 2, w), 128, dtype=np.uint8)
        planes[:h] = gray
        return av.VideoFrame.from_ndarray(planes, format="yuv420p")

    def encoder(self) -> Any:
        """A new PyAV encoder context of this codec (frame size, pixel format, GOP, CRF, preset).

        Returns
        -------
        av.CodecContext
            Open for writing; one per GOP in :meth:`encode`.
        """
        av = _av(None, self.spec)
        os.environ.setdefault("SVT_LOG", "1")  # (SVT-AV1 prints its configuration per encoder otherwise)
        h, w, _ = self._frame_shape()
        enc_name = VIDEO_CODECS[self.codec][0]
        ctx = av.CodecContext.create(enc_name, "w")
        ctx.width, ctx.height, ctx.pix_fmt = w, h, self._stream_pix_fmt()
        ctx.time_base = Fraction(self.time_base)
        ctx.gop_size = self.gop
        ctx.thread_count = 1
        options: dict[str, str] = {}
        if self.crf is not None:
            options["crf"] = str(self.crf)
        if self.preset is not None:
            options["preset"] = self.preset
        if self.codec == "av1":
            options["svtav1-params"] = f"keyint={self.gop}:scd=0:lp=1"
        elif self.codec == "ffv1":  # (version 1 keeps its parameters in each keyframe: no extradata)
            options.update({"level": "1", "coder": "range_def", "context": "1"})
        elif self.codec in ("h264", "h264_lossless"):
            options["x264-params"] = f"keyint={self.gop}:min-keyint={self.gop}:scenecut=0"
            if self.codec == "h264_lossless":
                options["qp"] = "0"
        ctx.options = options
        return ctx

    def encode_packets(self, frames: np.ndarray) -> list[tuple[bytes, int | None, int | None, bool]]:
        """Encode frames as one GOP with a new encoder: the packets, in decode order.

        Parameters
        ----------
        frames : numpy.ndarray
            uint8 ``(n, height, width[, channels])``, ``1 <= n <= gop``.

        Returns
        -------
        list of tuple
            ``(data, pts, dts, keyframe)`` per packet (one per frame; the first a keyframe).

        Raises
        ------
        ValueError
            The encoder gave not exactly one packet per frame.
        """
        av = _av(None, self.spec)
        out = []
        with kept_scheduling():
            ctx = self.encoder()
            pix_fmt = ctx.pix_fmt
            for i, frame in enumerate(frames):
                vf = self._to_video_frame(av, frame, pix_fmt)
                vf.pts = i
                out.extend(ctx.encode(vf))
            out.extend(ctx.encode(None))
        packets = [(bytes(p), p.pts, p.dts, bool(p.is_keyframe)) for p in out]
        if len(packets) != len(frames) or not packets[0][3]:
            raise ValueError(f"{self.codec}: {len(frames)} frames encoded as {len(packets)} packets "
                             f"(keyframe first: {bool(packets and packets[0][3])})")
        return packets

    def encode(self, raw: np.ndarray) -> bytes:
        # docstring inherited
        h, w, c = self._frame_shape()
        frames = np.asarray(raw, dtype=np.uint8).reshape(-1, h, w, c)
        # (the decoders need no timestamps: a block keeps none, which saves bytes per frame)
        return pack_gop([(data, None, None, key) for data, _, _, key in self.encode_packets(frames)])

    # -- decoding -----------------------------------------------------------------------------------------

    def _decoder_key(self) -> tuple[Any, ...]:
        h, w, c = self._frame_shape()
        return VIDEO_CODECS[self.codec][1], self.extradata, w, h, c, self._stream_pix_fmt()

    def _decoder(self, av: Any) -> Any:
        # (one decoder per thread and stream kind, shared by the codec objects of every fragment)
        held = getattr(_THREAD, "decoders", None)
        if held is None:
            held = _THREAD.decoders = {}
        key = self._decoder_key()
        ctx = held.get(key)
        if ctx is None:
            ctx = av.CodecContext.create(key[0], "r")
            if self.extradata is not None:
                ctx.extradata = self.extradata
            ctx.width, ctx.height = key[2], key[3]
            ctx.thread_count = 1
            held[key] = ctx
        return ctx

    def decode_packets(self, packets: list[tuple[bytes, int | None, int | None, bool]],
                       frames_wanted: int | None = None) -> list[Any]:
        """Decode one GOP's packets with this thread's decoder (reset after): PyAV video frames, in display order.

        Parameters
        ----------
        packets : list of tuple
            ``(data, pts, dts, keyframe)``, as :func:`unpack_gop` gives them.
        frames_wanted : int, optional
            Stop once the decoder has given this many frames (default: decode every packet
            and drain the decoder).

        Returns
        -------
        list of av.VideoFrame
            The decoded frames (at least ``frames_wanted`` when the packets hold that many).
        """
        av = _av(None, self.spec)
        ctx = self._decoder(av)
        frames: list[Any] = []
        try:
            for data, pts, dts, _key in packets:
                pkt = av.Packet(data)
                pkt.pts, pkt.dts = pts, dts
                frames.extend(ctx.decode(pkt))
                if frames_wanted is not None and len(frames) >= frames_wanted:
                    break
            else:
                frames.extend(ctx.decode(None))
        except BaseException:
            _THREAD.decoders.pop(self._decoder_key(), None)  # (a decoder that failed midway is not reused)
            raise
        ctx.flush_buffers()
        return frames

    def frame_array(self, frame: Any) -> np.ndarray:
        """A decoded PyAV frame as this field's record: RGB24 ``(h, w, 3)`` or the luma plane ``(h, w, 1)``.

        Parameters
        ----------
        frame : av.VideoFrame
            A frame :meth:`decode_packets` gave.

        Returns
        -------
        numpy.ndarray
            uint8 ``(height, width, channels)``.

        Raises
        ------
        ValueError
            The frame's size is not the field's.
        """
        h, w, c = self._frame_shape()
        if (frame.height, frame.width) != (h, w):
            raise ValueError(f"{self.codec}: decoded a {frame.width}x{frame.height} frame, expected {w}x{h}")
        if c == 3 and self.codec == "h264_lossless" and frame.format.name == "yuv444p":
            out = np.empty((h, w, 3), np.uint8)
            self._planes_into(frame, out)
            return out
        if c == 3:
            if frame.format.name == "rgb24":
                return frame.to_ndarray()
            reformatter = getattr(_THREAD, "reformatter", None)
            if reformatter is None:  # (one per thread: it keeps its conversion context between frames)
                from av.video.reformatter import VideoReformatter

                reformatter = _THREAD.reformatter = VideoReformatter()
            return reformatter.reformat(frame, format="rgb24").to_ndarray()
        name = frame.format.name
        if name in ("gray", "yuv420p", "yuvj420p", "yuv444p", "yuv422p"):
            # the luma plane as decoded (no range conversion)
            plane = frame.planes[0]
            return np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, :w, None]
        return frame.to_ndarray(format="gray")[:, :, None]

    def _planes_into(self, frame: Any, out: np.ndarray) -> None:
        """Planes (G, B, R) of a decoded ``h264_lossless`` frame into ``out`` ``(h, w, 3)``, no conversion."""
        h, w, _ = self._frame_shape()
        for plane, channel in zip(frame.planes, (1, 2, 0), strict=True):
            out[..., channel] = np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, :w]

    def _frame_into(self, frame: Any, out: np.ndarray) -> None:
        """:meth:`frame_array` written into ``out`` (one record, ``(h, w, c)``)."""
        if self.codec == "h264_lossless" and out.shape[-1] == 3 and frame.format.name == "yuv444p" \
                and (frame.height, frame.width) == out.shape[:2]:
            self._planes_into(frame, out)
        else:
            out[...] = self.frame_array(frame)

    def declared_size(self, data: np.ndarray) -> int | None:
        # docstring inherited: packets (one per frame) times the bytes of a frame
        h, w, c = self._frame_shape()
        try:
            return gop_packets(data) * h * w * c
        except ValueError:
            return None

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        # docstring inherited
        h, w, c = self._frame_shape()
        frames = self.decode_packets(unpack_gop(data))
        dest = out.reshape(-1, h, w, c)
        if len(frames) != len(dest):
            raise ValueError(f"{self.codec}: the block decodes into {len(frames)} frames, expected {len(dest)}")
        for i, frame in enumerate(frames):
            self._frame_into(frame, dest[i])

    def decode_rows_into(self, data: np.ndarray, out: np.ndarray, rows: list[int]) -> None:
        # docstring inherited: decodes the GOP's packets up to the last frame wanted, converts only those
        h, w, c = self._frame_shape()
        dest = out.reshape(-1, h, w, c)
        packets = unpack_gop(data)
        if len(packets) != len(dest):
            raise ValueError(f"{self.codec}: the block holds {len(packets)} packets, expected {len(dest)}")
        wanted = max(rows) + 1
        frames = self.decode_packets(packets, wanted)
        if len(frames) < wanted:
            raise ValueError(f"{self.codec}: the block decodes into {len(frames)} frames, expected {len(dest)}")
        for r in rows:
            self._frame_into(frames[r], dest[r])

    def max_encoded_bytes(self, raw: int) -> int:
        # docstring inherited: a lossless or high-quality stream of noise can exceed the raw frames
        return 2 * raw + self.gop * (32 + 4096) + _HEAD.size + 4096


register_codec(VideoCodec)
