"""Video-coded frame fields: random access from a store's GOP blocks vs one MP4 file, and ffv1 vs PNG.

    python bench/video_bench.py            # 3,000 frames (a few minutes on 2 cores: AV1 encoding)
    python bench/video_bench.py --quick    # 1,000 frames

Frames are RGB ALE Pong frames (210x160x3, gymnasium + ale-py, random policy; without ale-py,
smooth random frames).

(a) ours: a store with ``Dense("frame", np.uint8, (210, 160, 3), codec="video:av1:crf=30:gop=16")``
    (one GOP per block; a read decodes a GOP up to the last frame it wants and converts only the
    frames wanted). The peer: the same frames in one MP4 file written by PyAV with the same
    encoder, CRF, preset and GOP (SVT-AV1, keyframe every 16 frames, no scene cuts), read the way
    LeRobot's PyAV video backend reads it: open the file, seek to the keyframe at or before the
    first timestamp, decode to the last one converting each decoded frame to RGB, keep the
    frames at the timestamps. Both decoders are dav1d with one thread. Measured: random
    single-frame latency (p50, p99) and samples/s; 8-frame windows (consecutive frames at a
    random start) per second; bytes (the store's directory vs the MP4 file). Targets: >= 2.5x
    the samples/s at <= 1.05x the bytes.
(b) the lossless choice (``video:h264_lossless:gop=16``: x264 at qp 0, 4:4:4) vs one PNG per
    frame (Pillow, default compression): bytes, and decode speed (every frame in order,
    frames/s, best of a few interleaved runs). Targets: <= 0.5x the bytes at >= 3x the decode
    speed. ``video:ffv1`` (intra-only) is measured too, as information. Both read back
    bit-exact (checked).

Timing: ours and the peer alternate sample by sample (the same random rows), so load on a
shared machine falls on both alike.
"""

from __future__ import annotations

import io
import os
import sys
import time
from fractions import Fraction
from typing import Any

import numpy as np
from benchkit import Table, main

from replaystore.schemas import Dense, Schema
from replaystore.store import open_store

H, W = 210, 160
GOP, CRF, PRESET, FPS = 16, 30, "8", 30
WINDOW = 8
SIZES = ({"n": 3_000, "samples": 400, "png_reps": 3}, {"n": 1_000, "samples": 150, "png_reps": 2})


def pong_rgb(n: int) -> np.ndarray:
    """``n`` RGB Pong frames from a random policy (smooth random frames without ale-py)."""
    try:
        import ale_py
        import gymnasium as gym
    except ImportError:
        print("# ale-py not installed: smooth random frames", file=sys.stderr)
        rng = np.random.default_rng(0)
        base = rng.integers(0, 256, (H, W, 3))
        return np.stack([np.roll(base, t, axis=1) for t in range(n)]).astype(np.uint8)
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", obs_type="rgb")
    out = np.empty((n, H, W, 3), np.uint8)
    obs, _ = env.reset(seed=0)
    for i in range(n):
        out[i] = obs
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return out


def write_mp4(path: str, frames: np.ndarray) -> None:
    """One AV1 MP4 of ``frames``: the store's encoder settings (SVT-AV1, CRF, preset, GOP, no scene cuts)."""
    import av

    from replaystore.video import kept_scheduling

    with kept_scheduling(), av.open(path, "w") as out:  # (SVT-AV1 as root would leave the bench real-time)
        s = out.add_stream("libsvtav1", rate=FPS)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.gop_size = GOP
        s.codec_context.options = {"crf": str(CRF), "preset": PRESET,
                                   "svtav1-params": f"keyint={GOP}:scd=0:lp=1"}
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            out.mux(s.encode(vf))
        out.mux(s.encode(None))


def lerobot_decode(path: str, indices: list[int]) -> np.ndarray:
    """Frames ``indices`` of the MP4 as LeRobot's PyAV backend gets them: open, seek to the keyframe
    at or before the first timestamp, decode to the last one (each decoded frame converted to RGB)."""
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        tb = s.time_base
        wanted = [round(Fraction(i, FPS) / tb) for i in indices]
        c.seek(wanted[0], stream=s, backward=True, any_frame=False)
        got: dict[int, np.ndarray] = {}
        for frame in c.decode(s):
            rgb = frame.to_ndarray(format="rgb24")  # (LeRobot converts every frame it decodes)
            if frame.pts in wanted:
                got[frame.pts] = rgb
            if frame.pts >= wanted[-1]:
                break
    return np.stack([got[t] for t in wanted])


def _pcts(times: list[float]) -> tuple[float, float, float]:
    t = np.asarray(times) * 1e3
    return float(np.percentile(t, 50)), float(np.percentile(t, 99)), float(len(t) / t.sum() * 1e3)


def body(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    n, samples = cfg["n"], cfg["samples"]
    t0 = time.perf_counter()
    frames = pong_rgb(n)
    print(f"# recorded {n:,} frames in {time.perf_counter() - t0:.1f} s", flush=True)

    # (a) AV1: our GOP blocks vs one MP4 ------------------------------------------------------------
    codec = f"video:av1:crf={CRF}:gop={GOP}:preset={PRESET}"
    st = open_store(f"{tmp}/av1", Schema("pong", [Dense("frame", np.uint8, (H, W, 3), codec=codec)]))
    t0 = time.perf_counter()
    with st.writer() as w:
        w.append({"frame": frames})
        w.commit()
    enc_ours = time.perf_counter() - t0
    mp4 = f"{tmp}/pong.mp4"
    t0 = time.perf_counter()
    write_mp4(mp4, frames)
    enc_mp4 = time.perf_counter() - t0
    print(f"# encoded: store {n / enc_ours:,.0f} frames/s, mp4 {n / enc_mp4:,.0f} frames/s", flush=True)
    st.close()
    st = open_store(f"{tmp}/av1", mode="r")
    ids = st.row_ids()
    # both give the same frames up to the encoders' runs: ours are the store's own decode
    check = [0, GOP - 1, n // 2, n - 1]
    ours_frames = st.read(ids[check], columns=["frame"])["frame"]
    theirs_frames = np.concatenate([lerobot_decode(mp4, [i]) for i in check])
    err = float(np.abs(ours_frames.astype(int) - frames[check]).mean())
    err_mp4 = float(np.abs(theirs_frames.astype(int) - frames[check]).mean())
    print(f"# mean abs error vs the input: store {err:.2f}, mp4 {err_mp4:.2f}", flush=True)
    info = st.info()
    bytes_ours, bytes_mp4 = info["tables"]["records"]["columns"]["frame"]["stored"], os.path.getsize(mp4)
    out.add(f"bytes of {n:,} AV1 frames (crf {CRF}, gop {GOP})", bytes_ours, bytes_mp4, "bytes", ("<=", 1.05),
            f"the field's shards vs the MP4 file; whole store {info['apparent_bytes']:,}")

    rng = np.random.default_rng(0)
    single = rng.integers(0, n, samples)
    starts = rng.integers(0, n - WINDOW + 1, samples)
    for warm in range(3):  # (decoders and files warm)
        st.read(ids[[int(single[warm])]], columns=["frame"])
        lerobot_decode(mp4, [int(single[warm])])
    t_ours: list[float] = []
    t_mp4: list[float] = []
    for i in single.tolist():
        t = time.perf_counter()
        st.read(ids[[i]], columns=["frame"])
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        lerobot_decode(mp4, [i])
        t_mp4.append(time.perf_counter() - t)
    (p50, p99, rate), (q50, q99, qrate) = _pcts(t_ours), _pcts(t_mp4)
    out.add("random single frame p50 latency", p50, q50, "ms")
    out.add("random single frame p99 latency", p99, q99, "ms")
    out.add("random single frames", rate, qrate, "samples/s", 2.5)
    w_ours: list[float] = []
    w_mp4: list[float] = []
    for s in starts.tolist():
        t = time.perf_counter()
        got = st.read(ids[s:s + WINDOW], columns=["frame"])["frame"]
        w_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        lerobot_decode(mp4, list(range(s, s + WINDOW)))
        w_mp4.append(time.perf_counter() - t)
        assert got.shape == (WINDOW, H, W, 3)
    (p50, p99, rate), (q50, q99, qrate) = _pcts(w_ours), _pcts(w_mp4)
    out.add(f"{WINDOW}-frame windows", rate, qrate, "samples/s", 2.5, f"p50 {p50:.2f} vs {q50:.2f} ms")
    st.close()

    # (b) lossless: GOP blocks vs a PNG per frame ---------------------------------------------------
    from PIL import Image

    pngs = []
    for f in frames:
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    for name, target in (("h264_lossless", True), ("ffv1", False)):
        codec = f"video:{name}:gop={GOP}"
        ff = open_store(f"{tmp}/{name}", Schema("pong", [Dense("frame", np.uint8, (H, W, 3), codec=codec)]))
        with ff.writer() as w:
            w.append({"frame": frames})
            w.commit()
        stored = ff.info()["tables"]["records"]["columns"]["frame"]["stored"]
        ff.close()
        ff = open_store(f"{tmp}/{name}", mode="r")
        out.add(f"bytes of {n:,} frames, {codec}", stored, sum(map(len, pngs)), "bytes",
                ("<=", 0.5) if target else None, "vs a PNG per frame")
        ids = ff.row_ids()
        assert np.array_equal(ff.read(ids, columns=["frame"])["frame"], frames), f"{name} is not bit-exact"
        best_ours = best_png = 0.0
        for _ in range(cfg["png_reps"]):
            t = time.perf_counter()
            ff.read(ids, columns=["frame"])
            best_ours = max(best_ours, n / (time.perf_counter() - t))
            t = time.perf_counter()
            for b in pngs:
                np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))
            best_png = max(best_png, n / (time.perf_counter() - t))
        out.add(f"decode every frame in order, {codec}", best_ours, best_png, "frames/s", 3.0 if target else None,
                "vs PNG (Pillow)")
        ff.close()


if __name__ == "__main__":
    sys.exit(main("video", __doc__ or "", None, SIZES, Table("peer", "peer"), body))
