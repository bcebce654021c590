"""N-step sampling benchmark: ``n_step=3`` against plain uniform sampling and against SB3, in one run.

    python bench/nstep_bench.py            # 1M transitions
    python bench/nstep_bench.py --quick    # 100k transitions (< 1 minute)

Store: ``transitions(4, actions=3)``, 16 streams written in 1M-record commits (1% terminal),
as ``benchkit.build_transitions`` makes it. Measured, per minibatch of 256 (``sample()`` +
``gather(table, request)``: the work a DataLoader does with ``num_workers=0``):

1. ``UniformSampler(n_step=3, gamma=0.99)`` vs plain ``UniformSampler``: target cost <= 1.5x.
2. the same vs Stable-Baselines3 ``NStepReplayBuffer(n_steps=3).sample(256)`` over the same
   transitions in RAM (16 envs of 62,500 steps for 1M): target ours >= 1x its rate.
3. prioritized and epoch with ``n_step=3`` vs without (information).

Timing as the other benches (``benchkit.interleaved``: the best of interleaved windows after a
warm-up). Needs ``stable-baselines3`` (the test extra).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from benchkit import Table, build_transitions, interleaved, transitions_records

from replaystore.loaders import EpochSampler, PrioritizedSampler, UniformSampler, gather
from replaystore.store import open_store

FULL = {"records": 1_000_000, "warm_s": 0.5, "rep_s": 1.0, "reps": 5}
QUICK = {"records": 100_000, "warm_s": 0.2, "rep_s": 0.3, "reps": 3}
STREAMS, BATCH, N, GAMMA = 16, 256, 3, 0.99


def sb3_buffer(records: int) -> Any:
    """An SB3 ``NStepReplayBuffer`` holding the records ``build_transitions`` writes (16 envs), full
    (SB3 divides ``buffer_size`` among the envs)."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import NStepReplayBuffer

    per = records // STREAMS
    b = transitions_records(np.random.default_rng(2), per)  # what build_transitions appends per stream
    buffer = NStepReplayBuffer(records, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(3),
                               device="cpu", n_envs=STREAMS, handle_timeout_termination=True, n_steps=N, gamma=GAMMA)
    for s in range(STREAMS):
        buffer.observations[:, s] = b["obs"]
        buffer.next_observations[:, s] = b["next_obs"]
        buffer.actions[:, s, 0] = b["action"]
        buffer.rewards[:, s] = b["reward"]
        buffer.dones[:, s] = b["terminated"]
    buffer.full, buffer.pos = True, 0
    return buffer


def run(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    path = os.path.join(tmp, "t")
    build_transitions(path, cfg["records"], streams=STREAMS)
    st = open_store(path, mode="r")
    table = st.default
    table.read(table.row_ids())  # fault the maps in, for both
    plain = UniformSampler(st, batch_size=BATCH, seed=0)
    nstep = UniformSampler(st, batch_size=BATCH, seed=0, n_step=N, gamma=GAMMA)
    buffer = sb3_buffer(cfg["records"])
    fns = {"plain": (lambda: gather(table, plain.sample()), None),
           "nstep": (lambda: gather(table, nstep.sample()), None),
           "sb3": (lambda: buffer.sample(BATCH), None)}
    r = interleaved(fns, cfg)
    us = {k: 1e6 / v for k, v in r.items()}
    out.add(f"uniform n_step=3 vs plain uniform, {BATCH} of {cfg['records']:,}: cost", us["nstep"], us["plain"],
            "us/batch", ("<=", 1.5))
    out.add(f"uniform n_step=3 vs SB3 NStepReplayBuffer.sample({BATCH}) in RAM: rate", r["nstep"], r["sb3"],
            "batches/s", 1.0)
    for cls in (PrioritizedSampler, EpochSampler):
        a, b = cls(st, batch_size=BATCH, seed=0), cls(st, batch_size=BATCH, seed=0, n_step=N, gamma=GAMMA)
        rr = interleaved({"plain": (lambda a=a: gather(table, a.sample()), None),
                          "nstep": (lambda b=b: gather(table, b.sample()), None)}, cfg)
        out.add(f"{cls.kind} n_step=3 vs plain {cls.kind}: cost", 1e6 / rr["nstep"], 1e6 / rr["plain"],
                "us/batch", None, "information")


def main(argv: list[str] | None = None) -> int:
    """Parse ``--quick``/``--dir``, run, print the table.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status (2: stable-baselines3 missing).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k transitions (< 1 minute)")
    ap.add_argument("--dir", default=None, help="where to put the temporary store (default: system temp)")
    args = ap.parse_args(argv)
    try:
        import stable_baselines3
    except ImportError as exc:
        print(f"nstep_bench: needs stable-baselines3 ({exc}); pip install stable-baselines3", file=sys.stderr)
        return 2
    cfg = QUICK if args.quick else FULL
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus, numpy {np.__version__}, "
          f"stable-baselines3 {stable_baselines3.__version__}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    tmp = tempfile.mkdtemp(prefix="replaystore-nstep-bench-", dir=args.dir)
    t0 = time.perf_counter()
    out = Table("reference", "reference")
    try:
        run(tmp, cfg, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.perf_counter() - t0:.0f} s")
    out.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
