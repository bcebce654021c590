"""Pixel sampling benchmark: stacked transitions built at read time from frames stored once, vs TorchRL.

    python bench/pixels_sample_bench.py            # full sizes (a few minutes on 2 cores)
    python bench/pixels_sample_bench.py --quick    # smaller sizes (< 1 minute)

Frames are 84x84 uint8 grayscale ALE Pong frames (gymnasium + ale-py, random policy,
downscaled by nearest rows/columns; a recording of up to RECORD frames, tiled to the
store's size: the content does not change the cost of uncompressed reads; without
ale-py, random frames). Episodes of EPISODE steps, each closed by its final frame.

1. ours: a ``frames((84, 84), 6, codec="zstd:3")`` store, one zstd-compressed frame per record;
   ``UniformSampler(stack=4, batch_size=32)`` ``sample()`` + ``gather`` (tensors out:
   ``obs`` and ``next_obs`` ``(32, 4, 84, 84)`` built from the stream's frames).
2. the peer: the same transitions in the uncompressed stacked layout (``obs`` and
   ``next_obs`` ``(4, 84, 84)`` per transition, what SB3's buffer or a TorchRL memmap
   holds) in ``ReplayBuffer(LazyMemmapStorage, RandomSampler(), batch_size=32).sample()``
   (better of torch's default threads and 1).
3. ours through ``make_loader(num_workers=2)`` (minibatches per second out of the
   loader's iterator) against the same in-process peer figure.

Targets: >= 0.5x the peer in-process, >= 1x with 2 workers, both ratios against the peer
figure of the same run. Timing: the best of interleaved windows after a warm-up; every
memory map faulted in first. Bytes on disk of both layouts are printed as information
(compression ratios per game are measured by bench/pixels_bench.py).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from benchkit import Table, du, interleaved, main

from replaystore.loaders import UniformSampler, gather, make_loader
from replaystore.schemas import frames
from replaystore.store import open_store

K, B, H = 4, 32, 84
EPISODE = 800
RECORD = 3_000
CODEC = "zstd:3"
SIZES = ({"n": 100_000, "warm_s": 1.0, "rep_s": 2.0, "reps": 5},
         {"n": 10_000, "warm_s": 0.3, "rep_s": 0.6, "reps": 3})


def pong_frames(n: int) -> np.ndarray:
    """Up to ``n`` 84x84 Pong frames from a random policy (random frames without ale-py)."""
    try:
        import ale_py
        import gymnasium as gym
    except ImportError:
        print("# ale-py not installed: random frames", file=sys.stderr)
        return np.random.default_rng(0).integers(0, 256, (n, H, H), dtype=np.uint8)
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", obs_type="grayscale")
    ri, ci = np.linspace(0, 209, H).astype(np.int64), np.linspace(0, 159, H).astype(np.int64)
    out = np.empty((n, H, H), np.uint8)
    obs, _ = env.reset(seed=0)
    for i in range(n):
        out[i] = obs[ri][:, ci]
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return out


def body(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer

    n = cfg["n"]
    t0 = time.perf_counter()
    pool = pong_frames(min(RECORD, n))
    print(f"# recorded {len(pool):,} frames in {time.perf_counter() - t0:.1f} s", flush=True)
    eps = -(-n // EPISODE)
    # ours: per episode EPISODE step records + 1 final frame record
    path = os.path.join(tmp, "frames")
    st = open_store(path, frames((H, H), 6, codec=CODEC), mode="w")
    rng = np.random.default_rng(1)
    at = 0
    with st.writer() as w:
        for _ in range(eps):
            idx = (at + np.arange(EPISODE + 1)) % len(pool)
            at += EPISODE + 1
            term = np.zeros(EPISODE + 1, bool)
            term[EPISODE - 1] = True
            w.append({"frame": pool[idx], "action": rng.integers(0, 6, EPISODE + 1),
                      "reward": np.zeros(EPISODE + 1, np.float32), "terminated": term,
                      "truncated": np.zeros(EPISODE + 1, bool)}, reset=True)
        w.commit()
    st = open_store(path, mode="r")
    transitions = eps * EPISODE
    # the peer: the same transitions stacked (reset padding), obs + next_obs per record
    rb = ReplayBuffer(storage=LazyMemmapStorage(transitions, scratch_dir=os.path.join(tmp, "trl")),
                      sampler=RandomSampler(), batch_size=B)
    chunk = 4_000
    all_idx = np.concatenate([(e * (EPISODE + 1) + np.arange(EPISODE + 1)) % len(pool) for e in range(eps)])
    for lo in range(0, transitions, chunk):
        hi = min(lo + chunk, transitions)
        e, t = np.divmod(np.arange(lo, hi), EPISODE)
        win = np.maximum(t[:, None] + np.arange(1 - K, 2)[None, :], 0) + (e * (EPISODE + 1))[:, None]
        stacked = pool[all_idx[win]]
        rb.extend(TensorDict({"obs": torch.from_numpy(np.ascontiguousarray(stacked[:, :K])),
                              "next_obs": torch.from_numpy(np.ascontiguousarray(stacked[:, 1:])),
                              "action": torch.from_numpy(rng.integers(0, 6, hi - lo)),
                              "reward": torch.zeros(hi - lo), "terminated": torch.from_numpy(t == EPISODE - 1),
                              "truncated": torch.zeros(hi - lo, dtype=torch.bool)}, batch_size=[hi - lo]))
    ours_b, peer_b = du(path), du(os.path.join(tmp, "trl"))
    out.add(f"bytes on disk per transition ({transitions:,} transitions)", ours_b / transitions,
            peer_b / transitions, "B", None, f"information: {CODEC} frames once vs stacked obs + next_obs "
            f"({ours_b / 2**20:,.0f} vs {peer_b / 2**20:,.0f} MiB)")
    # fault every map in, then check one batch
    rb.sample()
    for lo in range(0, len(st), 20_000):
        st.default.read(np.arange(lo, min(lo + 20_000, len(st))), columns=["frame"])
    sampler = UniformSampler(st, batch_size=B, stack=K, seed=0)
    batch = gather(st.default, sampler.sample())
    assert batch["obs"].shape == (B, K, H, H) and batch["next_obs"].shape == (B, K, H, H)

    def ours() -> Any:
        return gather(st.default, sampler.sample())

    def peer() -> Any:
        return rb.sample()

    r = interleaved({"ours": (ours, None), "peer": (peer, None), "peer1": (peer, 1)}, cfg)
    best_peer = max(r["peer"], r["peer1"])
    out.add(f"sample {B} stacked transitions (stack {K}, {H}x{H}) in-process", r["ours"], best_peer, "batches/s",
            0.5, f"peer: better of default threads ({r['peer']:,.0f}) and 1 ({r['peer1']:,.0f})")
    loader = make_loader(st, UniformSampler(st, batch_size=B, stack=K, seed=1), num_workers=2)
    it = iter(loader)
    for _ in range(20):  # warm: workers started, maps faulted
        next(it)
    rates = []
    for _ in range(cfg["reps"]):
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < cfg["rep_s"]:
            next(it)
            k += 1
        rates.append(k / (time.perf_counter() - t0))
    del it
    out.add("the same through make_loader(num_workers=2), vs the peer in-process", max(rates), best_peer,
            "batches/s", 1.0, "best of windows; 2 workers on a 2-core machine")


if __name__ == "__main__":
    sys.exit(main("pixels_sample", __doc__ or "", None, SIZES, Table("TorchRL", "torchrl"), body))
