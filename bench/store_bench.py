"""Store benchmark: replaystore against TorchRL's LazyMemmapStorage, measured in the same run.

    python bench/store_bench.py            # full sizes (~90 s on 2 cores)
    python bench/store_bench.py --quick    # smaller sizes (~20 s)
    python bench/store_bench.py --append-only   # section 1 alone (with --quick: smaller)

Prints one table: our figure, the peer's figure, the ratio (higher is better for us)
and the target. What is measured (docs/PERFORMANCE.md has the details):

1. append: DqnBatch-shaped records (obs/next_obs 64 float32, 2 heads, 9 actions, CSR
   legal ids) appended in batches of 1,000 with a durable commit (fsync) every 10,000
   records (the writer's compaction runs on its background thread; the time includes
   close(), which waits for it), vs ``ReplayBuffer(LazyMemmapStorage).extend`` of the same records as a
   TensorDict (legal ids as dense ``(9,)`` bool masks: memmap storage has no ragged
   columns). Data is pregenerated outside the timed region. TorchRL does not fsync. The same
   with pipelined commits (``commit(wait=False)``: appends go on while a commit's files are
   synced; each commit is durable once the next one returns), against TorchRL made durable
   the same way (every file of its storage fsynced every 10,000 records), with records keyed
   per record by episode (a new stream every 20-400 records, as collectors that key by episode append),
   with 5x the records (1M: the disk's sustained write rate then counts for ours), and into a
   capped replay keeping a quarter of the records (ours evicts and reclaims storage by
   segment; TorchRL's ring buffer overwrites in place).
2. read: 256 random rows (every field) from a 1M-record store, sampling included, on the
   store as that writer leaves it, after ``Writer.compact()``, and written as one commit:
   ``Table.read(Table.rows_at(rng.integers(0, len, 256)))`` vs
   ``ReplayBuffer(LazyMemmapStorage, RandomSampler, batch_size=256).sample()``.
3. open + first read of a 10M-record store (page cache dropped, then warm), the one-time
   (stream, step) index build, and ``Table.lookup`` cost at 100k vs 10M records (no TorchRL
   equivalent).

Extra rows: the disk's durable-write ceiling (each commit's bytes as one file + fsync), the
read on a one-fragment copy of the store, and ours + ``torch.from_numpy``. TorchRL runs on
torch's default thread count and on one thread; the better figure is its figure.

TorchRL is a bench-only peer: ``pip install torchrl tensordict`` (keep torch==2.13.0).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from benchkit import (
    ACTIONS,
    HEADS,
    OBS,
    Table,
    append_all,
    as_tensordict,
    build_transitions,
    dqn_records,
    du,
    episode_keys,
    interleaved,
    main,
    store_append_rate,
)

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.read.table import TableReader

BATCH = 1_000
COMMIT_EVERY = 10_000
SAMPLE = 256

FULL = {"append": 200_000, "append_long": 1_000_000, "append_reps": 3, "read": 1_000_000, "big": 10_000_000,
        "small": 100_000, "warm_s": 2.0, "rep_s": 1.0, "reps": 5, "lookups": 20_000}
QUICK = {"append": 50_000, "append_long": 250_000, "append_reps": 3, "read": 200_000, "big": 1_000_000,
         "small": 100_000, "warm_s": 0.5, "rep_s": 0.3, "reps": 3, "lookups": 5_000}


# -- helpers ------------------------------------------------------------------------------------
def drop_cache(path: str) -> None:
    """Evict a directory's (clean, fsynced) file pages from the page cache: a cold open."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# -- benchmarks -----------------------------------------------------------------------------------
def bench_append(tmp: str, cfg: dict[str, Any], batches: list[dict[str, np.ndarray]], tds: list[Any],
                 out: Table) -> None:
    import torch
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    n = cfg["append"]
    schema = dqn(OBS, HEADS, actions=ACTIONS)

    capped = n // 4  # the capped rows: a replay keeping the newest quarter of what is appended

    keys = episode_keys(n, BATCH)  # records keyed by episode (a new stream every 20-400 records)

    def ours(i: int, capacity: int | None = None, by_episode: bool = False, wait: bool = True,
             records: int = n) -> float:
        return store_append_rate(os.path.join(tmp, f"append{i}"), schema, batches, records, COMMIT_EVERY, capacity,
                                 keys if by_episode else None, wait)

    def peer(i: int, threads: int, capacity: int | None = None, records: int = n, durable: bool = False) -> float:
        """TorchRL's rows/s; ``durable``: every file and directory of its storage fsynced every
        COMMIT_EVERY records (on 8 threads, as ours), which makes its records durable as our commits do."""
        torch.set_num_threads(threads)
        scratch = os.path.join(tmp, f"trl_append{i}_{threads}")
        rb = ReplayBuffer(storage=LazyMemmapStorage(capacity or records, scratch_dir=scratch), batch_size=SAMPLE)
        fds: list[int] = []
        t0 = time.perf_counter()
        for j in range(records // BATCH):
            rb.extend(tds[j % len(tds)])
            if durable and (j + 1) * BATCH % COMMIT_EVERY == 0:
                if not fds:  # its files exist from the first extend on
                    paths = [scratch] + [os.path.join(d, name) for d, dirs, files in os.walk(scratch)
                                         for name in [*files, *dirs]]
                    fds = [os.open(path, os.O_RDONLY) for path in paths]
                list(pool.map(os.fsync, fds))
        dt = time.perf_counter() - t0
        for fd in fds:
            os.close(fd)
        assert len(rb) == (capacity or records)
        del rb
        shutil.rmtree(scratch)
        return records / dt

    def floor(i: int) -> float:
        """The disk's durable-write ceiling: each commit's bytes as one file, written + fsynced."""
        per_commit = COMMIT_EVERY // BATCH
        blobs = [b"".join(np.ascontiguousarray(a).tobytes() for a in batches[j % len(batches)].values())
                 for j in range(per_commit)]
        payload = b"".join(blobs)
        folder = os.path.join(tmp, f"floor{i}")
        os.makedirs(folder)
        t0 = time.perf_counter()
        for c in range(n // COMMIT_EVERY):
            with open(os.path.join(folder, str(c)), "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            fd = os.open(folder, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        dt = time.perf_counter() - t0
        shutil.rmtree(folder)
        return n / dt

    # TorchRL copies into its memmaps on torch's intra-op threads; on a busy 2-core machine that
    # can collapse (OpenMP waits on a descheduled thread), so it also runs with one thread and
    # gets the better median (conservative for us).
    default = torch.get_num_threads()
    o, p, p1, f, oc, pc, pc1, oe, op = [], [], [], [], [], [], [], [], []
    ol, pl, pl1, pd, pd1 = [], [], [], [], []
    pool = ThreadPoolExecutor(8)
    try:
        for i in range(cfg["append_reps"]):
            o.append(ours(i))
            op.append(ours(i, wait=False))
            oe.append(ours(i, by_episode=True))
            p.append(peer(i, default))
            p1.append(peer(i, 1))
            pd.append(peer(i, default, durable=True))
            pd1.append(peer(i, 1, durable=True))
            f.append(floor(i))
            oc.append(ours(i, capped))
            pc.append(peer(i, default, capped))
            pc1.append(peer(i, 1, capped))
        long_n = cfg["append_long"]  # the same, longer: one-time costs (a writer's first segment) spread
        for i in range(cfg["append_reps"]):
            ol.append(ours(i, records=long_n))
            pl.append(peer(i, default, records=long_n))
            pl1.append(peer(i, 1, records=long_n))
    finally:
        torch.set_num_threads(default)
        pool.shutdown()
    med = statistics.median
    peer_best = max(med(p), med(p1))
    out.add(f"append {n:,} rows, batches of {BATCH:,}, commit every {COMMIT_EVERY:,}", med(o), peer_best,
            "rows/s", 1.0, f"median of {cfg['append_reps']}; ours fsyncs every commit, TorchRL never; peer: "
            f"better of {default} torch threads ({med(p):,.0f}) and 1 ({med(p1):,.0f})")
    out.add("  the same, commits pipelined (commit(wait=False))", med(op), peer_best, "rows/s", None,
            "each commit durable and visible by the time the next returns; close() waits for the last")
    out.add("  the same keyed by episode (a stream key per record)", med(oe), peer_best, "rows/s", None,
            f"{len(np.unique(np.concatenate([k for k, _ in keys]))):,} episodes of 20-400 records, a reset at "
            "each start; TorchRL has no streams (same peer figure)")
    out.add(f"  against TorchRL made durable: its files fsynced every {COMMIT_EVERY:,}", med(o), max(med(pd), med(pd1)),
            "rows/s", None, f"the peer's records durable as ours are at each commit (8 fsync threads, as ours); "
            f"better of {default} threads ({med(pd):,.0f}) and 1 ({med(pd1):,.0f})")
    out.add("  disk ceiling: each commit's bytes as 1 file + fsync", med(f), peer_best,
            "rows/s", None, "no format, no index: the durable-write floor of this disk")
    out.add(f"  the synced append, {long_n:,} rows", med(ol), max(med(pl), med(pl1)), "rows/s", None,
            f"median of {cfg['append_reps']}; 5x the records: one-time costs (the writer's first segment, the "
            f"peer's first allocation) spread, and the disk's sustained write rate counts for ours (the peer's "
            f"writes stay in the page cache); peer: better of {default} threads ({med(pl):,.0f}) and 1 "
            f"({med(pl1):,.0f})")
    out.add(f"  the synced append into a capped replay (capacity {capped:,})", med(oc), max(med(pc), med(pc1)),
            "rows/s", None, f"ours evicts and reclaims storage; TorchRL's ring buffer overwrites (better of {default} "
            f"threads {med(pc):,.0f} and 1 {med(pc1):,.0f})")


def build_read_stores(tmp: str, cfg: dict[str, Any], batches: list[dict[str, np.ndarray]], tds: list[Any],
                      out: Table) -> tuple[Any, Any, Any, Any]:
    import torch
    from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer

    n = cfg["read"]
    schema = dqn(OBS, HEADS, actions=ACTIONS)
    # (a) as collectors write it: batches of 1k, a commit every 10k (tiered compaction runs)
    path = os.path.join(tmp, "read10k")
    st = open_store(path, schema, mode="w")
    t0 = time.perf_counter()
    with st.writer() as w:
        append_all(w, batches, n, COMMIT_EVERY)
    ours_build = n / (time.perf_counter() - t0)
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(tmp, "trl_read")),
                      sampler=RandomSampler(), batch_size=SAMPLE)
    default = torch.get_num_threads()
    torch.set_num_threads(1)  # see bench_append: one thread is never the slow case here
    t0 = time.perf_counter()
    for j in range(n // BATCH):
        rb.extend(tds[j % len(tds)])
    peer_build = n / (time.perf_counter() - t0)
    torch.set_num_threads(default)
    frags = st.table("records").reader.fragments
    live = sum(du(os.path.join(path, group)) for group in {f.path for f in frags})  # a segment once
    out.add(f"append {n:,} rows (building the read store)", ours_build, peer_build, "rows/s", None,
            f"peer on 1 torch thread; {len(frags)} fragments, {live / 2**20:,.0f} MiB live "
            f"({du(path) / 2**20:,.0f} MiB on disk "
            "incl. compaction inputs in their 30 s trash grace)")
    # (c) the same again, then Writer.compact() before close: what a finished dataset can look like
    pathc = os.path.join(tmp, "read10kc")
    stc = open_store(pathc, schema, mode="w")
    with stc.writer() as w:
        append_all(w, batches, n, COMMIT_EVERY)
        t0 = time.perf_counter()
        merges = w.compact()
        compact_s = time.perf_counter() - t0
    out.add(f"Writer.compact() of that {n:,}-row store", compact_s, None, "s", None,
            f"{merges} merges -> {len(stc.table('records').reader.fragments)} fragment(s); rewrites every record "
            "not yet in a full-size fragment once")
    # (b) the same records written as one commit: one fragment
    path1 = os.path.join(tmp, "read1")
    st1 = open_store(path1, schema, mode="w")
    with st1.writer() as w:
        append_all(w, batches, n, None)
    assert len(st) == len(st1) == len(stc) == len(rb) == n
    return open_store(path, mode="r"), open_store(path1, mode="r"), open_store(pathc, mode="r"), rb


def bench_read(cfg: dict[str, Any], st: Any, st1: Any, stc: Any, rb: Any, out: Table) -> None:
    import torch

    rng = np.random.default_rng(1)
    tab, tab1, tabc = st.table("records"), st1.table("records"), stc.table("records")
    n = len(tab)
    frags, fragsc = len(tab.reader.fragments), len(tabc.reader.fragments)

    def ours() -> dict[str, np.ndarray]:
        return tab.read(tab.rows_at(rng.integers(0, n, SAMPLE)))

    def ours1() -> dict[str, np.ndarray]:
        return tab1.read(tab1.rows_at(rng.integers(0, n, SAMPLE)))

    def oursc() -> dict[str, np.ndarray]:
        return tabc.read(tabc.rows_at(rng.integers(0, n, SAMPLE)))

    def ours_torch() -> dict[str, Any]:
        return {k: torch.from_numpy(v) for k, v in ours().items()}

    # the same committed view, gathering fragment by fragment (the read path before contiguous views)
    r0 = tab.reader
    flat = TableReader(r0.storage, r0.log, r0.name, r0.schema, r0.capacity, contiguous=False)

    def ours_flat() -> dict[str, np.ndarray]:
        return flat.read(flat.rows_at(rng.integers(0, n, SAMPLE)))

    def peer() -> Any:
        return rb.sample()

    # sanity: every field present, same count
    b = ours()
    assert len(b["obs"]) == SAMPLE and len(b["legal_offsets"]) == SAMPLE + 1
    assert rb.sample().batch_size[0] == SAMPLE
    # TorchRL's memmap indexing runs on torch's intra-op threads; on a busy 2-core machine one
    # thread can be faster, so the peer gets the better of both (conservative for us).
    r = interleaved({"ours": (ours, None), "ours1": (ours1, None), "oursc": (oursc, None),
                     "ours_torch": (ours_torch, None), "ours_flat": (ours_flat, None),
                     "peer": (peer, None), "peer_1t": (peer, 1)}, cfg, agg=statistics.median)
    threads = torch.get_num_threads()
    print(f"  .. TorchRL sample(): {r['peer']:,.0f} batches/s with {threads} torch threads, "
          f"{r['peer_1t']:,.0f} with 1; using the better", flush=True)
    peer_note = f"peer: better of {threads} torch threads ({r['peer']:,.0f}) and 1 ({r['peer_1t']:,.0f})"
    r["peer"] = max(r["peer"], r["peer_1t"])
    out.add(f"read {SAMPLE} random rows, {n:,}-row store ({frags} fragments, 10k commits)", r["ours"], r["peer"],
            "batches/s", 2.0, f"all fields; sampling included; {peer_note}")
    out.add(f"read {SAMPLE} random rows, {n:,}-row store ({fragsc} fragment(s), 10k commits + compact())",
            r["oursc"], r["peer"], "batches/s", 2.0, "same records, the writer called compact() before close")
    out.add(f"read {SAMPLE} random rows, {n:,}-row store (1 fragment)", r["ours1"], r["peer"], "batches/s", 2.0,
            "same records, one commit")
    out.add("  same, 10k-commit store, + torch.from_numpy per field", r["ours_torch"], r["peer"], "batches/s",
            None, "tensor output, as the peer returns")
    out.add("  same, 10k-commit store, contiguous views off (a gather per fragment)", r["ours_flat"], r["peer"],
            "batches/s", None, "TableReader(contiguous=False): the read path on memory:// and S3")


def bench_open_lookup(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    big, small = cfg["big"], cfg["small"]
    rng = np.random.default_rng(3)
    stats: dict[int, dict[str, float]] = {}
    for records in (small, big):
        path = os.path.join(tmp, f"tr{records}")
        build_s = build_transitions(path, records)
        s: dict[str, float] = {"build": build_s, "bytes": du(path)}
        for cold in (True, False):
            if cold:
                drop_cache(path)
            t0 = time.perf_counter()
            st = open_store(path, mode="r")
            tab = st.table("records")
            n = len(tab)
            t1 = time.perf_counter()
            tab.read(tab.rows_at(rng.integers(0, n, SAMPLE)))
            t2 = time.perf_counter()
            streams = tab.streams()  # builds the (stream, step) index
            t3 = time.perf_counter()
            key = "cold" if cold else "warm"
            s[f"open_{key}"], s[f"read_{key}"], s[f"index_{key}"] = t1 - t0, t2 - t1, t3 - t2
            if cold:
                del st, tab, streams  # the warm pass starts from nothing held in memory
        per = n // len(streams)
        qs = rng.integers(0, len(streams), cfg["lookups"])
        qt = rng.integers(0, per, cfg["lookups"])
        t0 = time.perf_counter()
        for g, step in zip(qs.tolist(), qt.tolist(), strict=True):
            tab.lookup(streams[g], step)
        s["lookup"] = (time.perf_counter() - t0) / cfg["lookups"]
        got = tab.lookup(streams[0], np.arange(per))
        assert np.all(got >= 0) and len(np.unique(got)) == per
        steps256 = [rng.integers(0, per, SAMPLE) for _ in range(200)]
        t0 = time.perf_counter()
        for i, st_ in enumerate(steps256):
            tab.lookup(streams[i % len(streams)], st_)
        s["lookup256"] = (time.perf_counter() - t0) / len(steps256)
        stats[records] = s
        shutil.rmtree(path)
    b, sm = stats[big], stats[small]
    out.add(f"build {big:,}-row transitions store (1M-row commits)", big / b["build"], None, "rows/s", None,
            f"{b['bytes'] / 2**20:,.0f} MiB on disk")
    for key, what in (("cold", "page cache dropped"), ("warm", "page cache warm")):
        out.add(f"open {big:,}-row store ({what})", b[f"open_{key}"] * 1e3, None, "ms", None,
                f"{small:,} rows: {sm[f'open_{key}'] * 1e3:.3g} ms")
        out.add(f"first read of {SAMPLE} rows after open ({what})", b[f"read_{key}"] * 1e3, None, "ms", None,
                f"{small:,} rows: {sm[f'read_{key}'] * 1e3:.3g} ms")
        out.add(f"index build: first streams() after open ({what})", b[f"index_{key}"] * 1e3, None, "ms", None,
                f"{small:,} rows: {sm[f'index_{key}'] * 1e3:.3g} ms")
    out.add(f"lookup(stream, step), one step, {big:,} rows", b["lookup"] * 1e6, None, "us/call", None,
            f"{small:,} rows: {sm['lookup'] * 1e6:.3g} us; {big // small}x rows -> "
            f"{b['lookup'] / sm['lookup']:.2f}x time")
    out.add(f"lookup(stream, {SAMPLE} steps), {big:,} rows", b["lookup256"] * 1e6, None, "us/call", None,
            f"{small:,} rows: {sm['lookup256'] * 1e6:.3g} us; ratio {b['lookup256'] / sm['lookup256']:.2f}x")


def run(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    rng = np.random.default_rng(0)
    batches = [dqn_records(rng, BATCH) for _ in range(32)]
    tds = [as_tensordict(b) for b in batches]
    bench_append(tmp, cfg, batches, tds, out)
    st, st1, stc, rb = build_read_stores(tmp, cfg, batches, tds, out)
    bench_read(cfg, st, st1, stc, rb, out)
    del st, st1, stc, rb
    bench_open_lookup(tmp, cfg, out)


def run_append(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    rng = np.random.default_rng(0)
    batches = [dqn_records(rng, BATCH) for _ in range(32)]
    bench_append(tmp, cfg, batches, [as_tensordict(b) for b in batches], out)


if __name__ == "__main__":
    args = sys.argv[1:]
    append_only = "--append-only" in args
    args = [a for a in args if a != "--append-only"]
    sys.exit(main("store", __doc__, args, (FULL, QUICK), Table("TorchRL", "peer"), run_append if append_only else run))
