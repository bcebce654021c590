"""SequenceSampler on a growing store: sample() right after another writer's commit, 10M vs 100k.

    python bench/sequence_live_bench.py [--big 10000000] [--small 100000] [--reps 9] [--dir DIR]

The stores are loader_bench.py's section-4 transitions stores (16 streams, 1M-record commits),
built once under ``--dir`` and reused (each run adds ``reps`` commits to them). Before every timed minibatch a second writer commits
1,000 records; three kinds of commit:

- ``new stream``: the records start a new stream (loader_bench.py section 4b);
- ``append``: they continue one of the 16 existing streams (round robin);
- ``capped``: as ``append`` on the same records in a store created with ``capacity`` = its
  size, so each commit also evicts the 1,000 oldest records.

Printed per kind: median ``refresh()`` and ``sample()`` (which brings the stream index and the
sampler's windows up to date) in microseconds, at both sizes, and the ratio big / small.
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
KINDS = ("new stream", "append", "capped")


def build(path: str, records: int, capacity: int | None) -> float:
    """loader_bench.build_transitions, with a capacity; seconds taken."""
    per_commit = min(records, 1_000_000)
    per_stream = per_commit // 16
    rng = np.random.default_rng(2)
    b = {"obs": rng.standard_normal((per_stream, 4), dtype=np.float32),
         "action": rng.integers(0, 3, per_stream).astype(np.int64),
         "reward": rng.standard_normal(per_stream, dtype=np.float32),
         "next_obs": rng.standard_normal((per_stream, 4), dtype=np.float32),
         "terminated": rng.random(per_stream) < 0.01}
    t0 = time.perf_counter()
    with open_store(path, transitions(4, actions=3), mode="w", capacity=capacity).writer() as w:
        for _ in range(records // per_commit):
            for s in range(16):
                w.append(b, stream=s, reset=True)
            w.commit()
    return time.perf_counter() - t0


def live(path: str, kind: str, reps: int) -> tuple[float, float]:
    """Median seconds of ``(refresh, sample)`` right after each of ``reps`` commits."""
    st = open_store(path, mode="r")
    s = SequenceSampler(st, length=SLICE, burn_in=0, batch_size=SLICES, seed=0)
    s.sample()
    rng = np.random.default_rng(7)
    b = {"obs": rng.standard_normal((LIVE_COMMIT, 4), dtype=np.float32),
         "action": rng.integers(0, 3, LIVE_COMMIT).astype(np.int64),
         "reward": rng.standard_normal(LIVE_COMMIT, dtype=np.float32),
         "next_obs": rng.standard_normal((LIVE_COMMIT, 4), dtype=np.float32),
         "terminated": np.zeros(LIVE_COMMIT, bool)}
    times = []
    with open_store(path, mode="a").writer() as w:
        for i in range(reps):
            w.append(b, stream=10_000 + i if kind == "new stream" else i % 16, reset=kind == "new stream")
            w.commit()
            t0 = time.perf_counter()
            st.refresh()
            t1 = time.perf_counter()
            s.sample()
            times.append((t1 - t0, time.perf_counter() - t1))
    return tuple(float(np.median([t[j] for t in times])) for j in range(2))  # type: ignore[return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "replaystore_seqlive"))
    args = ap.parse_args()
    paths = {}
    for n in (args.small, args.big):
        for capped in (False, True):
            paths[n, capped] = path = os.path.join(args.dir, f"tr{n}{'c' if capped else ''}")
            if not os.path.exists(path):
                secs = build(path, n, n if capped else None)
                print(f"  .. built {path}: {secs:.1f} s", flush=True)
    print(f"{'commit kind':<12} {'refresh big/small us':>22} {'sample big/small us':>24} {'ratio':>7}")
    for kind in KINDS:
        rs, ss = live(paths[args.small, kind == "capped"], kind, args.reps)
        rb, sb = live(paths[args.big, kind == "capped"], kind, args.reps)
        print(f"{kind:<12} {rb * 1e6:>10,.0f} / {rs * 1e6:>9,.0f} {sb * 1e6:>12,.0f} / {ss * 1e6:>9,.0f} "
              f"{sb / ss:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
