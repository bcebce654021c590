"""Scale-out on one machine: N actor processes write one S3 store while a learner samples from it
and a Ray Data job exports a snapshot to Parquet.

    python examples/distributed_actors.py                  # moto's S3 server on 127.0.0.1, 4 actors
    python examples/distributed_actors.py --quick          # small sizes (well under a minute)
    python examples/distributed_actors.py --endpoint http://127.0.0.1:9000 --bucket replay   # your S3 server

1. Without ``--endpoint``, moto's S3 server starts on 127.0.0.1 (``replaystore.tools.s3local``;
   ``pip install 'moto[server]'``) and is stopped at the end.
2. ``--actors`` processes (spawned; each its own writer and its own s3fs client, as if on
   separate hosts) play random tic-tac-toe games (``replaystore.tools.tictactoe.play``) into
   4 streams each, appending DqnBatch records and committing every 40 games (20 with
   ``--quick``) and at most once a second, until they played ``--games`` games or are
   told to stop.
3. The learner (this process) waits for a first minibatch worth of records, then trains a
   Q-network (``replaystore.tools.dqn``) from ``make_loader(st, PrioritizedSampler(...))``
   for ``--steps`` minibatches, calling ``st.refresh()`` every 25 steps so the actors' new
   commits enter the sampler; the DataLoader worker opens the store itself.
4. While the actors are still writing (unless they are done), a Ray Data job on a local Ray cluster (2 CPUs,
   loopback) exports a snapshot: ``read_replaystore(url).write_parquet(out)``; its read
   tasks are the store's fragments. The export is checked: exactly the snapshot's rows,
   each identical to the store's record.
5. The actors stop (their last commits land), and the totals are printed (``--summary``
   writes them as JSON).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from typing import Any

import numpy as np

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.tools import tictactoe

STREAMS_PER_ACTOR = 4
REFRESH_EVERY = 25
TARGET_SYNC = 100
BATCH = 256

FULL = {"actors": 4, "games": 1500, "steps": 600, "games_per_commit": 40, "eval_games": 200}
QUICK = {"actors": 2, "games": 300, "steps": 200, "games_per_commit": 20, "eval_games": 50}
COMMIT_PERIOD_S = 1.0  # an actor commits at most this often (a stand-in for environment time)


def schema() -> Any:
    return dqn(tictactoe.OBSERVATION_SIZE, heads=1, actions=tictactoe.ACTIONS,
               metadata={"env_id": "tictactoe", "producer": "examples/distributed_actors.py"})


# -- actors (separate processes) ------------------------------------------------------------------

def actor(url: str, options: dict[str, Any], index: int, max_games: int, games_per_commit: int, stop: Any,
          out: Any) -> None:
    """One actor: its own store handle (its own s3fs client), 4 game streams, a commit every
    ``games_per_commit`` games and at most every COMMIT_PERIOD_S seconds, ``max_games`` in all."""
    st = open_store(url, mode="a", storage_options=options)
    rng = np.random.default_rng(1000 + index)
    records = commits = games = 0
    with st.writer() as w:
        while not stop.is_set() and games < max_games:
            started = time.monotonic()
            for g in range(games_per_commit):
                batch, _ = tictactoe.play(tictactoe.random_policy, rng)
                records += w.append(batch, stream=f"actor{index}/game{g % STREAMS_PER_ACTOR}", reset=True)
                games += 1
            w.commit(metadata={"actor": index, "games": games})
            commits += 1
            stop.wait(max(0.0, COMMIT_PERIOD_S - (time.monotonic() - started)))  # pacing, not synchronisation
        out.put({"actor": index, "writer": w.id, "records": records, "games": games, "commits": commits})


# -- learner -----------------------------------------------------------------------------------------

def wait_for_records(st: Any, n: int, timeout_s: float = 120.0) -> int:
    """Refresh until the store holds ``n`` records (bounded poll)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st.refresh()
        if len(st) >= n:
            return len(st)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the actors committed only {len(st)} records in {timeout_s} s")
        time.sleep(0.1)  # polling interval, not synchronisation: the loop checks the store itself


def learn(st: Any, steps: int, eval_games: int) -> dict[str, Any]:
    import copy

    import torch

    from replaystore.loaders import PrioritizedSampler, make_loader
    from replaystore.tools.dqn import QNet, greedy, train_step

    torch.manual_seed(0)
    online = QNet(tictactoe.OBSERVATION_SIZE, tictactoe.ACTIONS)
    target = copy.deepcopy(online)
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    sampler = PrioritizedSampler(st, batch_size=BATCH, alpha=0.6, beta=0.4, seed=0, num_batches=steps)
    loader = make_loader(st, sampler, num_workers=1, prefetch_factor=2)
    losses, seen = [], [len(st)]
    t0 = time.perf_counter()
    for i, batch in enumerate(loader):
        losses.append(train_step(online, target, opt, batch, sampler))
        if (i + 1) % TARGET_SYNC == 0:
            target.load_state_dict(online.state_dict())
        if (i + 1) % REFRESH_EVERY == 0:
            st.refresh()  # the actors' new commits enter the sampler (at the running max priority)
            seen.append(len(st))
    train_s = time.perf_counter() - t0

    rng = np.random.default_rng(7)
    wins = 0
    for _ in range(eval_games):  # the learned greedy policy moves first against a random player
        def policy(obs: np.ndarray, legal: np.ndarray, player: int, r: np.random.Generator) -> int:
            if player == 1:
                return tictactoe.random_policy(obs, legal, player, r)
            return greedy(online, torch.from_numpy(obs), torch.from_numpy(legal))
        _, result = tictactoe.play(policy, rng)
        wins += result == 1
    return {"steps": len(losses), "train_s": train_s, "loss_first": float(np.mean(losses[:20])),
            "loss_last": float(np.mean(losses[-20:])), "records_seen": seen, "win_rate_first": wins / eval_games}


# -- Ray Data export ------------------------------------------------------------------------------------

def export_snapshot(url: str, options: dict[str, Any], out_dir: str, ray_address: str | None) -> dict[str, Any]:
    """Snapshot the store into Parquet with Ray Data and check the files against the store."""
    if ray_address is None:  # a local cluster on loopback only (must be set before ray is imported)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    import pyarrow.parquet as pq
    import ray

    from replaystore.tools.ray_data import ReplayStoreDatasource

    if ray_address is None:
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                 configure_logging=False)
    else:
        ray.init(address=ray_address)
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        t0 = time.perf_counter()
        source = ReplayStoreDatasource(url, storage_options=options)  # the snapshot: taken here
        # one read task per fragment (Ray would merge a store this small into fewer tasks)
        ray.data.read_datasource(source, override_num_blocks=len(source.fragments)).write_parquet(out_dir)
        export_s = time.perf_counter() - t0
    finally:
        ray.shutdown()
    table = pq.read_table(out_dir).sort_by("row")
    rows = table.column("row").to_numpy()
    assert len(rows) == source.num_rows and len(np.unique(rows)) == len(rows), "the export is not the snapshot"
    st = open_store(url, mode="r", storage_options=options)
    got = st.read(rows)  # every exported record, as the store has it
    for name in ("obs", "actions", "rewards", "discounts"):
        column = table.column(name).combine_chunks()
        values = column.flatten().to_numpy() if name == "obs" else column.to_numpy()
        assert np.array_equal(values.reshape(got[name].shape), got[name]), f"exported {name} differs"
    legal = table.column("legal_ids").combine_chunks()
    assert np.array_equal(legal.flatten().to_numpy(), got["legal_ids"]), "exported legal_ids differ"
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".parquet"))
    return {"rows": len(rows), "tasks": len(source.fragments), "files": len(files), "export_s": export_s,
            "path": out_dir}


# -- main ------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace, url: str, options: dict[str, Any], endpoint: str) -> dict[str, Any]:
    cfg = QUICK if args.quick else FULL
    actors = args.actors or cfg["actors"]
    steps = args.steps or cfg["steps"]
    out_dir = args.out or tempfile.mkdtemp(prefix="replaystore-export-")
    st = open_store(url, schema(), mode="w+", storage_options=options)
    print(f"store {url} (S3 endpoint {endpoint})")

    ctx = mp.get_context("spawn")
    stop, reports = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=actor, args=(url, options, a, args.games or cfg["games"], cfg["games_per_commit"],
                                             stop, reports), daemon=True)
             for a in range(actors)]
    for p in procs:
        p.start()
    try:
        first = wait_for_records(st, 4 * BATCH)
        print(f"1. {actors} actor processes are writing; {first} records committed so far")
        learner = learn(st, steps, cfg["eval_games"])
        print(f"2. learner: {learner['steps']} prioritized minibatches of {BATCH} in {learner['train_s']:.1f} s, "
              f"loss {learner['loss_first']:.3f} -> {learner['loss_last']:.3f}, the store grew "
              f"{learner['records_seen'][0]} -> {learner['records_seen'][-1]} records meanwhile; greedy policy "
              f"wins {learner['win_rate_first']:.0%} moving first against a random player")
        export = export_snapshot(url, options, out_dir, args.ray_address)
        print(f"3. Ray Data exported a snapshot of {export['rows']} records ({export['tasks']} read tasks, one per "
              f"fragment) to {export['files']} Parquet files in {export['export_s']:.1f} s: {export['path']}")
    finally:
        stop.set()
        done = []
        for _ in procs:
            try:
                done.append(reports.get(timeout=120))
            except Exception:  # an actor that died reports nothing; its exit code says why below
                break
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"actor processes failed with exit codes {bad}")
    st = open_store(url, mode="r", storage_options=options)
    total = sum(d["records"] for d in done)
    print(f"4. actors stopped: {sum(d['games'] for d in done)} games, {total} records in "
          f"{sum(d['commits'] for d in done)} commits by writers {sorted(d['writer'] for d in done)}; "
          f"the store holds {len(st)}")
    return {"url": url, "endpoint": endpoint, "actors": sorted(done, key=lambda d: d["actor"]), "learner": learner,
            "export": export, "store_records": len(st), "store_writers": st.writers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 actors, 200 learner steps")
    ap.add_argument("--actors", type=int, default=None, help="actor processes (default 4; 2 with --quick)")
    ap.add_argument("--games", type=int, default=None,
                    help="games per actor, rounded up to whole commits (default 1500; 300 with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="learner minibatches (default 600; 200 with --quick)")
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint URL (default: start moto on 127.0.0.1)")
    ap.add_argument("--bucket", default="replaystore-example", help="the bucket (with --endpoint it must exist)")
    ap.add_argument("--prefix", default="distributed-actors", help="the store's prefix in the bucket")
    ap.add_argument("--out", default=None, help="Parquet output directory (default: a new temporary directory)")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local one)")
    ap.add_argument("--summary", default=None, help="also write the totals as JSON to this file")
    args = ap.parse_args(argv)
    # SIGTERM (e.g. a timeout) unwinds like Ctrl-C: the actors are told to stop, the S3 server stops
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.perf_counter()
    if args.endpoint:
        from replaystore.tools.s3local import s3_options

        options = s3_options(args.endpoint)
        summary = run(args, f"s3://{args.bucket}/{args.prefix}", options, args.endpoint)
    else:
        from replaystore.tools.s3local import loopback_s3

        with loopback_s3(args.bucket) as s3:
            summary = run(args, s3.url(args.prefix), s3.storage_options, s3.endpoint_url)
    summary["seconds"] = time.perf_counter() - t0
    print(f"done in {summary['seconds']:.0f} s")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
