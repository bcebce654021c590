"""SequenceSampler on a growing store: sample() right after another writer's commit, 10M vs 100k.

    python bench/sequence_live_bench.py [--big 10000000] [--small 100000] [--reps 9] [--dir DIR]

The stores are loader_bench.py's section-4 transitions stores (16 streams, 1M-record commits),
built once under ``--dir`` and reused (each run adds ``reps`` commits to them). Before every
timed minibatch a second writer commits 1,000 records; four kinds of commit:

- ``new stream``: the records start a new stream (loader_bench.py section 4b);
- ``append``: they continue one of the 16 existing streams (round robin);
- ``capped``: as ``append`` on the same records in a store created with ``capacity`` = its
  size, so each commit also evicts the 1,000 oldest records;
- ``episodes``: on a store of 200-step episodes, each its own stream (50k streams at 10M),
  the commit holds 5 new episodes.

Printed per kind: median ``refresh()`` and ``sample()`` (which brings the sampler's windows up
to date; ``refresh()`` updates the stream index) in microseconds, at both sizes (taking turns),
and the ratio big / small of refresh + sample.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from replaystore.loaders import SequenceSampler
from replaystore.schemas import transitions
from replaystore.store import open_store

LIVE_COMMIT, SLICE, SLICES = 1_000, 16, 16  # as loader_bench.py
KINDS = ("new stream", "append", "capped", "episodes")
EPISODE = 200
STEPS = np.arange(EPISODE, dtype=np.int64)


def build(path: str, records: int, capacity: int | None) -> float:
    """loader_bench.build_transitions, with a capacity; seconds taken."""
    per_commit = min(records, 1_000_000)
    per_stream = per_commit // 16
    b = transitions_batch(per_stream)
    t0 = time.perf_counter()
    with open_store(path, transitions(4, actions=3), mode="w", capacity=capacity).writer() as w:
        for _ in range(records // per_commit):
            for s in range(16):
                w.append(b, stream=s, reset=True)
            w.commit()
    return time.perf_counter() - t0


def build_episodes(path: str, records: int) -> float:
    """Records as ``EPISODE``-step episodes, one stream each, 1M-record commits; seconds taken."""
    per_commit = min(records, 1_000_000)
    b = transitions_batch(EPISODE)
    t0 = time.perf_counter()
    with open_store(path, transitions(4, actions=3), mode="w").writer() as w:
        for c in range(records // per_commit):
            for key in range(c * (per_commit // EPISODE), (c + 1) * (per_commit // EPISODE)):
                w.append(b, stream=key, step=STEPS, reset=STEPS == 0)
            w.commit()
    return time.perf_counter() - t0


def transitions_batch(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"obs": rng.standard_normal((n, 4), dtype=np.float32), "action": rng.integers(0, 3, n).astype(np.int64),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": rng.standard_normal((n, 4), dtype=np.float32), "terminated": np.zeros(n, bool)}


def live(paths: list[str], kind: str, reps: int) -> list[tuple[float, float]]:
    """Per store, median seconds of ``(refresh, sample)`` right after each of ``reps`` commits;
    the stores take turns (one commit + minibatch each), so machine noise hits them alike."""
    b, eb = transitions_batch(LIVE_COMMIT), transitions_batch(EPISODE)
    runs = []
    for path in paths:
        st = open_store(path, mode="r")
        s = SequenceSampler(st, length=SLICE, burn_in=0, batch_size=SLICES, seed=0)
        s.sample()
        runs.append((st, s, open_store(path, mode="a").writer(), []))
    for i in range(reps):
        for st, s, w, times in runs:
            if kind == "episodes":  # keys never used before: past every key of earlier runs
                for j in range(LIVE_COMMIT // EPISODE):
                    w.append(eb, stream=10**9 + len(st) + j, step=STEPS, reset=STEPS == 0)
            else:
                w.append(b, stream=10_000 + len(st) if kind == "new stream" else i % 16, reset=kind == "new stream")
            w.commit()
            t0 = time.perf_counter()
            st.refresh()
            t1 = time.perf_counter()
            s.sample()
            times.append((t1 - t0, time.perf_counter() - t1))
    for _, _, w, _ in runs:
        w.close()
    return [(float(np.median([t[0] for t in times])), float(np.median([t[1] for t in times])))
            for _, _, _, times in runs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "replaystore_seqlive"))
    args = ap.parse_args()
    paths = {}
    for n in (args.small, args.big):
        for kind in ("append", "capped", "episodes"):
            paths[n, kind] = path = os.path.join(args.dir, f"{kind}{n}")
            if not os.path.exists(path):
                secs = (build_episodes(path, n) if kind == "episodes"
                        else build(path, n, n if kind == "capped" else None))
                print(f"  .. built {path}: {secs:.1f} s", flush=True)
    paths[args.small, "new stream"] = paths[args.small, "append"]
    paths[args.big, "new stream"] = paths[args.big, "append"]
    print(f"{'commit kind':<12} {'refresh big/small us':>22} {'sample big/small us':>24} {'ratio':>7}")
    for kind in KINDS:
        (rs, ss), (rb, sb) = live([paths[args.small, kind], paths[args.big, kind]], kind, args.reps)
        print(f"{kind:<12} {rb * 1e6:>10,.0f} / {rs * 1e6:>9,.0f} {sb * 1e6:>12,.0f} / {ss * 1e6:>9,.0f} "
              f"{(rb + sb) / (rs + ss):>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
