"""Learner-side scale: a DataLoader sampling from a store on S3 while a writer process keeps
appending, against the same loader on local disk.

    python bench/s3_loader_bench.py            # 200k-record stores, 3 x 10 s windows (about 3 minutes)
    python bench/s3_loader_bench.py --quick    # 50k records, 3 x 3 s windows (about a minute)
    python bench/s3_loader_bench.py --endpoint http://127.0.0.1:9000 --bucket replay   # an S3 server of yours

Without ``--endpoint`` the S3 store lives on moto's S3 server started on 127.0.0.1
(``replaystore.tools.s3local``; needs ``pip install 'moto[server]'``). For each backend
(a local directory, then S3) the bench

1. writes the same ``dqn(observation_size=64, heads=2, actions=9)`` records (10k-record commits);
2. starts a writer *process* (its own store handle and, on S3, its own s3fs client) that
   appends and commits 1,000 records every 0.25 s until the end of the measurement;
3. runs ``make_loader(st, UniformSampler(st, batch_size=256), num_workers=2,
   persistent_workers=True)``: each DataLoader worker opens the store itself (its own
   s3fs client and connection pool), the learner calls ``st.refresh()`` every 0.5 s
   so the sampler draws from the growing store, and the workers catch up on rows they
   do not see yet (``StoreDataset``);
4. reports the cold start (the first 20 minibatches: workers start, open the store and,
   on S3, download the arrays the first draws touch) and the steady rate in samples/s
   (median of the windows), how far the store grew meanwhile, the mean time of one
   ``st.refresh()`` in the learner and (loopback server only) the S3 server's CPU use
   in cores.

The same loader on the same store without the writer ("static") is measured first, to
separate the cost of following a growing store from the cost of the storage itself. On S3
the loader runs without a chunk cache (``cache=False``: each worker holds what it downloads),
then with one in a fresh directory (cold: the workers download into it), again with it warm
(a restarted run), and live without and with it; between them, one process times
``Table.read`` of 256 random rows with and without the cache. Each row also gives the largest memory of
the two workers at the end (Linux ``/proc``): ``RssAnon``, what a worker holds itself, and
``RssFile``, the file pages it maps (page cache, shared between processes and reclaimable).
Prints one row per run and the ratios S3 / local. With the loopback server, its CPU use
during the windows is printed too (cores busy serving S3 requests: on this machine they
are taken from the loader, on a real deployment they are not).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from replaystore.loaders import UniformSampler, make_loader
from replaystore.schemas import dqn
from replaystore.store import ChunkCache, open_store

OBS, HEADS, ACTIONS = 64, 2, 9
BATCH = 256
CHUNK = 10_000          # records per commit when building the store
APPEND = 1_000          # records per commit of the background writer
APPEND_PERIOD_S = 0.25  # its pace: one commit per period (at most)
REFRESH_PERIOD_S = 0.5  # the learner calls st.refresh() at most this often
COLD_BATCHES = 20

FULL = {"records": 200_000, "window_s": 10.0, "windows": 3}
QUICK = {"records": 50_000, "window_s": 3.0, "windows": 3}


def schema() -> Any:
    return dqn(observation_size=OBS, heads=HEADS, actions=ACTIONS)


def records(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """``n`` random, valid DqnBatch records (legal-id sets of 1..9 ids)."""
    def csr() -> tuple[np.ndarray, np.ndarray]:
        counts = rng.integers(1, ACTIONS + 1, size=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ids = np.concatenate([rng.permutation(ACTIONS)[:c] for c in counts]).astype(np.int64)
        return ids, offsets

    legal, legal_off = csr()
    nxt, nxt_off = csr()
    tail = rng.random(n) < 0.2
    return {
        "obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "players": rng.integers(0, 2, n).astype(np.int64),
        "actions": legal[legal_off[:-1]],
        "rewards": rng.standard_normal(n),
        "dones": tail,
        "can_bootstrap": ~tail,
        "discounts": np.where(tail, 0.0, 0.99),
        "masks": np.ones((n, HEADS), dtype=np.float32),
        "legal_ids": legal, "legal_offsets": legal_off,
        "next_legal_ids": nxt, "next_legal_offsets": nxt_off,
    }


def build(url: str, options: dict[str, Any] | None, n: int) -> float:
    """Create the store with ``n`` records in CHUNK-record commits; seconds taken."""
    t0 = time.perf_counter()
    st = open_store(url, schema(), mode="w+", storage_options=options)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for i in range(0, n, CHUNK):
            w.append(records(rng, min(CHUNK, n - i)), stream=f"actor-{i // CHUNK % 8}")
            w.commit()
    return time.perf_counter() - t0


def background_writer(url: str, options: dict[str, Any] | None, stop: Any, done: Any) -> None:
    """The writer process: APPEND records per commit every APPEND_PERIOD_S until ``stop`` is set."""
    st = open_store(url, mode="a", storage_options=options)
    rng = np.random.default_rng(1)
    commits = 0
    with st.writer() as w:
        while not stop.is_set():
            t0 = time.monotonic()
            w.append(records(rng, APPEND), stream="live")
            w.commit()
            commits += 1
            stop.wait(max(0.0, APPEND_PERIOD_S - (time.monotonic() - t0)))  # pacing, not synchronisation
    done.put(commits)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds a process has used so far (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forked_children() -> list[int]:
    """This process's children that run its own command line: the DataLoader's (forked) workers,
    not the spawned writer nor multiprocessing's helpers (Linux /proc)."""
    me = str(os.getpid())
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if ppid == me and f.read() == cmdline:
                    out.append(int(pid))
        except OSError:  # exited meanwhile
            continue
    return out


def worker_memory(pids: list[int]) -> tuple[float, float]:
    """The largest ``(RssAnon, RssFile)`` in MiB among processes ``pids`` (Linux /proc): memory a
    process holds itself, and pages of files it maps (the page cache, shared and reclaimable)."""
    anon = file = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        anon = max(anon, int(fields["RssAnon"].split()[0]) / 1024)
        file = max(file, int(fields["RssFile"].split()[0]) / 1024)
    return anon, file


def measure(url: str, options: dict[str, Any] | None, cfg: dict[str, Any], live: bool = True,
            server_pid: int | None = None, cache: Any = None) -> dict[str, Any]:
    """The loader's cold start and steady samples/s, with the writer process appending (``live``) or not.

    ``server_pid``: the loopback S3 server's process, whose CPU share during the windows is reported.
    ``cache``: ``open_store``'s (the workers use the opener's).
    """
    ctx = mp.get_context("spawn")
    stop, done = ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=background_writer, args=(url, options, stop, done), daemon=True)
    if live:
        writer.start()
    try:
        st = open_store(url, mode="r", storage_options=options, cache=cache)
        start_len = len(st)
        sampler = UniformSampler(st, batch_size=BATCH, seed=0)
        loader = make_loader(st, sampler, num_workers=2, persistent_workers=True, prefetch_factor=4)
        it = iter(loader)
        refresh_s, refreshes, last = 0.0, 0, time.perf_counter()

        def next_batch() -> dict[str, Any]:
            nonlocal refresh_s, refreshes, last
            t = time.perf_counter()
            if t - last >= REFRESH_PERIOD_S:
                st.refresh()  # the sampler now draws from the store as it is now
                last = time.perf_counter()
                refresh_s += last - t
                refreshes += 1
            return next(it)

        t0 = time.perf_counter()
        for _ in range(COLD_BATCHES):
            batch = next_batch()
        cold = time.perf_counter() - t0
        assert batch["obs"].shape == (BATCH, OBS)
        rates = []
        server0, wall0, refresh0, count0 = cpu_seconds(server_pid), time.perf_counter(), refresh_s, refreshes
        for _ in range(cfg["windows"]):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < cfg["window_s"]:
                next_batch()
                n += 1
            rates.append(n * BATCH / (time.perf_counter() - t0))
        server1, wall1 = cpu_seconds(server_pid), time.perf_counter()
        server_share = None if server0 is None or server1 is None else (server1 - server0) / (wall1 - wall0)
        refresh_ms = 1e3 * (refresh_s - refresh0) / max(refreshes - count0, 1)
        memory = worker_memory(forked_children())
        st.refresh()
        end_len = len(st)
        it = loader = None  # drops the loader's workers (next_batch's cell still refers to ``it``)
    finally:
        stop.set()
        if live:
            writer.join(timeout=60)
            if writer.is_alive():
                writer.kill()
    commits = 0
    if live:
        commits = done.get(timeout=10)
        assert writer.exitcode == 0, f"the writer process failed (exit code {writer.exitcode})"
    return {"cold_s": cold, "rate": statistics.median(rates), "rates": rates, "start": start_len, "end": end_len,
            "writer_commits": commits, "server_cpu": server_share, "refresh_ms": refresh_ms, "memory": memory}


def read_costs(url: str, options: dict[str, Any], cache: Any, reps: int = 7) -> tuple[float, float, int]:
    """In-process ``Table.read`` of 256 random rows, in us: through the chunk cache (contiguous views
    over its files) and without it (a gather per fragment), best of interleaved rounds after a
    first read of everything; and the fragment count."""
    tables = [open_store(url, mode="r", storage_options=options, cache=c).default for c in (cache, False)]
    rows = tables[0].row_ids()
    pool = [np.random.default_rng(i).choice(rows, BATCH) for i in range(64)]
    for t in tables:
        t.read(rows)
    best = [float("inf"), float("inf")]
    for _ in range(reps):
        for j, t in enumerate(tables):
            t0 = time.perf_counter()
            for p in pool:
                t.read(p)
            best[j] = min(best[j], (time.perf_counter() - t0) / len(pool) * 1e6)
    return best[0], best[1], len(tables[0].reader.fragments)


def row(name: str, r: dict[str, Any], build_s: float) -> str:
    return (f"{name:<22} {r['rate']:>12,.0f} {'/'.join(f'{x:,.0f}' for x in r['rates']):>26} {r['cold_s']:>9.2f} "
            f"{build_s:>9.1f} {r['start']:>9,} -> {r['end']:>9,} {r['writer_commits']:>8} "
            f"{r['refresh_ms']:>10.1f} {'' if r['server_cpu'] is None else format(r['server_cpu'], '.2f'):>10}"
            f" {r['memory'][0]:>9,.0f} {r['memory'][1]:>9,.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50k records, 3 s windows")
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint URL (default: moto on 127.0.0.1)")
    ap.add_argument("--bucket", default="replaystore-bench", help="bucket for --endpoint (must exist)")
    ap.add_argument("--dir", default=None, help="where to put the local store (default: system temp)")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}"
          f"; {cfg['records']:,} records of dqn(obs={OBS}, heads={HEADS}, actions={ACTIONS}); batch {BATCH}; "
          f"2 DataLoader workers; writer process: {APPEND:,} records/commit every {APPEND_PERIOD_S} s")
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        url = os.path.join(tmp, "store")
        build_s = build(url, None, cfg["records"])
        results["local static"] = (measure(url, None, cfg, live=False), build_s)
        results["local"] = (measure(url, None, cfg), build_s)

    def run_s3(s3_url: str, options: dict[str, Any], pid: int | None = None) -> None:
        build_s = build(s3_url, options, cfg["records"])
        results["s3 static, no cache"] = (measure(s3_url, options, cfg, live=False, server_pid=pid, cache=False),
                                          build_s)
        with tempfile.TemporaryDirectory(dir=args.dir) as cache_dir:
            cache = ChunkCache(cache_dir)
            results["s3 static"] = (measure(s3_url, options, cfg, live=False, server_pid=pid, cache=cache), build_s)
            cached_mib[0] = cache.size() / 2**20
            reads[:] = read_costs(s3_url, options, cache)
            results["s3 static, warm cache"] = (measure(s3_url, options, cfg, live=False, server_pid=pid,
                                                        cache=cache), build_s)
            results["s3, no cache"] = (measure(s3_url, options, cfg, server_pid=pid, cache=False), build_s)
            results["s3"] = (measure(s3_url, options, cfg, server_pid=pid, cache=cache), build_s)
            cached_mib[1] = cache.size() / 2**20

    cached_mib = [0.0, 0.0]
    reads: list[float] = []

    if args.endpoint:
        from replaystore.tools.s3local import s3_options

        run_s3(f"s3://{args.bucket}/s3-loader-bench", s3_options(args.endpoint))
    else:
        from replaystore.tools.s3local import loopback_s3

        with loopback_s3("replaystore-bench") as s3:
            run_s3(s3.url("s3-loader-bench"), s3.storage_options, s3.pid)
    print(f"{'store':<22} {'samples/s':>12} {'windows':>26} {'cold (s)':>9} {'build (s)':>9} "
          f"{'visible records start -> end':>22} {'commits':>8} {'refresh ms':>10} {'S3 server CPU':>10}"
          f" {'worker MiB held':>9} {'mapped':>9}")
    for name, (r, b) in results.items():
        print(row(name, r, b))
    for kind in ("", " static"):
        ratio = results[f"s3{kind}"][0]["rate"] / results[f"local{kind}"][0]["rate"]
        what = "no writer" if kind else "writer appending"
        print(f"ratio S3 / local, steady samples/s, {what}: {ratio:.2f}")
    print(f"chunk cache: {cached_mib[0]:,.0f} MiB after the cold static run, {cached_mib[1]:,.0f} MiB at the end")
    print(f"Table.read({BATCH} random rows) in-process, S3 store of {reads[2]} fragments: {reads[0]:.0f} us through "
          f"the cache (views over its files), {reads[1]:.0f} us without (a gather per fragment): "
          f"{reads[1] / reads[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
