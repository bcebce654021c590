"""What following the commit log costs as writer sessions pile up: ``open_store`` (the newest
log checkpoint and the records after it) and ``refresh()`` with nothing new, on local disk and on S3;
and, on local disk, what a learner pays to follow a live collector's commit.

    python bench/log_bench.py            # local: 1,000 closed sessions; S3: 32 (about 3 minutes)
    python bench/log_bench.py --quick    # local: 300; S3: 16 (under a minute)
    python bench/log_bench.py --checkpoint-every 16   # log checkpoints every 16 records (default 1,024)

Each store is written by ``sessions`` writer sessions (a writer, one 4-record commit, close,
as restarted collectors do), plus ``--open`` writers that committed once and stay open (live
collectors). S3 is moto's server on 127.0.0.1 (``replaystore.tools.s3local``) behind a proxy
that delays every request by ``--latency-ms`` (default 20: a nearby region's round trip) and
counts them (``tests/support/s3proxy.py``). Moto serves requests one at a time, so requests
that a real endpoint would answer in parallel still queue here: the S3 figures are upper
bounds. No peer: TorchRL's buffers have no log to follow. Runs on any replaystore checkout
(public API only, plus ``--checkpoint-every``, which sets the log checkpoint interval where the
checkout has one), so older versions can be measured with the same script. A writer saves a
log checkpoint every 1,024 records by default: the local store (2 records per session) has
one; the S3 store reaches one only with a lower ``--checkpoint-every``.

Following a live collector (local disk): a writer in another process appends FOLLOW_COMMIT
records to its stream and commits; right after each commit the learner times ``refresh()`` and
``SequenceSampler.sample()`` (16 windows of 16 steps; the sampler brings its windows up to date).
Four stores take turns commit by commit: one with only the collector's writer; the store
above with its closed sessions (each session's records are a fragment of their own); the
same sessions between two collectors, one registered before them (it commits from the
bench's own process, just before the other), so that every refresh finds changes at both
ends of the store's fragments; and a replay capped at ``--capacity`` records that the
collector alone filled before timing began (every commit then evicts its oldest records: the
reader orders every commit's part by age again, docs/FORMAT.md "Reading a store"). The
collector commits FOLLOW_WARM times before timing begins (its tiered compaction reaches its
steady state) and ``--follow-reps`` times while timed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchkit import ACTIONS, HEADS, OBS, commit_server, dqn_records

from replaystore.loaders import SequenceSampler
from replaystore.schemas import dqn
from replaystore.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the loopback proxy
from support.s3proxy import Faults, faulty_s3, options_via  # noqa: E402

SCHEMA = dqn(OBS, HEADS, actions=ACTIONS)
FULL = {"local": 1_000, "s3": 32}
QUICK = {"local": 300, "s3": 16}
FOLLOW_COMMIT, FOLLOW_WARM, SLICE, SLICES = 1_000, 20, 16, 16


def write_sessions(url: str, options: dict[str, Any] | None, sessions: int, open_writers: int) -> list[Any]:
    """The store at ``url``: ``sessions`` closed writer sessions, then ``open_writers`` left open."""
    rng = np.random.default_rng(0)
    st = open_store(url, SCHEMA, mode="a", storage_options=options)
    for i in range(sessions):
        with st.writer() as w:
            w.append(dqn_records(rng, 4), stream=f"session-{i}")
    live = [st.writer() for _ in range(open_writers)]
    for i, w in enumerate(live):
        w.append(dqn_records(rng, 4), stream=f"live-{i}")
        w.commit()
    return live


def measure(url: str, options: dict[str, Any] | None, faults: Faults | None) -> dict[str, float]:
    opens, refreshes = [], []
    before = faults.requests if faults else 0
    for _ in range(3):
        t = time.perf_counter()
        st = open_store(url, mode="r", storage_options=options)
        opens.append(time.perf_counter() - t)
    open_requests = (faults.requests - before) / 3 if faults else float("nan")
    before = faults.requests if faults else 0
    for _ in range(10):
        t = time.perf_counter()
        st.refresh()
        refreshes.append(time.perf_counter() - t)
    return {"open_ms": 1e3 * statistics.median(opens), "refresh_ms": 1e3 * statistics.median(refreshes),
            "requests": (faults.requests - before) / 10 if faults else float("nan"), "open_requests": open_requests}


def follow(urls: list[str], reps: int, first: dict[str, Any], fill: dict[str, int]) -> list[tuple[float, float]]:
    """Per store: median ``(refresh, sample)`` seconds right after the collector's commit, and
    before it, where ``first`` has a writer for the store, that writer's commit (this process).
    ``fill``: commits made to a store before the warm-up ones."""
    batch = dqn_records(np.random.default_rng(8), FOLLOW_COMMIT)
    ours, theirs = multiprocessing.Pipe()
    collector = multiprocessing.get_context("spawn").Process(
        target=commit_server, args=(urls, dqn_records(np.random.default_rng(7), FOLLOW_COMMIT), theirs))
    collector.start()
    times: list[list[tuple[float, float]]] = [[] for _ in urls]
    try:
        def commits(url: str) -> None:
            if url in first:
                first[url].append(batch, stream="first collector")
                first[url].commit()
            ours.send((url, "collector", False))
            ours.recv()

        for url, n in fill.items():
            for _ in range(n):
                commits(url)
        for _ in range(FOLLOW_WARM):
            for url in urls:
                commits(url)
        stores = [open_store(url, mode="r") for url in urls]
        samplers = [SequenceSampler(st, length=SLICE, batch_size=SLICES, seed=0) for st in stores]
        for s in samplers:
            s.sample()
        for i in range(reps):
            for j in range(len(urls)) if i % 2 else reversed(range(len(urls))):
                commits(urls[j])
                t0 = time.perf_counter()
                stores[j].refresh()
                t1 = time.perf_counter()
                samplers[j].sample()
                times[j].append((t1 - t0, time.perf_counter() - t1))
    finally:
        ours.send(None)
        collector.join()
    return [(statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for ts in times]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sessions (under a minute)")
    ap.add_argument("--open", type=int, default=8, help="writers left open (default 8)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added to every S3 request (default 20)")
    ap.add_argument("--checkpoint-every", type=int, default=None,
                    help="records between log checkpoints (default: the library's, 1,024)")
    ap.add_argument("--follow-reps", type=int, default=31, help="timed commits per store when following (default 31)")
    ap.add_argument("--capacity", type=int, default=200_000,
                    help="records kept by the capped store followed (default 200,000)")
    args = ap.parse_args(argv)
    from replaystore.store.read import log
    if args.checkpoint_every is not None and hasattr(log, "CHECKPOINT_EVERY"):
        log.CHECKPOINT_EVERY = args.checkpoint_every
    sizes = QUICK if args.quick else FULL
    rows = []
    with tempfile.TemporaryDirectory(prefix="replaystore-log-bench-") as tmp:
        url = f"{tmp}/store"
        live = write_sessions(url, None, sizes["local"], args.open)
        rows.append(("local disk", sizes["local"], measure(url, None, None)))
        for w in live:
            w.close()
        open_store(f"{tmp}/alone", SCHEMA, mode="w").close()
        two = f"{tmp}/two"  # a collector registered before the sessions, the other after them
        first = open_store(two, SCHEMA, mode="w").writer()
        for w in write_sessions(two, None, sizes["local"], 0):
            w.close()
        capped = f"{tmp}/capped"
        open_store(capped, SCHEMA, mode="w", capacity=args.capacity).close()
        try:
            followed = follow([f"{tmp}/alone", url, two, capped], args.follow_reps, {two: first},
                              {capped: -(-args.capacity // FOLLOW_COMMIT)})
        finally:
            first.close()
    from replaystore.tools.s3local import loopback_s3

    with loopback_s3() as s3:
        url = f"s3://{s3.bucket}/log-bench"
        live = write_sessions(url, s3.storage_options, sizes["s3"], args.open)
        faults = Faults(latency_s=args.latency_ms / 1e3)
        with faulty_s3(s3.endpoint_url, faults) as endpoint:
            options = options_via(s3.storage_options, endpoint)
            rows.append((f"S3, +{args.latency_ms:.0f} ms per request", sizes["s3"], measure(url, options, faults)))
        for w in live:
            w.close()
    every = getattr(log, "CHECKPOINT_EVERY", None)
    print(f"log checkpoint every {every:,} records" if every else "no log checkpoints in this checkout")
    print("| store | closed sessions | open writers | open_store | refresh(), nothing new | requests per refresh |"
          " requests per open |")
    print("|---|---|---|---|---|---|---|")
    for name, sessions, m in rows:
        print(f"| {name} | {sessions:,} | {args.open} | {m['open_ms']:,.0f} ms | {m['refresh_ms']:,.2f} ms | "
              f"{m['requests']:.0f} | {m['open_requests']:.0f} |")
    print(f"\nfollowing a collector that commits {FOLLOW_COMMIT:,} records (another process); medians of "
          f"{args.follow_reps} commits per store, after {FOLLOW_WARM} untimed")
    print("| store | closed sessions | refresh() | SequenceSampler.sample() | both |")
    print("|---|---|---|---|---|")
    kinds = (("the collector's writer alone", 0), ("local disk above", sizes["local"]),
             ("the same + a collector registered before the sessions (both commit)", sizes["local"]),
             (f"a replay capped at {args.capacity:,} records, full (the collector alone)", 0))
    for (name, sessions), (r, smp) in zip(kinds, followed, strict=True):
        print(f"| {name} | {sessions:,} | {r * 1e3:.2f} ms | {smp * 1e3:.2f} ms | {(r + smp) * 1e3:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
