"""Loader benchmark: replaystore samplers + gather against TorchRL and numpy, measured in the same run.

    python bench/loader_bench.py            # full sizes (a few minutes on 2 cores)
    python bench/loader_bench.py --quick    # smaller sizes (< 1 minute)

Prints one table: our figure, the reference figure, the ratio and the target.
What is measured (docs/PERFORMANCE.md, "Loaders", has the details):

1. uniform: 256 records, every field of ``dqn(observation_size=64, heads=2, actions=9)``,
   from a 1M-record store: ``UniformSampler.sample()`` + ``gather(table, request)`` (the
   work a DataLoader does per minibatch with ``num_workers=0``: numpy -> torch tensors)
   vs ``ReplayBuffer(LazyMemmapStorage, RandomSampler(), batch_size=256).sample()`` on
   the same records (CSR legal ids as dense ``(9,)`` bool masks: the peer has no ragged
   columns). The store is written as collectors write it (10k-record commits, so several
   fragments); the same records written in one commit (one fragment) are shown as
   information (sections 1 and 2), with breakdown rows: ``sample()`` alone and ``Table.read`` alone (the
   store's read path, store/read/table.py).
2. sequences, 16 windows x 16 steps: ``SequenceSampler(length=16, burn_in=0,
   batch_size=16)`` sample + gather vs ``ReplayBuffer(LazyMemmapStorage,
   SliceSampler(slice_len=16, traj_key="episode"), batch_size=256).sample()``. The
   same records are laid out as episodes of 20..400 steps; each episode is one stream
   (starting with a reset) in our store and one contiguous trajectory in TorchRL's, so
   both draw from the same set of legal windows. TorchRL with ``cache_values=True``
   (only valid for static data) is shown as information.
3. prioritized: ``PrioritizedSampler`` ``sample()`` + ``update()`` of 256 over the 1M
   records (the priority work), against a plain numpy reference (``Generator.choice``
   with ``p`` over all records + writing 256 priorities back) and against the gather of
   the same minibatch (target: the priority work costs less than the gather); the full
   sample + gather + update next to uniform sample + gather. (TorchRL's
   PrioritizedSampler needs a C++ extension that does not load here.)
4. scale: every sampler (uniform, epoch, sequence, prioritized, reservoir, and uniform
   with ``subset=`` every 10th row id) at 10M records vs at 100k records,
   ``transitions(obs 4)`` stores built with 1M-record commits: the sampling alone
   (prioritized: sample + update; epoch: amortised over whole passes, the pass start
   included), target 10M <= 1.5x 100k; and sample + gather, shown as information next to a
   control: the same gather done by numpy ``take`` from in-RAM arrays. Random rows of a
   10M-record table lie beyond the CPU caches and TLB (each row a DRAM access and a page
   walk per column); the control shows what that costs any code (docs/PERFORMANCE.md,
   "The gather at 10M records is bound by memory").
   The one-time cost of the first ``sample()`` (index, windows, tree, reservoir) is
   shown as information.
   4b. the same stores kept growing: a writer in another process (a collector) commits
   LIVE_COMMIT records before every minibatch, so each ``sample()`` first follows a change of
   the store (the sampler's incremental bookkeeping); the two sizes take turns; median of
   15, 10M vs 100k, target 1.5x as above (the reader's maps faulted in first, as in section 4).
5. DataLoader end to end: ``make_loader(st, UniformSampler, num_workers=2)`` vs
   ``num_workers=0`` on the 1M-record store, and epoch passes over 50,000 of its records
   with 2 workers kept across passes (the default) vs restarted every pass (information).

Timing: the best of several interleaved windows after a warm-up (this runs on shared
2-core machines, where other processes only ever add time; ours and the peer's figures
get the same treatment). Every memory map (ours and TorchRL's) is faulted in by one
sequential pass first. TorchRL's indexing runs on torch's intra-op threads; on a busy
machine one thread can be faster, so the peer gets the better of both (conservative for
us). TorchRL is a bench-only peer: ``pip install torchrl tensordict`` (keep
torch==2.13.0).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
from benchkit import (
    ACTIONS,
    HEADS,
    OBS,
    Table,
    as_tensordict,
    build_transitions,
    commit_server,
    dqn_records,
    du,
    episodes_of,
    interleaved,
    main,
    rate,
    transitions_records,
)

from replaystore.loaders import (
    EpochSampler,
    PrioritizedSampler,
    ReservoirSampler,
    SequenceSampler,
    UniformSampler,
    gather,
    make_loader,
)
from replaystore.schemas import dqn
from replaystore.store import open_store

CHUNK = 10_000             # records per append and per commit when building the 1M-record store
SAMPLE = 256               # records per minibatch
SLICE, SLICES = 16, 16     # sequence windows: SLICES windows of SLICE steps
RESERVOIR = 100_000        # ReservoirSampler capacity in the scale test
POOL = 512                 # pre-drawn minibatches cycled where a measurement replays requests
EPOCH_ROWS = 50_000        # records of section 5's epoch passes
SAMPLERS = ("uniform", "uniform subset", "epoch", "sequence", "prioritized", "reservoir")
SUBSET_EVERY = 10          # "uniform subset": subset= every 10th row id (as a SQL query might return)
LIVE_COMMIT = 1_000        # records per commit arriving between minibatches in the live scale test

FULL = {"read": 1_000_000, "big": 10_000_000, "small": 100_000, "warm_s": 1.0, "rep_s": 0.5, "reps": 5,
        "scale_reps": 5, "loader_s": 3.0, "live_reps": 15}
QUICK = {"read": 200_000, "big": 1_000_000, "small": 100_000, "warm_s": 0.2, "rep_s": 0.15, "reps": 3,
         "scale_reps": 2, "loader_s": 0.7, "live_reps": 3}


# -- helpers ------------------------------------------------------------------------------------
def prefault(table: Any = None, rb: Any = None, step: int = 1_000_000) -> None:
    """Touch every page of a table's memory maps (or a TorchRL buffer's) with one sequential pass,
    so that the timed windows measure the steady state, not first-touch page faults."""
    if table is not None:
        n = len(table)
        for lo in range(0, n, step):
            table.read(table.rows_at(np.arange(lo, min(n, lo + step))))
    if rb is not None:
        import torch
        for lo in range(0, len(rb), step):
            rb.storage.get(torch.arange(lo, min(len(rb), lo + step)))


# -- the 1M-record DQN store, ours and TorchRL's ------------------------------------------------------
def build_read_stores(tmp: str, cfg: dict[str, Any], out: Table) -> tuple[Any, Any, Any, Any]:
    """``(our store, the same in one fragment, TorchRL uniform buffer, TorchRL slice buffer)``.

    Appended as collectors do: CHUNK records per append and a commit each (tiered
    compaction runs); every episode is one stream of ours starting with a reset, and one
    contiguous trajectory (its ``episode`` id) in TorchRL's slice buffer.
    """
    import torch
    from torchrl.data import (
        LazyMemmapStorage,
        RandomSampler,
        ReplayBuffer,
        SliceSampler,
    )

    n = cfg["read"]
    rng = np.random.default_rng(0)
    pool = [dqn_records(rng, CHUNK) for _ in range(4)]
    tds = [as_tensordict(b) for b in pool]
    path = os.path.join(tmp, "dqn")
    st = open_store(path, dqn(OBS, HEADS, actions=ACTIONS), mode="w")
    rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(tmp, "trl_uniform")),
                      sampler=RandomSampler(), batch_size=SAMPLE)
    rbs = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=os.path.join(tmp, "trl_slice")),
                       sampler=SliceSampler(slice_len=SLICE, traj_key="episode"), batch_size=SLICE * SLICES)
    t_ours = t_peer = 0.0
    first = 0
    eps = []
    with st.writer() as w:
        for j in range(n // CHUNK):
            ep = episodes_of(rng, CHUNK, first)
            eps.append(ep)
            first = int(ep[-1]) + 1
            t0 = time.perf_counter()
            w.append(pool[j % len(pool)], stream=ep, reset=True)
            w.commit()
            t1 = time.perf_counter()
            rb.extend(tds[j % len(tds)])
            td = tds[j % len(tds)].clone(recurse=False)
            td["episode"] = torch.from_numpy(ep)
            rbs.extend(td)
            t_ours, t_peer = t_ours + t1 - t0, t_peer + time.perf_counter() - t1
    assert len(st) == len(rb) == len(rbs) == n
    # (b) the same records, streams and steps written in one commit: one fragment
    path1 = os.path.join(tmp, "dqn1")
    st1 = open_store(path1, dqn(OBS, HEADS, actions=ACTIONS), mode="w")
    with st1.writer() as w:
        for j in range(n // CHUNK):
            w.append(pool[j % len(pool)], stream=eps[j], reset=True)
    assert len(st1) == n
    st, st1 = open_store(path, mode="r"), open_store(path1, mode="r")
    tab = st.table("records")
    prefault(st1.table("records"))
    out.add(f"build: append {n:,} DQN records ({CHUNK:,} per append + commit)", n / t_ours, 2 * n / t_peer,
            "rows/s", None, f"{first:,} episodes (= streams); {du(path) / 2**20:,.0f} MiB, "
            f"{len(tab.reader.fragments)} fragments; ours fsyncs each commit; TorchRL extends both buffers")
    prefault(tab)
    prefault(rb=rb)
    prefault(rb=rbs)
    return st, st1, rb, rbs


def bench_uniform(cfg: dict[str, Any], st: Any, st1: Any, rb: Any, out: Table) -> dict[str, float]:
    import torch

    tab = st.table("records")
    n = len(tab)
    s = UniformSampler(st, batch_size=SAMPLE, seed=0)
    # pre-drawn row sets, cycled: a fixed set would be served from the CPU caches
    pool = [tab.rows_at(p) for p in np.random.default_rng(1).integers(0, n, (POOL, SAMPLE))]
    k = [0]

    def ours() -> Any:
        return gather(tab, s.sample())

    def read() -> Any:
        k[0] = (k[0] + 1) % POOL
        return tab.read(pool[k[0]])

    tab1 = st1.table("records")
    s1 = UniformSampler(st1, batch_size=SAMPLE, seed=0)

    def ours1() -> Any:
        return gather(tab1, s1.sample())

    # the same read with the numpy CSR index: a second handle whose first ragged read has the kernels off
    tab_np = open_store(st.url, mode="r").table("records")
    with mock.patch.dict(os.environ, {"REPLAYSTORE_NUMBA": "0"}):
        prefault(tab_np)
    assert tab_np.reader._csr is None

    def read_np() -> Any:
        k[0] = (k[0] + 1) % POOL
        return tab_np.read(pool[k[0]])

    b = ours()
    assert b["obs"].shape == (SAMPLE, OBS) and len(b["legal_offsets"]) == SAMPLE + 1 and b["indices"].shape == (SAMPLE,)
    assert rb.sample().batch_size[0] == SAMPLE
    r = interleaved({"ours": (ours, None), "ours1": (ours1, None), "sample": (s.sample, None), "read": (read, None),
                     "read_np": (read_np, None), "peer": (rb.sample, None), "peer_1t": (rb.sample, 1)}, cfg)
    print(f"  .. TorchRL sample(): {r['peer']:,.0f} batches/s with {torch.get_num_threads()} torch threads, "
          f"{r['peer_1t']:,.0f} with 1; using the better", flush=True)
    r["peer"] = max(r["peer"], r["peer_1t"])
    frags = len(tab.reader.fragments)
    out.add(f"1. uniform {SAMPLE} from {n:,} DQN records: sample()+gather() vs TorchRL RandomSampler",
            r["ours"], r["peer"], "batches/s", (">=", 2.0), f"all fields, tensors out; {frags} fragments")
    out.add("   same records written in one commit (1 fragment)", r["ours1"], r["peer"], "batches/s", None,
            "information: the store's read path vs fragment count")
    out.add("   breakdown: UniformSampler.sample() alone", r["sample"], r["ours"], "batches/s", None,
            f"reference: sample()+gather(); {1e6 / r['sample']:.0f} of {1e6 / r['ours']:.0f} us")
    out.add("   breakdown: Table.read(256 rows) alone (store/read/table.py)", r["read"], r["ours"], "batches/s", None,
            f"reference: sample()+gather(); {1e6 / r['read']:.0f} of {1e6 / r['ours']:.0f} us")
    csr = "numba" if tab.reader._csr is not None else "numpy (no numba, or REPLAYSTORE_NUMBA=0)"
    out.add("   Table.read: this CSR index vs the numpy one (REPLAYSTORE_NUMBA=0)", r["read"], r["read_np"],
            "batches/s", None,
            f"{1e6 / r['read']:.0f} vs {1e6 / r['read_np']:.0f} us; CSR index: {csr} (store/read/csrkernels.py)")
    return r


def bench_sequence(cfg: dict[str, Any], st: Any, st1: Any, rbs: Any, out: Table) -> None:
    import torch
    from torchrl.data import LazyMemmapStorage, ReplayBuffer, SliceSampler

    tab = st.table("records")
    s = SequenceSampler(st, length=SLICE, burn_in=0, batch_size=SLICES, seed=0)

    def ours() -> Any:
        return gather(tab, s.sample())

    tab1 = st1.table("records")
    s1 = SequenceSampler(st1, length=SLICE, burn_in=0, batch_size=SLICES, seed=0)

    def ours1() -> Any:
        return gather(tab1, s1.sample())

    b = ours()
    assert b["obs"].shape == (SLICES, SLICE, OBS) and bool(b["sequence_valid"].all())
    assert ours1()["obs"].shape == (SLICES, SLICE, OBS)
    assert len(b["stream_keys"]) == SLICES and bool((b["steps"].diff(dim=1) == 1).all())
    p = rbs.sample()
    assert p.batch_size[0] == SLICE * SLICES and bool((p["episode"].view(SLICES, SLICE).diff(dim=1) == 0).all())
    # the same storage, sampled by a SliceSampler that caches the trajectory boundaries (static data only)
    cached = ReplayBuffer(storage=rbs.storage, sampler=SliceSampler(slice_len=SLICE, traj_key="episode",
                                                                    cache_values=True),
                          batch_size=SLICE * SLICES) if isinstance(rbs.storage, LazyMemmapStorage) else None
    fns = {"ours": (ours, None), "ours1": (ours1, None), "sample": (s.sample, None), "peer": (rbs.sample, None),
           "peer_1t": (rbs.sample, 1)}
    if cached is not None:
        cached.sample()
        fns["cached"] = (cached.sample, None)
        fns["cached_1t"] = (cached.sample, 1)
    r = interleaved(fns, cfg)
    print(f"  .. TorchRL SliceSampler: {r['peer']:,.0f} batches/s with {torch.get_num_threads()} torch threads, "
          f"{r['peer_1t']:,.0f} with 1; using the better", flush=True)
    r["peer"] = max(r["peer"], r["peer_1t"])
    n = len(tab)
    out.add(f"2. sequences {SLICES}x{SLICE} steps, {n:,} records: sample()+gather() vs TorchRL SliceSampler",
            r["ours"], r["peer"], "batches/s", (">=", 10.0),
            f"traj_key='episode'; {len(tab.streams()):,} episodes; {len(tab.reader.fragments)} fragments")
    out.add("   same records written in one commit (1 fragment)", r["ours1"], r["peer"], "batches/s", None,
            "information: the store's read path vs fragment count")
    if cached is not None:
        r["cached"] = max(r["cached"], r["cached_1t"])
        out.add("   same vs TorchRL SliceSampler(cache_values=True)", r["ours"], r["cached"], "batches/s", None,
                "information: caching is only valid for static data")
    out.add("   breakdown: SequenceSampler.sample() alone", r["sample"], r["ours"], "batches/s", None,
            "reference: sample()+gather()")


def bench_prioritized(cfg: dict[str, Any], st: Any, uniform: dict[str, float], out: Table) -> None:
    tab = st.table("records")
    n = len(tab)
    s = PrioritizedSampler(st, batch_size=SAMPLE, alpha=0.6, beta=0.4, seed=0)
    prng = np.random.default_rng(2)
    td_errors = [prng.exponential(1.0, SAMPLE) for _ in range(64)]
    k = [0]

    def errors() -> np.ndarray:
        k[0] = (k[0] + 1) % len(td_errors)
        return td_errors[k[0]]

    def work() -> None:
        req = s.sample()
        s.update(req.rows, errors())

    # the same sampler with the numpy tree (the tree picks its kernels when it grows, at the first sample)
    with mock.patch.dict(os.environ, {"REPLAYSTORE_NUMBA": "0"}):
        s_np = PrioritizedSampler(st, batch_size=SAMPLE, alpha=0.6, beta=0.4, seed=0)
        s_np.sample()

    def work_np() -> None:
        req = s_np.sample()
        s_np.update(req.rows, errors())

    def step() -> Any:
        req = s.sample()
        b = gather(tab, req)
        s.update(b["indices"], errors())
        return b

    requests = [s.sample() for _ in range(POOL)]

    def gather_only() -> Any:
        k[0] = (k[0] + 1) % len(requests)
        return gather(tab, requests[k[0]])

    # plain numpy: p^alpha over every record, Generator.choice with p (O(n) per draw), 256 written back
    w = np.ones(n)
    rng = np.random.default_rng(3)

    def numpy_ref() -> None:
        idx = rng.choice(n, SAMPLE, p=w / w.sum())
        w[idx] = (np.abs(errors()) + 1e-6) ** 0.6

    for _ in range(3):
        work()
    b = step()
    assert b["weights"].shape == (SAMPLE,) and float(b["weights"].max()) == 1.0
    r = interleaved({"work": (work, None), "step": (step, None), "gather": (gather_only, None),
                     "numpy": (numpy_ref, None), "sample": (s.sample, None), "work_np": (work_np, None)}, cfg)
    kernels = "numba kernels" if s.tree._kernels is not None else "numpy (no numba, or REPLAYSTORE_NUMBA=0)"
    out.add(f"3. prioritized {SAMPLE} over {n:,}: sample()+update() vs numpy choice(p=...)", r["work"], r["numpy"],
            "batches/s", None, "priority work only; numpy reference is O(n) per draw")
    out.add("   priority work (sample+update) vs gather of the same 256 rows", r["work"], r["gather"], "batches/s",
            (">=", 1.0), f"{1e6 / r['work']:.0f} us vs {1e6 / r['gather']:.0f} us: the priority work must cost less; "
            f"tree: {kernels}")
    out.add("   priority work (sample+update): this tree vs the numpy tree (REPLAYSTORE_NUMBA=0)", r["work"],
            r["work_np"], "batches/s", None, f"{1e6 / r['work']:.0f} vs {1e6 / r['work_np']:.0f} us; the draws are the "
            "same bit for bit (loaders/treekernels.py)")
    out.add("   prioritized sample+gather+update vs uniform sample+gather", r["step"], uniform["ours"], "batches/s",
            None, f"sample() alone {1e6 / r['sample']:.0f} us; uniform measured in section 1")


# -- scale: 100k vs 10M records ------------------------------------------------------------------
def make_sampler(kind: str, st: Any) -> Any:
    if kind == "uniform":
        return UniformSampler(st, batch_size=SAMPLE, seed=0)
    if kind == "uniform subset":
        return UniformSampler(st, batch_size=SAMPLE, seed=0, subset=st.table("records").row_ids()[::SUBSET_EVERY])
    if kind == "epoch":
        return EpochSampler(st, batch_size=SAMPLE, seed=0)
    if kind == "sequence":
        return SequenceSampler(st, length=SLICE, burn_in=0, batch_size=SLICES, seed=0)
    if kind == "prioritized":
        return PrioritizedSampler(st, batch_size=SAMPLE, alpha=0.6, beta=0.4, seed=0)
    return ReservoirSampler(st, capacity=RESERVOIR, batch_size=SAMPLE, seed=0)


def scale_fns(kind: str, st: Any) -> tuple[Callable[[], Any], Callable[[], Any], int, float]:
    """``(sample fn, sample+gather fn, batches per call, first-sample seconds)`` for one sampler."""
    tab = st.table("records")
    t0 = time.perf_counter()
    s = make_sampler(kind, st)
    s.sample()
    setup = time.perf_counter() - t0
    prng = np.random.default_rng(4)
    errs = prng.exponential(1.0, SAMPLE)
    if kind == "prioritized":
        def one() -> None:
            req = s.sample()
            s.update(req.rows, errs)

        def one_g() -> None:
            req = s.sample()
            b = gather(tab, req)
            s.update(b["indices"], errs)
        return one, one_g, 1, setup
    if kind == "epoch":
        # whole passes, so every call pays exactly one pass start (the permutation of all records)
        per_pass = -(-len(tab) // SAMPLE)
        while s._remaining():  # finish the pass in progress
            s.sample()

        def passes() -> None:
            for _ in range(per_pass):
                s.sample()

        def passes_g() -> None:
            for _ in range(per_pass):
                gather(tab, s.sample())
        return passes, passes_g, per_pass, setup
    return s.sample, (lambda: gather(tab, s.sample())), 1, setup


def bench_scale(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    small, big = cfg["small"], cfg["big"]
    stores: dict[int, Any] = {}
    paths: dict[int, str] = {}
    for records in (small, big):
        path = paths[records] = os.path.join(tmp, f"tr{records}")
        build_s = build_transitions(path, records, reset=True)  # each commit starts an episode per stream
        st = stores[records] = open_store(path, mode="r")
        prefault(st.table("records"))
        print(f"  .. built {records:,}-record transitions(obs 4) store in {build_s:.1f} s, "
              f"{du(path) / 2**20:,.0f} MiB, {len(st.table('records').reader.fragments)} fragments", flush=True)
    setups: dict[str, tuple[float, float]] = {}
    for kind in SAMPLERS:
        fs, fb = scale_fns(kind, stores[small]), scale_fns(kind, stores[big])
        setups[kind] = (fs[3], fb[3])
        # both sizes interleaved in one measurement, so machine noise hits them alike
        r = interleaved({"s": (fs[0], None), "b": (fb[0], None), "sg": (fs[1], None), "bg": (fb[1], None)}, cfg,
                        reps=cfg["scale_reps"])
        us = {k: 1e6 / v / (fs[2] if k in ("s", "sg") else fb[2]) for k, v in r.items()}
        what = {"prioritized": "sample()+update()", "epoch": "sample(), whole passes"}.get(kind, "sample()")
        out.add(f"4. {kind}: {what} at {big:,} vs {small:,}", us["b"], us["s"], "us/batch", ("<=", 1.5),
                "ratio = big / small")
        out.add(f"4. {kind}: {what.split(',')[0]}+gather at {big:,} vs {small:,}", us["bg"], us["sg"], "us/batch",
                None, "ratio = big / small; information: the gather is bound by memory (see the control)")
    # control: the same gather done by plain numpy from in-RAM arrays (no store, no sampler), to
    # separate what the memory hierarchy costs at 10M (data far beyond the CPU caches) from ours
    rng = np.random.default_rng(5)
    cols = {size: {"obs": np.ones((size, 4), np.float32), "action": np.ones(size, np.int64),  # ones: real pages
                   "reward": np.ones(size, np.float32), "next_obs": np.ones((size, 4), np.float32),
                   "terminated": np.ones(size, bool)} for size in (small, big)}

    def take(size: int) -> Any:
        idx = rng.integers(0, size, SAMPLE)
        return {k: a.take(idx, axis=0) for k, a in cols[size].items()}

    # and the store's read of random rows spread over all fragments vs inside the first one
    tab = stores[big].table("records")
    first = len(tab.reader.fragments) and int(tab.reader.fragments[0].rows)

    def read_all() -> Any:
        return tab.read(tab.rows_at(rng.integers(0, big, SAMPLE)))

    def read_one() -> Any:
        return tab.read(tab.rows_at(rng.integers(0, first, SAMPLE)))

    r = interleaved({"s": (lambda: take(small), None), "b": (lambda: take(big), None), "all": (read_all, None),
                     "one": (read_one, None)}, cfg, reps=cfg["scale_reps"])
    out.add(f"   control: numpy take of {SAMPLE} random rows from RAM arrays, {big:,} vs {small:,}", 1e6 / r["b"],
            1e6 / r["s"], "us/batch", None, "same 5 columns; no store: what the memory hierarchy costs")
    out.add(f"   control: Table.read of {SAMPLE} random rows of {big:,}: all {len(tab.reader.fragments)} fragments vs "
            f"first ({first:,} rows)", 1e6 / r["all"], 1e6 / r["one"], "us/batch", None,
            "the store's per-fragment read cost (store/read/table.py)")
    for kind, (s_small, s_big) in setups.items():
        out.add(f"   first sample() of a new {kind} sampler, {big:,} vs {small:,}", s_big * 1e3, s_small * 1e3, "ms",
                None, "one-time O(n) work (information)")
    del stores
    bench_live(cfg, paths, out)


def live_costs(cfg: dict[str, Any], paths: list[str], kind: str) -> list[tuple[float, float, float]]:
    """Per store of ``paths``: median seconds of ``(refresh, sample, sample+gather)`` right after
    another process's writer committed LIVE_COMMIT records (the commit is not timed; a new commit
    before each minibatch; the stores take turns, so machine noise hits them alike).
    The reader's maps are faulted in first, as in section 4: a learner that has run a while has
    touched its pages (a fresh reader's first random reads at 10M records pay a page fault per
    page touched, ~0.7 ms per minibatch here, which is not what following a commit costs)."""
    stores, tabs, samplers = [], [], []
    for path in paths:
        st = open_store(path, mode="r")
        stores.append(st)
        tabs.append(st.table("records"))
        prefault(tabs[-1])
        samplers.append(make_sampler(kind, st))
        samplers[-1].sample()
    errs = np.random.default_rng(6).exponential(1.0, SAMPLE)
    times: list[list[tuple[float, float, float]]] = [[] for _ in paths]
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    writer = multiprocessing.get_context("spawn").Process(  # the collector: LIVE_COMMIT records a commit
        target=commit_server, args=(paths, transitions_records(np.random.default_rng(7), LIVE_COMMIT), theirs))
    writer.start()
    try:
        for i in range(cfg["live_reps"]):
            for j in (range(len(paths)) if i % 2 else reversed(range(len(paths)))):
                ours.send((paths[j], 1000 + i, True))  # a new stream each time
                ours.recv()
                tab, s = tabs[j], samplers[j]
                t0 = time.perf_counter()
                stores[j].refresh()
                t1 = time.perf_counter()
                req = s.sample()
                t2 = time.perf_counter()
                gather(tab, req)
                times[j].append((t1 - t0, t2 - t1, time.perf_counter() - t1))
                if kind == "prioritized":
                    s.update(req.rows, errs)
    finally:
        ours.send(None)
        writer.join()
    return [tuple(float(np.median([t[k] for t in ts])) for k in range(3)) for ts in times]  # type: ignore[misc]


def bench_live(cfg: dict[str, Any], paths: dict[int, str], out: Table) -> None:
    """Sample cost when the store keeps growing: a commit from another process's writer arrives
    before every minibatch (the sampler's incremental bookkeeping, not a static table)."""
    small, big = sorted(paths)
    refresh: dict[int, list[float]] = {small: [], big: []}
    for kind in SAMPLERS:
        cs, cb = live_costs(cfg, [paths[small], paths[big]], kind)
        refresh[small].append(cs[0])
        refresh[big].append(cb[0])
        out.add(f"4b. {kind}: sample() after a {LIVE_COMMIT:,}-record commit, {big:,} vs {small:,}", cb[1] * 1e6,
                cs[1] * 1e6, "us/batch", ("<=", 1.5), f"median of {cfg['live_reps']}; ratio = big / small")
        out.add(f"4b. {kind}: sample()+gather after a commit, {big:,} vs {small:,}", cb[2] * 1e6, cs[2] * 1e6,
                "us/batch", None, "ratio = big / small; information, as in section 4")
    out.add(f"   store.refresh() after a {LIVE_COMMIT:,}-record commit, {big:,} vs {small:,}",
            float(np.median(refresh[big])) * 1e6, float(np.median(refresh[small])) * 1e6, "us", None,
            "the store's log refresh (not timed above; information)")


# -- DataLoader end to end -----------------------------------------------------------------------
def loader_rate(cfg: dict[str, Any], st: Any, workers: int) -> float:
    """Batches/s out of ``make_loader(UniformSampler)``, after the workers started and warmed up."""
    loader = make_loader(st, UniformSampler(st, batch_size=SAMPLE, seed=0), num_workers=workers)
    it = iter(loader)
    for _ in range(20):
        next(it)
    return max(rate(lambda: next(it), cfg["loader_s"] / 3) for _ in range(3))


def epoch_pass_seconds(st: Any, persistent: bool, context: str, rows: np.ndarray, passes: int = 3) -> float:
    """Median seconds of an epoch pass over ``rows`` through ``make_loader(num_workers=2)`` with
    workers started by ``context``, the first pass (the workers' first start) left out."""
    loader = make_loader(st, EpochSampler(st, batch_size=SAMPLE, seed=0, subset=rows), num_workers=2,
                         persistent_workers=persistent, multiprocessing_context=context)
    times = []
    for _ in range(passes + 1):
        t0 = time.perf_counter()
        for _ in loader:
            pass
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def bench_loader(cfg: dict[str, Any], st: Any, out: Table) -> None:
    rates = {workers: loader_rate(cfg, st, workers) for workers in (0, 2)}
    out.add(f"5. DataLoader, uniform {SAMPLE}: make_loader num_workers=2 vs 0", rates[2], rates[0], "batches/s",
            None, f"information; {os.cpu_count()} cpus; workers open the store themselves")
    rows = st.table("records").row_ids()[:EPOCH_ROWS]
    for context, note in (("fork", "forked workers inherit what this process loaded (numba too)"),
                          ("spawn", "a restart starts Python, torch, numba")):
        kept, restarted = (epoch_pass_seconds(st, persistent, context, rows) for persistent in (True, False))
        out.add(f"   epoch passes over {len(rows):,} records, 2 {context} workers: kept (default) vs restarted", kept,
                restarted, "s/pass", None, f"information; persistent_workers=True vs False; {note}")


def run(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    st, st1, rb, rbs = build_read_stores(tmp, cfg, out)
    uniform = bench_uniform(cfg, st, st1, rb, out)
    bench_sequence(cfg, st, st1, rbs, out)
    del st1, rb, rbs
    bench_prioritized(cfg, st, uniform, out)
    bench_scale(tmp, cfg, out)
    bench_loader(cfg, st, out)


if __name__ == "__main__":
    sys.exit(main("loader", __doc__, None, (FULL, QUICK), Table("reference", "reference"), run))
