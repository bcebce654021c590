"""``replaystore demo``: tic-tac-toe games from several streams into a local store, then ``info``."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from tqdm import tqdm

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.tools import tictactoe
from replaystore.tools.info import print_info

STREAMS = 4
GAMES_PER_STREAM = 250
COMMIT_EVERY = 50  # games per stream between commits


def run_demo(args: argparse.Namespace) -> int:
    root = args.dir or tempfile.mkdtemp(prefix="replaystore-demo-")
    url = os.path.join(root, "tictactoe-dqn")
    schema = dqn(tictactoe.OBSERVATION_SIZE, heads=1, actions=tictactoe.ACTIONS,
                 metadata={"env_id": "tictactoe", "action_frame": "board cell 0-8, row-major",
                           "observation": "own marks (9) then opponent marks (9)", "producer": "replaystore demo"})
    st = open_store(url, schema, mode="w+")
    print(f"1. collecting: {STREAMS} streams x {GAMES_PER_STREAM} random tic-tac-toe games -> {url}")
    rng = np.random.default_rng(0)
    results = []
    with st.writer() as w, tqdm(total=STREAMS * GAMES_PER_STREAM, unit="game", disable=not sys.stderr.isatty()) as bar:
        for g in range(GAMES_PER_STREAM):
            for s in range(STREAMS):
                records, result = tictactoe.play(tictactoe.random_policy, rng)
                w.append(records, stream=f"game-slot-{s}", reset=True)
                results.append(result)
                bar.update()
            if (g + 1) % COMMIT_EVERY == 0:
                w.commit(metadata={"games": (g + 1) * STREAMS})
    res = np.array(results)
    print(f"   {len(st)} DQN records committed; player 0 won {np.mean(res == 1):.0%}, "
          f"drew {np.mean(res == 0):.0%}, lost {np.mean(res == -1):.0%}")
    tails = st.read(st.row_ids())["can_bootstrap"]
    print(f"   {int((~tails).sum())} tail records cannot bootstrap (discount 0, empty next-legal slice)")
    print("\n2. store info:")
    print_info(open_store(url, mode="r"))
    return 0
