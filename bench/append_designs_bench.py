"""Append design ceilings: what a durable commit every 10k records can cost, by object layout.

    python bench/append_designs_bench.py            # 200k records (~30 s on 2 cores)
    python bench/append_designs_bench.py --quick    # 50k records

The append target compares a durable commit every 10k records with TorchRL's
``LazyMemmapStorage.extend``; the store measured ~0.2x with a fragment per commit and 0.65-0.73x with
the open segments of format 2, which the store now uses on local disk (docs/PERFORMANCE.md,
"Append design floors"). This bench measures the *floor* of the layouts, with no format
code, no validation and no index: the same bytes per commit as the store writes for DQN records (13 columns + the
3 stream/step/reset arrays), each commit made durable and then published by a commit
record created as the store creates it (temporary file, fsync, ``link``, directory
fsync). Rows, each against the peer in the same run:

- ours: the store itself (``Writer.append`` + ``commit``), as in bench/store_bench.py;
- fragment per commit: a new directory tree per commit, one file per array in its own
  directories, plus each array's metadata file (format 1, and format 2 on object storage:
  a Zarr group per commit);
- chunk per commit: one new file per array per commit in directories that exist (an
  open segment whose arrays gain one chunk object per commit);
- in-place segment: each array's file of an open segment extended in place and
  ``fdatasync``ed (committed bytes never rewritten; format 2 on local disk);
- the same as the writer fills it: a ``pwrite`` per array at each append of 1,000 records,
  write-back started on a thread every ``WRITEBACK_BYTES`` written, the ``fdatasync``s at
  each commit (what the store's open segment does, without validation, checksums, the log
  or the index);
- one file per commit: every column of the commit in a single object (not one Zarr
  array per column).

File fsyncs run on a pool of 8 threads, as the store does. TorchRL does not fsync. The
store's row notes where one more run of it spends its time on the appending thread:
``Schema.validate`` (and its value checks: finiteness, id ranges), the segment's writes
(``Segment.add``), creating the writer's first segment (later ones are made ahead on its I/O
threads), the rest of ``Writer.append``, and ``Writer.commit`` (and in it, the wait for the
fsyncs and the commit record, and showing the commit through the writer's store handle).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from benchkit import ACTIONS, HEADS, OBS, Table, as_tensordict, dqn_records, main, store_append_rate

from replaystore.schemas import Schema, dqn
from replaystore.schemas import validate as validate_module
from replaystore.store.format.fragment import INDEX_DTYPES
from replaystore.store.format.segment import WRITEBACK, WRITEBACK_BYTES, Segment
from replaystore.store.storage import LocalStorage
from replaystore.store.write.committer import Committer
from replaystore.store.write.segmentpool import SegmentPool
from replaystore.store.write.writer import Writer

BATCH = 1_000
COMMIT_EVERY = 10_000
FULL = {"records": 200_000, "reps": 5}
QUICK = {"records": 50_000, "reps": 3}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit_record(root: str, seq: int) -> None:
    """Create ``commits/<seq>.json`` the way the store does: temporary file, fsync, link, dir fsync."""
    final = os.path.join(root, "commits", f"{seq:010d}.json")
    tmp = os.path.join(root, "commits", f".tmp-{seq}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b'{"body": {"seq": %d}, "crc32c": 0}' % seq)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(tmp, final)
    _fsync_dir(os.path.dirname(final))
    os.unlink(tmp)


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_payloads(batches: list[dict[str, np.ndarray]]) -> list[list[bytes]]:
    """Per commit, the bytes of each of its 16 arrays (fields + stream codes, steps, resets)."""
    per_commit = COMMIT_EVERY // BATCH
    out = []
    for c in range(len(batches) // per_commit):
        group = batches[c * per_commit:(c + 1) * per_commit]
        cols = [b"".join(np.ascontiguousarray(b[k]).tobytes() for b in group) for k in group[0]]
        rows = sum(len(b["obs"]) for b in group)
        cols += [np.zeros(rows, np.int32).tobytes(), np.arange(rows, dtype=np.int64).tobytes(),
                 np.zeros(rows, bool).tobytes()]
        out.append(cols)
    return out


def append_arrays(batches: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Per append, its 16 arrays (fields + stream codes, steps, resets) as the store writes them."""
    index = [np.zeros(BATCH, dtype=d) for d in INDEX_DTYPES.values()]
    return [[np.ascontiguousarray(a) for a in b.values()] + index for b in batches]


class Designs:
    """The layouts, each writing ``commits`` (cycled) ``n // COMMIT_EVERY`` times under ``root``
    (the segment as filled: ``appends``, cycled, ``n // BATCH`` times)."""

    def __init__(self, root: str, commits: list[list[bytes]], appends: list[list[np.ndarray]], n: int) -> None:
        self.root, self.commits, self.appends, self.count = root, commits, appends, n // COMMIT_EVERY
        self.pool = ThreadPoolExecutor(8)
        self.arrays = len(commits[0])

    def _fresh(self) -> str:
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, "commits"))
        return self.root

    def _timed(self, body: Callable[[int], None]) -> float:
        t0 = time.perf_counter()
        for c in range(self.count):
            body(c)
            _commit_record(self.root, c)
        return self.count * COMMIT_EVERY / (time.perf_counter() - t0)

    def fragment_per_commit(self) -> float:
        root = self._fresh()

        def body(c: int) -> None:
            cols = self.commits[c % len(self.commits)]
            frag = os.path.join(root, "data", f"f{c:010d}")
            dirs = [os.path.join(frag, f"a{a}", "c") for a in range(self.arrays)]
            for d in dirs:
                os.makedirs(d)

            def one(a: int) -> None:
                _write_new(os.path.join(dirs[a], "0"), cols[a])
                _write_new(os.path.join(frag, f"a{a}", "zarr.json"), b"{}" * 200)
            list(self.pool.map(one, range(self.arrays)))
            list(self.pool.map(_fsync_dir, [*dirs, *(os.path.dirname(d) for d in dirs), frag,
                                            os.path.dirname(frag)]))
        return self._timed(body)

    def chunk_per_commit(self) -> float:
        root = self._fresh()
        dirs = [os.path.join(root, f"a{a}", "c") for a in range(self.arrays)]
        for d in dirs:
            os.makedirs(d)

        def body(c: int) -> None:
            cols = self.commits[c % len(self.commits)]

            def one(a: int) -> None:
                _write_new(os.path.join(dirs[a], str(c)), cols[a])
                _fsync_dir(dirs[a])
            list(self.pool.map(one, range(self.arrays)))
        return self._timed(body)

    def in_place_segment(self) -> float:
        root = self._fresh()
        fds = [os.open(os.path.join(root, f"a{a}"), os.O_WRONLY | os.O_CREAT, 0o644) for a in range(self.arrays)]
        _fsync_dir(root)
        offsets = [0] * self.arrays

        def body(c: int) -> None:
            cols = self.commits[c % len(self.commits)]

            def one(a: int) -> None:
                os.pwrite(fds[a], cols[a], offsets[a])
                os.fdatasync(fds[a])
            list(self.pool.map(one, range(self.arrays)))
            for a in range(self.arrays):
                offsets[a] += len(cols[a])
        try:
            return self._timed(body)
        finally:
            for fd in fds:
                os.close(fd)

    def segment_as_filled(self) -> float:
        root = self._fresh()
        fds = [os.open(os.path.join(root, f"a{a}"), os.O_WRONLY | os.O_CREAT, 0o644) for a in range(self.arrays)]
        _fsync_dir(root)
        offsets, started = [0] * self.arrays, [0] * self.arrays
        per_commit = COMMIT_EVERY // BATCH

        def body(c: int) -> None:
            for j in range(c * per_commit, (c + 1) * per_commit):
                for a, arr in enumerate(self.appends[j % len(self.appends)]):
                    os.pwrite(fds[a], arr, offsets[a])
                    offsets[a] += arr.nbytes
                    if offsets[a] - started[a] >= WRITEBACK_BYTES:
                        WRITEBACK.start(fds[a], started[a], offsets[a] - started[a])
                        started[a] = offsets[a]
            list(self.pool.map(os.fdatasync, fds))
        try:
            return self._timed(body)
        finally:
            for fd in fds:
                os.close(fd)

    def one_file_per_commit(self) -> float:
        root = self._fresh()
        data = os.path.join(root, "data")
        os.makedirs(data)

        def body(c: int) -> None:
            _write_new(os.path.join(data, str(c)), b"".join(self.commits[c % len(self.commits)]))
            _fsync_dir(data)
        return self._timed(body)


def run(tmp: str, cfg: dict[str, Any], out: Table) -> None:
    import torch
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    n = cfg["records"]
    rng = np.random.default_rng(0)
    batches = [dqn_records(rng, BATCH) for _ in range(20)]
    tds = [as_tensordict(b) for b in batches]
    designs = Designs(os.path.join(tmp, "designs"), commit_payloads(batches), append_arrays(batches), n)
    schema = dqn(OBS, HEADS, actions=ACTIONS)

    def ours() -> float:
        return store_append_rate(os.path.join(tmp, "store"), schema, batches, n, COMMIT_EVERY)

    def anatomy() -> str:
        """Where one more run of ours spends its time (wall clock per call on the appending
        thread, summed; calls on the writer's own threads, such as its spare segments, are not counted)."""
        labels = ("validate", "values", "writes", "segment", "append", "commit", "durable", "view")
        spent = dict.fromkeys(labels, 0.0)
        patched = [(Writer, "append", "append"), (Writer, "commit", "commit"), (Schema, "validate", "validate"),
                   (validate_module, "_check_values", "values"), (Segment, "add", "writes"),
                   (SegmentPool, "_new_segment", "segment"), (LocalStorage, "create_after", "durable"),
                   (Committer, "refresh_view", "view")]
        main_thread = threading.main_thread()

        def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
            def call(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    if threading.current_thread() is main_thread:
                        spent[label] += time.perf_counter() - t
            return call

        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
        for (owner, name, label), (_, _, fn) in zip(patched, originals, strict=True):
            setattr(owner, name, timed(fn, label))
        try:
            total = n / ours()
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)
        ms = {k: round(v * 1e3) for k, v in spent.items()}
        rest = ms["append"] - ms["validate"] - ms["writes"] - ms["segment"]
        return (f"one more run, {total * 1e3:.0f} ms: validation {ms['validate']} (value checks {ms['values']}), "
                f"segment writes {ms['writes']}, creating the first segment {ms['segment']}, the rest of append() "
                f"{rest}, commit() {ms['commit']} (waiting for fsyncs and the record {ms['durable']}, the "
                f"handle's view {ms['view']}) ms")

    def peer() -> float:
        scratch = os.path.join(tmp, "trl")
        rb = ReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch), batch_size=256)
        t0 = time.perf_counter()
        for j in range(n // BATCH):
            rb.extend(tds[j % len(tds)])
        rate = n / (time.perf_counter() - t0)
        del rb
        shutil.rmtree(scratch)
        return rate

    runs: dict[str, Callable[[], float]] = {
        "ours": ours, "peer": peer, "fragment": designs.fragment_per_commit, "chunk": designs.chunk_per_commit,
        "in_place": designs.in_place_segment, "as_filled": designs.segment_as_filled,
        "one_file": designs.one_file_per_commit}
    got: dict[str, list[float]] = {k: [] for k in runs}
    torch.set_num_threads(1)  # the peer's better setting on this 2-core machine (bench/store_bench.py)
    for _ in range(cfg["reps"]):  # interleaved: every variant sees the same machine state
        for k, fn in runs.items():
            got[k].append(fn())
    where = anatomy()
    med = {k: statistics.median(v) for k, v in got.items()}
    peer_rate = med["peer"]
    per_commit = sum(len(c) for c in designs.commits[0]) / 2**20
    note = f"median of {cfg['reps']}; {per_commit:.1f} MiB per commit"
    out.add(f"store append, {n:,} records, commit every {COMMIT_EVERY:,}", med["ours"], peer_rate, "rows/s", 1.0,
            note + f"; the store (validation, index arrays, an open segment); {where}")
    out.add("  floor: fragment per commit (format 1)", med["fragment"], peer_rate, "rows/s", None,
            f"{designs.arrays} arrays: {2 * designs.arrays + 1} new directories and {2 * designs.arrays} files "
            "per commit")
    out.add("  floor: chunk per commit in an open segment", med["chunk"], peer_rate, "rows/s", None,
            f"{designs.arrays} new files per commit in existing directories")
    out.add("  floor: open segment extended in place (format 2)", med["in_place"], peer_rate, "rows/s", None,
            f"{designs.arrays} files, pwrite + fdatasync each commit")
    out.add("  floor: open segment as the writer fills it", med["as_filled"], peer_rate, "rows/s", None,
            f"{designs.arrays} files, pwrite per append + write-back thread, fdatasync each commit")
    out.add("  floor: one file per commit", med["one_file"], peer_rate, "rows/s", None,
            "all columns in one object: not one Zarr array per column")


if __name__ == "__main__":
    sys.exit(main("append-designs", __doc__, None, (FULL, QUICK), Table("TorchRL", "peer"), run))
