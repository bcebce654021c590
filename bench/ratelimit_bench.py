"""Rate limiter overhead: minibatches of 256 from a sampler whose ``RateLimiter`` always admits, against none.

One local store of transitions; ``UniformSampler.sample()`` alone (the draw, where the limiter's
cost shows most) and through ``make_loader`` (draw, gather, tensors), each with no limiter, with a
limiter syncing its count after every minibatch (``sync_every_s=0``: a state-slot write and a
listing per minibatch) and at the default cadence (``sync_every_s=0.1``). Best of interleaved windows (benchkit).

    python bench/ratelimit_bench.py            # 200k transitions
    python bench/ratelimit_bench.py --quick    # 20k transitions (< 1 minute)
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
from typing import Any

import benchkit
import numpy as np

from replaystore.loaders import RateLimiter, UniformSampler, make_loader
from replaystore.schemas import transitions
from replaystore.store import open_store

BATCH = 256
SIZES = ({"records": 200_000, "warm_s": 0.5, "rep_s": 1.5, "reps": 3},
         {"records": 20_000, "warm_s": 0.2, "rep_s": 0.5, "reps": 2})


def body(tmp: str, cfg: dict[str, Any], out: benchkit.Table) -> None:
    """Fill a store, then time minibatches with and without a limiter that always admits."""
    rng = np.random.default_rng(0)
    n = cfg["records"]
    st = open_store(f"{tmp}/rl", transitions(obs_shape=8), mode="w+")
    with st.writer() as w:
        w.append({"obs": rng.random((n, 8), np.float32), "action": rng.integers(0, 4, n),
                  "reward": rng.random(n, np.float32), "next_obs": rng.random((n, 8), np.float32),
                  "terminated": rng.random(n) < 0.01}, stream=0)
        w.commit()

    def limiter(every_s: float, name: str) -> RateLimiter:  # 1e9 samples per insert: never waits
        return RateLimiter(1e9, 1, 1e10, name=name, sync_every_s=every_s)

    samplers = {"none": UniformSampler(st, BATCH, name="none"),
                "0": UniformSampler(st, BATCH, name="s0", rate_limiter=limiter(0.0, "s0")),
                "0.1": UniformSampler(st, BATCH, name="s01", rate_limiter=limiter(0.1, "s01"))}
    draws = benchkit.interleaved({k: (s.sample, 1) for k, s in samplers.items()}, cfg)
    loaders = {k: iter(make_loader(st, UniformSampler(st, BATCH, name=f"l{k}", rate_limiter=s.rate_limit
                                                      and s.rate_limit.limiter)))
               for k, s in samplers.items()}
    full = benchkit.interleaved({k: ((lambda it=it: next(it)), 1) for k, it in loaders.items()}, cfg)
    for k in ("0", "0.1"):
        out.add(f"sample() of {BATCH}, limiter sync_every_s={k}", draws[k], draws["none"], "batches/s",
                note=f"{1e6 / draws[k] - 1e6 / draws['none']:.0f} us added per minibatch")
        out.add(f"make_loader minibatch of {BATCH}, limiter sync_every_s={k}", full[k], full["none"],
                "batches/s", note=f"{1e6 / full[k] - 1e6 / full['none']:.0f} us added per minibatch")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (< 1 minute)")
    ap.add_argument("--dir", default=None, help="where to put the temporary store (default: system temp)")
    args = ap.parse_args(argv)
    cfg = SIZES[1] if args.quick else SIZES[0]
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"numpy {np.__version__}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    out = benchkit.Table("no limiter", "no limiter")
    tmp = tempfile.mkdtemp(prefix="replaystore-ratelimit-bench-", dir=args.dir)
    try:
        body(tmp, cfg, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
