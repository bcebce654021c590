"""``export --to lerobot``: a LeRobot dataset imported and exported again is the same dataset.

The data and episode tables have equal values and Arrow schemas (with their metadata), tasks are
equal, ``info.json`` and ``stats.json`` equal as JSON values, and the MP4 holds the same compressed
packets (remuxed, not re-encoded). A store recorded with our own writer exports to a dataset of the
LeRobot layout; LeRobot itself loads the exports when a Python with ``lerobot`` is at hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import episode
from replaystore.store import open_store
from replaystore.tools.cli import main
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store

av = pytest.importorskip("av")
pytest.importorskip("PIL.Image")

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"
CHECK = DATA / "check_lerobot_loads.py"
TABLES = ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet", "meta/tasks.parquet")


def _round_trip(tmp_path: Path, name: str) -> tuple[Path, Path]:
    src = DATA / name
    st = import_store(str(src), str(tmp_path / "store"), "lerobot")
    out = tmp_path / "out"
    summary = export_store(st, str(out), "lerobot")
    assert summary["records"] == len(st) and summary["episodes"] == len(st.streams())
    return src, out


def _packets(path: Path) -> list[tuple[bytes, int, int, bool]]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in c.demux(s) if p.size]


@pytest.mark.parametrize("name", ["video", "image"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    src, out = _round_trip(tmp_path, name)
    for rel in TABLES:
        a, b = pq.read_table(src / rel), pq.read_table(out / rel)
        assert a.to_pylist() == b.to_pylist(), rel
        if rel != "meta/tasks.parquet":  # (pandas' metadata names the pandas version that wrote it)
            assert a.schema.equals(b.schema, check_metadata=True), rel
        else:
            assert a.schema.equals(b.schema), rel
    for rel in ("meta/info.json", "meta/stats.json"):
        assert json.loads((src / rel).read_text()) == json.loads((out / rel).read_text()), rel
    videos = sorted(p.relative_to(src) for p in (src / "videos").rglob("*.mp4")) if (src / "videos").exists() else []
    assert videos == (sorted(p.relative_to(out) for p in (out / "videos").rglob("*.mp4")) if videos else [])
    for rel in videos:
        assert _packets(src / rel) == _packets(out / rel)
        with av.open(str(src / rel)) as a, av.open(str(out / rel)) as b:
            fa = [f.to_ndarray(format="rgb24") for f in a.decode(video=0)]
            fb = [f.to_ndarray(format="rgb24") for f in b.decode(video=0)]
        assert len(fa) == len(fb) == 200 and all(np.array_equal(x, y) for x, y in zip(fa, fb, strict=True))


def _recorded(path: Path, image: bool) -> object:
    rng = np.random.default_rng(3)
    shape = (32, 32, 3) if image else (4,)
    dtype = np.uint8 if image else np.float32
    st = open_store(str(path), episode(shape, actions=3, obs_dtype=dtype, metadata={"env_id": "Grid-v0"}), mode="w")
    with st.writer() as w:
        for s, n in enumerate((7, 5)):
            obs = (rng.integers(0, 255, (n + 1, *shape)) if image else rng.standard_normal((n + 1, *shape))).astype(
                dtype)
            term = np.zeros(n, bool)
            term[-1] = True
            w.append({"obs": obs[:-1], "action": rng.integers(0, 3, n), "reward": rng.random(n).astype(np.float32),
                      "next_obs": obs[1:], "terminated": term, "truncated": np.zeros(n, bool)},
                     stream=s, reset=np.arange(n) == 0)
    return st


@pytest.mark.parametrize("image", [False, True])
def test_recorded_store_exports_lerobot_layout(tmp_path: Path, image: bool) -> None:
    st = _recorded(tmp_path / "rec", image)
    out = tmp_path / "out"
    summary = export_store(st, str(out), "lerobot")
    assert (summary["records"], summary["episodes"]) == (12, 2)
    info = json.loads((out / "meta" / "info.json").read_text())
    obs_key = "observation.image" if image else "observation.state"
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == 12 and info["total_episodes"] == 2
    assert set(info["features"]) == {obs_key, "action", "next.reward", "next.done", "timestamp", "frame_index",
                                     "episode_index", "index", "task_index"}
    data = pq.read_table(out / TABLES[0]).to_pydict()
    assert data["episode_index"] == [0] * 7 + [1] * 5
    assert data["frame_index"] == list(range(7)) + list(range(5))
    assert data["index"] == list(range(12))
    assert data["next.done"] == [False] * 6 + [True] + [False] * 4 + [True]
    assert pq.read_table(out / "meta" / "tasks.parquet").to_pydict()["task"] == ["Grid-v0"]
    eps = pq.read_table(out / TABLES[1]).to_pylist()
    assert [e["length"] for e in eps] == [7, 5] and eps[1]["dataset_from_index"] == 7
    stats = json.loads((out / "meta" / "stats.json").read_text())
    assert set(stats) == set(info["features"]) - {"timestamp", "frame_index", "episode_index", "index",
                                                  "task_index"}


def test_refuses_existing_output(tmp_path: Path) -> None:
    st = _recorded(tmp_path / "rec", False)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("keep")
    with pytest.raises(StoreError, match="not an empty directory"):
        export_store(st, str(tmp_path / "out"), "lerobot")
    assert (tmp_path / "out" / "x").read_text() == "keep"


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _recorded(tmp_path / "rec", False)
    assert main(["export", str(tmp_path / "rec"), str(tmp_path / "out"), "--to", "lerobot", "--quiet"]) == 0
    assert "lerobot at" in capsys.readouterr().out


def _lerobot_python() -> str | None:
    """An interpreter with ``lerobot``: this one, or ``$LEROBOT_PYTHON`` (LeRobot needs Python >= 3.12)."""
    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    return os.environ.get("LEROBOT_PYTHON") or None


@pytest.mark.skipif(_lerobot_python() is None,
                    reason="lerobot is not importable here and LEROBOT_PYTHON names no interpreter that has it "
                           "(LeRobot needs Python >= 3.12 and torch < 2.12; see tests/data/lerobot/make_fixtures.py)")
@pytest.mark.parametrize("name", ["video", "image", "recorded"])
def test_lerobot_loads_our_export(tmp_path: Path, name: str) -> None:
    if name == "recorded":
        st = _recorded(tmp_path / "rec", True)
        out = tmp_path / "out"
        export_store(st, str(out), "lerobot")
        args = [str(out)]
    else:
        _, out = _round_trip(tmp_path, name)
        args = [str(out), str(DATA / name)]
    python = _lerobot_python()
    assert python is not None
    done = subprocess.run([python, str(CHECK), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("ok ")


def test_video_coded_frames_export_as_images(tmp_path: Path) -> None:
    """A video-coded frame field (lossless ffv1 here) exports its decoded frames, as PNG images."""
    from PIL import Image

    from replaystore.schemas import Dense, Schema

    rng = np.random.default_rng(5)
    schema = Schema("cam", [Dense("obs", np.uint8, (32, 32, 3), codec="video:ffv1:gop=4"),
                            Dense("action", np.float32, (2,)), Dense("reward", np.float32),
                            Dense("terminated", np.bool_)])
    st = open_store(str(tmp_path / "rec"), schema, mode="w")
    frames = rng.integers(0, 255, (9, 32, 32, 3)).astype(np.uint8)
    with st.writer() as w:
        w.append({"obs": frames, "action": rng.random((9, 2)).astype(np.float32),
                  "reward": np.zeros(9, np.float32), "terminated": np.arange(9) == 8}, stream=0)
    export_store(st, str(tmp_path / "out"), "lerobot")
    col = pq.read_table(tmp_path / "out" / TABLES[0]).column("observation.image").to_pylist()
    import io

    got = np.stack([np.asarray(Image.open(io.BytesIO(c["bytes"]))) for c in col])
    assert np.array_equal(got, frames)

