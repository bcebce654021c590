"""Journey: Atari frames recorded once into a compressed ``frames`` store, exported, read by the peers, re-imported.

A user records Pong through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4) and
``FrameStackObservation(4)``,
writes each frame once into a zstd ``frames`` store with a plain writer loop (the documented frames API), then
exports it: to Minari (read back with ``minari.load_dataset``; stacked observations equal gymnasium's stacks frame
for frame), to D4RL HDF5 (read with h5py), to Parquet (read with DuckDB and pyarrow). Each export imports back into
a store whose records equal the original's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import gymnasium as gym
import h5py
import minari
import numpy as np
import pyarrow.dataset as pads
import pytest

from replaystore.schemas import frames
from replaystore.store import Store, open_store
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store
from support.pixels import pong as pong_env

STEPS = 300
EPISODE_STEPS = 120  # TimeLimit: episodes of 120, 120 and (cut by the loop, marked truncated) 60 steps
STACK = 4


def record_pong(url: str) -> tuple[Store, list[dict[str, Any]]]:
    """Record ``STEPS`` random Pong steps into a zstd frames store; return it and gymnasium's own episodes.

    Each episode in the reference: its stacked observations (T + 1, from FrameStackObservation), actions, rewards,
    terminations and truncations.
    """
    env = gym.wrappers.FrameStackObservation(pong_env(EPISODE_STEPS), STACK)
    env.action_space.seed(0)
    st = open_store(url, frames((84, 84), actions=int(env.action_space.n), codec="zstd"), mode="w+")
    episodes: list[dict[str, Any]] = []
    obs, _ = env.reset(seed=0)
    ep: dict[str, list[Any]] = {"obs": [obs], "action": [], "reward": [], "term": [], "trunc": []}
    with st.writer() as w:
        for t in range(STEPS):
            action = int(env.action_space.sample())
            obs, reward, term, trunc, _ = env.step(action)
            trunc = trunc or t == STEPS - 1  # the loop stops here: the episode is truncated
            for key, value in (("obs", obs), ("action", action), ("reward", reward), ("term", term),
                               ("trunc", trunc)):
                ep[key].append(value)
            if term or trunc:
                n = len(ep["action"])
                stacks = np.stack(ep["obs"])
                # one record per frame: the frame seen at step t and the step taken on it, then the final frame
                w.append({"frame": stacks[:, -1], "action": np.r_[ep["action"], 0].astype(np.int64),
                          "reward": np.r_[ep["reward"], 0].astype(np.float32),
                          "terminated": np.r_[ep["term"], False].astype(bool),
                          "truncated": np.r_[ep["trunc"], False].astype(bool)}, reset=True)
                w.commit()
                assert len(stacks) == n + 1
                episodes.append({"obs": stacks, "action": np.array(ep["action"]),
                                 "reward": np.array(ep["reward"], np.float32), "term": np.array(ep["term"]),
                                 "trunc": np.array(ep["trunc"])})
                obs, _ = env.reset()
                ep = {"obs": [obs], "action": [], "reward": [], "term": [], "trunc": []}
    env.close()
    return st, episodes


def records(st: Store) -> dict[str, np.ndarray]:
    """Every record of the store's table in stream and step order, with its stream index."""
    t = st.default
    t.view()
    rows, steps, resets, streams = [], [], [], []
    idx = t.stream_index()
    for key in t.streams():
        lo, hi = idx.span(key)
        rows.append(idx.rows[lo:hi])
        steps.append(idx.steps[lo:hi])
        resets.append(idx.resets[lo:hi])
        streams += [key] * (hi - lo)
    data = t.read(np.concatenate(rows))
    return {**data, "step": np.concatenate(steps), "reset": np.concatenate(resets),
            "stream": np.array(streams, dtype=object)}


def assert_same_records(a: Store, b: Store) -> None:
    ra, rb = records(a), records(b)
    assert set(ra) == set(rb)
    for name in ra:
        np.testing.assert_array_equal(ra[name], rb[name], err_msg=name)
    assert a.default.schema.to_dict() == b.default.schema.to_dict()


@pytest.fixture(scope="module")
def pong(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("frames-export")
    st, episodes = record_pong(str(root / "pong"))
    return st, episodes, root


def test_record_pong_into_a_frames_store(pong):
    st, episodes, _ = pong
    assert [len(e["action"]) for e in episodes] == [EPISODE_STEPS, EPISODE_STEPS, STEPS - 2 * EPISODE_STEPS]
    assert len(st) == STEPS + len(episodes)  # each frame once: T + 1 records per episode
    assert st.default.schema.field("frame").codec is not None


def test_minari_export_reads_with_minari_and_matches_gymnasium_stacks(pong, tmp_path, monkeypatch):
    st, episodes, _ = pong
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    export_store(st, str(tmp_path), "minari", dataset_id="pong/frames-v0")
    export_store(st, str(tmp_path), "minari", dataset_id="pong/stacked-v0", stack=STACK)
    frames_ds, stacked_ds = minari.load_dataset("pong/frames-v0"), minari.load_dataset("pong/stacked-v0")
    assert stacked_ds.observation_space == gym.spaces.Box(0, 255, (STACK, 84, 84), np.uint8)
    assert frames_ds.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    assert stacked_ds.action_space == gym.spaces.Discrete(6)
    assert frames_ds.total_episodes == stacked_ds.total_episodes == len(episodes)
    assert frames_ds.total_steps == STEPS
    for one, stacked, ref in zip(frames_ds.iterate_episodes(), stacked_ds.iterate_episodes(), episodes, strict=True):
        np.testing.assert_array_equal(stacked.observations, ref["obs"])  # gymnasium's stacks, reset-padded
        np.testing.assert_array_equal(one.observations, ref["obs"][:, -1])  # T + 1 frames
        for ep in (one, stacked):
            np.testing.assert_array_equal(ep.actions, ref["action"])
            np.testing.assert_array_equal(ep.rewards, ref["reward"])
            np.testing.assert_array_equal(ep.terminations, ref["term"])
            np.testing.assert_array_equal(ep.truncations, ref["trunc"])
    for dataset_id in ("pong/frames-v0", "pong/stacked-v0"):
        back = import_store(str(tmp_path), str(tmp_path / f"back-{dataset_id.replace('/', '-')}"), "minari",
                            dataset_id=dataset_id)
        assert_same_records(st, back)


def test_d4rl_export_reads_with_h5py_and_imports_back(pong, tmp_path):
    st, episodes, _ = pong
    export_store(st, str(tmp_path / "pong.hdf5"), "d4rl")
    export_store(st, str(tmp_path / "pong-stacked.hdf5"), "d4rl", stack=STACK)
    want_obs = np.concatenate([e["obs"][:-1] for e in episodes])
    want_next = np.concatenate([e["obs"][1:] for e in episodes])
    with h5py.File(tmp_path / "pong.hdf5", "r") as f, h5py.File(tmp_path / "pong-stacked.hdf5", "r") as g:
        assert f["observations"].shape == (STEPS, 84, 84) and g["observations"].shape == (STEPS, STACK, 84, 84)
        np.testing.assert_array_equal(f["observations"][:], want_obs[:, -1])
        np.testing.assert_array_equal(f["next_observations"][:], want_next[:, -1])
        np.testing.assert_array_equal(g["observations"][:], want_obs)
        np.testing.assert_array_equal(g["next_observations"][:], want_next)
        np.testing.assert_array_equal(f["actions"][:], np.concatenate([e["action"] for e in episodes]))
        np.testing.assert_array_equal(f["rewards"][:], np.concatenate([e["reward"] for e in episodes]))
        np.testing.assert_array_equal(f["terminals"][:], np.concatenate([e["term"] for e in episodes]))
        np.testing.assert_array_equal(f["timeouts"][:], np.concatenate([e["trunc"] for e in episodes]))
    for name in ("pong.hdf5", "pong-stacked.hdf5"):
        assert_same_records(st, import_store(str(tmp_path / name), str(tmp_path / f"back-{name}"), "d4rl"))


def test_parquet_export_reads_with_duckdb_and_keeps_the_codec(pong, tmp_path):
    st, episodes, _ = pong
    export_store(st, str(tmp_path / "pq"), "parquet")
    con = duckdb.connect()
    count, frames_only = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE reset) FROM read_parquet('{tmp_path / 'pq'}/**/*.parquet')"
    ).fetchone()
    assert count == STEPS + len(episodes) and frames_only == len(episodes)
    table = pads.dataset(str(tmp_path / "pq"), format="parquet", partitioning="hive").to_table().sort_by("row")
    got = np.asarray(table.column("frame").combine_chunks().flatten().flatten()).reshape(-1, 84, 84)
    np.testing.assert_array_equal(got, np.concatenate([e["obs"][:, -1] for e in episodes]))  # decoded frames
    back = import_store(str(tmp_path / "pq"), str(tmp_path / "back-pq"), "parquet")
    assert_same_records(st, back)
    assert back.default.schema.field("frame").codec == st.default.schema.field("frame").codec
