"""Where following a commit beats redoing a reader's view: ``TableReader.sync`` either way,
by the number of fragments in the store (the crossover sets ``store.table._REDO_UP_TO``).

    python bench/sync_threshold_bench.py             # 4 to 512 closed sessions, 41 commits each (~1 min)
    python bench/sync_threshold_bench.py --quick     # 4 to 128, 15 commits

Each store holds ``n`` closed writer sessions (a writer, one 4-record commit, close: a fragment
each) and a collector's writer in this process. The collector appends 1,000 DQN records and
commits; a reader's handle (opened before, its views taken by a read) then ``refresh()``es,
timed, alternately with the reader redoing its whole view and following the change. No
peer: TorchRL has no commit log. The figure is the median ``refresh()`` per mode and size, and
the last column says which is cheaper. The store's fragments are the sessions' plus the
collector's few (its tiered compaction keeps them under ~10).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
from benchkit import ACTIONS, HEADS, OBS, dqn_records

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.read import table as table_module

SCHEMA = dqn(OBS, HEADS, actions=ACTIONS)
MODES = {"redo": 1 << 62, "follow": -1}  # values of _REDO_UP_TO that force each path


def build(path: str, sessions: int) -> None:
    """A store of ``sessions`` closed writer sessions, one 4-record fragment each."""
    small = dqn_records(np.random.default_rng(1), 4)
    st = open_store(path, SCHEMA, mode="w")
    for i in range(sessions):
        with st.writer() as w:
            w.append(small, stream=10_000 + i)
    st.close()


def follow(path: str, batch: dict[str, np.ndarray], commits: int) -> dict[str, float]:
    """Median ``refresh()`` seconds per mode after each of ``commits`` collector commits per mode."""
    collector = open_store(path, mode="a")
    reader = open_store(path, mode="r")
    times: dict[str, list[float]] = {m: [] for m in MODES}
    saved = table_module._REDO_UP_TO
    try:
        with collector.writer() as w:
            for _ in range(3):  # warm: the collector's first segment and fragments exist
                w.append(batch, stream=0)
                w.commit()
            reader.refresh()
            table = reader.table("records")
            table.read(table.rows_at(np.arange(min(len(table), 256))))
            for c in range(commits * len(MODES)):
                mode = list(MODES)[c % len(MODES)]
                w.append(batch, stream=0)
                w.commit()
                table_module._REDO_UP_TO = MODES[mode]
                t0 = time.perf_counter()
                reader.refresh()
                times[mode].append(time.perf_counter() - t0)
                table_module._REDO_UP_TO = saved
                table.read(table.rows_at(np.arange(len(table) - 256, len(table))))  # a learner reads between commits
    finally:
        table_module._REDO_UP_TO = saved
        reader.close()
        collector.close()
    return {m: statistics.median(v) for m, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 to 128 closed sessions, 15 commits each")
    args = ap.parse_args()
    sizes = [4, 16, 32, 64, 128] if args.quick else [4, 16, 24, 32, 48, 64, 128, 256, 512]
    commits = 15 if args.quick else 41
    batch = dqn_records(np.random.default_rng(0), 1_000)
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}")
    print(f"_REDO_UP_TO in this checkout: {table_module._REDO_UP_TO}")
    print("| closed sessions | refresh(), redo | refresh(), follow | cheaper |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="replaystore_sync_") as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"s{n}")
            build(path, n)
            med = follow(path, batch, commits)
            best = min(med, key=med.__getitem__)
            print(f"| {n} | {med['redo'] * 1e3:.3f} ms | {med['follow'] * 1e3:.3f} ms | {best} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
