"""``make_loader(output="lerobot", delta_timestamps=...)``: LeRobot's windows, ``<key>_is_pad``, video frames.

The reference model is LeRobot's rule written out over the episode table: frame ``i`` of an
episode ``[start, end)`` with delta ``d`` (frames) reads frame ``clip(i + d, start, end - 1)``
and is padding where ``i + d`` falls outside.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis.strategies import integers as st_integers
from hypothesis.strategies import lists as st_lists

from replaystore.errors import (
    LoaderArgumentError,
    MissingDependencyError,
    SamplerParameterError,
    UnsupportedCombinationError,
)
from replaystore.loaders import EpochSampler, SequenceSampler, UniformSampler, make_loader
from replaystore.tools.importer import import_store

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"
DELTAS = {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}
VIDEO = "observation.images.top"

pytest.importorskip("PIL.Image")


def reference(episode: np.ndarray, deltas: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per frame (dataset order) and delta: the frame LeRobot reads and whether it is padding."""
    n = len(episode)
    start, end = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for e in np.unique(episode):
        at = np.flatnonzero(episode == e)
        start[at], end[at] = at.min(), at.max() + 1
    want = np.arange(n)[:, None] + np.asarray(deltas)[None, :]
    return np.clip(want, start[:, None], end[:, None] - 1), (want < start[:, None]) | (want >= end[:, None])


def items_by_index(loader: Any, total: int) -> dict[int, dict[str, Any]]:
    """Every sample the loader yields, split out of its batches, by its LeRobot ``index``."""
    out: dict[int, dict[str, Any]] = {}
    for b in loader:
        for j, ix in enumerate(b["index"].tolist()):
            out[ix] = {k: (v[j] if isinstance(v, (torch.Tensor, list)) else v) for k, v in b.items()}
        if len(out) == total:
            break
    return out


def chw(frames: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(frames).movedim(-1, -3).float() / 255


def _store(tmp_path: Path, name: str) -> Any:
    if name == "video":
        pytest.importorskip("av")
    return import_store(str(DATA / name), str(tmp_path / "s"), "lerobot")


@pytest.mark.parametrize("name", ["image", "video"])
def test_windows_and_is_pad_equal_the_reference(tmp_path: Path, name: str) -> None:
    st = _store(tmp_path, name)
    fps = st.default.schema.metadata["fps"]
    deltas = dict(DELTAS)
    if name == "image":
        deltas["observation.image"] = [-2 / fps, 0.0, 1 / fps]
    full = st.read(np.arange(len(st.default.stream_index().rows)))
    order = np.argsort(full["index"])
    episode = full["episode_index"][order]
    loader = make_loader(st, EpochSampler(st, 16, seed=2), output="lerobot", delta_timestamps=deltas)
    items = items_by_index(loader, len(order))
    assert len(items) == len(order)
    for key, ts in deltas.items():
        field = key.replace(".", "__")
        q, pad = reference(episode, [round(t * fps) for t in ts])
        values = full[field][order]
        for i, item in items.items():
            want = torch.from_numpy(values[q[i]])
            assert torch.equal(item[key], chw(values[q[i]]) if name == "image" and "image" in key else want), (key, i)
            assert torch.equal(item[key + "_is_pad"], torch.from_numpy(pad[i])), (key, i)
            assert item[key].shape[0] == len(ts)


def test_video_frames_equal_decode_video_and_pyav(tmp_path: Path) -> None:
    import av

    from replaystore.tools.formats.lerobot import decode_video

    st = _store(tmp_path, "video")
    full = st.read(np.arange(len(st.default.stream_index().rows)), columns=["index", "episode_index", "frame_index"])
    by_ep = {int(e): decode_video(st, VIDEO, int(e)) for e in np.unique(full["episode_index"])}
    with av.open(str(DATA / "video" / "videos" / VIDEO / "chunk-000" / "file-000.mp4")) as c:
        mp4 = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    assert len(mp4) == len(full["index"])  # the fixture's episodes lie one after the other in one file
    loader = make_loader(st, EpochSampler(st, 24, seed=1), output="lerobot",
                         delta_timestamps={VIDEO: [-2 / 30, 0.0, 1 / 30]})
    items = items_by_index(loader, len(mp4))
    episode = full["episode_index"][np.argsort(full["index"])]
    q, pad = reference(episode, [-2, 0, 1])
    for i, item in items.items():
        e, f = int(item["episode_index"]), int(item["frame_index"])
        assert torch.equal(item[VIDEO][1], chw(by_ep[e][f])), i
        assert torch.equal(item[VIDEO], chw(mp4[q[i]])), i
        assert torch.equal(item[VIDEO + "_is_pad"], torch.from_numpy(pad[i]))
    b = next(iter(make_loader(st, UniformSampler(st, 5, seed=0, num_batches=1), output="lerobot")))
    assert b[VIDEO].shape == (5, 3, 64, 64) and b[VIDEO].dtype == torch.float32
    assert torch.equal(b[VIDEO], chw(mp4[b["index"].numpy()]))


def test_a_group_of_pictures_decodes_once_per_minibatch(tmp_path: Path) -> None:
    from replaystore.loaders.base import Request
    from replaystore.loaders.dataset import gather_arrays
    from replaystore.loaders.lerobotwindows import view_part

    st = _store(tmp_path, "video")
    t = st.default
    part = view_part(UniformSampler(st, 4, seed=0), {VIDEO: [-1 / 30, 0.0]})
    dec = part.videos["observation__images__top"]
    calls: list[int] = []
    group = dec._group
    dec._group = lambda *a: calls.append(len(a[2])) or group(*a)  # type: ignore  # (a[2]: the group's pts)
    rows, _ = t.rows(0)  # episode 0: keyframes every 2 frames (the fixture's g=2)
    batch = gather_arrays(t, Request(rows=np.array([rows[1], rows[1], rows[0]])), [part])
    assert calls == [2]  # frames 0 and 1 of the first group, for three samples: one decode
    assert batch["observation__images__top"].shape == (3, 2, 64, 64, 3)
    assert batch["observation__images__top_is_pad"].tolist() == [[False, False]] * 2 + [[True, False]]


def test_dataloader_workers_give_the_same_items(tmp_path: Path) -> None:
    st = _store(tmp_path, "video")
    deltas = {**DELTAS, VIDEO: [-0.1, 0.0]}
    total = len(st.default.stream_index().rows)
    main = items_by_index(make_loader(st, EpochSampler(st, 20, seed=4), output="lerobot",
                                      delta_timestamps=deltas), total)
    loader = make_loader(st, EpochSampler(st, 20, seed=5), num_workers=2, output="lerobot", delta_timestamps=deltas,
                         multiprocessing_context="spawn")
    workers = items_by_index(loader, total)
    assert set(main) == set(workers) == set(range(total))
    for i in main:
        for k, v in main[i].items():
            if k != "indices":
                assert (torch.equal(v, workers[i][k]) if isinstance(v, torch.Tensor) else v == workers[i][k]), (i, k)


def test_recorded_cartpole_store(tmp_path: Path) -> None:
    gym = pytest.importorskip("gymnasium")
    from replaystore.gym import RecordEpisodes
    from replaystore.store import open_store

    env = RecordEpisodes(gym.make("CartPole-v1"), str(tmp_path / "cp"))
    rng = np.random.default_rng(0)
    for k in range(4):
        env.reset(seed=k)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(int(rng.integers(2)))
            done = term or trunc
    env.close()
    st = open_store(str(tmp_path / "cp"))
    deltas = {"observation.state": [-0.04, 0.0], "action": [0.0, 0.02, 0.04], "next.reward": [0.0]}
    with pytest.raises(SamplerParameterError, match="delta_timestamps"):
        make_loader(st, UniformSampler(st, 8), output="lerobot", delta_timestamps=deltas)
    t = st.default
    rows = np.concatenate([t.rows(s)[0] for s in t.streams()])  # one stream; episodes split at resets
    raw = t.read(rows, columns=["obs", "action", "reward"])
    resets = np.zeros(len(rows), bool)
    si = t.stream_index()
    resets[np.searchsorted(rows, si.rows[si.resets])] = True
    episode = np.cumsum(resets)
    pos = {int(r): i for i, r in enumerate(rows)}
    loader = make_loader(st, UniformSampler(st, 32, seed=3, num_batches=3), output="lerobot",
                         delta_timestamps=deltas, fps=50)
    for b in loader:
        assert b["observation.state"].shape == (32, 2, 4) and b["action"].shape == (32, 3)
        for j, r in enumerate(b["indices"].tolist()):
            for key, field in (("observation.state", "obs"), ("action", "action"), ("next.reward", "reward")):
                q, pad = reference(episode, [round(d * 50) for d in deltas[key]])
                assert torch.equal(b[key][j], torch.from_numpy(raw[field][q[pos[r]]])), (key, r)
                assert torch.equal(b[key + "_is_pad"][j], torch.from_numpy(pad[pos[r]]))


def test_bad_delta_timestamps_are_refused(tmp_path: Path) -> None:
    st = _store(tmp_path, "image")
    u = UniformSampler(st, 4, seed=0)
    with pytest.raises(SamplerParameterError, match="observation.nothing"):
        make_loader(st, u, output="lerobot", delta_timestamps={"observation.nothing": [0.0]})
    with pytest.raises(SamplerParameterError, match="action") as info:
        make_loader(st, u, output="lerobot", delta_timestamps={"action": [0.0, 0.01]})
    assert info.value.field == "action"
    with pytest.raises(SamplerParameterError, match="action"):
        make_loader(st, u, output="lerobot", delta_timestamps={"action": []})
    with pytest.raises(UnsupportedCombinationError, match="SequenceSampler"):
        make_loader(st, SequenceSampler(st, 2, 3), output="lerobot", delta_timestamps={"action": [0.0]})
    with pytest.raises(UnsupportedCombinationError, match="stack="):
        make_loader(st, UniformSampler(st, 2, stack=2, stack_field="observation__image"), output="lerobot",
                    delta_timestamps={"action": [0.0]})
    with pytest.raises(LoaderArgumentError, match="delta_timestamps"):
        make_loader(st, u, delta_timestamps={"action": [0.0]})
    with pytest.raises(SamplerParameterError, match="fps"):
        make_loader(st, u, output="lerobot", delta_timestamps={"action": [0.0]}, fps=15)
    # field names work as keys; a delta within LeRobot's 1e-4 s tolerance is taken
    b = next(iter(make_loader(UniformSampler(st, 3, seed=0, num_batches=1).store, UniformSampler(
        st, 3, seed=0, num_batches=1), output="lerobot", delta_timestamps={"observation__state": [0.10004]})))
    assert b["observation.state"].shape == (3, 1, 6)


def test_missing_pyav_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    st = _store(tmp_path, "video")
    monkeypatch.setitem(sys.modules, "av", None)  # (import av now fails)
    with pytest.raises(MissingDependencyError, match=VIDEO):
        make_loader(st, UniformSampler(st, 4), output="lerobot")


@given(lengths=st_lists(st_integers(1, 6), min_size=1, max_size=6), streams=st_integers(1, 3),
       deltas=st_lists(st_integers(-4, 4), min_size=1, max_size=4))
@settings(max_examples=15, deadline=None)
def test_windows_property(lengths: list[int], streams: int, deltas: list[int]) -> None:
    """Episodes spread over interleaved streams (row ids not in episode order) against the reference."""
    import tempfile

    from replaystore.schemas import episode as episode_schema
    from replaystore.store import open_store

    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp + "/s", episode_schema(2, actions=2, metadata={"fps": 10}), mode="w")
        ep_of: list[int] = []  # per record number: its episode
        with store.writer() as w:
            for e, n in enumerate(lengths):  # episode e goes to stream e % streams, its records numbered in order
                first = len(ep_of)
                ep_of += [e] * n
                obs = np.stack([np.arange(first, first + n), np.zeros(n)], 1).astype(np.float32)
                w.append({"obs": obs, "action": np.zeros(n, np.int64), "reward": obs[:, 0].copy(),
                          "next_obs": obs, "terminated": np.arange(n) == n - 1, "truncated": np.zeros(n, bool)},
                         stream=e % streams, reset=np.arange(n) == 0)
        q, pad = reference(np.array(ep_of), deltas)
        loader = make_loader(store, EpochSampler(store, 7, seed=0), output="lerobot",
                             delta_timestamps={"observation.state": [d / 10 for d in deltas]})
        seen: set[int] = set()
        for b in loader:
            for j, rec in enumerate(b["next.reward"].long().tolist()):
                seen.add(rec)
                assert b["observation.state"][j, :, 0].long().tolist() == q[rec].tolist()
                assert b["observation.state_is_pad"][j].tolist() == pad[rec].tolist()
            if len(seen) == len(ep_of):
                break
        assert len(seen) == len(ep_of)


def test_sequence_windows_get_their_frames(tmp_path: Path) -> None:
    """Without delta_timestamps every sampler gets decoded frames: a SequenceSampler's windows too."""
    from replaystore.tools.formats.lerobot import decode_video

    st = _store(tmp_path, "video")
    b = next(iter(make_loader(st, SequenceSampler(st, 6, batch_size=4, seed=2, num_batches=1), output="lerobot")))
    assert b[VIDEO].shape == (4, 6, 3, 64, 64)
    rows = b["indices"].numpy()
    by_ep: dict[int, np.ndarray] = {}
    for j, r in np.ndenumerate(rows):
        if r < 0:
            assert not b[VIDEO][j].any()
            continue
        raw = st.read(np.array([r]), columns=["episode_index", "frame_index"])
        e = int(raw["episode_index"][0])
        if e not in by_ep:
            by_ep[e] = decode_video(st, VIDEO, e)
        want = by_ep[e][int(raw["frame_index"][0])]
        assert torch.equal(b[VIDEO][j], chw(want)), j
