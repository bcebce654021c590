"""Stable-Baselines3: ``ReplayStoreBuffer`` against SB3's own in-RAM ``ReplayBuffer``, in one run.

1. ``sample(256)`` from the same CartPole-shaped transitions (obs 4 float32, Discrete(2) actions):
   ours over a local store (everything committed), SB3's from its numpy arrays. Best of
   interleaved windows (benchkit). Also ``add`` of one step (ours: RAM, plus a commit every 1000).
2. DQN training on CartPole-v1 (the rl-zoo hyperparameters: train_freq 256, 128 gradient steps of
   batch 64): environment steps per second with our buffer and with SB3's, same seed, alternated.

    python bench/sb3_bench.py            # 100k transitions, DQN 2 x 3 runs of 6k steps
    python bench/sb3_bench.py --quick    # 20k transitions, DQN 2 x 1 run of 4k steps (< 1 minute)
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any

import benchkit
import numpy as np

BATCH = 256
SIZES = ({"records": 100_000, "warm_s": 1.0, "rep_s": 2.0, "reps": 3, "dqn_steps": 6_000, "dqn_runs": 3},
         {"records": 20_000, "warm_s": 0.3, "rep_s": 0.5, "reps": 2, "dqn_steps": 4_000, "dqn_runs": 1})


def timed(buf: Any, spent: list[float]) -> None:
    """Wrap ``buf.add`` and ``buf.sample`` (on the instance) to add their time to ``spent[0]``."""
    for name in ("add", "sample"):
        fn = getattr(buf, name)

        def wrapper(*a: Any, _fn: Any = fn, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        setattr(buf, name, wrapper)


def dqn_rate(url: str | None, steps: int) -> tuple[float, float]:
    """Environment steps per second of a seeded DQN on CartPole, with our buffer when ``url`` is given,
    and the seconds spent in the buffer's ``add`` and ``sample`` per environment step."""
    import gymnasium as gym
    from stable_baselines3 import DQN

    from replaystore.integrations.sb3 import ReplayStoreBuffer

    kw: dict[str, Any] = {}
    if url is not None:
        kw = {"replay_buffer_class": ReplayStoreBuffer, "replay_buffer_kwargs": {"url": url}}
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
                seed=0, device="cpu", **kw)
    spent = [0.0]
    timed(model.replay_buffer, spent)
    t0 = time.perf_counter()
    model.learn(steps)
    dt = time.perf_counter() - t0
    if url is not None:
        model.replay_buffer.close()  # type: ignore[union-attr]
    return steps / dt, spent[0] / steps


def body(tmp: str, cfg: dict[str, Any], out: benchkit.Table) -> None:
    """Fill both buffers with the same transitions, time ``sample``/``add``, then DQN training."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    from replaystore.integrations.sb3 import ReplayStoreBuffer

    env = gym.make("CartPole-v1")
    n = cfg["records"]
    rng = np.random.default_rng(0)
    ref = ReplayBuffer(n, env.observation_space, env.action_space, device="cpu")
    ours = ReplayStoreBuffer(n, env.observation_space, env.action_space, device="cpu", url=f"{tmp}/sample")
    obs = rng.standard_normal((n + 1, 1, 4)).astype(np.float32)
    act = rng.integers(0, 2, (n, 1))
    rew = np.ones((n, 1), np.float32)
    done = rng.random((n, 1)) < 0.02
    infos = [{}]
    for t in range(n):
        for b in (ref, ours):
            b.add(obs[t], obs[t + 1], act[t], rew[t], done[t], infos)
    ours.flush()
    k = [0]

    def add_ours() -> None:
        t = k[0] % n
        k[0] += 1
        ours.add(obs[t], obs[t + 1], act[t], rew[t], done[t], infos)

    def add_ref() -> None:
        t = k[0] % n
        k[0] += 1
        ref.add(obs[t], obs[t + 1], act[t], rew[t], done[t], infos)

    rates = benchkit.interleaved({"ours": (lambda: ours.sample(BATCH), 1), "sb3": (lambda: ref.sample(BATCH), 1)},
                                 cfg)
    out.add(f"sample({BATCH}) from {n:,} CartPole transitions, all committed", rates["ours"], rates["sb3"],
            "batches/s", 0.5)
    for t in range(500):  # 500 steps pending: a sample draws from the store and from RAM
        ours.add(obs[t], obs[t + 1], act[t], rew[t], done[t], infos)
    rates = benchkit.interleaved({"ours": (lambda: ours.sample(BATCH), 1), "sb3": (lambda: ref.sample(BATCH), 1)},
                                 cfg)
    out.add(f"sample({BATCH}) with 500 steps pending (uncommitted, in RAM)", rates["ours"], rates["sb3"],
            "batches/s", 0.5)
    ours.flush()
    rates = benchkit.interleaved({"ours": (add_ours, 1), "sb3": (add_ref, 1)}, cfg)
    out.add("add() of one step (ours: RAM, a commit every 1000 steps)", rates["ours"], rates["sb3"], "steps/s",
            note="commits included")
    ours.close()
    ours_r: list[tuple[float, float]] = []
    ref_r: list[tuple[float, float]] = []
    for i in range(cfg["dqn_runs"]):
        ref_r.append(dqn_rate(None, cfg["dqn_steps"]))
        ours_r.append(dqn_rate(f"{tmp}/dqn{i}", cfg["dqn_steps"]))
    out.add(f"DQN CartPole training, {cfg['dqn_steps']:,} steps (best of {cfg['dqn_runs']})",
            max(r[0] for r in ours_r), max(r[0] for r in ref_r), "env steps/s", 0.8)
    out.add("  of which in the buffer's add + sample (lower is better)", min(r[1] for r in ours_r) * 1e6,
            min(r[1] for r in ref_r) * 1e6, "us/env step", note="commits included")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    try:
        import stable_baselines3
        import torch
    except ImportError as exc:
        print(f"sb3_bench: needs stable-baselines3 ({exc}); pip install stable-baselines3", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (< 1 minute)")
    ap.add_argument("--dir", default=None, help="where to put the temporary stores (default: system temp)")
    args = ap.parse_args(argv)
    cfg = SIZES[1] if args.quick else SIZES[0]
    torch.set_num_threads(1)
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"numpy {np.__version__}, torch {torch.__version__}, stable-baselines3 {stable_baselines3.__version__}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    out = benchkit.Table("SB3", "SB3")
    tmp = tempfile.mkdtemp(prefix="replaystore-sb3-bench-", dir=args.dir)
    try:
        body(tmp, cfg, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
