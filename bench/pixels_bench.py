"""Pixel replay: bytes per Atari transition and compressed append rate, on real frames (ale-py).

    python bench/pixels_bench.py            # Pong, Breakout, MsPacman: ~50k frames each (~2 min each)
    python bench/pixels_bench.py --quick    # 3k frames each
    python bench/pixels_bench.py --at 200000 --games Pong   # also a measured 200k-transition store

Each game is played by a random policy (``ALE/<Game>-v5``, grayscale, frameskip 4), frames
resized to 84x84 (nearest neighbour). The store holds one frame per record (``frame``
zstd-compressed, ``action``, ``reward``, ``terminated``, ``truncated``): a transition's
stacked ``obs``/``next_obs`` are rebuilt from the stream at read time, so each frame is
stored once. The baseline is what SB3's ReplayBuffer or a TorchRL ``LazyMemmapStorage``
holds for the same transition: stacked uint8 ``obs`` + ``next_obs``, 4x84x84x2 bytes.
Printed per game: stored bytes per transition (frame column; live data; the store on disk, which
also holds fragments compacted away and not yet reclaimed),
the ratio to the baseline, frames/s appended by one writer (compression included, a durable
commit every 10k frames) and the 1M-transition extrapolation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from replaystore.loaders import UniformSampler, gather
from replaystore.schemas import Dense, Schema
from replaystore.store import open_store

SIZE, STACK = 84, 4
BASELINE = STACK * SIZE * SIZE * 2  # stacked uint8 obs + next_obs per transition: 56,448 bytes
COMMIT_EVERY, APPEND_ROWS = 10_000, 1_000
INDEX_BYTES = 4 + 8 + 1  # per record: _stream, _step, _reset


def frames_schema(codec: str | None = "zstd") -> Schema:
    """One Atari frame per record, stored once (the stacks are rebuilt at read time)."""
    return Schema("atari_frames", [
        Dense("frame", np.uint8, (SIZE, SIZE), codec=codec),
        Dense("action", np.int64),
        Dense("reward", np.float32),
        Dense("terminated", np.bool_),
        Dense("truncated", np.bool_),
    ])


def record(game: str, frames: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``frames`` steps of ``game`` under a random policy: per record the frame seen and the step taken.

    A record's ``frame`` is the observation the action was taken in; an episode's final
    observation is a record of its own with action 0 and ``terminated``/``truncated`` set.
    """
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    env = gymnasium.make(f"ALE/{game}-v5", obs_type="grayscale")
    rows, cols = np.arange(SIZE) * 210 // SIZE, np.arange(SIZE) * 160 // SIZE
    rng = np.random.default_rng(seed)
    out = {"frame": np.empty((frames, SIZE, SIZE), np.uint8), "action": np.zeros(frames, np.int64),
           "reward": np.zeros(frames, np.float32), "terminated": np.zeros(frames, bool),
           "truncated": np.zeros(frames, bool)}
    obs, _ = env.reset(seed=seed)
    i = 0
    while i < frames:
        out["frame"][i] = obs[rows][:, cols]
        a = int(rng.integers(env.action_space.n))
        obs, r, term, trunc, _ = env.step(a)
        out["action"][i], out["reward"][i] = a, r
        i += 1
        if (term or trunc) and i < frames:  # the final observation, then a new episode
            out["frame"][i] = obs[rows][:, cols]
            out["terminated"][i], out["truncated"][i] = term, trunc
            i += 1
            obs, _ = env.reset()
    env.close()
    return out


def store_frames(path: str, data: dict[str, np.ndarray], codec: str | None = "zstd") -> float:
    """Append ``data`` with one writer (commit every :data:`COMMIT_EVERY`); the frames/s it took."""
    n = len(data["frame"])
    st = open_store(path, frames_schema(codec), mode="w")
    t0 = time.perf_counter()
    with st.writer() as w:
        for lo in range(0, n, APPEND_ROWS):
            w.append({k: v[lo:lo + APPEND_ROWS] for k, v in data.items()}, stream=0)
            if (lo + APPEND_ROWS) % COMMIT_EVERY == 0:
                w.commit()
    return n / (time.perf_counter() - t0)


def sizes(path: str) -> dict[str, Any]:
    """Stored bytes per record: the frame column; live data (all columns and the index arrays); the store
    on disk (allocated: also fragments compacted away and not reclaimed yet, and the log)."""
    st = open_store(path, mode="r")
    info = st.info()
    cols = next(iter(info["tables"].values()))["columns"]
    n = len(st)
    live = sum(c["stored"] for c in cols.values()) / n + INDEX_BYTES
    return {"records": n, "frame": cols["frame"]["stored"] / n, "live": live, "disk": info["bytes"] / n}


def sampling_figures(path: str, quick: bool) -> dict[str, float]:
    """Minibatches of 32 stacked transitions (``UniformSampler(stack=4)`` + gather, in-process) per second
    from the compressed store at ``path``; bench/pixels_sample_bench.py compares the raw layout with TorchRL."""
    st = open_store(path, mode="r")
    sampler = UniformSampler(st, batch_size=32, stack=4, seed=0)
    gather(st.default, sampler.sample())  # warm: the frame index and the first reads
    n = 30 if quick else 200
    t0 = time.perf_counter()
    for _ in range(n):
        gather(st.default, sampler.sample())
    return {"stack4 batches/s": n / (time.perf_counter() - t0)}


def tile(data: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """``data`` repeated to ``n`` records (for the measured large store: the same frames again)."""
    reps = -(-n // len(data["frame"]))
    return {k: np.concatenate([v] * reps)[:n] for k, v in data.items()}


def run(games: list[str], frames: int, at: int | None, codec: str) -> None:
    """Record, store and print the table."""
    print(f"baseline (SB3 / TorchRL LazyMemmapStorage, stacked uint8 obs+next_obs): {BASELINE:,} bytes/transition")
    print(f"codec {codec}; one frame per record; note: timings on a shared machine are noisy\n")
    head = (f"{'game':10s} {'frames':>8s} {'frame B/tr':>10s} {'live B/tr':>10s} {'ratio':>8s} {'disk B/tr':>10s} "
            f"{'append fr/s':>11s} {'1M: live':>10s} {'1M: baseline':>12s}")
    print(head)
    root = tempfile.mkdtemp(prefix="pixels-bench-")
    try:
        for game in games:
            t0 = time.perf_counter()
            data = record(game, frames)
            rec_s = time.perf_counter() - t0
            path = os.path.join(root, game)
            fps = store_frames(path, data, codec)
            s = sizes(path)
            extra = sampling_figures(path, frames < 10_000)
            print(f"{game:10s} {s['records']:8d} {s['frame']:10.1f} {s['live']:10.1f} {BASELINE / s['live']:7.1f}x "
                  f"{s['disk']:10.1f} {fps:11,.0f} {s['live'] * 1e6 / 2**30:8.2f} GiB "
                  f"{BASELINE * 1e6 / 2**30:9.1f} GiB"
                  + "".join(f"  {k} {v:,.1f}" for k, v in extra.items())
                  + f"   (recorded at {len(data['frame']) / rec_s:,.0f} frames/s)", flush=True)
            if at:
                big = os.path.join(root, f"{game}-{at}")
                fps = store_frames(big, tile(data, at), codec)
                s = sizes(big)
                print(f"{game + '@' + str(at):10s} {s['records']:8d} {s['frame']:10.1f} {s['live']:10.1f} "
                      f"{BASELINE / s['live']:7.1f}x {s['disk']:10.1f} {fps:11,.0f}   measured: "
                      f"{s['live'] * s['records'] / 2**20:,.0f} MiB live, {s['disk'] * s['records'] / 2**20:,.0f} MiB "
                      f"on disk vs {BASELINE * s['records'] / 2**20:,.0f} MiB baseline "
                      "(frames repeated from the recording)", flush=True)
                shutil.rmtree(big)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3k frames per game")
    p.add_argument("--frames", type=int, default=50_000)
    p.add_argument("--games", nargs="+", default=["Pong", "Breakout", "MsPacman"])
    p.add_argument("--at", type=int, default=None, help="also store this many transitions and measure it")
    p.add_argument("--codec", default="zstd:3")
    a = p.parse_args(argv)
    run(a.games, 3_000 if a.quick else a.frames, a.at, a.codec)


if __name__ == "__main__":
    main()
