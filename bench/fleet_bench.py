"""Fleet benchmark: many collector processes appending into one capped replay on local disk.

    python bench/fleet_bench.py            # 16 writers, capacity 100k, 2M DQN records (~1 min on 2 cores)
    python bench/fleet_bench.py --quick    # 4 writers, capacity 20k, 200k records

Each writer process appends DQN records (``dqn(observation_size=64, heads=2, actions=9)``)
in batches of 1,000 with a commit each, to its own stream, all at once. Printed: the data
the store holds on disk while they run (peak) and after they closed (end), against what
TorchRL's ``LazyMemmapStorage`` of the same capacity holds for the same records (a ring
buffer: exactly capacity records, allocated once), and the records/s of all writers
together, into the capped store and into an unbounded one. Disk is counted in allocated
blocks (segment files are sparse), commit records and registrations left out
(docs/FORMAT.md "Capacity and reclamation").
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
from typing import Any

import numpy as np
from benchkit import ACTIONS, HEADS, OBS, Table, as_tensordict, dqn_records, main

from replaystore.schemas import dqn
from replaystore.store import open_store

BATCH = 1_000  # records per append and per commit
FULL = {"writers": 16, "capacity": 100_000, "records": 2_000_000}
QUICK = {"writers": 4, "capacity": 20_000, "records": 200_000}


def allocated(path: str, under: str = "") -> int:
    """Bytes of disk allocated to the files below ``path`` whose directory path contains ``under``."""
    total = 0
    for root, _, files in os.walk(path):
        if under not in root:
            continue
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # deleted meanwhile (a reclaimed segment)
                pass
    return total


def collector(url: str, i: int, records: int) -> None:
    batch = dqn_records(np.random.default_rng(i), BATCH)
    with open_store(url, mode="a").writer() as w:
        for _ in range(records // BATCH):
            w.append(batch, stream=i)
            w.commit()


def peer_bytes(tmp: str, capacity: int) -> int:
    """Disk TorchRL's memmap ring buffer of ``capacity`` takes once full of the same records."""
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    scratch = os.path.join(tmp, "trl")
    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch))
    td = as_tensordict(dqn_records(np.random.default_rng(0), BATCH))
    for _ in range(capacity // BATCH):
        rb.extend(td)
    return allocated(scratch)


def fleet(url: str, writers: int, records: int) -> tuple[float, int]:
    """``(seconds, peak data bytes on disk)`` of ``writers`` collector processes appending
    ``records`` in all into the store at ``url``."""
    procs = [mp.get_context("spawn").Process(target=collector, args=(url, i, records // writers))
             for i in range(writers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    peak = 0
    while any(p.is_alive() for p in procs):
        peak = max(peak, allocated(url, "/data"))
        time.sleep(0.2)  # a sampling interval, not synchronisation
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    return time.perf_counter() - t0, peak


def run(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    writers, cap, n = cfg["writers"], cfg["capacity"], cfg["records"]
    schema = dqn(OBS, HEADS, actions=ACTIONS)
    url = os.path.join(tmp, "fleet")
    st = open_store(url, schema, mode="w", capacity=cap)
    dt, peak = fleet(url, writers, n)
    st.refresh()
    assert len(st) == cap
    ref = peer_bytes(tmp, cap)
    what = f"{writers} writers, capacity {cap:,}, {n:,} records"
    out.add(f"{what}: data on disk, peak while appending", peak / 2**20, ref / 2**20, "MiB", None,
            "reference: TorchRL LazyMemmapStorage of the same capacity, full (a ring buffer)")
    out.add(f"{what}: data on disk after the writers closed", allocated(url, "/data") / 2**20, ref / 2**20, "MiB",
            None, "ours keeps up to capacity + grace (N/4) records plus partly evicted segments")
    out.add(f"{what}: append, all writers together", n / dt, None, "records/s", None,
            f"{BATCH:,} records per append + commit; process start-up included; {os.cpu_count()} cpus")
    shutil.rmtree(url)
    url = os.path.join(tmp, "unbounded")
    st = open_store(url, schema, mode="w")
    dt, _ = fleet(url, writers, n)
    st.refresh()
    assert len(st) == n
    out.add(f"{writers} writers, no capacity, {n:,} records: append, all writers together", n / dt, None,
            "records/s", None, "a commit reads no other writer's records (only a capped store's writer must)")


if __name__ == "__main__":
    sys.exit(main("fleet", __doc__, None, (FULL, QUICK), Table("TorchRL", "TorchRL"), run))
