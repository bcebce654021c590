"""Exports of ``frames`` stores (one frame per record, the final frame on a frame-only record).

Minari: T + 1 frames (or stacks) per episode; D4RL: one row per step; Parquet: one row per record with the
codec kept. Each imports back into a store with the original's records; ``stack=`` is checked.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import minari
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import StoreError
from replaystore.schemas import frames, transitions
from replaystore.store import Store, open_store
from replaystore.tools.cli import main
from replaystore.tools.export import export_store
from replaystore.tools.formats.common import stack_frames
from replaystore.tools.formats.d4rl import export_d4rl
from replaystore.tools.formats.minari import export_minari
from replaystore.tools.importer import import_store

pytestmark = pytest.mark.usefixtures("minari_root")

# (stream, steps, how the episode ends): the cut one stops without a flag (an episode still being collected)
EPISODES = [(0, 5, "terminated"), (0, 7, "cut"), ("b", 3, "truncated"), (0, 4, "terminated"), ("b", 1, "cut")]


def frames_store(url: str, codec: str | None = "zstd") -> Store:
    st = open_store(url, frames((6, 5), actions=4, codec=codec), mode="w+")
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for stream, t, end in EPISODES:
            action = np.r_[rng.integers(0, 4, t), 0]
            reward = np.r_[rng.standard_normal(t).astype(np.float32), 0]
            term, trunc = np.zeros(t + 1, bool), np.zeros(t + 1, bool)
            if end != "cut":
                (term if end == "terminated" else trunc)[t - 1] = True
            w.append({"frame": rng.integers(0, 256, (t + 1, 6, 5), dtype=np.uint8), "action": action,
                      "reward": reward, "terminated": term, "truncated": trunc}, stream=stream, reset=True)
        w.commit()
    return st


def records(st: Store) -> list[tuple[object, list[int], list[bool], dict[str, list[object]]]]:
    t = st.default
    t.view()
    idx = t.stream_index()
    out = []
    for key in t.streams():
        lo, hi = idx.span(key)
        data = t.read(idx.rows[lo:hi])
        out.append((key, idx.steps[lo:hi].tolist(), idx.resets[lo:hi].tolist(),
                    {k: v.tolist() for k, v in sorted(data.items())}))
    return out


@pytest.mark.parametrize("stack", [None, 3])
@pytest.mark.parametrize("fmt", ["minari", "minari-hdf5", "d4rl"])
def test_frames_export_imports_back_to_the_same_records(tmp_path: Path, fmt: str, stack: int | None) -> None:
    st = frames_store(str(tmp_path / "st"))
    out = tmp_path / ("out.hdf5" if fmt == "d4rl" else "root")
    summary = export_store(st, str(out), fmt, dataset_id="tt/frames-v0" if fmt != "d4rl" else None, stack=stack)
    assert summary["records"] == sum(t for _, t, _ in EPISODES) and summary["episodes"] == len(EPISODES)
    src = str(out / "tt" / "frames-v0") if fmt != "d4rl" else str(out)
    back = import_store(src, str(tmp_path / "back"), fmt)
    assert back.default.schema.to_dict() == st.default.schema.to_dict()
    assert records(back) == records(st)


def test_d4rl_small_reads_span_episodes(tmp_path: Path) -> None:
    st = frames_store(str(tmp_path / "st"))
    export_d4rl(st, str(tmp_path / "a.hdf5"), batch_rows=2, stack=2)
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        assert f["observations"].shape == (20, 2, 6, 5)
        assert f["timeouts"][:].sum() == 3 and f["infos/cut"][:].sum() == 2 and f["terminals"][:].sum() == 2
    back = import_store(str(tmp_path / "a.hdf5"), str(tmp_path / "back"), "d4rl")
    assert records(back) == records(st)


def test_minari_reader_sees_t_plus_one_frames_and_the_cut_as_truncation(tmp_path: Path, minari_root: Path) -> None:
    st = frames_store(str(tmp_path / "st"))
    export_minari(st, str(minari_root), dataset_id="tt/stacked-v0", stack=3)
    ds = minari.load_dataset("tt/stacked-v0")
    t = st.default
    in_stream_order = [e for e in EPISODES if e[0] == 0] + [e for e in EPISODES if e[0] == "b"]
    for ep, (_, steps, end) in zip(ds.iterate_episodes(), in_stream_order, strict=True):
        assert ep.observations.shape == (steps + 1, 3, 6, 5)
        assert bool(ep.truncations[-1]) == (end != "terminated") and bool(ep.terminations[-1]) == (end == "terminated")
    first = t.read(np.arange(6))["frame"]
    np.testing.assert_array_equal(next(ds.iterate_episodes()).observations, stack_frames(first, 3))
    assert stack_frames(first, 3)[0].tolist() == [first[0].tolist()] * 3  # reset padding


def test_a_lone_first_frame_has_no_step_and_is_left_out(tmp_path: Path, minari_root: Path) -> None:
    st = frames_store(str(tmp_path / "st"))
    with st.writer() as w:  # a new episode's first frame, its step not taken yet
        w.append({"frame": np.zeros((1, 6, 5), np.uint8), "action": np.zeros(1, np.int64),
                  "reward": np.zeros(1, np.float32), "terminated": np.zeros(1, bool),
                  "truncated": np.zeros(1, bool)}, stream=0, reset=True)
        w.commit()
    assert export_minari(st, str(minari_root), dataset_id="tt/lone-v0")["episodes"] == len(EPISODES)
    assert export_d4rl(st, str(tmp_path / "a.hdf5"))["records"] == sum(t for _, t, _ in EPISODES)


def test_parquet_keeps_one_frame_per_record_and_the_codec(tmp_path: Path) -> None:
    st = frames_store(str(tmp_path / "st"))
    export_store(st, str(tmp_path / "pq"), "parquet")
    back = import_store(str(tmp_path / "pq"), str(tmp_path / "back"), "parquet")
    assert records(back) == records(st)
    assert back.default.schema.field("frame").codec == st.default.schema.field("frame").codec


@pytest.mark.parametrize("stack", [0, -1, 2.0, True, "4"])
def test_a_bad_stack_is_refused_before_anything_is_written(tmp_path: Path, stack: object) -> None:
    st = frames_store(str(tmp_path / "st"))
    with pytest.raises(StoreError, match="stack: expected a positive int"):
        export_store(st, str(tmp_path / "a.hdf5"), "d4rl", stack=stack)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="stack: expected a positive int"):
        export_store(st, str(tmp_path / "root"), "minari", stack=stack)  # type: ignore[arg-type]
    assert not (tmp_path / "a.hdf5").exists() and not (tmp_path / "root").exists()


def test_stack_is_refused_for_parquet_and_for_stores_without_frames(tmp_path: Path) -> None:
    st = frames_store(str(tmp_path / "st"))
    with pytest.raises(StoreError, match="Parquet exports keep one frame per record"):
        export_store(st, str(tmp_path / "pq"), "parquet", stack=4)
    assert not (tmp_path / "pq").exists()
    plain = open_store(str(tmp_path / "plain"), transitions(3, actions=2), mode="w+")
    with pytest.raises(StoreError, match="applies to frames stores"):
        export_store(plain, str(tmp_path / "p.hdf5"), "d4rl", stack=4)
    assert not (tmp_path / "p.hdf5").exists()


def test_cli_export_takes_stack(tmp_path: Path, minari_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frames_store(str(tmp_path / "st"))
    assert main(["export", str(tmp_path / "st"), str(tmp_path / "a.hdf5"), "--to", "d4rl", "--stack", "4"]) == 0
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        assert f["observations"].shape[1:] == (4, 6, 5)
    assert main(["export", str(tmp_path / "st"), str(minari_root), "--to", "minari", "--dataset-id",
                 "tt/cli-v0", "--stack", "2"]) == 0
    assert minari.load_dataset("tt/cli-v0").observation_space.shape == (2, 6, 5)
    assert os.path.isdir(minari_root / "tt" / "cli-v0")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(episodes=hs.lists(hs.tuples(hs.sampled_from([0, 1, "s"]), hs.integers(0, 5),
                                   hs.sampled_from(["terminated", "truncated", "cut"])), min_size=1, max_size=6),
       stack=hs.sampled_from([None, 1, 2, 4]), fmt=hs.sampled_from(["minari", "minari-hdf5", "d4rl"]))
def test_round_trip_matches_a_reference_model(tmp_path_factory: pytest.TempPathFactory,
                                              episodes: list[tuple[object, int, str]], stack: int | None,
                                              fmt: str) -> None:
    """Any episode layout: the import holds the source's records less its lone first frames (no step)."""
    root = tmp_path_factory.mktemp("frames-prop")
    st = open_store(str(root / "st"), frames((3, 2), actions=3, codec="lz4"), mode="w+")
    rng = np.random.default_rng(len(episodes))
    with st.writer() as w:
        for stream, t, end in episodes:
            term, trunc = np.zeros(t + 1, bool), np.zeros(t + 1, bool)
            if t and end != "cut":
                (term if end == "terminated" else trunc)[t - 1] = True
            w.append({"frame": rng.integers(0, 256, (t + 1, 3, 2), dtype=np.uint8),
                      "action": np.r_[rng.integers(0, 3, t), 0], "reward": np.r_[rng.random(t), 0].astype(np.float32),
                      "terminated": term, "truncated": trunc}, stream=stream, reset=True)
        w.commit()
    want = []  # the reference: every stream's records without its one-record episodes
    for key, steps, resets, data in records(st):
        starts = [i for i, r in enumerate(resets) if r] + [len(steps)]
        keep = [i for a, b in zip(starts[:-1], starts[1:], strict=True) if b - a > 1 for i in range(a, b)]
        if keep:
            want.append((key, [steps[i] for i in keep], [resets[i] for i in keep],
                         {k: [v[i] for i in keep] for k, v in data.items()}))
    if not want:
        return
    out = root / ("out.hdf5" if fmt == "d4rl" else "root")
    export_store(st, str(out), fmt, dataset_id=None if fmt == "d4rl" else "tt/prop-v0", stack=stack)
    back = import_store(str(out) if fmt == "d4rl" else str(out / "tt" / "prop-v0"), str(root / "back"), fmt)
    assert records(back) == want
