"""Stacks and sequences over a video-coded ``frames`` store equal those built from the decoded frames.

A lossless video field (ffv1) gives the raw store's minibatches bit for bit; a lossy one (AV1, H.264)
gives the minibatches of a raw store holding the frames the video store decodes. A window inside one
GOP decodes that GOP once per read.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.loaders import SequenceSampler, UniformSampler, gather
from replaystore.schemas import frames
from replaystore.store import open_store
from replaystore.store.format.codecs import CompressedArray

FRAME = (8, 12)

episodes = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30), st.booleans()), min_size=1, max_size=6)


def _fill(path: str, codec: str | None, plan: list[tuple[int, int, bool]], seed: int, commit_each: int,
          frames_in_order: np.ndarray | None = None) -> None:
    """Episodes ``(stream, steps, closed)``, committed every ``commit_each`` episodes; with
    ``frames_in_order``, the k-th record appended gets its k-th frame instead of the generated one."""
    rng = np.random.default_rng(seed)
    st_ = open_store(path, frames(FRAME, 4, codec=codec), mode="w")
    at = 0
    with st_.writer() as w:
        for i, (stream, steps, closed) in enumerate(plan):
            n = steps + 1 if closed else steps
            base = rng.integers(0, 256, FRAME)
            data = ((base[None] + np.arange(n)[:, None, None] * rng.integers(0, 3)) % 256).astype(np.uint8)
            if frames_in_order is not None:
                data = frames_in_order[at:at + n]
            at += n
            term = np.zeros(n, bool)
            if closed:
                term[steps - 1] = True
            w.append({"frame": data, "action": rng.integers(0, 4, n), "reward": rng.random(n).astype(np.float32),
                      "terminated": term, "truncated": np.zeros(n, bool)}, stream=stream, reset=True)
            if (i + 1) % commit_each == 0:
                w.commit()
        w.commit()
    st_.close()


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if hasattr(x, "numpy"):
            x, y = x.numpy(), y.numpy()
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=key)


def _compare(root: str, codec: str, plan, seed: int, k: int, padding: str, commit_each: int) -> None:
    _fill(f"{root}/video", codec, plan, seed, commit_each)
    video = open_store(f"{root}/video", mode="r")
    decoded = video.read(video.row_ids())["frame"]  # (one writer: rows in append order)
    _fill(f"{root}/raw", None, plan, seed, commit_each, frames_in_order=decoded)
    raw = open_store(f"{root}/raw", mode="r")
    kw = {"stack": k, "stack_padding": padding}
    a = UniformSampler(raw, batch_size=16, seed=seed, **kw)
    b = UniformSampler(video, batch_size=16, seed=seed, **kw)
    for _ in range(3):
        _same(gather(raw.default, a.sample()), gather(video.default, b.sample()))
    a = SequenceSampler(raw, batch_size=3, length=5, seed=seed, stack=k, stack_padding=padding)
    b = SequenceSampler(video, batch_size=3, length=5, seed=seed, stack=k, stack_padding=padding)
    _same(gather(raw.default, a.sample()), gather(video.default, b.sample()))
    raw.close()
    video.close()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(plan=episodes, k=st.integers(1, 4), padding=st.sampled_from(["reset", "zero"]), seed=st.integers(0, 999),
       commit_each=st.integers(1, 3), gop=st.sampled_from([1, 3, 8]))
def test_lossless_video_frames_give_the_raw_stores_minibatches(tmp_path_factory, plan, k, padding, seed,
                                                                commit_each, gop) -> None:
    plan = [*plan, (0, 12, True)]  # windows of 5 steps to draw, whatever else was drawn
    root = str(tmp_path_factory.mktemp("v"))
    _fill(f"{root}/plain", None, plan, seed, commit_each)
    _compare(root, f"video:ffv1:gop={gop}", plan, seed, k, padding, commit_each)
    plain, video = open_store(f"{root}/plain", mode="r"), open_store(f"{root}/video", mode="r")
    np.testing.assert_array_equal(video.read(video.row_ids())["frame"], plain.read(plain.row_ids())["frame"])


@pytest.mark.parametrize("codec", ["video:av1:crf=40:gop=4", "video:h264:gop=5"])
def test_lossy_video_frames_give_the_minibatches_of_their_decoded_frames(tmp_path, codec) -> None:
    plan = [(0, 30, True), (1, 17, False), (0, 9, True), (2, 22, True)]
    _compare(str(tmp_path), codec, plan, 3, 4, "reset", 2)


def test_a_stacked_window_inside_one_gop_decodes_it_once_per_read(tmp_path) -> None:
    plan = [(0, 63, True)]  # 64 records, one fragment: GOPs [0, 16), [16, 32), ...
    _fill(str(tmp_path / "v"), "video:ffv1:gop=16", plan, 0, 1)
    video = open_store(str(tmp_path / "v"), mode="r")
    ids = video.row_ids()
    before = CompressedArray.blocks_decoded
    got = video.read(ids[[17, 18, 19, 20, 18, 19, 20, 21]], columns=["frame"])  # obs and next_obs of stack=4
    assert CompressedArray.blocks_decoded - before == 1
    assert got["frame"].shape == (8, *FRAME)
    sampler = SequenceSampler(video, batch_size=1, length=8, seed=0, stack=4)
    before = CompressedArray.blocks_decoded
    gather(video.default, sampler.sample())
    # a window of 8 steps with 4 stacked frames touches at most 2 GOPs of 16: each decoded once
    assert CompressedArray.blocks_decoded - before <= 2
