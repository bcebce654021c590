"""``make_loader(..., output="lerobot")``: batches of LeRobot items (keys with dots, CHW float images, tasks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from replaystore.loaders import UniformSampler, make_loader
from replaystore.schemas import episode
from replaystore.store import open_store
from replaystore.tools.importer import import_store

pytest.importorskip("PIL.Image")

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"


def test_imported_dataset_batches_are_lerobot_items(tmp_path: Path) -> None:
    st = import_store(str(DATA / "image"), str(tmp_path / "s"), "lerobot")
    tasks = st.default.schema.metadata["lerobot"]["tasks"]
    batches = list(make_loader(st, UniformSampler(st, 8, seed=1, num_batches=2), output="lerobot"))
    assert len(batches) == 2
    for b in batches:
        assert set(b) == {"observation.state", "action", "observation.image", "timestamp", "frame_index",
                          "episode_index", "index", "task_index", "task", "indices"}
        raw = st.read(b["indices"].numpy())
        img = b["observation.image"]
        assert img.shape == (8, 3, 48, 48) and img.dtype == torch.float32
        assert torch.equal(img, torch.from_numpy(raw["observation__image"]).permute(0, 3, 1, 2).float() / 255)
        assert torch.equal(b["observation.state"], torch.from_numpy(raw["observation__state"]))
        assert b["timestamp"].shape == (8,)
        assert b["task"] == [tasks[i] for i in raw["task_index"]]


def test_video_packets_left_out_frames_decoded(tmp_path: Path) -> None:
    pytest.importorskip("av")
    st = import_store(str(DATA / "video"), str(tmp_path / "s"), "lerobot")
    b = next(iter(make_loader(st, UniformSampler(st, 4, seed=0, num_batches=1), output="lerobot")))
    assert not any(k.startswith("observation__images") for k in b)
    assert b["observation.images.top"].shape == (4, 3, 64, 64)  # (frames: tests/loaders/test_lerobot_windows.py)
    assert {"observation.state", "next.reward", "next.done", "task"} <= set(b)


def test_recorded_store_keys(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "r"), episode(4, actions=3, metadata={"env_id": "Grid-v0"}), mode="w")
    with st.writer() as w:
        w.append({"obs": np.zeros((5, 4), np.float32), "action": np.zeros(5, np.int64),
                  "reward": np.ones(5, np.float32), "next_obs": np.zeros((5, 4), np.float32),
                  "terminated": np.arange(5) == 4, "truncated": np.zeros(5, bool)}, stream=0)
    b = next(iter(make_loader(st, UniformSampler(st, 3, seed=0, num_batches=1), output="lerobot")))
    assert set(b) == {"observation.state", "action", "next.reward", "next.done", "task", "indices"}
    assert b["task"] == ["Grid-v0"] * 3


def test_view_and_export_share_the_key_mapping() -> None:
    from replaystore.loaders.lerobotview import GYM_KEYS
    from replaystore.tools.formats import lerobot

    assert lerobot._GYM_KEYS == GYM_KEYS
