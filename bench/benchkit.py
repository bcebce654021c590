"""What the benchmark scripts share: the DQN test records, timing, the result table and ``main``.

Not a benchmark itself (tools/bench.py runs only ``bench/*_bench.py``); the scripts import it
as ``benchkit`` because ``python bench/x_bench.py`` puts ``bench/`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from replaystore.schemas import transitions
from replaystore.store import open_store

OBS, HEADS, ACTIONS = 64, 2, 9
EPISODE = (20, 400)  # episode lengths (uniform), in steps, where records are keyed by episode


# -- data ------------------------------------------------------------------------------------
def _csr(rng: np.random.Generator, n: int, empty: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted random legal-id sets (1..ACTIONS per record; none where ``empty``), vectorised."""
    counts = rng.integers(1, ACTIONS + 1, n)
    if empty is not None:
        counts[empty] = 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    perm = np.argsort(rng.random((n, ACTIONS)), axis=1)
    keep = np.arange(ACTIONS)[None, :] < counts[:, None]
    ids = np.sort(np.where(keep, perm, ACTIONS), axis=1)
    return ids[keep].astype(np.int64), offsets


def dqn_records(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A DqnBatch of ``n`` records as the producer emits it (cf. tests/support/batches.py)."""
    tail = rng.random(n) < 0.2
    legal, legal_off = _csr(rng, n)
    nxt, nxt_off = _csr(rng, n, empty=tail)
    return {
        "obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "players": rng.integers(0, 2, n).astype(np.int64),
        "actions": legal[legal_off[:-1] + rng.integers(0, np.diff(legal_off))],
        "rewards": rng.standard_normal(n),
        "dones": tail & (rng.random(n) < 0.7),
        "can_bootstrap": ~tail,
        "discounts": np.where(tail, 0.0, 0.99 ** rng.integers(1, 4, n)),
        "masks": rng.integers(0, 2, (n, HEADS)).astype(np.float32),
        "legal_ids": legal, "legal_offsets": legal_off,
        "next_legal_ids": nxt, "next_legal_offsets": nxt_off,
    }


def _mask(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """CSR legal ids as a dense ``(n, ACTIONS)`` bool mask."""
    n = len(offsets) - 1
    mask = np.zeros((n, ACTIONS), dtype=bool)
    mask[np.repeat(np.arange(n), np.diff(offsets)), ids] = True
    return mask


def as_tensordict(b: dict[str, np.ndarray], episode: np.ndarray | None = None) -> Any:
    """The same records for TorchRL: dense fields as tensors, CSR legal ids as dense bool masks,
    plus an ``episode`` column when given."""
    import torch
    from tensordict import TensorDict

    n = len(b["obs"])
    fields = {k: torch.from_numpy(v) for k, v in b.items() if "legal" not in k}
    fields["legal_mask"] = torch.from_numpy(_mask(b["legal_ids"], b["legal_offsets"]))
    fields["next_legal_mask"] = torch.from_numpy(_mask(b["next_legal_ids"], b["next_legal_offsets"]))
    if episode is not None:
        fields["episode"] = torch.from_numpy(episode)
    return TensorDict(fields, batch_size=[n])


def transitions_records(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """``n`` records of ``transitions(4, actions=3)`` (1% terminated)."""
    return {"obs": rng.standard_normal((n, 4), dtype=np.float32),
            "action": rng.integers(0, 3, n).astype(np.int64),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
            "terminated": rng.random(n) < 0.01}


def build_transitions(path: str, records: int, streams: int = 16, reset: bool = False) -> float:
    """A transitions(obs 4) store built with 1M-record commits of ``streams`` streams (each
    commit starting an episode per stream if ``reset``); seconds taken."""
    per_commit = min(records, 1_000_000)
    per_stream = per_commit // streams
    b = transitions_records(np.random.default_rng(2), per_stream)
    st = open_store(path, transitions(4, actions=3), mode="w")
    t0 = time.perf_counter()
    with st.writer() as w:
        for _ in range(records // per_commit):
            for s in range(streams):
                w.append(b, stream=s, reset=reset)
            w.commit()
    assert len(st) == records
    return time.perf_counter() - t0


def episodes_of(rng: np.random.Generator, n: int, first: int) -> np.ndarray:
    """Per-record episode ids for ``n`` consecutive records: whole episodes of EPISODE steps
    (the last one cut at ``n``), numbered from ``first``."""
    lens = rng.integers(EPISODE[0], EPISODE[1] + 1, n // EPISODE[0] + 1)
    return (first + np.repeat(np.arange(len(lens)), lens)[:n]).astype(np.int64)


EpisodeKeys = list[tuple[np.ndarray, np.ndarray]]


def episode_keys(n: int, size: int, seed: int = 0) -> EpisodeKeys:
    """Per batch of ``size`` records, ``(episode ids, resets)`` for ``n`` records keyed by episode,
    as a collector appends them: episodes run on across batches, a reset marks each one's start."""
    ep = episodes_of(np.random.default_rng(seed), n, 0)
    resets = np.r_[True, ep[1:] != ep[:-1]]
    return [(ep[lo:lo + size], resets[lo:lo + size]) for lo in range(0, n, size)]


# -- timing ----------------------------------------------------------------------------------
def append_all(w: Any, batches: list[dict[str, np.ndarray]], n: int, commit_every: int | None,
               keys: EpisodeKeys | None = None, wait: bool = True) -> None:
    """``n`` records from ``batches`` (cycled, all of one size) through writer ``w``, over 8 streams
    or, with ``keys`` (:func:`episode_keys`), keyed per record by episode; a commit every
    ``commit_every`` records (None: at close), pipelined with ``wait=False``."""
    size = len(batches[0]["obs"])
    for j in range(n // size):
        if keys is None:
            w.append(batches[j % len(batches)], stream=j % 8)
        else:
            w.append(batches[j % len(batches)], stream=keys[j][0], reset=keys[j][1])
        if commit_every and (j + 1) * size % commit_every == 0:
            w.commit(wait=wait)


def commit_server(paths: list[str], batch: dict[str, np.ndarray], conn: Any) -> None:
    """A collector in its own process (the target of a spawned ``multiprocessing.Process``): on
    ``(path, stream, reset)`` it appends ``batch`` to that stream of the store at ``path``,
    commits, and answers once the commit returned; None stops it."""
    writers = {path: open_store(path, mode="a").writer() for path in paths}
    try:
        while (msg := conn.recv()) is not None:
            path, stream, reset = msg
            writers[path].append(batch, stream=stream, reset=reset)
            writers[path].commit()
            conn.send(path)
    finally:
        for w in writers.values():
            w.close()


def store_append_rate(path: str, schema: Any, batches: list[dict[str, np.ndarray]], n: int,
                      commit_every: int, capacity: int | None = None, keys: EpisodeKeys | None = None,
                      wait: bool = True) -> float:
    """Records/s of :func:`append_all` into a new store at ``path`` (the writer's close, which waits
    for its last commit and merge, included); the store is deleted afterwards."""
    st = open_store(path, schema, mode="w", capacity=capacity)
    t0 = time.perf_counter()
    with st.writer() as w:
        append_all(w, batches, n, commit_every, keys, wait)
    dt = time.perf_counter() - t0
    assert len(st) == min(n, capacity or n)
    shutil.rmtree(path)
    return n / dt


def rate(fn: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (at least one call)."""
    k, t0 = 0, time.perf_counter()
    while True:
        fn()
        k += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return k / dt


def interleaved(fns: dict[str, tuple[Callable[[], Any], int | None]], cfg: dict[str, Any],
                reps: int | None = None, agg: Callable[[list[float]], float] = max) -> dict[str, float]:
    """``agg`` (default: the best) of each ``(fn, torch threads)``'s calls/s over ``reps``
    (default ``cfg["reps"]``) interleaved windows of ``cfg["rep_s"]``, after a ``cfg["warm_s"]`` warm-up.

    The best window suits a shared machine, where other processes only ever add time, and
    every function compared gets the same treatment."""
    import torch

    default = torch.get_num_threads()
    try:
        for fn, threads in fns.values():
            torch.set_num_threads(threads or default)
            rate(fn, cfg["warm_s"])
        runs: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps or cfg["reps"]):
            for k, (fn, threads) in fns.items():
                torch.set_num_threads(threads or default)
                runs[k].append(rate(fn, cfg["rep_s"]))
    finally:
        torch.set_num_threads(default)
    return {k: agg(v) for k, v in runs.items()}


def du(path: str) -> int:
    """Bytes allocated to every file below ``path`` (as ``du``: a segment's chunk files are
    created at their full size, sparse, and hold blocks only where records were written)."""
    return sum(os.stat(os.path.join(r, f)).st_blocks * 512 for r, _, fs in os.walk(path) for f in fs)


# -- output ----------------------------------------------------------------------------------
class Table:
    """Rows of the result table, each echoed as a progress line when added.

    ``ref`` names the reference column, ``label`` the reference in progress lines; a row's
    ``target`` is a minimum ratio or ``(">=" | "<=", ratio)``."""

    def __init__(self, ref: str, label: str) -> None:
        self.ref, self.label = ref, label
        self.rows: list[tuple[str, ...]] = []

    def add(self, what: str, ours: float | None, ref: float | None, unit: str,
            target: float | tuple[str, float] | None = None, note: str = "") -> None:
        def fmt(x: float | None) -> str:
            if x is None:
                return "-"
            return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"
        if isinstance(target, int | float):
            target = (">=", float(target))
        ratio = ours / ref if ours is not None and ref else None
        met = "-"
        if target is not None and ratio is not None:
            met = "yes" if (ratio >= target[1] if target[0] == ">=" else ratio <= target[1]) else "NO"
        self.rows.append((what, fmt(ours), fmt(ref), unit, "-" if ratio is None else f"{ratio:.2f}x",
                          "-" if target is None else f"{target[0]} {target[1]:g}x", met, note))
        print(f"  .. {what}: ours {fmt(ours)}, {self.label} {fmt(ref)} {unit}"
              + (f", ratio {ratio:.2f}x" if ratio is not None else "") + (f" ({note})" if note else ""),
              flush=True)

    def print(self) -> None:
        head = ("benchmark", "ours", self.ref, "unit", "ratio", "target", "met", "notes")
        rows = [head, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

        def line(r: list[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

        print(line(head))
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for r in self.rows:
            print(line(r))


def _numba() -> str:
    """numba's version (the compiled kernels of the sum tree and the CSR gather), or "not installed"."""
    try:
        import numba
    except ImportError:
        return "not installed"
    return numba.__version__


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(name: str, doc: str, argv: list[str] | None, sizes: tuple[dict[str, Any], dict[str, Any]],
         out: Table, body: Callable[[str, dict[str, Any], Table], None]) -> int:
    """A benchmark script's ``main``: parse ``--quick``/``--dir``, check the TorchRL peer, print the
    machine and versions, run ``body(tmp dir, sizes, out)`` in a fresh temporary directory
    (``replaystore-<name>-bench-``, removed afterwards), then print ``out``. ``sizes`` is ``(full, quick)``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (< 1 minute)")
    ap.add_argument("--dir", default=None, help="where to put the temporary stores (default: system temp)")
    args = ap.parse_args(argv)
    cfg = sizes[1] if args.quick else sizes[0]
    try:
        import tensordict
        import torch
        import torchrl
    except ImportError as exc:
        print(f"{name}_bench: needs the TorchRL peer ({exc}); pip install torchrl tensordict", file=sys.stderr)
        return 2
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    print(f"# {'quick' if args.quick else 'full'} run: {os.cpu_count()} cpus ({cpu}), Python "
          f"{platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, torchrl "
          f"{torchrl.__version__}, tensordict {tensordict.__version__}, numba {_numba()}; load average {_load()}",
          flush=True)
    tmp = tempfile.mkdtemp(prefix=f"replaystore-{name}-bench-", dir=args.dir)
    t_start = time.perf_counter()
    try:
        body(tmp, cfg, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.perf_counter() - t_start:.0f} s; load average now {_load()}")
    out.print()
    return 0
