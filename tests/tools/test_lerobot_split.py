"""LeRobot exports split into ``chunk-XXX/file-YYY`` files as LeRobot's writer splits them.

With tiny size limits the LeRobot-written fixture (4 episodes, one AV1 camera) spans several data
and video files in two chunks: each episode's row points at the files holding its rows and its
video segment (packets copied, timestamps continuing across a file's episodes), LeRobot itself
loads it item for item like the original, and an import of it exported again gives the same files.
The assignment of episodes to files equals a transcription of LeRobot's rule driven by the sizes
read back from the written files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.errors import StoreError
from replaystore.schemas import episode
from replaystore.store import open_store
from replaystore.tools.cli import main
from replaystore.tools.export import export_store
from replaystore.tools.formats.lerobot import export_lerobot
from replaystore.tools.importer import import_store

av = pytest.importorskip("av")
pytest.importorskip("PIL.Image")

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"
CHECK = DATA / "check_lerobot_loads.py"
VIDEO = DATA / "video"
CAM = "observation.images.top"
MB = 1024 ** 2
# 4 episodes (48, 61, 37, 54 frames): every data file holds one episode at this limit, a video
# file two episodes (their packets are ~9-13 KB each)
LIMITS = {"data_files_size_in_mb": 0.004, "video_files_size_in_mb": 0.024, "chunks_size": 2}


def _lerobot_python() -> str | None:
    """An interpreter with ``lerobot``: this one, or ``$LEROBOT_PYTHON`` (LeRobot needs Python >= 3.12)."""
    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    return os.environ.get("LEROBOT_PYTHON") or None


def _packets(path: Path) -> list[tuple[bytes, int, int, bool]]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in c.demux(s) if p.size]


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def _episodes(root: Path) -> list[dict]:
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def _rel(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The video fixture imported, then exported with LIMITS; (store path, export root)."""
    tmp = tmp_path_factory.mktemp("split")
    st_ = import_store(str(VIDEO), str(tmp / "store"), "lerobot")
    out = tmp / "out"
    summary = export_lerobot(st_, str(out), **LIMITS)
    assert (summary["records"], summary["episodes"]) == (200, 4)
    return tmp / "store", out


def test_files_split_and_episode_rows_point_at_them(split: tuple[Path, Path]) -> None:
    _, out = split
    files = _rel(out)
    data = [f for f in files if f.startswith("data/")]
    videos = [f for f in files if f.startswith("videos/")]
    assert data == ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet",
                    "data/chunk-001/file-000.parquet", "data/chunk-001/file-001.parquet"]
    assert videos == [f"videos/{CAM}/chunk-000/file-000.mp4", f"videos/{CAM}/chunk-000/file-001.mp4"]
    info = json.loads((out / "meta" / "info.json").read_text())
    assert {k: info[k] for k in LIMITS} == LIMITS
    assert (info["total_episodes"], info["total_frames"]) == (4, 200)
    src_eps = _episodes(VIDEO)
    eps = _episodes(out)
    assert [e["episode_index"] for e in eps] == [0, 1, 2, 3]
    src_frames = _frames(VIDEO / "videos" / CAM / "chunk-000" / "file-000.mp4")
    src_packets = _packets(VIDEO / "videos" / CAM / "chunk-000" / "file-000.mp4")
    for e, (row, src) in enumerate(zip(eps, src_eps, strict=True)):
        # the data rows are in the file the row names, at the frame indices it names
        t = pq.read_table(out / f"data/chunk-{row['data/chunk_index']:03d}/file-{row['data/file_index']:03d}.parquet")
        mine = t.filter(t.column("episode_index").to_numpy() == e).to_pydict()
        assert mine["index"] == list(range(row["dataset_from_index"], row["dataset_to_index"]))
        # the segment: the file's frames between from_timestamp and to_timestamp are the episode's
        path = out / (f"videos/{CAM}/chunk-{row[f'videos/{CAM}/chunk_index']:03d}/"
                      f"file-{row[f'videos/{CAM}/file_index']:03d}.mp4")
        fps = 30
        lo = round(row[f"videos/{CAM}/from_timestamp"] * fps)
        hi = round(row[f"videos/{CAM}/to_timestamp"] * fps)
        s_lo = round(src[f"videos/{CAM}/from_timestamp"] * fps)
        got = _frames(path)[lo:hi]
        assert len(got) == row["length"]
        assert all(np.array_equal(a, b) for a, b in zip(got, src_frames[s_lo:s_lo + row["length"]], strict=True))
        # the same compressed packets, shifted to the segment's place in its file
        with av.open(str(path)) as c:
            tb = c.streams.video[0].time_base
        pk = [p for p in _packets(path) if lo <= round(p[1] * tb * fps) < hi]
        want = [p for p in src_packets if s_lo <= round(p[1] * (1 / 15360) * fps) < s_lo + row["length"]]
        assert [(p[0], p[3]) for p in pk] == [(p[0], p[3]) for p in want]
        assert pk[0][3]  # a segment starts at a keyframe
    # a file's timestamps continue across its episodes; a new file starts at 0
    stamps = [(r[f"videos/{CAM}/file_index"], r[f"videos/{CAM}/from_timestamp"], r[f"videos/{CAM}/to_timestamp"])
              for r in eps]
    assert stamps[0][1] == 0.0 and stamps[1][1] == stamps[0][2] and stamps[2][1] == 0.0
    assert stamps[3][1] == stamps[2][2]


def _same_files(a_root: Path, b_root: Path) -> None:
    assert _rel(a_root) == _rel(b_root)
    for rel in _rel(a_root):
        a, b = a_root / rel, b_root / rel
        if rel.endswith(".parquet"):
            ta, tb = pq.read_table(a), pq.read_table(b)
            assert ta.to_pylist() == tb.to_pylist(), rel
            # (tasks.parquet's pandas metadata names the pandas version that wrote it)
            assert ta.schema.equals(tb.schema, check_metadata=not rel.endswith("tasks.parquet")), rel
        elif rel.endswith(".json"):
            assert json.loads(a.read_text()) == json.loads(b.read_text()), rel
        else:
            assert _packets(a) == _packets(b), rel


def test_lerobot_split_dataset_exports_as_lerobot_split_it(tmp_path: Path) -> None:
    """A dataset LeRobot wrote with tiny limits (8 data files in 4 chunks, 2 episode files, 9 video
    files): imported and exported with the kept limits, every file is where LeRobot put it, with the
    same rows, episode rows (files, indices, timestamps) and compressed packets."""
    src = DATA / "split"
    back = import_store(str(src), str(tmp_path / "store"), "lerobot")
    assert len(back) == 174 and back.streams() == list(range(14))
    out = tmp_path / "out"
    export_store(back, str(out), "lerobot")
    assert len([f for f in _rel(src) if f.startswith("videos/")]) == 9
    _same_files(src, out)


def test_import_of_split_export_exports_the_same_files(split: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = split
    back = import_store(str(out), str(tmp_path / "store"), "lerobot")
    assert len(back) == 200 and back.streams() == [0, 1, 2, 3]
    again = tmp_path / "again"
    export_store(back, str(again), "lerobot")  # (the limits come from the imported info.json)
    _same_files(out, again)


@pytest.mark.skipif(_lerobot_python() is None, reason="lerobot is not importable here and LEROBOT_PYTHON names "
                    "no interpreter that has it (see tests/data/lerobot/make_fixtures.py)")
def test_lerobot_loads_split_export(split: tuple[Path, Path]) -> None:
    """LeRobot reads every item of the split export equal to the original's (values and video frames)."""
    _, out = split
    python = _lerobot_python()
    assert python is not None
    done = subprocess.run([python, str(CHECK), str(out), str(VIDEO)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok 200 frames, 4 episodes"


def test_bad_limit_refused(tmp_path: Path) -> None:
    st_ = _recorded(tmp_path / "rec", [3, 4])
    for bad in ({"chunks_size": 0}, {"chunks_size": 1.5}, {"data_files_size_in_mb": -1},
                {"video_files_size_in_mb": "big"}):
        with pytest.raises(StoreError, match=next(iter(bad))):
            export_lerobot(st_, str(tmp_path / "out"), **bad)  # type: ignore[arg-type]
        assert not (tmp_path / "out").exists()


def test_cli_size_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _recorded(tmp_path / "rec", [30, 20, 25, 10])
    assert main(["export", str(tmp_path / "rec"), str(tmp_path / "out"), "--to", "lerobot", "--quiet",
                 "--data-files-size-in-mb", "0.001", "--chunks-size", "3", "--video-files-size-in-mb", "50"]) == 0
    info = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())
    assert {k: info[k] for k in LIMITS} == {"data_files_size_in_mb": 0.001, "video_files_size_in_mb": 50,
                                            "chunks_size": 3}
    assert [f for f in _rel(tmp_path / "out") if f.startswith("data/")] == [
        "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet", "data/chunk-000/file-002.parquet",
        "data/chunk-001/file-000.parquet"]
    with pytest.raises(StoreError, match="chunks_size applies to LeRobot exports only"):
        export_store(open_store(str(tmp_path / "rec")), str(tmp_path / "pq"), "parquet", chunks_size=2)


# -- the split equals a transcription of LeRobot's rule -------------------------------------------------------


def _recorded(path: Path, lengths: list[int]) -> object:
    rng = np.random.default_rng(len(lengths))
    store = open_store(str(path), episode((4,), actions=3, metadata={"env_id": "Grid-v0"}), mode="w")
    with store.writer() as w:
        for s, n in enumerate(lengths):
            obs = rng.standard_normal((n + 1, 4)).astype(np.float32)
            term = np.arange(n) == n - 1
            w.append({"obs": obs[:-1], "action": rng.integers(0, 3, n), "reward": rng.random(n).astype(np.float32),
                      "next_obs": obs[1:], "terminated": term, "truncated": np.zeros(n, bool)},
                     stream=s, reset=np.arange(n) == 0)
    return store


def _next(chunk: int, file: int, size: int) -> tuple[int, int]:
    return (chunk + 1, 0) if file == size - 1 else (chunk, file + 1)


def _row_groups(root: Path, kind: str) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Per (chunk, file) of ``kind``: each row group's (rows, bytes written)."""
    out = {}
    for f in sorted((root / kind).glob("chunk-*/file-*.parquet")):
        md = pq.read_metadata(f)
        key = (int(f.parent.name[6:]), int(f.stem[5:]))
        out[key] = [(md.row_group(i).num_rows, sum(md.row_group(i).column(j).total_compressed_size
                                                   for j in range(md.num_columns)))
                    for i in range(md.num_row_groups)]
    return out


def _reference_data(lengths: list[int], groups: list[int], limit_mb: float, chunks: int) -> list[tuple[int, int]]:
    """LeRobot's ``_save_episode_data``: a new file when ``size + size / frames * n >= limit``."""
    at, size, frames, out = (0, 0), 0, 0, []
    for i, (n, g) in enumerate(zip(lengths, groups, strict=True)):
        if i and size / MB + size / MB / frames * n >= limit_mb:
            at, size, frames = _next(*at, chunks), 0, 0
        size = (size or 4) + g  # (the magic bytes, then one row group per episode)
        frames += n
        out.append(at)
    return out


def _reference_episodes(lengths: list[int], groups: dict[tuple[int, int], list[tuple[int, int]]], limit_mb: float,
                        chunks: int) -> list[tuple[int, int]]:
    """LeRobot's ``_save_episode_metadata``: rows flushed 10 at a time; a new file when the current one
    exists with ``size`` and ``size + size / previous_episode_index * n >= limit``."""
    at, flushed, buffer, out = (0, 0), 0, 0, []

    def flush() -> None:
        nonlocal flushed, buffer
        if buffer:
            rows, nbytes = groups[at][flushed]
            assert rows == buffer
            flushed, buffer = flushed + 1, 0

    for i, n in enumerate(lengths):
        if i and flushed:
            size = 4 + sum(b for _, b in groups[at][:flushed])
            per = size / MB / (i - 1) if i - 1 > 0 else 0.0
            if size / MB + per * n >= limit_mb:
                flush()
                at, flushed = _next(*at, chunks), 0
        out.append(at)
        buffer += 1
        if buffer >= 10:
            flush()
    return out


@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=12, max_size=30), limit_kb=st.sampled_from([3, 6, 12, 40, 100]),
       chunks=st.integers(1, 3))
def test_split_follows_lerobots_rule(lengths: list[int], limit_kb: int, chunks: int) -> None:
    limit = limit_kb / 1024
    with tempfile.TemporaryDirectory() as tmp:
        store = _recorded(Path(tmp) / "rec", lengths)
        out = Path(tmp) / "out"
        export_lerobot(store, str(out), data_files_size_in_mb=limit, chunks_size=chunks)  # type: ignore[arg-type]
        eps = _episodes(out)
        assert [e["length"] for e in eps] == lengths
        data = _row_groups(out, "data")
        by_file = [data[(e["data/chunk_index"], e["data/file_index"])] for e in eps]
        seen: dict[tuple[int, int], int] = {}
        groups = []
        for e, rgs in zip(eps, by_file, strict=True):
            key = (e["data/chunk_index"], e["data/file_index"])
            rows, nbytes = rgs[seen.get(key, 0)]
            assert rows == e["length"]
            seen[key] = seen.get(key, 0) + 1
            groups.append(nbytes)
        assert [(e["data/chunk_index"], e["data/file_index"]) for e in eps] == _reference_data(
            lengths, groups, limit, chunks)
        assert [(e["meta/episodes/chunk_index"], e["meta/episodes/file_index"]) for e in eps] == _reference_episodes(
            lengths, _row_groups(out / "meta", "episodes"), limit, chunks)
        # (each file is where its rows say: the files list in order)
        assert sorted(data) == sorted({(e["data/chunk_index"], e["data/file_index"]) for e in eps})
        info = json.loads((out / "meta" / "info.json").read_text())
        assert (info["chunks_size"], info["data_files_size_in_mb"]) == (chunks, limit)
