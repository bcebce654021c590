"""What the HTML report costs: ``build_report`` time and file size on a 1M-step transitions store and a
100k-frame Pong ``frames`` store.

    python bench/report_bench.py                      # 1M transitions (64 streams), 100k Pong frames
    python bench/report_bench.py --quick              # 100k transitions, 10k Pong frames
    python bench/report_bench.py --cache ~/.cache/rs  # keep the built stores there for the next run

The stores:

- **transitions**: ``transitions(8, actions=4)``, 64 streams of episodes 20-400 steps long (uniform), each
  but the last of a stream ending ``terminated``; a small reward every step and a terminal reward whose mean
  rises over the run (a learning curve); written in 20 commits of one writer (every stream a share of each).
- **Pong frames**: Pong through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4, random
  policy) in 8 environments under ``FrameStackObservation(4)``, recorded with
  ``RecordVectorEpisodes(frame_stack=4)`` (one zstd frame per record), episodes cut at 1,000 steps; a
  ``PrioritizedSampler(stack=4)`` state saved on it, so the report's sampler section has priorities to show.

Building them takes minutes (the Pong recording most of it): ``--cache DIR`` keeps them (a store is reused
when its ``<name>.done`` marker is there); without it they go to a temporary directory removed at the end.

Printed per store: ``build_report``'s wall time (the best of ``--reps``; each run writes the whole file) and
the file's size, against the targets (<= 10 s, <= 5 MB: ratio <= 1 meets them), with the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from benchkit import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support.reportstores

TIME_TARGET_S = 10.0
SIZE_TARGET_MB = 5.0
STREAMS = 64
COMMITS = 20
OBS = 8
PONG_ENVS = 8
PONG_EPISODE = 1_000


def build_transitions(url: str, records: int) -> None:
    """A ``transitions(8, actions=4)`` store of ``records`` steps over :data:`STREAMS` streams (see the module)."""
    from replaystore.schemas import transitions
    from replaystore.store import open_store

    rng = np.random.default_rng(0)
    per_stream = records // STREAMS
    st = open_store(url, transitions(OBS, actions=4, metadata={"env_id": "Synthetic-v0"}), mode="w")
    streams = []
    for _ in range(STREAMS):
        lengths = rng.integers(20, 401, per_stream // 20 + 1)
        ends = np.cumsum(lengths)
        ends = ends[ends <= per_stream]
        reset = np.zeros(per_stream, dtype=bool)
        reset[np.r_[0, ends[:-1]]] = True
        terminated = np.zeros(per_stream, dtype=bool)
        terminated[ends - 1] = True  # the last episode of a stream stays open
        progress = np.arange(per_stream) / per_stream
        reward = (0.01 * rng.standard_normal(per_stream)).astype(np.float32)
        reward[terminated] += rng.normal(-1 + 3 * progress[terminated], 1.0).astype(np.float32)
        obs = rng.standard_normal((per_stream + 1, OBS), dtype=np.float32) * np.linspace(0.1, 10, OBS, dtype=np.float32)
        streams.append({"obs": obs[:-1], "next_obs": obs[1:], "action": rng.integers(0, 4, per_stream),
                        "reward": reward, "terminated": terminated, "reset": reset})
    bounds = np.linspace(0, per_stream, COMMITS + 1).astype(int)
    with st.writer() as w:
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            for s, data in enumerate(streams):
                w.append({k: v[lo:hi] for k, v in data.items() if k != "reset"}, stream=s,
                         reset=data["reset"][lo:hi])
            w.commit(metadata={"records": int(hi) * STREAMS})
    assert len(st) == per_stream * STREAMS
    st.close()


def build_pong(root: str, frames: int) -> str:
    """A Pong ``frames`` store of about ``frames`` records (tests/support/reportstores.py's ``pong_store``)."""
    from support.reportstores import pong_store

    return pong_store(root, envs=PONG_ENVS, steps=frames // PONG_ENVS, episode_steps=PONG_EPISODE, sampler=True)


def cached(cache: str, name: str, build: Callable[[str], str]) -> tuple[str, float | None]:
    """The store ``name`` under ``cache``: built by ``build(dir)`` (returning its url) unless its marker is there.

    Returns its url and the build's seconds (None when reused).
    """
    where = os.path.join(cache, name)
    marker = os.path.join(cache, f"{name}.done")
    if os.path.exists(marker):
        return Path(marker).read_text().strip(), None
    shutil.rmtree(where, ignore_errors=True)
    t0 = time.perf_counter()
    url = build(where)
    took = time.perf_counter() - t0
    Path(marker).write_text(url)
    return url, took


def time_report(url: str, out: str, reps: int) -> tuple[float, int]:
    """The best of ``reps`` ``build_report`` runs (seconds) and the file's size (bytes)."""
    from replaystore.report import build_report
    from replaystore.store import open_store

    best = float("inf")
    for _ in range(reps):
        if os.path.exists(out):
            os.remove(out)
        with open_store(url, mode="r") as st:
            t0 = time.perf_counter()
            build_report(st, out)
            best = min(best, time.perf_counter() - t0)
    return best, os.path.getsize(out)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    """Build (or reuse) the stores, time their reports, print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k transitions, 10k Pong frames")
    ap.add_argument("--cache", default=None, help="keep the built stores in DIR (default: a temporary directory)")
    ap.add_argument("--reps", type=int, default=None, help="report builds per store, best kept (default 3; 1 quick)")
    args = ap.parse_args()
    steps = 100_000 if args.quick else 1_000_000
    frames = 10_000 if args.quick else 100_000
    reps = args.reps or (1 if args.quick else 3)
    cache = os.path.abspath(os.path.expanduser(args.cache)) if args.cache else tempfile.mkdtemp(prefix="report-bench-")
    os.makedirs(cache, exist_ok=True)
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus; load average {_load()}; "
          f"stores in {cache}", flush=True)
    out = Table("limit", "limit")
    t_start = time.perf_counter()
    try:
        for name, build, what in (
            (f"transitions-{steps}", lambda d: (build_transitions(d, steps), d)[1],
             f"{steps:,} transitions, {STREAMS} streams"),
            (f"pong-{frames}", lambda d: build_pong(d, frames), f"Pong frames store, {frames:,} frames"),
        ):
            url, took = cached(cache, name, build)
            how = "reused" if took is None else f"built in {took:.0f} s"
            print(f"  .. {what}: {how} ({url})", flush=True)
            html = os.path.join(cache, f"{name}.html")
            seconds, size = time_report(url, html, reps)
            note = f"best of {reps}; load {_load()}"
            out.add(f"build_report, {what}", seconds, TIME_TARGET_S, "s", ("<=", 1.0), note)
            out.add(f"report size, {what}", size / 1e6, SIZE_TARGET_MB, "MB", ("<=", 1.0), html)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"# {time.perf_counter() - t_start:.0f} s; load average now {_load()}")
    out.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
