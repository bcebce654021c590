"""LeRobot datasets (format v3.0), read and written without importing lerobot.

On disk (what ``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id, root=...)`` loads):

``meta/info.json``
    ``codebase_version`` (``"v3.0"``), ``fps``, ``features`` (each key's ``dtype``, ``shape``,
    ``names`` and, for videos, ``info``), totals and the path templates.
``meta/stats.json``
    Per feature ``min``, ``max``, ``mean``, ``std``, ``count`` and quantiles.
``meta/tasks.parquet``
    One row per task: ``task_index``, indexed by the ``task`` string (pandas' layout).
``meta/episodes/chunk-*/file-*.parquet``
    One row per episode: ``episode_index``, ``tasks``, ``length``, where its rows and video
    segments are, and its own statistics (``stats/<key>/<stat>``).
``data/chunk-*/file-*.parquet``
    One row per frame: every feature but the videos (images as PNG structs ``{bytes, path}``).
``videos/<key>/chunk-*/file-*.mp4``
    Each camera's frames, episodes one after the other.

Import makes one stream per episode (key: ``episode_index``; steps: ``frame_index``; a reset
on each episode's first frame), one field per feature. Field names are the LeRobot keys with
``.`` spelled ``__`` (``observation.images.top`` -> ``observation__images__top``); the schema
metadata keeps the exact key of every field, so the mapping is reversible. Videos are not
re-encoded: each frame's compressed packet is copied as demuxed (see docs/EXPORT.md, "LeRobot").
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replaystore.errors import ImportSourceError, SchemaError, StoreError
from replaystore.schemas import Dense, Ragged, Schema
from replaystore.store import Store, open_store
from replaystore.tools.formats.common import ImportDestination, expand_local, pick_table, progress_bar
from replaystore.tools.formats.lerobot_split import (
    VIDEO_PATH,
    DataFiles,
    EpisodeFiles,
    Limits,
    VideoFiles,
)

CODEBASE_VERSION = "v3.0"
"""The LeRobot dataset version read and written."""
DEFAULT_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
"""The features every LeRobot dataset has (``lerobot.utils.constants.DEFAULT_FEATURES``)."""
META = "lerobot"
"""The schema metadata key of what an import keeps (docs/EXPORT.md, "LeRobot")."""
PTS, DTS, KEY = "__pts", "__dts", "__key"
"""Suffixes of a video feature's per-frame packet fields: presentation and decode timestamps
(in the stream's time base) and the keyframe flag, beside the packet bytes field itself."""
COMMIT_BYTES = 64 << 20
BATCH_ROWS = 16384
"""Rows of a data file read and appended at a time."""
_STATS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
_QS = (0.01, 0.10, 0.50, 0.90, 0.99)
U8, I64, BOOL = np.dtype(np.uint8), np.dtype(np.int64), np.dtype(np.bool_)


def field_name(key: str) -> str:
    """The field name of LeRobot feature ``key``: its ``.`` spelled ``__``.

    Parameters
    ----------
    key : str
        A LeRobot feature key (``observation.images.top``).

    Returns
    -------
    str
        ``observation__images__top``.

    Raises
    ------
    ImportSourceError
        The key does not map to a field name (a part that is not an identifier, starts with
        ``_`` or holds ``__``).
    """
    parts = key.split(".") if isinstance(key, str) else []
    if not parts or any(not p.isidentifier() or p.startswith("_") or "__" in p for p in parts):
        raise ImportSourceError(f"features[{key!r}]", "a key of identifiers joined by '.' (none starting "
                                "with '_' or holding '__')", repr(key)[:80])
    return "__".join(parts)


def feature_key(name: str) -> str:
    """The LeRobot key of field ``name`` in a store not imported from LeRobot: ``__`` spelled ``.``.

    Parameters
    ----------
    name : str
        A field name.

    Returns
    -------
    str
        The key (``observation__state`` -> ``observation.state``).
    """
    return name.replace("__", ".")


# -- reading the source ------------------------------------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ImportSourceError(str(path), "a file of the LeRobot dataset", "none") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ImportSourceError(str(path), "a JSON document", f"unreadable ({exc})") from None


def _parquets(root: Path, sub: str) -> list[Path]:
    files = sorted((root / sub).glob("chunk-*/file-*.parquet"))
    if not files:
        raise ImportSourceError(str(root / sub), "chunk-*/file-*.parquet files", "none")
    return files


def _read_table(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ImportSourceError(str(path), "a Parquet file", f"unreadable ({exc})") from None


def _tasks(root: Path) -> list[str]:
    t = _read_table(root / "meta" / "tasks.parquet")
    if "task_index" not in t.column_names or "task" not in t.column_names:
        raise ImportSourceError(str(root / "meta" / "tasks.parquet"), "columns task_index and task",
                                f"columns {t.column_names}")
    index = t.column("task_index").to_pylist()
    names = t.column("task").to_pylist()
    out: list[str | None] = [None] * len(index)
    for i, name in zip(index, names, strict=True):
        if not isinstance(i, int) or not 0 <= i < len(index) or out[i] is not None or not isinstance(name, str):
            raise ImportSourceError(str(root / "meta" / "tasks.parquet"), "task indices 0..n-1, each once, "
                                    "with a task string", f"index {i!r} for {name!r}")
        out[i] = name
    return [str(x) for x in out]


class _Feature:
    """One LeRobot feature and the field(s) it is stored in."""

    def __init__(self, key: str, doc: Any, where: str) -> None:
        if not isinstance(doc, dict) or "dtype" not in doc or "shape" not in doc:
            raise ImportSourceError(f"features[{key!r}]", "a feature with dtype and shape", repr(doc)[:80], where)
        self.key, self.doc = key, doc
        self.name = field_name(key)
        self.kind = doc["dtype"] if doc["dtype"] in ("image", "video") else "value"
        shape = doc["shape"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ImportSourceError(f"features[{key!r}].shape", "a list of positive ints", repr(shape)[:80], where)
        self.shape = tuple(shape)
        if self.kind == "value":
            self.dtype: np.dtype[Any]
            try:
                self.dtype = np.dtype(doc["dtype"])
            except TypeError:
                self.dtype = np.dtype(object)
            if self.dtype.kind not in "biuf":
                raise ImportSourceError(f"features[{key!r}].dtype", "a numeric or bool dtype, 'image' or 'video'",
                                        repr(doc["dtype"]), where)
        else:
            self.dtype = np.dtype(np.uint8)

    @property
    def record_shape(self) -> tuple[int, ...]:
        """A value feature of shape (1,) is one scalar per frame (as LeRobot's parquet holds it)."""
        return () if self.shape == (1,) else self.shape

    def fields(self) -> list[Dense | Ragged]:
        if self.kind == "value":
            return [Dense(self.name, self.dtype, self.record_shape, finite=False)]
        if self.kind == "image":
            return [Dense(self.name, U8, self.shape, description=f"LeRobot image {self.key!r} (HWC)")]
        return [Ragged(self.name, U8, offsets=self.name + "__offsets",
                       description=f"LeRobot video {self.key!r}: the frame's compressed packet, as demuxed"),
                Dense(self.name + PTS, I64, description="the packet's presentation timestamp"),
                Dense(self.name + DTS, I64, description="the packet's decode timestamp"),
                Dense(self.name + KEY, BOOL, description="whether the packet is a keyframe")]


def _column_values(col: pa.ChunkedArray, f: _Feature, where: str) -> np.ndarray:
    """A data-parquet column as a numpy array of the field's dtype and record shape (no cast but exact ones)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    depth = 0
    flat = arr
    while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type) or pa.types.is_large_list(
            flat.type):
        flat = flat.flatten()
        depth += 1
    if flat.null_count:
        raise ImportSourceError(f.key, "values without nulls", f"{flat.null_count} nulls", where)
    values = flat.to_numpy(zero_copy_only=False)
    want = int(np.prod(f.record_shape, dtype=np.int64))
    if len(values) != n * want or values.dtype.kind not in "biuf":
        raise ImportSourceError(f.key, f"{f.dtype} values shaped {f.shape} per frame",
                                f"{arr.type} ({len(values)} values for {n} frames)", where)
    if values.dtype != f.dtype:
        if not np.can_cast(values.dtype, f.dtype, "safe"):
            raise ImportSourceError(f.key, f"{f.dtype} values", f"{values.dtype} values", where)
        values = values.astype(f.dtype)
    return values.reshape((n, *f.record_shape))


def _images(col: pa.ChunkedArray, f: _Feature, where: str) -> np.ndarray:
    """PNG (or any PIL-readable) image structs ``{bytes, path}`` decoded to uint8 HWC frames."""
    try:
        from PIL import Image
    except ImportError:
        raise StoreError(f"LeRobot image feature {f.key!r}: decoding its images needs Pillow "
                         f"(pip install pillow)") from None
    arr = col.combine_chunks()
    if not pa.types.is_struct(arr.type) or arr.type.get_field_index("bytes") < 0:
        raise ImportSourceError(f.key, "image structs {bytes, path}", str(arr.type), where)
    raw = arr.field("bytes").to_pylist()
    out = np.empty((len(raw), *f.shape), np.uint8)
    for i, data in enumerate(raw):
        if data is None:
            raise ImportSourceError(f.key, "image bytes in the data file", f"none at row {i}", where)
        try:
            with Image.open(io.BytesIO(data)) as im:
                a = np.asarray(im.convert("RGB") if f.shape[-1] == 3 else im)
        except (OSError, ValueError) as exc:
            raise ImportSourceError(f.key, "an image file's bytes", f"undecodable at row {i} ({exc})",
                                    where) from None
        if a.shape != f.shape:
            a = a.reshape(f.shape) if a.size == out[i].size else a
        if a.shape != f.shape:
            raise ImportSourceError(f.key, f"images shaped {f.shape}", f"shape {a.shape} at row {i}", where)
        out[i] = a
    return out


class _Video:
    """One video feature's MP4 files, demuxed a packet at a time in file order."""

    def __init__(self, root: Path, f: _Feature) -> None:
        try:
            import av
        except ImportError:
            raise StoreError(f"LeRobot video feature {f.key!r}: demuxing needs PyAV "
                             f"(pip install 'replaystore[video]')") from None
        self.av = av
        self.f = f
        self.root = root
        self.files: dict[tuple[int, int], Any] = {}
        self.params: dict[str, Any] | None = None
        first = sorted((root / "videos" / f.key).glob("chunk-*/file-*.mp4"))
        if not first:
            raise ImportSourceError(str(root / "videos" / f.key), "the feature's MP4 files", "none")
        c = self._container(first[0])
        self.params = self._params(c)
        c.close()

    def _container(self, path: Path) -> Any:
        try:
            c = self.av.open(str(path))
        except (OSError, self.av.FFmpegError) as exc:
            raise ImportSourceError(str(path), "an MP4 file of the dataset", f"unreadable ({exc})") from None
        if not c.streams.video:
            raise ImportSourceError(str(path), "a video stream", "none")
        return c

    @staticmethod
    def _params(c: Any) -> dict[str, Any]:
        s = c.streams.video[0]
        ctx = s.codec_context
        return {"codec": ctx.name, "width": ctx.width, "height": ctx.height, "pix_fmt": ctx.pix_fmt,
                "time_base": str(s.time_base), "average_rate": str(s.average_rate),
                "extradata": bytes(ctx.extradata).hex() if ctx.extradata else None}

    def _open(self, chunk: int, file: int) -> Any:
        got = self.files.get((chunk, file))
        if got is not None:
            return got
        self.files.clear()  # (episodes come in file order: one file's packets are held at a time)
        path = self.root / VIDEO_PATH.format(key=self.f.key, chunk=chunk, file=file)
        c = self._container(path)
        params = self._params(c)
        if params != self.params:
            raise ImportSourceError(str(path), f"the stream parameters of the feature's other files {self.params}",
                                    str(params))
        s = c.streams.video[0]
        tb = Fraction(s.time_base) if s.time_base else None  # (read before closing: the stream goes with it)
        chunks, pts, dts, key = [], [], [], []
        for p in c.demux(s):
            if p.size:
                chunks.append(bytes(p))
                pts.append(p.pts)
                dts.append(p.dts)
                key.append(p.is_keyframe)
        c.close()
        sizes = np.fromiter(map(len, chunks), np.int64, len(chunks))
        got = _Packets(b"".join(chunks), np.r_[0, np.cumsum(sizes)].astype(np.int64), np.array(pts, np.int64),
                       np.array(dts, np.int64), np.array(key, bool), tb)
        self.files[(chunk, file)] = got
        return got

    def segment(self, chunk: int, file: int, start: float, skip: int, n: int, where: str
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Packets ``skip .. skip + n`` of the episode whose segment starts at ``start`` seconds in its file.

        Returns the packets' bytes (uint8), their offsets (from 0), pts, dts and keyframe flags.
        """
        f = self._open(chunk, file)
        first = round(Fraction(start).limit_denominator(1 << 30) / f.tb) if f.tb else 0
        # the segment: from the first packet whose pts reaches its start, in decode order
        lo = int(np.searchsorted(f.reach, first - 1, side="left"))
        if lo + skip + n > len(f.pts):
            raise ImportSourceError(self.f.key, f"{skip + n} video frames from {start} s",
                                    f"{len(f.pts) - lo} packets from there in the file", where)
        if skip == 0 and not f.key[lo]:
            raise ImportSourceError(self.f.key, "an episode segment starting at a keyframe", "a delta frame", where)
        lo += skip
        off = f.offsets[lo:lo + n + 1]
        data = np.frombuffer(f.data, np.uint8)[off[0]:off[-1]]
        return data, off - off[0], f.pts[lo:lo + n], f.dts[lo:lo + n], f.key[lo:lo + n]


class _Packets:
    """One MP4's demuxed packets: their bytes one after the other, offsets, pts, dts, keyframe flags."""

    def __init__(self, data: bytes, offsets: np.ndarray, pts: np.ndarray, dts: np.ndarray, key: np.ndarray,
                 tb: Fraction | None) -> None:
        self.data, self.offsets, self.pts, self.dts, self.key, self.tb = data, offsets, pts, dts, key, tb
        self.reach = np.maximum.accumulate(pts) if len(pts) else pts


EPISODES_SLOT = "lerobot_episodes"
"""The state slot where an import keeps the dataset's episode table (array ``parquet``: its Parquet bytes)."""


def _episode_table(root: Path) -> pa.Table:
    tables = [_read_table(path) for path in _parquets(root / "meta", "episodes")]
    try:
        t = pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise ImportSourceError(str(root / "meta" / "episodes"), "episode files of one schema",
                                f"files that differ ({exc})") from None
    if "episode_index" not in t.column_names:
        raise ImportSourceError(str(root / "meta" / "episodes"), "an episode_index column", "none")
    return t.sort_by("episode_index")


def import_lerobot(src: str, url: str, *, progress: bool = False, storage_options: Any = None) -> Store:
    """Create a store at ``url`` from the LeRobot v3 dataset in directory ``src``.

    One stream per episode (its ``episode_index``), steps its ``frame_index``, one field per
    feature (docs/EXPORT.md, "LeRobot"): values as they are in the data files, images decoded
    to uint8 frames, videos as their demuxed packets (copied, not re-encoded). The schema
    metadata keeps ``info.json``, ``stats.json``, the tasks (index -> string), the data
    files' Arrow schema metadata and each episode's metadata row, which an export writes back.

    Parameters
    ----------
    src : str
        The dataset's root directory (holding ``meta/info.json``).
    url : str
        Where to create the store (new, or an empty directory).
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    storage_options : mapping, optional
        Passed to the storage backend of ``url``.

    Returns
    -------
    Store
        The new store, opened and refreshed.

    Raises
    ------
    ImportSourceError
        A file of the dataset is missing or malformed, a feature's values do not have its
        declared dtype and shape, or a video segment is not where the episode says.
    StoreError
        ``src`` is not a local directory, its ``codebase_version`` is not v3.0, or Pillow
        (images) or PyAV (videos) is missing.
    StoreExistsError
        ``url`` is not new or empty.
    """
    src = expand_local(src)
    url = expand_local(url)
    if "://" in src and not src.startswith("file://"):
        raise StoreError(f"{src}: LeRobot datasets are imported from a local directory")
    root = Path(src.removeprefix("file://"))
    info_path = root / "meta" / "info.json"
    info = _json(info_path)
    if not isinstance(info, dict) or info.get("codebase_version") != CODEBASE_VERSION:
        got = info.get("codebase_version") if isinstance(info, dict) else type(info).__name__
        raise StoreError(f"{root}: a LeRobot dataset of codebase_version {got!r}; only {CODEBASE_VERSION} is read")
    feats = info.get("features")
    if not isinstance(feats, dict) or not all(k in feats for k in DEFAULT_KEYS):
        raise ImportSourceError("features", f"a mapping with {', '.join(DEFAULT_KEYS)}", repr(feats)[:80],
                                str(info_path))
    features = [_Feature(k, v, str(info_path)) for k, v in feats.items()]
    stats_path = root / "meta" / "stats.json"
    stats = _json(stats_path) if stats_path.exists() else None
    tasks = _tasks(root)
    episodes = _episode_table(root)
    data_files = _parquets(root, "data")
    names = [x.name for f in features for x in f.fields()]
    if len(set(names)) != len(names):
        raise ImportSourceError("features", "keys that map to distinct field names", f"fields {names}",
                                str(info_path))
    hf_meta = pq.read_schema(data_files[0]).metadata or {}
    keep = {
        "info": info, "stats": stats, "tasks": tasks,
        "keys": {f.name: f.key for f in features},
        "huggingface": hf_meta.get(b"huggingface", b"").decode() or None,
        # (LeRobot's files each carry the fingerprint of their first episode: the others' kept by path)
        "huggingface_files": _hf_files(root, data_files, hf_meta.get(b"huggingface")),
        # (the manifest keeps JSON objects with sorted keys: the orders are kept as lists)
        "order": {"features": list(feats), "info": list(info), "stats": list(stats or {}),
                  "episode_columns": episodes.column_names},
    }
    fields: list[Any] = [x for f in features for x in f.fields()]
    videos = {f.key: _Video(root, f) for f in features if f.kind == "video"}
    located = ["episode_index", *(f"videos/{k}/{c}" for k in videos for c in ("chunk_index", "file_index",
                                                                             "from_timestamp"))]
    missing = [c for c in located if c not in episodes.column_names]
    if missing:
        raise ImportSourceError(str(root / "meta" / "episodes"), "columns " + ", ".join(missing), "none")
    where = episodes.select(located).to_pydict()
    by_ep = {e: {c: where[c][i] for c in located} for i, e in enumerate(where["episode_index"])}
    buf = io.BytesIO()
    pq.write_table(episodes, buf)
    keep["videos"] = {k: v.params for k, v in videos.items()}
    try:
        schema = Schema("lerobot", fields, metadata={META: keep, "fps": info.get("fps"),
                                                     "robot_type": info.get("robot_type")})
    except SchemaError as exc:
        raise ImportSourceError("features", "features that make a schema", str(exc), str(info_path)) from None
    total = sum(pq.read_metadata(p).num_rows for p in data_files)
    with ImportDestination(url, storage_options) as dest:
        st = dest.opened(open_store(url, schema, mode="w", storage_options=storage_options))
        st.save_state(EPISODES_SLOT, {"source": "meta/episodes", "episodes": episodes.num_rows},
                      {"parquet": np.frombuffer(buf.getvalue(), np.uint8)})
        consumed: dict[tuple[int, str], int] = {}
        with st.writer() as w, progress_bar(total, "import lerobot", progress) as bar:
            pending = 0
            for path in data_files:
                try:
                    pf = pq.ParquetFile(path)
                    missing = [f.key for f in features if f.kind != "video" and f.key not in pf.schema_arrow.names]
                    if missing:
                        raise ImportSourceError(missing[0], "a column of the data file", "none", str(path))
                    batches = pf.iter_batches(batch_size=BATCH_ROWS)
                    for rb in batches:
                        batch = _batch(pa.Table.from_batches([rb]), features, videos, by_ep, consumed, str(path))
                        steps = batch["frame_index"]
                        w.append(batch, stream=batch["episode_index"].tolist(), step=steps, reset=steps == 0)
                        pending += sum(a.nbytes for a in batch.values())
                        if pending >= COMMIT_BYTES:
                            w.commit()
                            pending = 0
                        bar.update(rb.num_rows)
                except (OSError, pa.ArrowException) as exc:
                    raise ImportSourceError(str(path), "a Parquet file", f"unreadable ({exc})") from None
        st.refresh()
    return st


def _hf_files(root: Path, files: list[Path], first: bytes | None) -> dict[str, str]:
    """The ``huggingface`` metadata of the data files whose metadata is not the first file's, by path."""
    out: dict[str, str] = {}
    for path in files[1:]:
        try:
            got = (pq.read_schema(path).metadata or {}).get(b"huggingface")
        except (OSError, pa.ArrowException) as exc:
            raise ImportSourceError(str(path), "a Parquet file", f"unreadable ({exc})") from None
        if got is not None and got != first:
            out[path.relative_to(root).as_posix()] = got.decode()
    return out


def _batch(part: pa.Table, features: list[_Feature], videos: dict[str, _Video], by_ep: dict[Any, dict[str, Any]],
           consumed: dict[tuple[int, str], int], where: str) -> dict[str, np.ndarray]:
    """The records of some rows of a data file: values, images decoded, each video's packets of those frames."""
    batch: dict[str, np.ndarray] = {}
    for key in ("episode_index", "frame_index"):
        if part.column(key).null_count or not pa.types.is_integer(part.column(key).type):
            raise ImportSourceError(key, "int64 values without nulls", str(part.column(key).type), where)
    ep_col = part.column("episode_index").to_numpy()
    bounds = np.flatnonzero(np.diff(ep_col)) + 1
    runs = list(zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(ep_col)].tolist(), strict=True))
    for f in features:
        if f.kind == "value":
            batch[f.name] = _column_values(part.column(f.key), f, where)
        elif f.kind == "image":
            batch[f.name] = _images(part.column(f.key), f, where)
    for f in features:
        if f.kind != "video":
            continue
        pre = f"videos/{f.key}/"
        pieces = []
        for lo, hi in runs:
            ep = int(ep_col[lo])
            row = by_ep.get(ep)
            if row is None:
                raise ImportSourceError(f"episode {ep}", "a row in meta/episodes", "none", where)
            try:
                chunk, file, start = int(row[pre + "chunk_index"]), int(row[pre + "file_index"]), float(
                    row[pre + "from_timestamp"])
            except (KeyError, TypeError, ValueError):
                raise ImportSourceError(f"episode {ep} {pre}*", "the video's chunk, file and from_timestamp",
                                        "missing", where) from None
            skip = consumed.get((ep, f.key), 0)
            pieces.append(videos[f.key].segment(chunk, file, start, skip, hi - lo, f"episode {ep}"))
            consumed[(ep, f.key)] = skip + hi - lo
        sizes = np.cumsum([len(p[0]) for p in pieces])
        batch[f.name] = np.concatenate([p[0] for p in pieces])
        batch[f.name + "__offsets"] = np.concatenate(
            [[0], *[p[1][1:] + (sizes[i - 1] if i else 0) for i, p in enumerate(pieces)]]).astype(np.int64)
        batch[f.name + PTS] = np.concatenate([p[2] for p in pieces])
        batch[f.name + DTS] = np.concatenate([p[3] for p in pieces])
        batch[f.name + KEY] = np.concatenate([p[4] for p in pieces])
    return batch


# -- export --------------------------------------------------------------------------------------------------

_GYM_KEYS = {"obs": "observation.state", "action": "action", "reward": "next.reward", "terminated": "next.done"}
"""A store not imported from LeRobot: the LeRobot keys of the step fields (an image ``obs`` is
``observation.image``; ``next_obs``, ``truncated`` and ragged fields are left out). The loader view
(``replaystore.loaders.lerobotview.GYM_KEYS``) uses the same; it is not imported here, since
importing the loaders imports torch."""


def _is_image(f: Dense) -> bool:
    return (f.dtype == np.uint8 and len(f.shape) == 3 and f.shape[2] in (1, 3) and f.shape[0] >= 16
            and f.shape[1] >= 16 and (f.codec is None or not str(f.codec).startswith("video")))


def _is_frames(f: Any) -> bool:
    return isinstance(f, Dense) and f.dtype == np.uint8 and len(f.shape) == 3 and f.shape[2] in (1, 3) \
        and f.shape[0] >= 16 and f.shape[1] >= 16


class _Plan:
    """What an export writes: each exported feature's key, kind and source field(s)."""

    def __init__(self, schema: Schema, fps: int | None, task: str | None) -> None:
        keep = schema.metadata.get(META)
        self.imported = isinstance(keep, dict) and isinstance(keep.get("info"), dict)
        self.keep: dict[str, Any] = dict(keep) if isinstance(keep, dict) and self.imported else {}
        self.schema = schema
        names = {f.name for f in schema.fields}
        self.features: dict[str, dict[str, Any]] = {}
        self.source: dict[str, str] = {}  # key -> field name
        self.videos: dict[str, dict[str, Any]] = {}
        if self.imported:
            info = self.keep["info"]
            self.fps = int(info.get("fps") or 30)
            keys = {key: name for name, key in (self.keep.get("keys") or {}).items()}
            order = self.keep.get("order") or {}
            for key in _ordered(info["features"], order.get("features")):  # (in the dataset's order)
                name = keys.get(key)
                if name is None or name not in names:
                    continue
                self.features[key] = dict(info["features"][key])
                self.source[key] = name
                if self.features[key].get("dtype") == "video":
                    self.videos[key] = (self.keep.get("videos") or {}).get(key) or {}
            self.tasks = list(self.keep.get("tasks") or [])
        else:
            self.fps = int(fps or schema.metadata.get("fps") or 30)
            for f in schema.fields:
                if not isinstance(f, Dense) or f.name in ("next_obs", "truncated") or f.name in DEFAULT_KEYS:
                    continue
                key = _GYM_KEYS.get(f.name) or feature_key(f.name)
                if _is_frames(f):
                    key = "observation.image" if f.name == "obs" else key
                    self.features[key] = {"dtype": "image", "shape": list(f.shape),
                                          "names": ["height", "width", "channels"]}
                else:
                    dtype = "bool" if f.dtype == np.bool_ else str(f.dtype)
                    self.features[key] = {"dtype": dtype, "shape": list(f.shape) or [1], "names": None}
                self.source[key] = f.name
            for key in DEFAULT_KEYS:
                self.features[key] = {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1],
                                      "names": None}
            env = schema.metadata.get("env_id")
            self.tasks = [task or (env if isinstance(env, str) else None) or schema.name]
        if fps is not None and self.imported and int(fps) != self.fps:
            raise StoreError(f"fps={fps}: this store was imported from a LeRobot dataset at {self.fps} fps")

    def arrow_type(self, key: str) -> pa.DataType:
        ft = self.features[key]
        if ft["dtype"] == "image":
            return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        t = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
        shape = [int(s) for s in ft["shape"]]
        if shape == [1]:
            return t
        for s in reversed(shape):
            t = pa.list_(t, s) if s is not None else pa.list_(t)
        return t

    def hf_features(self) -> str:
        if self.keep.get("huggingface"):
            return str(self.keep["huggingface"])
        feats: dict[str, Any] = {}
        for key in self.data_keys():
            ft = self.features[key]
            if ft["dtype"] == "image":
                feats[key] = {"_type": "Image"}
                continue
            value: dict[str, Any] = {"dtype": ft["dtype"], "_type": "Value"}
            shape = [int(s) for s in ft["shape"]]
            if shape == [1]:
                feats[key] = value
            elif len(shape) == 1:
                feats[key] = {"feature": value, "length": shape[0], "_type": "List"}
            else:
                feats[key] = {"dtype": ft["dtype"], "shape": shape, "_type": f"Array{len(shape)}D"}
        return json.dumps({"info": {"features": feats}})

    def data_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") != "video"]


def _ordered(doc: dict[str, Any], order: Any) -> dict[str, Any]:
    """``doc`` with its keys in ``order`` (a list, as an import kept it) first, the others after."""
    first = [k for k in order if k in doc] if isinstance(order, list) else []
    return {**{k: doc[k] for k in first}, **{k: v for k, v in doc.items() if k not in first}}


def _episodes_of(t: Any) -> list[tuple[Any, np.ndarray]]:
    """Each episode's row ids in step order: per stream, split at resets and step gaps."""
    out: list[tuple[Any, np.ndarray]] = []
    for key in t.streams():
        rows, steps = t.rows(key)
        rows, steps = np.asarray(rows), np.asarray(steps)
        if not len(rows):
            continue
        _, _, resets = t.index_of(rows)
        cut = np.flatnonzero(np.asarray(resets, bool)[1:] | (np.diff(steps) != 1)) + 1
        for part in np.split(rows, cut):
            out.append((key, part))
    return out


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(frame[:, :, 0] if frame.shape[2] == 1 else frame)
    img.save(buf, format="png")
    return buf.getvalue()


def _arrow_column(values: np.ndarray, typ: pa.DataType, n: int) -> pa.Array:
    if not pa.types.is_fixed_size_list(typ) and not pa.types.is_list(typ):
        return pa.array(values.reshape(n), type=typ)
    shape = values.shape[1:]
    arr: pa.Array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for s in reversed(shape):
        arr = pa.FixedSizeListArray.from_arrays(arr, s)
    return arr


def _stats_of(values: np.ndarray, image: bool) -> dict[str, list[Any]]:
    """LeRobot's per-episode statistics of one feature (``compute_stats.get_feature_stats``'s layout)."""
    v = np.asarray(values, np.float64)
    shape: tuple[int, ...]
    if image:
        v = v.reshape(len(v), -1, v.shape[-1]).reshape(-1, v.shape[-1]) / 255.0
        axis, shape = 0, (-1, 1, 1)
    else:
        v = v.reshape(len(v), -1) if v.ndim > 1 else v.reshape(-1, 1)
        axis, shape = 0, (-1,)
    out: dict[str, list[Any]] = {
        "min": np.min(v, axis=axis).reshape(shape).tolist(), "max": np.max(v, axis=axis).reshape(shape).tolist(),
        "mean": np.mean(v, axis=axis).reshape(shape).tolist(), "std": np.std(v, axis=axis).reshape(shape).tolist(),
        "count": [int(len(values))]}
    for q, name in zip(_QS, ("q01", "q10", "q50", "q90", "q99"), strict=True):
        out[name] = np.quantile(v, q, axis=axis).reshape(shape).tolist()
    return out


def _tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet`` as LeRobot's pandas writes it: ``task_index`` indexed by ``task``."""
    pandas = {"index_columns": ["task"], "column_indexes": [{"name": None, "field_name": None, "pandas_type":
                                                             "unicode", "numpy_type": "object",
                                                             "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                           "numpy_type": "int64", "metadata": None},
                          {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
                           "metadata": None}],
              "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())],
                       metadata={b"pandas": json.dumps(pandas).encode()})
    return pa.table({"task_index": np.arange(len(tasks), dtype=np.int64), "task": tasks}, schema=schema)


def export_lerobot(store: Store, out: str, *, table: str | None = None, progress: bool = False,
                   fps: int | None = None, task: str | None = None, data_files_size_in_mb: float | None = None,
                   video_files_size_in_mb: float | None = None, chunks_size: int | None = None
                   ) -> dict[str, Any]:
    """Write one table as a LeRobot v3.0 dataset in the new directory ``out``.

    A store imported from LeRobot gives its dataset back: the same features, values, tasks,
    ``info.json`` and ``stats.json`` (totals recomputed), each episode's statistics, and the
    videos remuxed from the stored packets (the same compressed packets, not re-encoded).
    Any other store: one episode per run of a stream (split at resets and step gaps), its
    dense fields as features (``obs`` as ``observation.state``, or ``observation.image`` for
    frames; ``reward`` as ``next.reward``; ``terminated`` as ``next.done``; other names with
    ``__`` spelled ``.``), frames as PNG images, statistics computed (docs/EXPORT.md, "LeRobot").

    Parameters
    ----------
    store : Store
        The opened store.
    out : str
        A local directory that does not exist yet (or is empty).
    table : str, optional
        The table to export; required when the store has several.
    progress : bool, optional
        Show a progress bar on stderr (when it is a terminal).
    fps : int, optional
        Frames per second of a store not imported from LeRobot (default: the schema
        metadata's ``fps``, else 30): timestamps are ``frame_index / fps``.
    task : str, optional
        The one task string of a store not imported from LeRobot (default: its ``env_id``,
        else the schema's name).
    data_files_size_in_mb : float, optional
        Size limit of the data and episode files in MiB: a new file starts where LeRobot's
        writer would start one (docs/EXPORT.md, "How files are split"). Default: the imported
        dataset's ``info.json`` value, else LeRobot's 100.
    video_files_size_in_mb : float, optional
        Size limit of each camera's MP4 files in MiB (default: the imported value, else 200).
    chunks_size : int, optional
        Files per ``chunk-XXX`` directory (default: the imported value, else 1000).

    Returns
    -------
    dict of str to Any
        ``format``, ``path``, ``files``, ``records`` (frames), ``episodes`` and ``streams``.

    Raises
    ------
    StoreError
        ``out`` is not local or not empty, the store has several tables and none was chosen,
        ``fps`` differs from an imported dataset's, a size limit is not a positive number
        (``chunks_size``: a positive int), or Pillow (images) or PyAV (videos) is missing.
    """
    out = expand_local(out)
    if "://" in out and not out.startswith("file://"):
        raise StoreError(f"{out}: LeRobot datasets are written to a local directory")
    root = Path(out.removeprefix("file://"))
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise StoreError(f"{root}: exists and is not an empty directory; export into a new one")
    t = pick_table(store, table)
    t.view()
    plan = _Plan(t.schema, fps, task)
    limits = Limits(plan.keep.get("info") if plan.imported else None, chunks_size=chunks_size,
                    data_files_size_in_mb=data_files_size_in_mb, video_files_size_in_mb=video_files_size_in_mb)
    existed = root.exists()
    root.mkdir(parents=True, exist_ok=True)
    try:
        return _write(t, plan, root, progress, _kept_episodes(store) if plan.imported else None, limits)
    except BaseException:  # what was written goes; an empty directory given stays
        shutil.rmtree(root, ignore_errors=True)
        if existed:
            root.mkdir(parents=True, exist_ok=True)
        raise


def _kept_episodes(store: Store) -> pa.Table | None:
    """The episode table an import kept (state slot :data:`EPISODES_SLOT`), or None."""
    got = store.load_state(EPISODES_SLOT)
    if got is None or "parquet" not in got[1]:
        return None
    try:
        return pq.read_table(pa.BufferReader(got[1]["parquet"].tobytes()))
    except (OSError, pa.ArrowException):
        warnings.warn(f"LeRobot export: the state slot {EPISODES_SLOT!r} does not hold a Parquet episode "
                      f"table; episode statistics are computed", stacklevel=4)
        return None


def _write(t: Any, plan: _Plan, root: Path, progress: bool, kept_table: pa.Table | None,
           limits: Limits) -> dict[str, Any]:
    episodes = _episodes_of(t)
    keys = plan.data_keys()
    arrow = pa.schema([(k, plan.arrow_type(k)) for k in keys], metadata={b"huggingface": plan.hf_features().encode()})
    data_files = DataFiles(root, arrow, limits, plan.keep.get("huggingface_files"))
    ep_files = EpisodeFiles(root, limits, (plan.keep.get("order") or {}).get("episode_columns"))
    videos = {k: VideoFiles(root, k, p, plan.fps, limits) for k, p in plan.videos.items()}
    positions = {} if kept_table is None else {
        e: i for i, e in enumerate(kept_table.column("episode_index").to_pylist())}
    index = episodes_written = 0
    total = sum(len(r) for _, r in episodes)
    try:
        with progress_bar(total, "export lerobot", progress) as bar:
            for ordinal, (stream, rows) in enumerate(episodes):
                at = positions.get(int(stream) if plan.imported and isinstance(stream, int) else ordinal)
                kept = None if at is None or kept_table is None else kept_table.slice(at, 1).to_pylist()[0]
                ep_files.add(_episode(t, plan, keys, arrow, stream, rows, ordinal, index, kept, data_files, videos))
                index += len(rows)
                episodes_written += 1
                bar.update(len(rows))
    finally:
        data_files.close()
        ep_files.close()
        for v in videos.values():
            v.close()
    pq.write_table(_tasks_table(plan.tasks), root / "meta" / "tasks.parquet")
    info = _info(plan, episodes_written, index, limits)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    (root / "meta" / "stats.json").write_text(json.dumps(_stats(t, plan), indent=4))
    files = 3 + data_files.files + ep_files.files + sum(v.files for v in videos.values())
    return {"format": "lerobot", "path": str(root), "files": files, "records": index, "episodes": episodes_written,
            "streams": len(t.streams())}


def _episode(t: Any, plan: _Plan, keys: list[str], arrow: pa.Schema, stream: Any, rows: np.ndarray, ordinal: int,
             index: int, kept: dict[str, Any] | None, data_files: DataFiles, videos: dict[str, VideoFiles]
             ) -> dict[str, Any]:
    """Write one episode's data rows and video segments; its row of ``meta/episodes``."""
    data = t.read(rows)
    n = len(rows)
    ep_index = int(stream) if plan.imported and isinstance(stream, int) else ordinal
    cols: dict[str, pa.Array] = {}
    values: dict[str, np.ndarray] = {}
    for k in keys:
        ft = plan.features[k]
        name = plan.source.get(k)
        if name is not None:
            v = np.asarray(data[name])
            if name == "terminated" and not plan.imported and "truncated" in data:
                v = v | np.asarray(data["truncated"])
        elif k == "frame_index":
            v = np.arange(n, dtype=np.int64)
        elif k == "timestamp":
            v = (np.arange(n) / plan.fps).astype(np.float32)
        elif k == "episode_index":
            v = np.full(n, ep_index, np.int64)
        elif k == "index":
            v = np.arange(index, index + n, dtype=np.int64)
        else:  # task_index
            v = np.zeros(n, np.int64)
        values[k] = v
        if ft["dtype"] == "image":
            frame_ix = values.get("frame_index", np.arange(n))
            cols[k] = pa.array([{"bytes": _png(v[i]), "path": f"frame-{int(frame_ix[i]):06d}.png"}
                                for i in range(n)], type=plan.arrow_type(k))
        else:
            cols[k] = _arrow_column(v, plan.arrow_type(k), n)
    chunk, file = data_files.write(pa.table(cols, schema=arrow))
    task_ix = sorted({int(x) for x in values["task_index"]}) if "task_index" in values else [0]
    row: dict[str, Any] = {"episode_index": ep_index,
                           "tasks": [plan.tasks[i] if 0 <= i < len(plan.tasks) else str(i) for i in task_ix],
                           "length": n, "data/chunk_index": chunk, "data/file_index": file,
                           "dataset_from_index": index, "dataset_to_index": index + n}
    for k, video in videos.items():
        name = plan.source[k]
        row.update(video.episode(data[name], data[name + "__offsets"], data[name + PTS], data[name + DTS],
                                 data[name + KEY], kept))
    if kept is not None and kept.get("length") == n:
        row.update({c: v for c, v in kept.items() if c.startswith("stats/")})
    else:
        for k in keys:
            for stat, val in _stats_of(values[k], plan.features[k]["dtype"] == "image").items():
                row[f"stats/{k}/{stat}"] = val
    return row


def _info(plan: _Plan, episodes: int, frames: int, limits: Limits) -> dict[str, Any]:
    base: dict[str, Any] = dict(plan.keep["info"]) if plan.imported else {
        "codebase_version": CODEBASE_VERSION, "robot_type": plan.schema.metadata.get("robot_type"),
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None}
    base.update({"fps": plan.fps, "features": plan.features, "total_episodes": episodes, "total_frames": frames,
                 "total_tasks": len(plan.tasks), "splits": {"train": f"0:{episodes}"}, **limits.info()})
    order = ["codebase_version", "robot_type", "total_episodes", "total_frames", "total_tasks", "chunks_size",
             "data_files_size_in_mb", "video_files_size_in_mb", "fps", "splits", "data_path", "video_path",
             "features"]
    if plan.imported:
        return _ordered(base, (plan.keep.get("order") or {}).get("info"))
    return {k: base[k] for k in order if k in base}


def _stats(t: Any, plan: _Plan) -> dict[str, Any]:
    if plan.imported and isinstance(plan.keep.get("stats"), dict):
        return _ordered(plan.keep["stats"], (plan.keep.get("order") or {}).get("stats"))
    from replaystore.report import field_stats, lerobot_stats

    names = [n for k, n in plan.source.items()]
    doc = lerobot_stats(field_stats(t, names))
    return {k: doc[n] for k, n in plan.source.items() if n in doc}


def decode_video(store: Store, feature: str, episode: int, *, table: str | None = None) -> np.ndarray:
    """The frames of one imported video feature in one episode, decoded from the stored packets.

    Parameters
    ----------
    store : Store
        A store imported from a LeRobot dataset.
    feature : str
        The LeRobot key of a video feature (``observation.images.top``).
    episode : int
        The episode index (the stream key).
    table : str, optional
        The table, when the store has several.

    Returns
    -------
    numpy.ndarray
        uint8 ``(frames, height, width, 3)``, RGB, in display order: what PyAV's decode of
        the source MP4 gives for the episode's segment.

    Raises
    ------
    StoreError
        The store was not imported from LeRobot, ``feature`` is not one of its video
        features, or PyAV is missing.
    """
    t = pick_table(store, table)
    keep = t.schema.metadata.get(META)
    if not isinstance(keep, dict):
        keep = {}
    params = (keep.get("videos") or {}).get(feature)
    if not params:
        raise StoreError(f"{feature!r}: not a video feature of a store imported from LeRobot")
    try:
        import av
    except ImportError:
        raise StoreError("decoding LeRobot videos needs PyAV (pip install 'replaystore[video]')") from None
    name = next(n for n, k in keep["keys"].items() if k == feature)
    rows, _ = t.rows(episode)
    data: dict[str, np.ndarray] = t.read(rows, columns=[name, name + PTS, name + DTS])
    ctx = av.CodecContext.create(params["codec"], "r")
    if params.get("extradata"):
        ctx.extradata = bytes.fromhex(params["extradata"])
    ctx.width, ctx.height = int(params["width"]), int(params["height"])
    offsets = data[name + "__offsets"]
    frames = []
    for i in range(len(rows)):
        p = av.Packet(bytes(data[name][offsets[i]:offsets[i + 1]]))
        p.pts, p.dts = int(data[name + PTS][i]), int(data[name + DTS][i])
        frames.extend(ctx.decode(p))
    frames.extend(ctx.decode(None))
    frames.sort(key=lambda f: f.pts if f.pts is not None else 0)
    return np.stack([f.to_ndarray(format="rgb24") for f in frames]) if frames else np.zeros(
        (0, int(params["height"]), int(params["width"]), 3), np.uint8)
