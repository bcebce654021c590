"""Exports of compressed fields (Parquet, Minari) and imports back: the frames come back bit-identical."""

from __future__ import annotations

import numpy as np

from replaystore.schemas import Dense, Schema
from replaystore.store import open_store
from replaystore.tools.formats.minari import export_minari, import_minari
from replaystore.tools.formats.parquet import export_parquet, import_parquet

STEPS = Schema("pixel_steps", [
    Dense("obs", np.uint8, (6, 5), codec="zstd:1"),
    Dense("next_obs", np.uint8, (6, 5), codec="lz4"),
    Dense("action", np.int64),
    Dense("reward", np.float32),
    Dense("terminated", np.bool_),
    Dense("truncated", np.bool_),
])


def _store(url: str) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    n = 21
    frames = rng.integers(0, 256, (n + 2, 6, 5), dtype=np.uint8)
    first = np.r_[np.arange(10), np.arange(11, 22)]  # two episodes of 10 and 11 steps, each with a final obs
    batch = {"obs": frames[first], "next_obs": frames[first + 1],
             "action": rng.integers(0, 3, n), "reward": rng.standard_normal(n).astype(np.float32),
             "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    batch["terminated"][[9, 20]] = True
    st = open_store(url, STEPS, mode="w")
    with st.writer() as w:
        w.append(batch, stream=0)
    return st, batch


def test_parquet_round_trip_keeps_frames_and_codecs(tmp_path) -> None:
    st, batch = _store(str(tmp_path / "st"))
    export_parquet(st, str(tmp_path / "pq"))
    back = import_parquet(str(tmp_path / "pq"), str(tmp_path / "back"))
    assert back.default.schema.compressed == {"obs": "zstd:1", "next_obs": "lz4:1"}
    got = back.read(back.row_ids())
    for name in ("obs", "next_obs", "action", "reward"):
        assert np.array_equal(got[name], batch[name]), name


def test_minari_round_trip_keeps_frames(tmp_path) -> None:
    st, batch = _store(str(tmp_path / "st"))
    export_minari(st, str(tmp_path / "mn"), dataset_id="pix/frames-v0")
    back = import_minari(str(tmp_path / "mn" / "pix" / "frames-v0"), str(tmp_path / "back"))
    got = back.read(back.row_ids())
    assert np.array_equal(got["obs"], batch["obs"]) and np.array_equal(got["next_obs"], batch["next_obs"])
