"""Child-process entry points and shared oracles for the system tests (tests/system/).

Children are started with ``subprocess`` as ``python -m support.procs <role> <json args>``
(never forked from a process that imported torch). They report to the parent on
stdout, one line per event, flushed after each: a line written before a SIGKILL is
still in the pipe for the parent to read.

Roles:

- ``crash-writer``: appends deterministic DQN batches to its own streams, committing
  in groups given by :func:`crash_plan` (local or, with ``storage_options``, S3 through
  its own s3fs client); prints ``ready`` after opening the store,
  ``w <writer id>`` after registering, and ``c <commits> <batches>`` after each
  ``commit()`` returned (``pipelined``: ``commit(wait=False)``, reported once the next
  one returned, i.e. once durable). Runs until killed. With ``hold_merge``, its first compaction
  (merge) stops once the merged fragment's data are durable, before its commit record
  is created: it prints ``m`` and blocks there, for the parent to kill it mid-merge.
- ``stream-writer``: appends :func:`stream_batch` batches to streams ``w<i>-<j>`` with
  many commits, then closes and prints a JSON summary.
- ``reader``: loops ``refresh()`` + random reads, checking every record it reads
  against the index and against :func:`stream_batch`, until its stdin reaches EOF;
  then checks the final count and prints a JSON summary.
- ``create-racer``: opens the storage (its own s3fs client), prints ``ready``, waits for
  a line on stdin (the parent's start gate), then creates each given key with its tag as
  content and prints a JSON summary: the keys it won, and every exception (none expected).
- ``register-writer``: opens the store, prints ``ready``, waits for the gate, then
  registers a writer, appends one batch and commits; prints a JSON summary.
- ``replace-writer``: a w+ opener that writes while another replaces its store, driven by JSON
  commands on stdin, one per line, each answered by one JSON line (see :func:`replace_writer`).
- ``replace-racer``: opens a store with mode "w+" and its own schema once released, reports
  whether it opened, then (at EOF on stdin) writes one batch if it did; see :func:`replace_racer`.
- ``idle-writer``: commits one :func:`crash_batch` to its stream, prints ``c <writer id> 1`` and
  waits; each line on stdin makes it commit the next batch and print ``c <writer id> <batches>``;
  at EOF it closes its writer and exits. The parent kills it, or keeps it alive, while waiting.
- ``state-saver``: saves state slot ``slot`` (``keep_last``) over and over, version ``i`` holding
  ``{"i": i}`` and array ``a = [i] * 100``, printing ``s <version> <i>`` after each save returned.
  With ``hold_delete``, its first deletion of a superseded version (after the new record exists)
  prints ``d`` and blocks until the parent kills it.
- ``fsize-writer``: appends and commits to a new local store while its file size limit
  (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored) is lowered at chosen moments, so that
  file writes and file sizing past the limit fail with ``EFBIG`` as they would on a full
  disk; prints one JSON line per step: the errno name it raised (or null) and the
  visible record count. Every batch is :func:`fsize_batch`.

Everything a child writes is a pure function of its arguments, so the parent
regenerates the expected records bit for bit.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import functools
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.schemas import Schema, dqn, transitions
from replaystore.store import open_store
from replaystore.store.read import log as log_module
from replaystore.store.write import sizing
from support.batches import dqn_batch

OBS = 8
HEADS = 2
ACTIONS = 9
CRASH_MAX_BATCHES = 1_000_000


def schema() -> Schema:
    return dqn(observation_size=OBS, heads=HEADS, actions=ACTIONS)


def as_arrays(batch: Any) -> dict[str, np.ndarray]:
    """A DqnBatch's fields as a dict (what ``read`` returns for all of its rows)."""
    return {k: np.asarray(v) for k, v in vars(batch).items()}


def take_rows(sch: Schema, arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Records ``rows`` of full-batch arrays, in ``read``'s layout (ragged values + rebased offsets)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = {f.name: arrays[f.name][rows] for f in sch.dense_fields}
    for off_name, names in sch.offsets_groups.items():
        offsets = arrays[off_name]
        starts, ends = offsets[rows], offsets[rows + 1]
        new = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=new[1:])
        out[off_name] = new
        for n in names:
            vals = arrays[n]
            out[n] = (np.concatenate([vals[s:e] for s, e in zip(starts, ends, strict=True)])
                      if len(rows) else vals[:0])
    return out


def same_records(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[str]:
    """Names of fields whose dtype, shape or bytes differ (bit-identity, NaN-safe)."""
    bad = []
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.dtype != w.dtype or g.shape != w.shape or \
                np.ascontiguousarray(g).tobytes() != np.ascontiguousarray(w).tobytes():
            bad.append(name)
    if set(got) != set(want):
        bad.append(f"field set {sorted(got)} != {sorted(want)}")
    return bad


# -- crash writer -------------------------------------------------------------------------------

def _tag_seed(seed: int, tag: str) -> list[int]:
    return [seed, zlib.crc32(tag.encode())]


@functools.cache
def crash_batch(seed: int, tag: str, i: int, max_records: int) -> dict[str, np.ndarray]:
    """Batch ``i`` of writer ``tag``: 1..max_records random DQN records."""
    rng = np.random.default_rng([*_tag_seed(seed, tag), 0, i])
    n = int(rng.integers(1, max_records + 1))
    return as_arrays(dqn_batch(rng, n, observation_size=OBS, heads=HEADS, actions=ACTIONS, extra=0))


def crash_stream(tag: str, i: int, streams: int) -> str:
    return f"{tag}-{i % streams}"


def crash_plan(seed: int, tag: str, max_appends: int, commits: int) -> Iterator[list[int]]:
    """The first ``commits`` commit groups of writer ``tag``: batch indices per commit."""
    rng = np.random.default_rng([*_tag_seed(seed, tag), 1])
    i = 0
    for _ in range(commits):
        size = int(rng.integers(1, max_appends + 1))
        yield list(range(i, i + size))
        i += size


def write_planned(st: Any, seed: int, tag: str, max_records: int, max_appends: int, streams: int,
                  commits: int, report: Any = None, close: bool = False, pipelined: bool = False) -> int:
    """Append + commit the first ``commits`` groups of ``tag``'s plan through one new writer
    (and with ``close``, close it). ``report("c K B")`` once commit K (its batches below B) is
    durable: when ``commit()`` returned or, ``pipelined`` (``commit(wait=False)``), when the
    next one did."""
    w = st.writer()
    if report:
        report(f"w {w.id}")
    done = [0]  # batches below the end of each commit so far
    for k, group in enumerate(crash_plan(seed, tag, max_appends, commits)):
        for i in group:
            w.append(crash_batch(seed, tag, i, max_records), stream=crash_stream(tag, i, streams))
        w.commit(metadata={"tag": tag, "batches": group}, wait=not pipelined)
        done.append(group[-1] + 1)
        durable = k if pipelined else k + 1
        if report and durable:
            report(f"c {durable} {done[durable]}")
    if close:
        w.close()
    return w.id


_say_lock = threading.Lock()  # the compaction thread reports too: whole lines only


def _say(line: str) -> None:
    with _say_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


COMPACT_THREAD = "replaystore-compact"  # the writer's compaction thread's name prefix (store/write/compactor.py)


def hold_merges(storage: Any) -> None:
    """Stop the first merge between its data and its record: when the writer's compaction
    thread is about to create a commit record (the merged fragment's data are durable, or a
    merge of a segment's fragments needs none), print ``m`` and block that thread until the
    process is killed.

    A test-only wrapper on this process's storage object; the writer's commits (main thread)
    write as usual until they wait for the held merge.
    """
    create = storage.create

    def hold_then_create(*args: Any, **kwargs: Any) -> bool:
        if threading.current_thread().name.startswith(COMPACT_THREAD):
            _say("m")
            threading.Event().wait()  # never set: only the parent's SIGKILL ends this
        return create(*args, **kwargs)

    storage.create = hold_then_create


def crash_writer(url: str, seed: int, tag: str, max_records: int, max_appends: int, streams: int,
                 storage_options: dict | None = None, hold_merge: bool = False,
                 checkpoint_every: int | None = None, pipelined: bool = False) -> None:
    if checkpoint_every is not None:
        log_module.CHECKPOINT_EVERY = checkpoint_every
    st = open_store(url, mode="a", storage_options=storage_options)
    if hold_merge:
        hold_merges(st.storage)
    _say("ready")
    write_planned(st, seed, tag, max_records, max_appends, streams, CRASH_MAX_BATCHES, report=_say,
                  pipelined=pipelined)
    _say("exhausted")  # never reached in practice: the parent kills it first


# -- concurrent writers and readers ----------------------------------------------------------------

def batch_size(i: int, j: int) -> int:
    """Records per batch of stream ``w<i>-<j>`` (fixed per stream, different across streams)."""
    return 2 + (3 * i + j) % 5


@functools.lru_cache(maxsize=4096)
def stream_batch(seed: int, i: int, j: int, b: int) -> dict[str, np.ndarray]:
    """Batch ``b`` of stream ``w<i>-<j>``; its records carry ``(i, j, step)`` in ``obs[:, :3]``."""
    size = batch_size(i, j)
    rng = np.random.default_rng([seed, i, j, b])
    arrays = as_arrays(dqn_batch(rng, size, observation_size=OBS, heads=HEADS, actions=ACTIONS, extra=0))
    arrays["obs"][:, 0] = i
    arrays["obs"][:, 1] = j
    arrays["obs"][:, 2] = b * size + np.arange(size)
    return arrays


def stream_key(i: int, j: int) -> str:
    return f"w{i}-{j}"


def stream_writer_plan(i: int, streams: int, commits: int) -> list[list[int]]:
    """Per commit, the streams ``j`` appended to (one batch each, in order)."""
    return [[(c + a) % streams for a in range(1 + (c + i) % 3)] for c in range(commits)]


def stream_totals(i: int, streams: int, commits: int) -> dict[int, int]:
    """Batches per stream ``j`` that writer ``i`` appends in all."""
    out = dict.fromkeys(range(streams), 0)
    for group in stream_writer_plan(i, streams, commits):
        for j in group:
            out[j] += 1
    return out


def stream_writer(url: str, storage_options: dict | None, seed: int, i: int, streams: int, commits: int) -> None:
    st = open_store(url, mode="a", storage_options=storage_options)
    w = st.writer()
    _say(f"w {w.id}")
    next_b = dict.fromkeys(range(streams), 0)
    for c, group in enumerate(stream_writer_plan(i, streams, commits)):
        for j in group:
            w.append(stream_batch(seed, i, j, next_b[j]), stream=stream_key(i, j))
            next_b[j] += 1
        w.commit(metadata={"writer": i, "commit": c})
    w.close()
    _say(json.dumps({"writer": w.id, "batches": next_b, "commits": len(st.commits())}))


def parse_stream_key(key: Any) -> tuple[int, int]:
    i, j = str(key)[1:].split("-")
    return int(i), int(j)


def check_rows(st: Any, seed: int, rows: np.ndarray) -> int:
    """Read ``rows`` and check each record against the index and :func:`stream_batch`."""
    table = st.table("records")
    data = st.read(rows)
    keys, steps, _ = table.index_of(rows)
    sch = st.schema
    for k, (key, step) in enumerate(zip(keys, steps, strict=True)):
        i, j = parse_stream_key(key)
        one = take_rows(sch, data, np.array([k]))
        size = batch_size(i, j)
        want = take_rows(sch, stream_batch(seed, i, j, int(step) // size), np.array([int(step) % size]))
        assert tuple(one["obs"][0, :3]) == (i, j, step), (key, step, one["obs"][0, :3])
        bad = same_records(one, want)
        assert not bad, f"row {int(rows[k])} ({key!r}, step {step}): fields {bad} differ"
    return len(rows)


def _stdin_closed(wait_s: float = 0.005) -> bool:
    """Whether the parent closed our stdin, waiting for it up to ``wait_s``.

    The wait is on the pipe itself (it returns at once when the parent closes it); it keeps a
    polling reader from taking a whole core, which on 2 cores starved the parent and the writers.
    """
    with selectors.DefaultSelector() as sel:
        sel.register(sys.stdin, selectors.EVENT_READ)
        ready = sel.select(wait_s)
    return bool(ready) and sys.stdin.buffer.read1(1) == b""


def reader(url: str, storage_options: dict | None, seed: int, expected_total: int, batch: int) -> None:
    st = open_store(url, mode="r", storage_options=storage_options)
    rng = np.random.default_rng([seed, os.getpid()])
    lengths: set[int] = set()
    last_len, iterations, checked, intermediate = len(st), 0, 0, 0
    lengths.add(last_len)
    _say(f"ready {last_len}")
    seen_rows = np.zeros(0, dtype=np.int64)
    while not _stdin_closed():
        st.refresh()
        n = len(st)
        assert n >= last_len, f"visible count went back from {last_len} to {n}"
        last_len = n
        lengths.add(n)
        intermediate += 0 < n < expected_total
        # commits appear whole and in order: the log's record counts match the index
        committed = sum(hi - lo for c in st.commits()
                        for a in c["tables"].get("records", {}).get("appends", []) for lo, hi in [a["rows"]])
        assert committed == n, f"commit records say {committed} rows, the table shows {n}"
        if n:
            rows = st.table("records").rows_at(rng.integers(0, n, size=batch))
            # rows once visible stay visible (unbounded store): re-read a few earlier ones
            checked += check_rows(st, seed, np.concatenate([rows, seen_rows[-4:]]))
            seen_rows = np.concatenate([seen_rows[-64:], rows])
            key = st.streams()[int(rng.integers(0, len(st.streams())))]
            _, steps = st.rows(key)
            assert np.array_equal(steps, np.arange(len(steps))), f"stream {key!r}: steps with a gap {steps}"
        iterations += 1
    st.refresh()
    assert len(st) == expected_total, f"final count {len(st)}, expected {expected_total}"
    checked += check_rows(st, seed, st.table("records").row_ids())
    _say(json.dumps({"iterations": iterations, "checked": checked, "lengths": len(lengths),
                     "intermediate": intermediate}))



# -- create races ----------------------------------------------------------------------------------

def _gate() -> None:
    _say("ready")
    sys.stdin.readline()  # the parent releases every racer at once


def create_racer(url: str, storage_options: dict | None, keys: list[str], tag: str) -> None:
    from replaystore.store.storage import open_storage

    storage = open_storage(url, storage_options)
    storage.check_create()  # the endpoint probe, before the gate
    _gate()
    won, errors = [], []
    for key in keys:
        try:
            if storage.create(key, tag.encode()):
                won.append(key)
        except Exception as exc:  # reported, and the test asserts there are none
            errors.append(f"{key}: {exc!r}")
    _say(json.dumps({"tag": tag, "won": won, "errors": errors}))


def register_writer(url: str, storage_options: dict | None, seed: int, tag: str) -> None:
    st = open_store(url, mode="a", storage_options=storage_options)
    st.storage.check_create()
    _gate()
    w = st.writer()
    w.append(crash_batch(seed, tag, 0, 4), stream=tag)
    result = w.commit(metadata={"tag": tag})
    assert result is not None
    _say(json.dumps({"tag": tag, "writer": w.id, "rows": list(result.rows["records"])}))


def replace_racer(url: str, storage_options: dict | None, seed: int, i: int) -> None:
    """Open ``url`` with mode "w+" and schema :func:`racer_schema` ``(i)`` once released (one line on
    stdin), print a JSON line (``error``: the exception's class name, or null); at EOF, if it
    opened, register a writer and commit :func:`racer_batch` ``(seed, i)``, then print another."""
    from replaystore.errors import ReplayStoreError
    from replaystore.store.storage import open_storage

    open_storage(url, storage_options).check_create()  # the endpoint probe, before the gate
    _gate()
    try:
        st = open_store(url, racer_schema(i), mode="w+", storage_options=storage_options)
        error = None
    except ReplayStoreError as exc:
        st, error = None, type(exc).__name__
    _say(json.dumps({"i": i, "error": error}))
    sys.stdin.readline()  # the second gate: EOF
    wrote, error = False, None
    if st is not None:
        try:
            w = st.writer()
            w.append(racer_batch(seed, i), stream=f"r{i}")
            w.commit()
            w.close()
            wrote = True
        except ReplayStoreError as exc:
            error = type(exc).__name__
    _say(json.dumps({"i": i, "wrote": wrote, "error": error}))


def replace_batch(seed: int, i: int, j: int) -> dict[str, np.ndarray]:
    """Batch ``j`` of replace-writer ``i`` (schema :func:`racer_schema` ``(i)``, 5 records)."""
    rng = np.random.default_rng([seed, i, j])
    return as_arrays(dqn_batch(rng, 5, observation_size=OBS + i, heads=HEADS, actions=ACTIONS, extra=0))


def replace_writer(seed: int) -> None:
    """Answer commands (JSON lines on stdin) until EOF, one JSON line each.

    ``{"op": "open", "url", "options", "i"}``: open ``url`` with mode "w+" and schema
    :func:`racer_schema` ``(i)``, register a writer (``writer``: its number);
    ``{"op": "append", "j"}``: append :func:`replace_batch` ``(seed, i, j)`` to stream ``r<i>``;
    ``{"op": "commit"}``; ``{"op": "close"}``; ``{"op": "burst", "url", "options", "i", "n"}``:
    open (answering ``{"opened": ...}`` at once), then append and commit batches ``0..n-1``
    and close, answering with the batches committed and the first error. Every answer has
    ``error``: the exception's class name, or null.
    """
    from replaystore.errors import ReplayStoreError

    st: Any = None
    w: Any = None
    i = 0

    def run(op: dict[str, Any]) -> dict[str, Any]:
        nonlocal st, w, i
        if op["op"] == "open":
            i = op["i"]
            st = open_store(op["url"], racer_schema(i), mode="w+", storage_options=op.get("options"))
            w = st.writer()
            return {"writer": w.id}
        if op["op"] == "append":
            w.append(replace_batch(seed, i, op["j"]), stream=f"r{i}")
        elif op["op"] == "commit":
            w.commit()
        elif op["op"] == "close":
            w.close()
        return {}

    for line in sys.stdin:
        op = json.loads(line)
        if op["op"] != "burst":
            try:
                answer = {**run(op), "error": None}
            except ReplayStoreError as exc:
                answer = {"error": type(exc).__name__, "message": str(exc)}
            _say(json.dumps(answer))
            continue
        try:
            run({**op, "op": "open"})
        except ReplayStoreError as exc:
            _say(json.dumps({"opened": False, "error": type(exc).__name__}))
            continue
        _say(json.dumps({"opened": True, "writer": w.id}))
        committed, error, message = 0, None, None
        try:
            for j in range(op["n"]):
                run({"op": "append", "j": j})
                run({"op": "commit"})
                committed += 1
            run({"op": "close"})
        except ReplayStoreError as exc:
            error, message = type(exc).__name__, str(exc)
            with contextlib.suppress(ReplayStoreError):
                w.close()
        _say(json.dumps({"committed": committed, "error": error, **({"message": message} if message else {})}))


def racer_schema(i: int) -> Schema:
    """Racer ``i``'s schema: each racer's differs (its observation size)."""
    return dqn(observation_size=OBS + i, heads=HEADS, actions=ACTIONS)


def racer_batch(seed: int, i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, i])
    return as_arrays(dqn_batch(rng, 5, observation_size=OBS + i, heads=HEADS, actions=ACTIONS, extra=0))


def idle_writer(url: str, seed: int, tag: str, max_records: int, storage_options: dict | None = None,
                spares: bool = False) -> None:
    """Commit batch 0 of ``tag`` to stream ``tag`` and print ``c <writer id> 1``; then, per line on
    stdin, commit the next batch and print ``c <writer id> <batches>``; at EOF close and exit.
    With ``spares``, each report waits until the writer's spare segments being created exist."""
    w = open_store(url, mode="a", storage_options=storage_options).writer()
    i = 0
    while True:
        w.append(crash_batch(seed, tag, i, max_records), stream=tag)
        w.commit()
        if spares:
            for future in list(w._segments.spares.values()):
                future.result()
        i += 1
        _say(f"c {w.id} {i}")
        if not sys.stdin.readline():
            w.close()
            return


def state_saver(url: str, slot: str, keep_last: int, hold_delete: bool = False) -> None:
    st = open_store(url, mode="a")
    if hold_delete:
        delete = st.storage.delete

        def hold_then_delete(path: str) -> None:
            _say("d")
            threading.Event().wait()  # never set: only the parent's SIGKILL ends this
            delete(path)

        st.storage.delete = hold_then_delete  # type: ignore[method-assign]
    i = 0
    while True:
        version = st.save_state(slot, {"i": i}, {"a": np.full(100, i, dtype=np.int64)}, keep_last=keep_last)
        _say(f"s {version} {i}")
        i += 1


# -- parent side ------------------------------------------------------------------------------------

TESTS_DIR = Path(__file__).resolve().parents[1]


FSIZE_CAPACITY = 4_000  # the fsize-writer's store: segments of capacity // 4 = 1,000 records


def fsize_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Records ``start .. start + n - 1`` of the fsize-writer: ``reward`` is the record number."""
    rng = np.random.default_rng(start)
    return {"obs": rng.random((n, 4), dtype=np.float32), "action": np.arange(start, start + n) % 3,
            "reward": np.arange(start, start + n, dtype=np.float32),
            "next_obs": rng.random((n, 4), dtype=np.float32), "terminated": np.zeros(n, dtype=bool)}


def fsize_writer(url: str) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    sizing.SEGMENT_FLOOR_BYTES = 0  # (this child only) segments of capacity // 4 rows
    st = open_store(url, transitions(4), mode="w", capacity=FSIZE_CAPACITY)
    w = st.writer()
    segment_bytes = FSIZE_CAPACITY // 4 * 16  # a segment's largest file: 1,000 records of 4 float32

    def step(name: str, limit: int, fn: Any) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            fn()
            raised = None
        except OSError as e:
            raised = errno.errorcode.get(e.errno or 0, str(e.errno))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        _say(json.dumps({"step": name, "raised": raised, "visible": len(st)}))

    unlimited = resource.RLIM_INFINITY
    step("first", unlimited, lambda: (w.append(fsize_batch(0, 400), stream=1), w.commit()))
    # the open segment gets half full: its successor (a spare) is created on an I/O thread, and
    # cannot be (its files would end past the limit); writes into the open segment still fit
    spare: list[BaseException | None] = []

    def half() -> None:
        w.append(fsize_batch(400, 200), stream=1)
        spare.append(w._segments.spares["records"].exception())  # white-box: waits for the background creation

    step("half", segment_bytes - 1, half)
    _say(json.dumps({"step": "spare", "raised": errno.errorcode[spare[0].errno]  # type: ignore[union-attr]
                     if isinstance(spare[0], OSError) else repr(spare[0]), "visible": len(st)}))
    # 600 more do not fit: a rollover, whose segment cannot be created either
    step("rollover", segment_bytes - 1, lambda: w.append(fsize_batch(600, 600), stream=1))
    step("again", segment_bytes - 1, lambda: w.append(fsize_batch(600, 100), stream=1))
    step("recovered", unlimited, lambda: (w.append(fsize_batch(600, 600), stream=1), w.commit()))
    # a write past the limit in the middle of an append (the new segment holds 600 records)
    step("mid-append", 600 * 16 + 50, lambda: w.append(fsize_batch(1200, 100), stream=1))
    step("append", unlimited, lambda: w.append(fsize_batch(1200, 100), stream=1))
    # the commit record cannot be written: nothing becomes visible, the records stay pending
    step("commit", 1, w.commit)
    step("commit again", unlimited, w.commit)
    step("close", unlimited, w.close)


class Child:
    """A child process running one role; stdout read line-wise with deadlines, stderr kept in a file.

    Waits use ``select`` on the pipe with a deadline, never sleeps.
    """

    def __init__(self, role: str, stdin: bool = False, **args: Any) -> None:
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": str(TESTS_DIR) + (os.pathsep + path if path else "")}
        self.role = role
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "support.procs", role, json.dumps(args)],
                                     cwd=TESTS_DIR, env=env, stdin=subprocess.PIPE if stdin else None,
                                     stdout=subprocess.PIPE, stderr=self.err)
        self.fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self.buf = b""
        self.eof = False

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with selectors.DefaultSelector() as sel:  # epoll: select() fails on descriptors >= 1024
            sel.register(self.fd, selectors.EVENT_READ)
            ready = sel.select(left)
        if not ready:
            return False
        chunk = os.read(self.fd, 65536)
        self.eof = not chunk
        self.buf += chunk
        return True

    def readline(self, timeout: float) -> str | None:
        """The next line, or None at EOF or when ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            if not self._fill(deadline):
                return None
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def rest(self, timeout: float) -> list[str]:
        """Every remaining line up to EOF (call once the child has exited)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            assert self._fill(deadline), f"{self.role}: stdout did not reach EOF"
        lines, self.buf = self.buf.decode().splitlines(), b""
        return lines

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def finish(self, timeout: float) -> list[str]:
        """Wait for a clean exit; its remaining stdout lines. Fails with its stderr otherwise."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # dump its stacks into stderr before killing it
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            self.kill()
            raise AssertionError(f"{self.role} did not finish within {timeout} s:\n{self.stderr()}") from None
        assert rc == 0, f"{self.role} failed with exit status {rc}:\n{self.stderr()}"
        return self.rest(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self.err.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


ROLES = {"crash-writer": crash_writer, "stream-writer": stream_writer, "reader": reader,
         "create-racer": create_racer, "register-writer": register_writer, "fsize-writer": fsize_writer,
         "idle-writer": idle_writer, "replace-racer": replace_racer,
         "replace-writer": replace_writer, "state-saver": state_saver}


def main(argv: list[str]) -> None:
    faulthandler.register(signal.SIGUSR1)  # the parent asks for stacks of a child that hangs
    role, args = argv[0], json.loads(argv[1])
    ROLES[role](**args)


if __name__ == "__main__":
    main(sys.argv[1:])
