"""Hindsight relabelling: HER ``future`` minibatches of 256 against SB3's ``HerReplayBuffer.sample(256)``.

Both hold the same goal-conditioned episodes (one environment; observation 10, goals 3, length 50).
Ours: ``UniformSampler(her=HER("future", 4, ...))`` through ``make_loader`` in the main process (draw, gather,
relabel, tensors), over a local store. SB3: ``HerReplayBuffer(n_sampled_goal=4, "future")`` in RAM, its
``compute_reward`` called through a ``DummyVecEnv`` as SB3 does. Best of interleaved windows (benchkit).

    python bench/her_bench.py            # 200k transitions
    python bench/her_bench.py --quick    # 20k transitions (< 1 minute)
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
from typing import Any

import benchkit
import numpy as np

from replaystore.loaders import HER, UniformSampler, make_loader
from replaystore.schemas import goal_transitions
from replaystore.store import open_store

OBS, GOAL, LENGTH, BATCH = 10, 3, 50, 256
SIZES = ({"episodes": 4000, "warm_s": 1.0, "rep_s": 2.0, "reps": 3},
         {"episodes": 400, "warm_s": 0.3, "rep_s": 0.5, "reps": 2})


def reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """FetchReach's sparse reward: 0 within 0.05, else -1 (vectorised)."""
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def goal_env() -> Any:
    """A gymnasium goal env with :func:`reward`: SB3 reads its spaces and calls its ``compute_reward``."""
    import gymnasium as gym

    class GoalEnv(gym.Env):  # type: ignore[misc]
        observation_space = gym.spaces.Dict({
            "observation": gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
            "achieved_goal": gym.spaces.Box(-np.inf, np.inf, (GOAL,), np.float32),
            "desired_goal": gym.spaces.Box(-np.inf, np.inf, (GOAL,), np.float32)})
        action_space = gym.spaces.Box(-1, 1, (4,), np.float32)

        def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
            return reward(achieved, desired, info)

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
            return self.observation_space.sample(), 0.0, False, False, {}

    return GoalEnv()


def episode(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One random-walk episode of LENGTH steps, truncated at its end."""
    obs = np.cumsum(rng.normal(0, 0.02, (LENGTH + 1, OBS)), axis=0).astype(np.float32)
    goal = rng.normal(0, 0.1, GOAL).astype(np.float32)
    ach = obs[:, :GOAL]
    trunc = np.zeros(LENGTH, bool)
    trunc[-1] = True
    desired = np.repeat(goal[None], LENGTH, 0)
    return {"observation": obs[:-1], "achieved_goal": ach[:-1], "desired_goal": desired,
            "action": rng.uniform(-1, 1, (LENGTH, 4)).astype(np.float32),
            "reward": reward(ach[1:], desired, None), "next_observation": obs[1:], "next_achieved_goal": ach[1:],
            "next_desired_goal": desired.copy(), "terminated": np.zeros(LENGTH, bool), "truncated": trunc}


def body(tmp: str, cfg: dict[str, Any], out: benchkit.Table) -> None:
    """Fill both buffers with the same episodes, then time minibatches of 256."""
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

    rng = np.random.default_rng(0)
    n = cfg["episodes"]
    env = DummyVecEnv([goal_env])
    buf = HerReplayBuffer(n * LENGTH, env.observation_space, env.action_space, env, n_sampled_goal=4,
                          goal_selection_strategy="future")
    st = open_store(f"{tmp}/her", goal_transitions(OBS, GOAL, 4), mode="w+")
    with st.writer() as w:
        for e in range(n):
            ep = episode(rng)
            w.append(ep, stream=e % 16, reset=True)
            for t in range(LENGTH):
                buf.add({k: ep[k][t:t + 1] for k in ("observation", "achieved_goal", "desired_goal")},
                        {k: ep[f"next_{k}"][t:t + 1] for k in ("observation", "achieved_goal", "desired_goal")},
                        ep["action"][t:t + 1], ep["reward"][t:t + 1], np.array([t == LENGTH - 1]),
                        [{"TimeLimit.truncated": t == LENGTH - 1}])
        w.commit()
    her_loader = iter(make_loader(st, UniformSampler(st, BATCH, seed=0, her=HER("future", 4, reward, seed=1))))
    plain_loader = iter(make_loader(st, UniformSampler(st, BATCH, seed=0)))
    rates = benchkit.interleaved({"her": (lambda: next(her_loader), 1), "plain": (lambda: next(plain_loader), 1),
                                  "sb3": (lambda: buf.sample(BATCH), 1)}, cfg)
    out.add(f"HER future minibatch of {BATCH}, {n * LENGTH:,} transitions", rates["her"], rates["sb3"],
            "batches/s", 1.0)
    out.add(f"plain uniform minibatch of {BATCH} (same store; ratio: HER over plain)", rates["her"],
            rates["plain"], "batches/s", note="the cost of relabelling")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    try:
        import stable_baselines3
    except ImportError as exc:
        print(f"her_bench: needs stable-baselines3 ({exc}); pip install stable-baselines3", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (< 1 minute)")
    ap.add_argument("--dir", default=None, help="where to put the temporary store (default: system temp)")
    args = ap.parse_args(argv)
    cfg = SIZES[1] if args.quick else SIZES[0]
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"numpy {np.__version__}, stable-baselines3 {stable_baselines3.__version__}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    out = benchkit.Table("SB3", "SB3")
    tmp = tempfile.mkdtemp(prefix="replaystore-her-bench-", dir=args.dir)
    try:
        body(tmp, cfg, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
