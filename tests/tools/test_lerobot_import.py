"""``import --from lerobot``: LeRobot v3 datasets written by LeRobot itself (tests/data/lerobot) come in whole.

One stream per episode, every feature a field with the data files' values, tasks, ``info.json`` and
``stats.json`` kept in the schema metadata, images decoded to their pixels, videos as the MP4's own
packets (not re-encoded; decoding them gives PyAV's frames of the source file). Malformed sources are
refused with typed errors naming the file or feature, leaving the destination as it was.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replaystore.errors import ImportSourceError, ReplayStoreError, StoreError
from replaystore.tools.cli import main
from replaystore.tools.formats.lerobot import PTS, decode_video, feature_key, field_name
from replaystore.tools.importer import import_store

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"
VIDEO, IMAGE = DATA / "video", DATA / "image"
MP4 = VIDEO / "videos" / "observation.images.top" / "chunk-000" / "file-000.mp4"


@pytest.fixture(scope="module")
def video_store(tmp_path_factory):
    return import_store(str(VIDEO), str(tmp_path_factory.mktemp("lr") / "video"), "lerobot")


@pytest.fixture(scope="module")
def image_store(tmp_path_factory):
    return import_store(str(IMAGE), str(tmp_path_factory.mktemp("lr") / "image"), "lerobot")


def _data(root: Path) -> pa.Table:
    return pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")


def test_field_names_map_back() -> None:
    for key in ("observation.images.top", "next.reward", "action", "observation.state"):
        assert feature_key(field_name(key)) == key
    assert field_name("observation.images.top") == "observation__images__top"
    for bad in ("observation.images.wrist-cam", "a..b", "_x", "a.b__c", ""):
        with pytest.raises(ImportSourceError, match="features"):
            field_name(bad)


def test_episodes_are_streams_and_values_are_the_data_files(video_store) -> None:
    src = _data(VIDEO)
    assert len(video_store) == src.num_rows == 200
    assert video_store.streams() == [0, 1, 2, 3]
    lengths = [len(video_store.rows(e)[0]) for e in range(4)]
    assert lengths == [48, 61, 37, 54]
    rows = np.concatenate([video_store.rows(e)[0] for e in range(4)])
    got = video_store.read(rows)
    for key in src.column_names:
        want = src.column(key).combine_chunks()
        values = np.asarray(want.flatten().to_numpy() if pa.types.is_fixed_size_list(want.type) else want.to_numpy(
            zero_copy_only=False))
        assert np.array_equal(got[field_name(key)].reshape(-1), values.reshape(-1)), key
        assert got[field_name(key)].dtype == values.dtype, key
    # steps are the frame indices, each episode starts with a reset
    for e in range(4):
        r, steps = video_store.rows(e)
        assert np.array_equal(steps, np.arange(len(r)))
        _, _, resets = video_store.index_of(r)
        assert resets[0] and not resets[1:].any()


def test_metadata_kept(video_store) -> None:
    keep = video_store.default.schema.metadata["lerobot"]
    assert keep["info"] == json.loads((VIDEO / "meta" / "info.json").read_text())
    assert keep["stats"] == json.loads((VIDEO / "meta" / "stats.json").read_text())
    tasks = pq.read_table(VIDEO / "meta" / "tasks.parquet").to_pydict()
    assert [keep["tasks"][i] for i in tasks["task_index"]] == tasks["task"]
    assert keep["keys"]["observation__images__top"] == "observation.images.top"
    assert keep["videos"]["observation.images.top"]["width"] == 64


def test_video_packets_are_the_files_packets(video_store) -> None:
    with av.open(str(MP4)) as c:
        s = c.streams.video[0]
        want = [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in c.demux(s) if p.size]
    name = "observation__images__top"
    rows = np.concatenate([video_store.rows(e)[0] for e in range(4)])
    got = video_store.read(rows)
    off = got[name + "__offsets"]
    packets = [(bytes(got[name][off[i]:off[i + 1]]), int(got[name + PTS][i]), int(got[name + "__dts"][i]),
                bool(got[name + "__key"][i])) for i in range(len(rows))]
    assert packets == want


def test_video_frames_decode_as_pyav_decodes_the_file(video_store) -> None:
    with av.open(str(MP4)) as c:
        want = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    ours = np.concatenate([decode_video(video_store, "observation.images.top", e) for e in range(4)])
    assert ours.shape == want.shape == (200, 64, 64, 3)
    assert np.array_equal(ours, want)


def test_images_are_their_pixels(image_store) -> None:
    src = _data(IMAGE)
    col = src.column("observation.image").combine_chunks().field("bytes").to_pylist()
    rows = np.concatenate([image_store.rows(e)[0] for e in image_store.streams()])
    got = image_store.read(rows, columns=["observation__image"])["observation__image"]
    assert got.shape == (60, 48, 48, 3) and got.dtype == np.uint8
    for i, png in enumerate(col):
        assert np.array_equal(got[i], np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))), i


def test_cli_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(IMAGE), str(tmp_path / "s"), "--from", "lerobot", "--quiet"]) == 0
    assert "60 records in 3 streams" in capsys.readouterr().out


def _copy(tmp_path: Path, root: Path = VIDEO) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(root, dst)
    return dst


def _refused(src: Path, dst: Path, error: type[BaseException], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        import_store(str(src), str(dst), "lerobot")
    assert isinstance(info.value, ReplayStoreError)
    assert not dst.exists()


def test_missing_info_refused(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    (src / "meta" / "info.json").unlink()
    _refused(src, tmp_path / "dst", ImportSourceError, "info.json")


def test_other_version_refused(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    info = json.loads((src / "meta" / "info.json").read_text())
    info["codebase_version"] = "v2.1"
    (src / "meta" / "info.json").write_text(json.dumps(info))
    _refused(src, tmp_path / "dst", StoreError, "v2.1")


def test_wrong_column_type_refused(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    path = src / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    i = t.column_names.index("next.reward")
    t = t.set_column(i, "next.reward", pa.array([str(x) for x in t.column(i).to_pylist()]))
    pq.write_table(t, path)
    _refused(src, tmp_path / "dst", ImportSourceError, "next.reward")


def test_missing_video_refused(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    shutil.rmtree(src / "videos")
    _refused(src, tmp_path / "dst", ImportSourceError, "videos")
