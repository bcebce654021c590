"""Atari pixels from where they are made: bytes per step and sampling rate against SB3's own buffer.

    python bench/pixels_journey_bench.py            # 20k vector steps of 4 Pongs (~80k transitions)
    python bench/pixels_journey_bench.py --quick    # 1.5k vector steps

Pong through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4, random policy)
in 4 environments, stacked by 4:

- **recorder**: gymnasium's ``FrameStackObservation(4)`` under ``RecordVectorEpisodes(frame_stack=4)``;
- **SB3 buffer**: ``VecFrameStack(4)`` + ``VecTransposeImage`` (as DQN wraps it) feeding
  ``ReplayStoreBuffer(frame_stack=4)`` and SB3's own ``ReplayBuffer`` with the same ``add`` calls.

Printed: stored bytes per step (every column's stored bytes plus the 13-byte per-record index;
the store's allocated bytes on disk too) against SB3's ``ReplayBuffer`` (all its arrays'
``nbytes`` per transition: stacked obs + next_obs, action, reward, done, timeout), and
``sample(32)`` calls per second of the store buffer (everything committed) against SB3's
``ReplayBuffer.sample(32)`` on the same transitions, in one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

N_ENVS, STACK, SIZE = 4, 4, 84


def pong(channel: bool) -> Any:
    """Pong through ``AtariPreprocessing``: 84x84 grayscale, frame skip 4 (``(84, 84, 1)`` with ``channel``)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    return gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=SIZE, grayscale_obs=True,
                                           grayscale_newaxis=channel)


def live_bytes(url: str) -> tuple[int, int, int]:
    """(records, live bytes: columns stored + per-record index, allocated bytes on disk)."""
    from replaystore.store import open_store

    with open_store(url, mode="r") as st:
        info = st.info()
        cols = next(iter(info["tables"].values()))["columns"]
        return len(st), int(sum(c["stored"] for c in cols.values())) + 13 * len(st), int(info["bytes"])


def recorder(root: str, steps: int) -> dict[str, float]:
    """Record ``steps`` vector steps through ``RecordVectorEpisodes(frame_stack=4)``."""
    import gymnasium as gym
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordVectorEpisodes

    url = os.path.join(root, "recorded")
    venv = gym.vector.SyncVectorEnv([lambda: FrameStackObservation(pong(False), STACK)] * N_ENVS)
    venv = RecordVectorEpisodes(venv, url, frame_stack=STACK)
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        venv.step(rng.integers(6, size=N_ENVS))
    venv.close()
    elapsed = time.perf_counter() - t0
    records, live, disk = live_bytes(url)
    transitions = steps * N_ENVS
    return {"transitions": transitions, "live": live / transitions, "disk": disk / transitions,
            "steps_per_s": transitions / elapsed}


def sb3(root: str, steps: int, samples: int) -> dict[str, float]:
    """Feed ``ReplayStoreBuffer(frame_stack=4)`` and SB3's ``ReplayBuffer`` the same VecFrameStack steps."""
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecTransposeImage

    from replaystore.integrations.sb3 import ReplayStoreBuffer

    url = os.path.join(root, "sb3")
    venv = VecTransposeImage(VecFrameStack(DummyVecEnv([lambda: pong(True)] * N_ENVS), STACK))
    venv.seed(0)
    size = steps * N_ENVS
    ref = ReplayBuffer(size, venv.observation_space, venv.action_space, "cpu", n_envs=N_ENVS)
    buf = ReplayStoreBuffer(size, venv.observation_space, venv.action_space, "cpu", n_envs=N_ENVS, url=url,
                            frame_stack=STACK)
    rng = np.random.default_rng(0)
    obs = venv.reset()
    add_s = 0.0
    for _ in range(steps):
        action = rng.integers(6, size=N_ENVS)
        new, reward, done, infos = venv.step(action)
        nxt = new.copy()
        for i in np.flatnonzero(done):
            nxt[i] = infos[i]["terminal_observation"]
        t0 = time.perf_counter()
        buf.add(obs, nxt, action.reshape(N_ENVS, 1), reward, done, infos)
        add_s += time.perf_counter() - t0
        ref.add(obs, nxt, action.reshape(N_ENVS, 1), reward, done, infos)
        obs = new
    buf.flush()
    transitions = steps * N_ENVS
    sb3_step = sum(a.nbytes for a in (ref.observations, ref.next_observations, ref.actions, ref.rewards,
                                      ref.dones, ref.timeouts)) / (ref.buffer_size * N_ENVS)

    def rate(b: Any) -> float:
        b.sample(32)  # warm
        t0 = time.perf_counter()
        for _ in range(samples):
            b.sample(32)
        return samples / (time.perf_counter() - t0)

    np.random.seed(0)
    store_rate = rate(buf)
    ref_rate = rate(ref)
    buf.close()
    records, live, disk = live_bytes(url)
    return {"transitions": transitions, "live": live / transitions, "disk": disk / transitions,
            "sb3": sb3_step, "store_rate": store_rate, "sb3_rate": ref_rate, "add_us": add_s / steps * 1e6}


def main() -> None:
    """Print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1.5k vector steps, 300 samples")
    ap.add_argument("--steps", type=int, default=None, help="vector steps (4 envs each)")
    args = ap.parse_args()
    steps = args.steps or (1_500 if args.quick else 20_000)
    samples = 300 if args.quick else 2_000
    root = tempfile.mkdtemp(prefix="pixels-journey-")
    try:
        print(f"load {os.getloadavg()[0]:.2f}; Pong, {N_ENVS} envs x {steps} steps, stack {STACK}")
        r = recorder(root, steps)
        s = sb3(root, steps, samples)
        sb3_step = s["sb3"]
        print(f"SB3 ReplayBuffer: {sb3_step:,.0f} B per transition")
        print(f"recorder (RecordVectorEpisodes, frame_stack=4): {r['live']:,.1f} B/transition live "
              f"({sb3_step / r['live']:,.0f}x fewer), {r['disk']:,.1f} B on disk ({sb3_step / r['disk']:,.0f}x); "
              f"{r['steps_per_s']:,.0f} transitions/s recorded (env included)")
        print(f"SB3 buffer (ReplayStoreBuffer, frame_stack=4): {s['live']:,.1f} B/transition live "
              f"({sb3_step / s['live']:,.0f}x fewer), {s['disk']:,.1f} B on disk ({sb3_step / s['disk']:,.0f}x); "
              f"add {s['add_us']:,.0f} us per vector step")
        print(f"sample(32): store buffer {s['store_rate']:,.0f}/s, SB3 ReplayBuffer {s['sb3_rate']:,.0f}/s "
              f"({s['store_rate'] / s['sb3_rate']:.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
