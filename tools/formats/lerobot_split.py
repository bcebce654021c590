"""LeRobot v3 files split into ``chunk-XXX/file-YYY`` as LeRobot 0.6.1's writer splits them.

LeRobot's writer (``lerobot.datasets.dataset_writer`` and ``dataset_metadata``) starts a new file
when the current one would pass its size limit, and a new chunk directory every ``chunks_size``
files (``utils.update_chunk_file_indices``). An episode is never split across files. Per kind:

data (``data/chunk-*/file-*.parquet``)
    One row group per episode. Before writing an episode of ``n`` frames to a file that holds
    ``m`` frames in ``s`` MiB (its size on disk while it is written: no footer yet), a new file
    starts when ``s + s / m * n >= data_files_size_in_mb``.
episodes (``meta/episodes/chunk-*/file-*.parquet``)
    Rows are buffered and written ten at a time (one row group per batch). Before adding an
    episode of ``n`` frames, when the current file exists on disk with ``s`` MiB, a new file starts
    when ``s + s / i * n >= data_files_size_in_mb``, where ``i`` is the previous episode's
    ``episode_index`` (LeRobot divides by it, not by a row count; 0 gives 0); the buffered rows
    are written to the old file first.
videos (``videos/<key>/chunk-*/file-*.mp4``)
    Before appending an episode whose own MP4 is ``e`` MiB to a file of ``s`` MiB, a new file
    starts when ``s + e >= video_files_size_in_mb``. LeRobot measures its encoder's MP4 of the
    episode and the concatenated file on disk; we mux the episode's packets alone into an MP4 in
    memory for ``e``, and count a file as its episodes' own MP4s less, per episode after the
    first, the boxes one shared file saves (measured once, on the first two episodes). On the
    LeRobot-written fixture this gives LeRobot's sizes to a byte or two. In a file each episode's
    segment starts where the previous ends (``from_timestamp`` = the previous ``to_timestamp``;
    0 in a new file), packets are copied.
"""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replaystore.errors import StoreError
from replaystore.video import kept_scheduling

DEFAULT_CHUNK_SIZE = 1000
"""Files per chunk directory (LeRobot's ``DEFAULT_CHUNK_SIZE``)."""
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
"""Size limit of data and episode files (LeRobot's ``DEFAULT_DATA_FILE_SIZE_IN_MB``)."""
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 200
"""Size limit of video files (LeRobot's ``DEFAULT_VIDEO_FILE_SIZE_IN_MB``)."""
METADATA_BUFFER = 10
"""Episode rows LeRobot buffers before writing them (``metadata_buffer_size``)."""
MB = 1024 ** 2
_Packets = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One episode's packets: bytes, offsets, pts, dts, keyframe flags."""
DATA_PATH = "data/chunk-{chunk:03d}/file-{file:03d}.parquet"
VIDEO_PATH = "videos/{key}/chunk-{chunk:03d}/file-{file:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"


def next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """The chunk and file index after ``(chunk, file)`` (LeRobot's ``update_chunk_file_indices``).

    Parameters
    ----------
    chunk, file : int
        The current indices.
    chunks_size : int
        Files per chunk.

    Returns
    -------
    tuple of int
        The next file's ``(chunk, file)``.
    """
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


class Limits:
    """The size limits of an export: ``chunks_size``, ``data_files_size_in_mb``, ``video_files_size_in_mb``.

    Parameters
    ----------
    info : dict, optional
        An imported dataset's ``info.json`` (its values are the defaults).
    chunks_size, data_files_size_in_mb, video_files_size_in_mb : int or float, optional
        Given values (else ``info``'s, else LeRobot's defaults).

    Raises
    ------
    StoreError
        A value is not a positive number (``chunks_size``: a positive int).
    """

    def __init__(self, info: dict[str, Any] | None = None, *, chunks_size: int | None = None,
                 data_files_size_in_mb: float | None = None, video_files_size_in_mb: float | None = None) -> None:
        info = info or {}
        given = {"chunks_size": chunks_size, "data_files_size_in_mb": data_files_size_in_mb,
                 "video_files_size_in_mb": video_files_size_in_mb}
        defaults = {"chunks_size": DEFAULT_CHUNK_SIZE, "data_files_size_in_mb": DEFAULT_DATA_FILE_SIZE_IN_MB,
                    "video_files_size_in_mb": DEFAULT_VIDEO_FILE_SIZE_IN_MB}
        got: dict[str, Any] = {}
        for name, default in defaults.items():
            v = given[name]
            if v is None:
                kept = info.get(name)
                v = kept if isinstance(kept, int | float) and not isinstance(kept, bool) and kept > 0 else default
            ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            if name == "chunks_size":
                ok = ok and isinstance(v, int)
            if not ok:
                raise StoreError(f"{name}={v!r}: expected a positive {'int' if name == 'chunks_size' else 'number'}")
            got[name] = int(v) if isinstance(v, float) and v.is_integer() else v
        self.chunks_size: int = got["chunks_size"]
        self.data_mb: float = got["data_files_size_in_mb"]
        self.video_mb: float = got["video_files_size_in_mb"]

    def info(self) -> dict[str, Any]:
        """The ``info.json`` entries of these limits."""
        return {"chunks_size": self.chunks_size, "data_files_size_in_mb": self.data_mb,
                "video_files_size_in_mb": self.video_mb}


class DataFiles:
    """``data/chunk-*/file-*.parquet``: one episode at a time, a new file when LeRobot would start one."""

    def __init__(self, root: Path, schema: pa.Schema, limits: Limits, metadata: Any = None) -> None:
        self.root, self.schema, self.limits = root, schema, limits
        self.metadata: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
        self.chunk = self.file = 0
        self.writer: pq.ParquetWriter | None = None
        self.path: Path | None = None
        self.index = 0  # frames written
        self.file_start = 0  # the first frame of the current file
        self.files = 0

    def write(self, table: pa.Table) -> tuple[int, int]:
        """Write one episode's rows; the ``(chunk, file)`` they went to."""
        n = table.num_rows
        if self.path is not None:
            size = os.path.getsize(self.path) / MB
            in_file = self.index - self.file_start
            per_frame = size / in_file if in_file > 0 else 0
            if size + per_frame * n >= self.limits.data_mb:
                self.chunk, self.file = next_file(self.chunk, self.file, self.limits.chunks_size)
                self._close()
                self.file_start = self.index
        if self.writer is None:
            self.path = self.root / DATA_PATH.format(chunk=self.chunk, file=self.file)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            schema = self.schema
            kept = self.metadata.get(DATA_PATH.format(chunk=self.chunk, file=self.file))
            if isinstance(kept, str):  # (an imported file's own huggingface metadata)
                schema = schema.with_metadata({**(schema.metadata or {}), b"huggingface": kept.encode()})
            self.writer = pq.ParquetWriter(self.path, schema, compression="snappy", use_dictionary=True)
            self.files += 1
        self.writer.write_table(table.replace_schema_metadata(self.writer.schema.metadata))
        self.index += n
        return self.chunk, self.file

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> None:
        """Finish the last file."""
        self._close()


class EpisodeFiles:
    """``meta/episodes/chunk-*/file-*.parquet``: rows buffered and split as LeRobot's metadata writer does."""

    def __init__(self, root: Path, limits: Limits, order: list[str] | None) -> None:
        self.root, self.limits, self.order = root, limits, order
        self.chunk = self.file = 0
        self.buffer: list[dict[str, Any]] = []
        self.writer: pq.ParquetWriter | None = None
        self.latest: dict[str, Any] | None = None
        self.files = 0

    def _path(self) -> Path:
        return self.root / EPISODES_PATH.format(chunk=self.chunk, file=self.file)

    def add(self, row: dict[str, Any]) -> None:
        """Add one episode's row (its ``meta/episodes/*`` indices are set here)."""
        if self.latest is not None:
            path = self._path() if self.writer is None else Path(self.writer.where)
            if path.exists():
                size = os.path.getsize(path) / MB
                prev = int(self.latest["episode_index"])
                per = size / prev if prev > 0 else 0.0
                if size + per * int(row["length"]) >= self.limits.data_mb:
                    self._flush()
                    self.chunk, self.file = next_file(self.chunk, self.file, self.limits.chunks_size)
                    self._close()
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = self.chunk, self.file
        self.buffer.append(row)
        self.latest = row
        if len(self.buffer) >= METADATA_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        first = self.buffer[0]
        table = pa.Table.from_pylist([_ordered(r, self.order) for r in self.buffer])
        if self.writer is None:
            path = self.root / EPISODES_PATH.format(chunk=first["meta/episodes/chunk_index"],
                                                    file=first["meta/episodes/file_index"])
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, table.schema, compression="snappy", use_dictionary=True)
            self.files += 1
        else:
            table = table.select(self.writer.schema.names).cast(self.writer.schema)
        self.writer.write_table(table)
        self.buffer.clear()

    def _close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> None:
        """Write what is buffered and finish the last file."""
        self._close()


def _ordered(doc: dict[str, Any], order: Any) -> dict[str, Any]:
    """``doc`` with its keys in ``order`` (a list) first, the others after."""
    first = [k for k in order if k in doc] if isinstance(order, list) else []
    return {**{k: doc[k] for k in first}, **{k: v for k, v in doc.items() if k not in first}}


class VideoFiles:
    """One video feature's MP4 files: the stored packets remuxed (not re-encoded), split by size."""

    def __init__(self, root: Path, key: str, params: dict[str, Any], fps: int, limits: Limits) -> None:
        try:
            import av
        except ImportError:
            raise StoreError(f"LeRobot video feature {key!r}: remuxing needs PyAV "
                             f"(pip install 'replaystore[video]')") from None
        os.environ.setdefault("SVT_LOG", "1")
        self.av, self.root, self.key, self.params, self.fps, self.limits = av, root, key, params, fps, limits
        self.tb = Fraction(params.get("time_base") or f"1/{fps}")
        self.chunk = self.file = 0
        self.c: Any = None
        self.s: Any = None
        self.bytes = 0  # the current file's MP4 size, as its episodes' own MP4s give it
        self.overhead: int | None = None  # (negative: the boxes a file of two episodes saves)
        self.first: _Packets | None = None  # the first episode, until the overhead is measured
        self.template: Any = None  # an MP4 of the first episode, read: its stream is copied
        self.template_delta = 0
        self.end = 0.0  # the current file's last to_timestamp
        self.files = 0

    def _stream(self, c: Any) -> Any:
        p = self.params
        codec = {"libdav1d": "av1", "libaom-av1": "av1", "libsvtav1": "av1"}.get(p.get("codec", ""),
                                                                                 p.get("codec", "av1"))
        s = c.add_stream(codec, rate=self.fps)
        s.width, s.height = int(p["width"]), int(p["height"])
        s.pix_fmt = p.get("pix_fmt") or "yuv420p"
        s.time_base = self.tb
        if p.get("extradata"):
            s.codec_context.extradata = bytes.fromhex(p["extradata"])
        return s

    def _open(self) -> None:
        path = self.root / VIDEO_PATH.format(key=self.key, chunk=self.chunk, file=self.file)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.c = self.av.open(str(path), "w", format="mp4")
        self.s = self._stream(self.c)
        self.end = 0.0
        self.files += 1

    def _mux(self, c: Any, s: Any, packets: _Packets, shift: int) -> None:
        data, offsets, pts, dts, key = packets
        for i in range(len(pts)):
            p = self.av.Packet(bytes(data[offsets[i]:offsets[i + 1]]))
            p.pts, p.dts, p.is_keyframe = int(pts[i]) + shift, int(dts[i]) + shift, bool(key[i])
            p.stream = s
            p.time_base = self.tb
            c.mux(p)

    def _mp4_size(self, *episodes: _Packets) -> int:
        """The bytes of an MP4 of these episodes alone, one after the other from time 0 (muxed in memory).

        The first call muxes as the files are muxed (a new stream: its encoder opens, tens of ms
        for AV1); later ones copy that MP4's stream (no encoder) and add the constant difference
        the copy makes in the container's boxes.
        """
        if not any(len(p[2]) for p in episodes):
            return 0
        buf = io.BytesIO()
        c = self.av.open(buf, "w", format="mp4")
        if self.template is None:
            s = self._stream(c)
        else:
            s = c.add_stream_from_template(self.template.streams.video[0], opaque=True)
            s.time_base = self.tb
        at = 0
        for packets in episodes:
            pts = packets[2]
            if len(pts):
                self._mux(c, s, packets, at - int(pts.min()))
                at += round(Fraction(len(pts), self.fps) / self.tb)
        c.close()
        size = len(buf.getvalue())
        if self.template is not None:
            return size + self.template_delta
        buf.seek(0)
        self.template = self.av.open(buf)
        self.template_delta = size - self._mp4_size(*episodes)
        return size

    def episode(self, data: np.ndarray, offsets: np.ndarray, pts: np.ndarray, dts: np.ndarray, key: np.ndarray,
                kept: dict[str, Any] | None = None) -> dict[str, Any]:
        """Mux one episode's packets; its row's ``videos/<key>/*`` entries.

        The segment starts where the file's previous one ends (packets shifted there), unless
        ``kept`` (an imported episode's row) places it in this file at the same time as its
        packets already are: then its timestamps are kept and its packets are not shifted.
        A muxer's stream opens an encoder (SVT-AV1 for AV1), which would leave the process
        real-time: :func:`~replaystore.video.kept_scheduling`.
        """
        with kept_scheduling():
            return self._episode(data, offsets, pts, dts, key, kept)

    def _episode(self, data: np.ndarray, offsets: np.ndarray, pts: np.ndarray, dts: np.ndarray, key: np.ndarray,
                 kept: dict[str, Any] | None) -> dict[str, Any]:
        packets: _Packets = (data, offsets, pts, dts, key)
        size = self._mp4_size(packets)  # (LeRobot: the episode's own MP4)
        if self.c is None:
            self._open()
            self.first = packets
            self.bytes = size
        else:
            if self.overhead is None and self.first is not None:
                # what a file of two episodes saves against two files: the boxes of one MP4
                self.overhead = self._mp4_size(self.first, packets) - size - self.bytes
                self.first = None
            if (self.bytes + size) / MB >= self.limits.video_mb:
                self._close_file()
                self.chunk, self.file = next_file(self.chunk, self.file, self.limits.chunks_size)
                self._open()
                self.bytes = size
            else:
                self.bytes += size + (self.overhead or 0)
        pre = f"videos/{self.key}/"
        first = int(pts.min()) if len(pts) else 0
        half = 0.5 / self.fps
        k_from = None if kept is None else kept.get(pre + "from_timestamp")
        k_to = None if kept is None else kept.get(pre + "to_timestamp")
        if kept is not None and isinstance(k_from, float) and isinstance(k_to, float) \
                and kept.get(pre + "chunk_index") == self.chunk and kept.get(pre + "file_index") == self.file \
                and abs(k_from - self.end) < half and abs(float(first * self.tb) - k_from) < half:
            shift, start, end = 0, k_from, k_to
        else:
            start = self.end
            shift = round(Fraction(start).limit_denominator(1 << 30) / self.tb) - first
            end = start + len(pts) / self.fps
        self._mux(self.c, self.s, packets, shift)
        self.end = end
        return {pre + "chunk_index": self.chunk, pre + "file_index": self.file, pre + "from_timestamp": start,
                pre + "to_timestamp": end}

    def _close_file(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None

    def close(self) -> None:
        """Finish the current file."""
        with kept_scheduling():
            self._close_file()
        if self.template is not None:
            self.template.close()
            self.template = None
