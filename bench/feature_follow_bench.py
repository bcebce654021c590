"""Features on a live store: refresh + ``sample()`` with stack / n-step / HER while another process commits.

    python bench/feature_follow_bench.py            # 1M-record stores
    python bench/feature_follow_bench.py --quick    # 100k-record stores (about a minute)

Stores: ``frames((4, 4))`` (for ``stack=4`` and ``n_step=3``) and ``goal_transitions(4, 3)`` (for
HER), each 16 streams of episodes (200 and 50 steps: a reset at each start, ``terminated`` at
each end) built in 1M-record commits. A collector in its own process commits 1,000 more records
(continuing the 16 streams) to a store before every timed minibatch. Samplers, each on its own
store handle, with ``refresh_every=1`` and a minibatch of 256:

1. ``UniformSampler(stack=4)``, ``UniformSampler(n_step=3)``, ``UniformSampler(her=HER(...))``:
   the median cost of ``sample()`` (the store's refresh, following the features' indexes, the
   draw) right after a commit, against the same ``sample()`` on the unchanged store (called
   again with nothing committed in between) plus what following the same commit costs a
   ``SequenceSampler(length=1)`` on the same store (its live minus its static ``sample()``),
   which follows the stream index incrementally. Target <= 1.5x.
2. ``UniformSampler(n_step=3)`` ``sample()`` + ``gather`` on a static ``transitions(4)`` store
   against Stable-Baselines3's ``NStepReplayBuffer.sample(256)`` over the same records in RAM
   (target ours >= 1x its rate), and against TorchRL's ``MultiStep(0.99, 3)`` transform applied
   to the same 256 windows of 3 steps taken from a TensorDict of the records in RAM (information).

Live costs are medians over ``reps`` commits; the rates of part 2 are ``benchkit.interleaved``'s.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

import numpy as np
from benchkit import Table, build_transitions, interleaved, main, transitions_records

from replaystore.loaders import HER, SequenceSampler, UniformSampler, gather
from replaystore.schemas import frames, goal_transitions
from replaystore.store import open_store

FULL = {"records": 1_000_000, "reps": 40, "warm_s": 0.5, "rep_s": 1.0}
QUICK = {"records": 100_000, "reps": 15, "warm_s": 0.2, "rep_s": 0.3}
STREAMS, BATCH, COMMIT, N, GAMMA = 16, 256, 1_000, 3, 0.99
EPISODES = {"frames": 200, "goals": 50}


def records(kind: str, n: int, first: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``n`` records of one stream from step ``first`` on, and their steps."""
    steps = first + np.arange(n, dtype=np.int64)
    end = steps % EPISODES[kind] == EPISODES[kind] - 1
    f32 = np.float32
    if kind == "frames":
        return {"frame": rng.integers(0, 255, (n, 4, 4)).astype(np.uint8), "action": rng.integers(0, 3, n),
                "reward": rng.standard_normal(n).astype(f32), "terminated": end, "truncated": np.zeros(n, bool)}, steps
    g = rng.standard_normal((n, 3)).astype(f32)
    return {"observation": rng.standard_normal((n, 4)).astype(f32), "achieved_goal": g, "desired_goal": g,
            "action": rng.standard_normal((n, 4)).astype(f32), "reward": -np.ones(n, f32),
            "next_observation": rng.standard_normal((n, 4)).astype(f32), "next_achieved_goal": g,
            "next_desired_goal": g,
            "terminated": end, "truncated": np.zeros(n, bool)}, steps


def append(w: Any, kind: str, nxt: list[int], total: int, rng: np.random.Generator) -> None:
    """``total`` records spread over the streams, continuing each at its next step ``nxt[s]``."""
    per = [total // STREAMS + (s < total % STREAMS) for s in range(STREAMS)]
    for s, n in enumerate(per):
        b, steps = records(kind, n, nxt[s], rng)
        w.append(b, stream=s, step=steps, reset=steps % EPISODES[kind] == 0)
        nxt[s] += n


def build(path: str, kind: str, n: int) -> None:
    schema = frames((4, 4), actions=3) if kind == "frames" else goal_transitions(4, 3, 4)
    rng, nxt = np.random.default_rng(0), [0] * STREAMS
    with open_store(path, schema, mode="w").writer() as w:
        for done in range(0, n, 1_000_000):
            append(w, kind, nxt, min(1_000_000, n - done), rng)
            w.commit()


def collector(paths: dict[str, str], records_per_stream: int, conn: Any) -> None:
    """The other process: on a kind, commits ``COMMIT`` records to that store; answers when done; None stops."""
    rng = np.random.default_rng(1)
    writers = {k: open_store(p, mode="a").writer() for k, p in paths.items()}
    nxt = {k: [records_per_stream] * STREAMS for k in paths}
    try:
        while (kind := conn.recv()) is not None:
            append(writers[kind], kind, nxt[kind], COMMIT, rng)
            writers[kind].commit()
            conn.send(kind)
    finally:
        for w in writers.values():
            w.close()


def her_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def live(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    n = cfg["records"]
    paths = {k: os.path.join(tmp, k) for k in EPISODES}
    for kind, path in paths.items():
        build(path, kind, n)
    make = {
        "stack": ("frames", lambda st: UniformSampler(st, BATCH, refresh_every=1, stack=4, stack_field="frame")),
        "n_step": ("frames", lambda st: UniformSampler(st, BATCH, refresh_every=1, n_step=N, gamma=GAMMA)),
        "her": ("goals", lambda st: UniformSampler(st, BATCH, refresh_every=1, her=HER("future", 4, her_reward))),
        "sequence frames": ("frames", lambda st: SequenceSampler(st, 1, batch_size=BATCH, refresh_every=1)),
        "sequence goals": ("goals", lambda st: SequenceSampler(st, 1, batch_size=BATCH, refresh_every=1)),
    }
    samplers = {name: (kind, fn(open_store(paths[kind], mode="r"))) for name, (kind, fn) in make.items()}
    for _, s in samplers.values():
        s.sample()  # first look: the indexes are built
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=collector, args=(paths, n // STREAMS, child))
    proc.start()
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in samplers}
    try:
        for _ in range(cfg["reps"]):
            for kind in EPISODES:
                conn.send(kind)
                conn.recv()
                for name, (k, s) in samplers.items():
                    if k != kind:
                        continue
                    t0 = time.perf_counter()
                    s.sample()  # refresh (the new commit), follow it, draw
                    t1 = time.perf_counter()
                    s.sample()  # refresh (nothing new), draw
                    times[name][0].append(t1 - t0)
                    times[name][1].append(time.perf_counter() - t1)
    finally:
        conn.send(None)
        proc.join()
    med = {name: (float(np.median(a)) * 1e6, float(np.median(b)) * 1e6) for name, (a, b) in times.items()}
    for name, (kind, _) in samplers.items():
        if name.startswith("sequence"):
            continue
        seq = med[f"sequence {kind}"]
        follow = seq[0] - seq[1]
        note = f"static {med[name][1]:,.0f} us + SequenceSampler following {follow:,.0f} us"
        out.add(f"{name}: refresh + sample() after a {COMMIT:,}-record commit, {n:,} records", med[name][0],
                med[name][1] + follow, "us/batch", ("<=", 1.5), note)


def nstep_peers(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    import torch
    from nstep_bench import sb3_buffer
    from tensordict import TensorDict
    from torchrl.data.postprocs import MultiStep

    n = cfg["records"]
    path = os.path.join(tmp, "t")
    build_transitions(path, n, streams=STREAMS)
    st = open_store(path, mode="r")
    table = st.default
    table.read(table.row_ids())  # fault the maps in
    ours = UniformSampler(st, batch_size=BATCH, seed=0, n_step=N, gamma=GAMMA)
    buffer = sb3_buffer(n)
    per = n // STREAMS
    b = {k: torch.from_numpy(v) for k, v in transitions_records(np.random.default_rng(2), per).items()}
    rep = {k: v.unsqueeze(0).expand(STREAMS, *v.shape).contiguous() for k, v in b.items()}
    flag = rep["terminated"].unsqueeze(-1)
    data = TensorDict({"obs": rep["obs"], "action": rep["action"],
                       "next": TensorDict({"obs": rep["next_obs"], "reward": rep["reward"].unsqueeze(-1),
                                           "done": flag, "terminated": flag, "truncated": torch.zeros_like(flag)},
                                          [STREAMS, per])}, [STREAMS, per])
    multistep = MultiStep(GAMMA, N)
    gen = torch.Generator().manual_seed(0)
    span = torch.arange(N)

    def torchrl_batch() -> Any:
        env = torch.randint(0, STREAMS, (BATCH,), generator=gen)
        t = torch.randint(0, per - N + 1, (BATCH,), generator=gen)
        return multistep(data[env[:, None], t[:, None] + span])

    r = interleaved({"ours": (lambda: gather(table, ours.sample()), None),
                     "sb3": (lambda: buffer.sample(BATCH), None), "torchrl": (torchrl_batch, None)}, cfg)
    out.add(f"uniform n_step=3 sample()+gather vs SB3 NStepReplayBuffer.sample({BATCH}), {n:,}: rate", r["ours"],
            r["sb3"], "batches/s", 1.0)
    out.add(f"uniform n_step=3 sample()+gather vs TorchRL MultiStep on {BATCH} windows of {N}: rate", r["ours"],
            r["torchrl"], "batches/s", None, "information")


def body(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    live(tmp, cfg, out)
    nstep_peers(tmp, cfg, out)


if __name__ == "__main__":
    sys.exit(main("feature_follow", __doc__ or "", None, (FULL, QUICK), Table("reference", "reference"), body))
