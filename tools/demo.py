"""``replaystore demo``: the whole product end to end on tic-tac-toe, on the local disk.

1. Two collector processes (each its own writer) play random games from 4 streams
   each, appending DqnBatch-shaped records (CSR legal ids, discounts, bootstrap
   masks) and committing as they go.
2. A Q-network trains from a PrioritizedSampler DataLoader; its win rate against a
   random player is printed before and after.
3. The run is stopped (sampler and network saved into the store) and resumed from
   the store: the next minibatch is identical to the uninterrupted run's.
4. A DuckDB summary of the replay is printed and the replay is exported.

Each stage prints one line saying what it shows; the code is this module
(``replaystore.tools.demo``), meant to be read next to its output.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from replaystore.loaders import PrioritizedSampler, make_loader
from replaystore.schemas import dqn
from replaystore.store import Store, open_store
from replaystore.tools import tictactoe
from replaystore.tools.dqn import QNet, greedy, train_step
from replaystore.tools.info import info_document, info_text
from replaystore.tools.progress import progress_shown
from replaystore.tools.tables import format_table

COLLECTORS = 2
STREAMS_PER_COLLECTOR = 4
GAMES_PER_STREAM = 300
COMMIT_EVERY = 25  # games per stream between commits
TRAIN_STEPS = 1500
RESUME_STEPS = 700
EVAL_GAMES = 300


def _bar(progress: bool, **kwargs: Any) -> tqdm:
    return tqdm(disable=not progress_shown(progress), leave=False, **kwargs)


def collect(url: str, collector: int, seed: int) -> int:
    """One collector process: its own writer, ``STREAMS_PER_COLLECTOR`` game streams.

    Parameters
    ----------
    url : str
        The store.
    collector : int
        The collector's number (names its streams).
    seed : int
        Seed of its games.

    Returns
    -------
    int
        Records appended.
    """
    st = open_store(url)
    rng = np.random.default_rng(seed)
    records = 0
    with st.writer() as w:
        for g in range(GAMES_PER_STREAM):
            for s in range(STREAMS_PER_COLLECTOR):
                batch, _ = tictactoe.play(tictactoe.random_policy, rng)
                records += w.append(batch, stream=f"collector{collector}/game{s}", reset=True)
            if (g + 1) % COMMIT_EVERY == 0:
                w.commit(metadata={"collector": collector, "games": (g + 1) * STREAMS_PER_COLLECTOR})
    return records


def win_rate(net: QNet | None, rng: np.random.Generator, games: int = EVAL_GAMES) -> tuple[float, float]:
    """Win rates of the greedy network (random play if None) against a random player.

    Parameters
    ----------
    net : QNet or None
        The network.
    rng : numpy.random.Generator
        Randomness of the games.
    games : int, optional
        Games per seat.

    Returns
    -------
    first, second : float
        Win rates moving first and moving second.
    """
    rates = []
    for seat in (0, 1):
        wins = 0
        for _ in range(games):
            def policy(obs: np.ndarray, legal: np.ndarray, player: int, r: np.random.Generator,
                       seat: int = seat) -> int:
                if net is None or player != seat:
                    return tictactoe.random_policy(obs, legal, player, r)
                return greedy(net, torch.from_numpy(obs), torch.from_numpy(legal))
            _, result = tictactoe.play(policy, rng)
            wins += result == (1 if seat == 0 else -1)
        rates.append(wins / games)
    return rates[0], rates[1]


def train(st: Store, sampler: PrioritizedSampler, online: QNet, target: QNet, opt: torch.optim.Optimizer,
          steps: int, label: str, progress: bool = False) -> float:
    """Train ``steps`` minibatches from a DataLoader over ``sampler``.

    Parameters
    ----------
    st : Store
        The store.
    sampler : PrioritizedSampler
        The sampler (its ``num_batches`` is set to ``steps``).
    online : QNet
        The network trained.
    target : QNet
        The target network (synced every 100 steps).
    opt : torch.optim.Optimizer
        The optimizer.
    steps : int
        Minibatches.
    label : str
        The progress bar's label.
    progress : bool, optional
        Show the progress bar (on stderr, when it is a terminal).

    Returns
    -------
    float
        The mean loss of the last 100 steps.
    """
    sampler.num_batches = steps
    loader = make_loader(st, sampler, num_workers=1, prefetch_factor=1)
    losses = []
    for i, batch in enumerate(_bar(progress, iterable=loader, total=steps, desc=label, unit="batch")):
        losses.append(train_step(online, target, opt, batch, sampler))
        if (i + 1) % 100 == 0:
            target.load_state_dict(online.state_dict())
    return float(np.mean(losses[-100:]))


def _net_arrays(net: QNet) -> dict[str, np.ndarray]:
    return {k.replace(".", "__"): v.detach().numpy().copy() for k, v in net.state_dict().items()}


def _load_net(net: QNet, arrays: dict[str, np.ndarray]) -> None:
    net.load_state_dict({k.replace("__", "."): torch.from_numpy(v) for k, v in arrays.items()})


def store_summary(st: Store) -> list[str]:
    """What a newcomer wants to know about the demo's store: ``replaystore info``'s short summary.

    Parameters
    ----------
    st : Store
        The demo's store.

    Returns
    -------
    list of str
        The lines of :func:`replaystore.tools.info.info_text`: the store, records, writers,
        commits, size, the schema as a table, its metadata, the episodes and their returns.
    """
    return info_text(info_document(st)).splitlines()


def run_demo(args: argparse.Namespace) -> int:
    """Run the end-to-end demo (``replaystore demo``).

    Collect tic-tac-toe games with several writer processes, train a DQN with
    prioritized replay through a DataLoader, stop and resume from state saved in
    the store, query it with DuckDB and export it. Takes about a minute.

    Parameters
    ----------
    args : argparse.Namespace
        ``args.dir``: where to put the store (default: a temporary directory); ``args.quiet``
        (optional): no progress bars.

    Returns
    -------
    int
        0, or 1 if the resumed sampler did not continue the same draws.
    """
    threads = torch.get_num_threads()
    # the network is tiny: one intra-op thread is ~3x faster per step than two on a 2-core machine
    # (the DataLoader worker and the collectors need the other core); restored when the demo returns
    torch.set_num_threads(1)
    try:
        return _run_demo(args)
    finally:
        torch.set_num_threads(threads)


def _run_demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    stage_times: list[float] = []

    def stage_done() -> None:
        stage_times.append(time.perf_counter() - started - sum(stage_times))

    torch.manual_seed(0)
    root = args.dir or tempfile.mkdtemp(prefix="replaystore-demo-")
    progress = not getattr(args, "quiet", False)
    url = os.path.join(root, "tictactoe-dqn")
    schema = dqn(tictactoe.OBSERVATION_SIZE, heads=1, actions=tictactoe.ACTIONS,
                 metadata={"env_id": "tictactoe", "action_frame": "board cell 0-8, row-major",
                           "observation": "own marks (9) then opponent marks (9)", "producer": "replaystore demo"})
    open_store(url, schema, mode="w+", capacity=200_000)

    games = COLLECTORS * STREAMS_PER_COLLECTOR * GAMES_PER_STREAM
    print(f"replaystore demo: the code is {__name__} ({os.path.abspath(__file__)}); read it beside this output.\n")
    print(f"1. collect: {COLLECTORS} writer processes x {STREAMS_PER_COLLECTOR} streams play {games} random "
          f"tic-tac-toe games into {url}")
    print("   shows: processes append to one store at once, each with its own writer; a commit makes its "
          "records visible to readers")
    with mp.get_context("spawn").Pool(COLLECTORS) as pool:
        counts = pool.starmap(collect, [(url, c, 100 + c) for c in range(COLLECTORS)])
    st = open_store(url)
    played = st.sql("SELECT count(*) FILTER (WHERE reset) AS games FROM records").column("games")[0].as_py()
    print(f"   {sum(counts)} DqnBatch records committed by {len(st.writers)} writers "
          f"in {len(st.commits())} commits: {played} games, each player's last move ends an episode "
          "(2 a game)")
    print(f"   the store, as `replaystore info {url}` shows it (--verbose adds the internals):")
    for line in store_summary(st):
        print(("   | " + line).rstrip())

    stage_done()

    rng = np.random.default_rng(0)
    first, second = win_rate(None, rng)
    print(f"\n2. train: random play wins {first:.0%} moving first, {second:.0%} moving second")
    print("   shows: a PyTorch DataLoader draws prioritized minibatches from the store; TD errors update "
          "the priorities")
    online = QNet(tictactoe.OBSERVATION_SIZE, tictactoe.ACTIONS)
    target = copy.deepcopy(online)
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    sampler = PrioritizedSampler(st, batch_size=256, alpha=0.6, beta=0.4, seed=0, name="demo-per")
    loss = train(st, sampler, online, target, opt, TRAIN_STEPS, "train", progress)
    first, second = win_rate(online, rng)
    print(f"   after {TRAIN_STEPS} prioritized minibatches (loss {loss:.4f}): the Q-network wins "
          f"{first:.0%} moving first, {second:.0%} moving second")

    stage_done()
    print("\n3. stop and resume: sampler state and network weights saved into the store")
    print("   shows: training state lives in the store; the reopened run draws the minibatches the "
          "uninterrupted run would have")
    sampler.save()
    st.save_state("demo-qnet", {"steps": TRAIN_STEPS}, _net_arrays(online))
    expected = copy.deepcopy(sampler.state_dict())
    uninterrupted = PrioritizedSampler(st, 256, seed=0, name="demo-per")
    uninterrupted.load_state_dict(expected)
    next_rows = uninterrupted.sample().rows
    del sampler, online, target, opt, st

    st = open_store(url, mode="a")
    sampler = PrioritizedSampler(st, batch_size=256, alpha=0.6, beta=0.4, seed=0, name="demo-per", resume=True)
    doc, arrays = st.load_state("demo-qnet")  # type: ignore[misc]
    online = QNet(tictactoe.OBSERVATION_SIZE, tictactoe.ACTIONS)
    _load_net(online, arrays)
    target = copy.deepcopy(online)
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    probe = PrioritizedSampler(st, 256, seed=0, name="demo-per", resume=True)
    same = np.array_equal(probe.sample().rows, next_rows)
    print(f"   reopened {url}: {len(st)} records, {doc['steps']} steps done; next minibatch identical to the "
          f"uninterrupted run: {'yes' if same else 'NO'}")
    loss = train(st, sampler, online, target, opt, RESUME_STEPS, "resume", progress)
    first, second = win_rate(online, rng)
    print(f"   after {RESUME_STEPS} more minibatches (loss {loss:.4f}): wins {first:.0%} moving first, "
          f"{second:.0%} moving second")

    stage_done()
    print("\n4. DuckDB over the replay, then export:")
    print("   shows: SQL over the records where they lie (no copy), and exports other offline-RL tools load")
    print("   tails: records whose TD target does not bootstrap (each player's last move of a game: 2 a game)")
    print("   first_mover_result: the first mover's mean game result (+1 win, 0 draw, -1 loss), from its "
          "last records")
    print("   mean_legal_actions: the mean number of legal moves (the ragged legal_ids) per record")
    summary = st.sql("""
        SELECT stream, count(*) AS records, count(DISTINCT commit) AS commits,
               sum(CASE WHEN NOT can_bootstrap THEN 1 ELSE 0 END) AS tails,
               round(avg(rewards) FILTER (WHERE NOT can_bootstrap AND players = 0), 3) AS first_mover_result,
               round(avg(len(legal_ids)), 2) AS mean_legal_actions
        FROM records GROUP BY stream ORDER BY stream""")
    print(format_table(summary))
    _export(st, root, progress)
    stage_done()
    parts = ", ".join(f"{name} {sec:.0f} s" for name, sec in zip(("collect", "train", "resume", "query and export"),
                                                                  stage_times, strict=True))
    print(f"\ndone in {time.perf_counter() - started:.0f} s ({parts}); the store stays at {url}")
    return 0 if same else 1


def _export(st: Store, root: str, progress: bool) -> None:
    from replaystore.tools.export import export_store

    for fmt in ("parquet", "minari"):
        out = os.path.join(root, f"export-{fmt}")
        dataset_id = "tictactoe/random-v0" if fmt == "minari" else None
        summary = export_store(st, out, fmt, dataset_id=dataset_id, progress=progress)
        print(f"   exported to {fmt}: {summary['path']} ({summary['records']} records"
              + (f", {summary['episodes']} episodes: one ends at each of the 2 dones a game)"
                 if summary.get("episodes") else ")"))
