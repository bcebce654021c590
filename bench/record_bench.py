"""What recording costs: ``RecordVectorEpisodes`` on a vector of 8 CartPole-v1 envs
(``SyncVectorEnv``) against the same vector env unrecorded, and against Minari's ``DataCollector``.

    python bench/record_bench.py            # 4,000 vector steps (32,000 transitions) per run
    python bench/record_bench.py --quick    # 500 vector steps
    python bench/record_bench.py --steps 10000 --reps 5

Every figure is transitions per second, the best of ``--reps`` runs, interleaved (the machine may be shared).
Actions are drawn before timing. The recorded run includes ``close()`` (its last commit); Minari's
includes ``create_dataset`` (its write-out). Minari's ``DataCollector`` wraps a single environment,
not a vector one, so it steps one CartPole the same number of transitions; the unrecorded single
env is shown beside it. ``DataCollector`` needs jax: ``pip install "minari[create]"`` (the bench
says so and skips that column when it is missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv

from replaystore.gym import RecordVectorEpisodes

ENVS = 8
ENV_ID = "CartPole-v1"


def _vector() -> SyncVectorEnv:
    return SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(ENVS)])


def vector_plain(actions: np.ndarray, _: str) -> None:
    """The unrecorded vector env: reset, then one step per row of ``actions``."""
    env = _vector()
    env.reset(seed=0)
    for a in actions:
        env.step(a)
    env.close()


def vector_recorded(actions: np.ndarray, tmp: str) -> None:
    """The same under ``RecordVectorEpisodes``, into a new store; ``close()`` commits."""
    env = RecordVectorEpisodes(_vector(), os.path.join(tmp, "store"))
    env.reset(seed=0)
    for a in actions:
        env.step(a)
    env.close()


def single_plain(actions: np.ndarray, _: str) -> None:
    """One CartPole stepping every transition of ``actions`` (reset at each episode end)."""
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    for a in actions.reshape(-1):
        _, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            env.reset()
    env.close()


def single_minari(actions: np.ndarray, tmp: str) -> None:
    """The same under Minari's ``DataCollector``, then ``create_dataset`` (its write-out)."""
    import minari

    os.environ["MINARI_DATASETS_PATH"] = os.path.join(tmp, "minari")
    env = minari.DataCollector(gym.make(ENV_ID))
    env.reset(seed=0)
    for a in actions.reshape(-1):
        _, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # author, permalink, ...
        env.create_dataset(dataset_id="bench/cartpole-v0", algorithm_name="random")
    env.close()


def best_rates(fns: dict[str, Callable[[np.ndarray, str], None]], actions: np.ndarray,
               reps: int) -> dict[str, float]:
    """Transitions per second of each function on ``actions``: the best of ``reps`` runs, each in a fresh
    temp dir. The runs are interleaved (one of each per round), so that a change in the machine's load
    reaches every figure alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(reps):
        for name, fn in fns.items():
            tmp = tempfile.mkdtemp(prefix="record-bench-")
            try:
                t0 = time.perf_counter()
                fn(actions, tmp)
                best[name] = min(best[name], time.perf_counter() - t0)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return {name: actions.size / t for name, t in best.items()}


def main(argv: list[str] | None = None) -> None:
    """Run the bench and print one table and the two ratios."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4000, help="vector steps per run (x8 transitions)")
    p.add_argument("--reps", type=int, default=3, help="runs per figure; the best is kept")
    p.add_argument("--quick", action="store_true", help="500 vector steps")
    args = p.parse_args(argv)
    steps = 500 if args.quick else args.steps
    actions = np.random.default_rng(0).integers(0, 2, (steps, ENVS))
    try:
        import jax  # noqa: F401  (DataCollector needs it)
        import minari  # noqa: F401
        have_minari = True
    except ImportError:
        have_minari = False
    fns = {"vector env, unrecorded": vector_plain, "vector env, RecordVectorEpisodes": vector_recorded,
           "single env, unrecorded": single_plain}
    if have_minari:
        fns["single env, minari DataCollector"] = single_minari
    rates = best_rates(fns, actions, args.reps)
    print(f"{ENVS} x {ENV_ID}, {steps} vector steps ({actions.size} transitions), best of {args.reps}")
    for name, rate in rates.items():
        print(f"  {name:<36} {rate:>12,.0f} transitions/s")
    ours = rates["vector env, RecordVectorEpisodes"]
    print(f"recorded / unrecorded (vector env):       {ours / rates['vector env, unrecorded']:.2f}x  (target >= 0.5x)")
    if have_minari:
        print(f"RecordVectorEpisodes / minari DataCollector: {ours / rates['single env, minari DataCollector']:.2f}x"
              "  (target >= 2x)")
    else:
        print("minari DataCollector: not measured (pip install 'minari[create]' for jax)")


if __name__ == "__main__":
    main()
