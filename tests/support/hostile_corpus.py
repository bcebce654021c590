"""A generated hostile-store corpus: every object kind of a store x every damage that applies to it.

Each case copies one honest base store, damages one object, and runs what users run on a store:
``open_store``, a read of every row of every table, a scan, a sampler draw, ``load_state``,
``verify``, and the ``replaystore info``, ``verify`` and ``copy`` commands. Each operation runs
in a worker subprocess under a per-operation alarm and an address-space limit
(``RLIMIT_AS``); its outcome is classified:

``ok``
    It returned, and what it returned equals the honest store's (reads, scans, draws, the
    copy's data), or it reported the damage (``verify``).
``typed``
    It raised an error of ``replaystore.errors`` (a command: exited with a documented code
    other than "internal error", printing one line and no traceback).
``raw``
    Any other exception (a command: exit 70, a traceback, or more than one line).
``hang``
    The alarm fired.
``memory``
    A ``MemoryError`` (an allocation the limit refused: sized by a claim, not by data).
``wrong``
    It returned something other than the honest store's, or ``verify`` passed the damaged store.
``crash``
    The worker process died (a signal, an abort).

Run standalone for the figures: ``python tests/support/hostile_corpus.py`` (``--cases`` to
list them, ``-k TEXT`` to run those whose id contains TEXT, ``--json`` for every outcome).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OUTCOMES = ("ok", "typed", "raw", "hang", "memory", "wrong", "crash")
BAD = ("raw", "hang", "memory", "wrong", "crash")
OPS = ("open", "read", "scan", "sample", "load_state", "verify", "cli info", "cli verify", "cli copy")
OP_TIMEOUT_S = 15.0
"""The alarm of one operation: an honest one takes well under a second on the base store."""
MEMORY_HEADROOM = 2 << 30
"""Address space a worker may add to what it holds after its imports (RLIMIT_AS)."""
SILENCE_S = 120.0
"""A worker that prints nothing for this long is killed (its operation counts as a hang)."""

WRITER = "writers/000000"
SLOT = "slot"
FAR = 64 << 30  # a sparse size far past any data


def scratch_dir() -> str | None:
    """Where stores are made: a tmpfs if there is one (fsyncs cost nothing there), else the default."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


# -- the base store ------------------------------------------------------------------------------
def build_base(root: str) -> None:
    """Write the honest store every case copies (local disk, about 1 MB, a few seconds).

    Two tables: ``records`` (DQN: dense and ragged fields, written into segments of 64 rows)
    and ``frames`` (a zstd-compressed field beside a raw one: plain fragments with a shard),
    three commits of 20 records to each by one writer that then closes, log checkpoints, and a
    state slot with two versions.
    """
    from replaystore.schemas import Dense, Schema, dqn
    from replaystore.store import open_store
    from replaystore.store.read import log
    from replaystore.store.write import sizing
    from support.batches import dqn_batch

    frames = Schema("frames", [Dense("frame", np.uint8, (6, 5), codec="zstd"), Dense("reward", np.float32)])
    saved = sizing.MAX_FRAGMENT_ROWS, log.CHECKPOINT_EVERY
    sizing.MAX_FRAGMENT_ROWS, log.CHECKPOINT_EVERY = 64, 2  # small segments, a checkpoint every 2 records
    try:
        st = open_store(root, {"records": dqn(8, 2, actions=5), "frames": frames}, mode="w")
        rng = np.random.default_rng(7)
        with st.writer() as w:
            for i in range(3):
                w.append(dqn_batch(rng, 20, observation_size=8, actions=5, extra=0), stream=i % 2, table="records")
                frame = np.zeros((20, 6, 5), np.uint8)
                frame[:, :2] = rng.integers(0, 256, (20, 2, 5), dtype=np.uint8)
                w.append({"frame": frame, "reward": rng.standard_normal(20).astype(np.float32)}, stream=i % 2,
                         table="frames")
                w.commit()
        st.save_state(SLOT, {"v": 0}, {"x": np.arange(10)})
        st.save_state(SLOT, {"v": 1}, {"x": np.arange(10) * 2})
    finally:
        sizing.MAX_FRAGMENT_ROWS, log.CHECKPOINT_EVERY = saved


# -- finding the objects of a store ---------------------------------------------------------------
def _body(root: Path, path: str) -> dict[str, Any]:
    from replaystore.store.format import records
    return records.decode(path, (root / path).read_bytes())


def _forge(root: Path, path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite record ``path`` with ``edit`` applied to its body, checksum-valid (as a forger would)."""
    from replaystore.store.format import records
    body = _body(root, path)
    edit(body)
    (root / path).write_bytes(records.encode(body))


def _commits(root: Path) -> list[str]:
    return sorted(f"{WRITER}/commits/{n}" for n in os.listdir(root / WRITER / "commits") if n.endswith(".json"))


def _appends(root: Path) -> list[str]:
    """The writer's append commit records, oldest first."""
    return [p for p in _commits(root) if _body(root, p)["kind"] == "append"]


def _checkpoint(root: Path) -> str:
    names = sorted(n for n in os.listdir(root / "checkpoints") if n.endswith(".json"))
    return f"checkpoints/{names[-1]}"


def _state_record(root: Path) -> str:
    names = sorted(n for n in os.listdir(root / "state" / SLOT) if n.endswith(".json"))
    return f"state/{SLOT}/{names[-1]}"


def _payload(root: Path) -> str:
    return str(_body(root, _state_record(root))["arrays"]["x"])


def _last_fragment(root: Path, table: str) -> dict[str, Any]:
    return dict(_body(root, _appends(root)[-1])["tables"][table]["add"][-1])


def _fragment_chunk(root: Path, array: str, ndim: int = 1) -> str:
    name = _last_fragment(root, "frames")["name"]
    return f"{WRITER}/data/frames/{name}/{array}/c/" + "/".join(["0"] * ndim)


def _segment_chunk(root: Path, array: str, ndim: int = 1) -> str:
    name = _last_fragment(root, "records")["segment"]["name"]
    return f"{WRITER}/data/records/{name}/{array}/c/" + "/".join(["0"] * ndim)


KINDS: dict[str, Callable[[Path], str]] = {
    "manifest": lambda r: "replaystore.json",
    "writer registration": lambda r: f"{WRITER}/writer.json",
    "commit record": lambda r: _appends(r)[1],
    "checkpoint": _checkpoint,
    "state record": _state_record,
    "state payload": _payload,
    "fragment chunk": lambda r: _fragment_chunk(r, "reward"),
    "fragment index chunk": lambda r: _fragment_chunk(r, "_step"),
    "shard": lambda r: _fragment_chunk(r, "frame", 3),
    "shard index": lambda r: _fragment_chunk(r, "frame", 3),
    "segment chunk": lambda r: _segment_chunk(r, "obs", 2),
    "segment offsets": lambda r: _segment_chunk(r, "legal_offsets"),
    "segment index chunk": lambda r: _segment_chunk(r, "_reset"),
}
"""Object kind -> the object of that kind a case damages (a path relative to the store root)."""

RECORDS = ("manifest", "writer registration", "commit record", "checkpoint", "state record")


# -- damages --------------------------------------------------------------------------------------
def _replace(root: Path, path: str, make: Callable[[Path], None]) -> None:
    p = root / path
    p.unlink()
    make(p)


def truncated(root: Path, path: str) -> None:
    """Cut the object to half its size."""
    p = root / path
    os.truncate(p, p.stat().st_size // 2)


def emptied(root: Path, path: str) -> None:
    """Cut the object to 0 bytes."""
    os.truncate(root / path, 0)


def fifo(root: Path, path: str) -> None:
    """A FIFO in place of the object (a blocking open of it never returns)."""
    _replace(root, path, lambda p: os.mkfifo(p))


def directory(root: Path, path: str) -> None:
    """An (empty) directory in place of the object."""
    _replace(root, path, lambda p: p.mkdir())


def symlink_outside(root: Path, path: str) -> None:
    """A symbolic link to the object's own bytes, moved outside the store root."""
    outside = Path(tempfile.mkdtemp(prefix="outside-", dir=root.parent))
    target = outside / "object"
    shutil.move(str(root / path), target)
    os.symlink(target, root / path)


def sparse_far(root: Path, path: str) -> None:
    """Extend the object with a hole to 64 GiB: its size far past the data it holds."""
    os.truncate(root / path, FAR)


def _set_rows(d: dict[str, Any], rows: int) -> None:
    d["rows"] = rows
    d["parts"] = [d["parts"][0][:2] + [rows]]
    if "segment" in d:
        d["segment"]["crc32c"] = {k: v[:1] for k, v in d["segment"]["crc32c"].items()}


def _claim_rows(table: str, rows: int) -> Callable[[Path, str], None]:
    def damage(root: Path, path: str) -> None:
        last = _appends(root)[-1]  # (the writer's last fragment: no other overlaps it)

        def edit(b: dict[str, Any]) -> None:
            d = b["tables"][table]["add"][-1]
            _set_rows(d, rows)
            if "segment" in d:
                d["segment"]["capacity"]["rows"] = 1 << 32
        _forge(root, last, edit)
    return damage


def _claim_checkpoint_rows(root: Path, path: str) -> None:
    def edit(b: dict[str, Any]) -> None:
        frags = b["writers"]["0"]["tables"]["frames"]
        last = max(frags, key=lambda d: d["row_start"])
        _set_rows(last, 1 << 32)
    _forge(root, path, edit)


def _claim_segment_capacity(root: Path, path: str) -> None:
    _claim_rows("records", _last_fragment(root, "records")["rows"])(root, path)


def _claim_shape(root: Path, path: str) -> None:
    def edit(b: dict[str, Any]) -> None:
        field = next(f for f in b["tables"]["records"]["fields"] if f["name"] == "obs")
        field["shape"] = [1 << 31]
    _forge(root, path, edit)


def _claim_npy_shape(root: Path, path: str) -> None:
    p = root / path
    data = p.read_bytes()
    header_end = data.index(b"\n") + 1
    header = data[:header_end].replace(b"(10,)", b"(1099511627776,)")
    p.write_bytes(header + data[header_end:])


def _claim_shard_index(root: Path, path: str) -> None:
    """The shard index's first entry claims a block at offset 2**62 (its CRC32C recomputed)."""
    import google_crc32c

    p = root / path
    data = bytearray(p.read_bytes())
    blocks = -(-int(_last_fragment(root, "frames")["rows"]) // 8)
    start = len(data) - 4 - 16 * blocks
    data[start:start + 8] = (1 << 62).to_bytes(8, "little")
    data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    p.write_bytes(bytes(data))


def _overlap_shard_index(root: Path, path: str) -> None:
    """The shard index's second entry names the first block's bytes (its CRC32C recomputed)."""
    import google_crc32c

    p = root / path
    data = bytearray(p.read_bytes())
    blocks = -(-int(_last_fragment(root, "frames")["rows"]) // 8)
    start = len(data) - 4 - 16 * blocks
    data[start + 16:start + 32] = data[start:start + 16]
    data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    p.write_bytes(bytes(data))


def _wrong_type(key_path: tuple[Any, ...], value: Any) -> Callable[[Path, str], None]:
    def damage(root: Path, path: str) -> None:
        def edit(b: dict[str, Any]) -> None:
            d: Any = b
            for k in key_path[:-1]:
                d = d[k]
            d[key_path[-1]] = value
        _forge(root, path, edit)
    return damage


def _wrong_type_commit(root: Path, path: str) -> None:
    _wrong_type(("tables", "frames", "add", 0, "rows"), "20")(root, path)


def _wrong_type_checkpoint(root: Path, path: str) -> None:
    _wrong_type(("writers", "0", "next_seq"), "3")(root, path)


def _other_array(array: str, ndim: int = 1) -> Callable[[Path, str], None]:
    """The bytes of another array of the same unit in place of the object (another dtype and size)."""
    def damage(root: Path, path: str) -> None:
        unit = path.split("/c/")[0].rsplit("/", 1)[0]
        src = root / unit / array / "c" / "/".join(["0"] * ndim)
        (root / path).write_bytes(src.read_bytes())
    return damage


def _pickled_payload(root: Path, path: str) -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    (root / path).write_bytes(buf.getvalue())


def _overlap_commit(root: Path, path: str) -> None:
    """The commit adds a second copy of its ``frames`` fragment under another name."""
    def edit(b: dict[str, Any]) -> None:
        adds = b["tables"]["frames"]["add"]
        dup = json.loads(json.dumps(adds[0]))
        dup["name"] = "f0000009999"
        adds.append(dup)
    _forge(root, path, edit)


def _overlap_checkpoint(root: Path, path: str) -> None:
    def edit(b: dict[str, Any]) -> None:
        frags = b["writers"]["0"]["tables"]["frames"]
        dup = json.loads(json.dumps(frags[0]))
        dup["name"] = "f0000009999"
        frags.append(dup)
    _forge(root, path, edit)


def _overlap_segment(root: Path, path: str) -> None:
    """A commit places its fragment at the segment rows of the previous fragment of that segment."""
    appends = _appends(root)
    by_segment: dict[str, list[tuple[str, dict[str, Any]]]] = collections.defaultdict(list)
    for p in appends:
        d = _body(root, p)["tables"]["records"]["add"][-1]
        by_segment[d["segment"]["name"]].append((p, d))
    runs = next(r for r in by_segment.values() if len(r) >= 2)
    (_, first), (second, _) = runs[0], runs[1]

    def edit(b: dict[str, Any]) -> None:
        seg = b["tables"]["records"]["add"][-1]["segment"]
        seg["row"] = first["segment"]["row"]
        seg["values"] = dict(first["segment"]["values"])
    _forge(root, second, edit)


GENERIC = {"truncated": truncated, "emptied": emptied, "fifo": fifo, "directory": directory,
           "symlink outside": symlink_outside}

SPECIFIC: dict[str, dict[str, Callable[[Path, str], None]]] = {
    "manifest": {"claimed size": _claim_shape, "wrong type": _wrong_type(("capacity",), "100")},
    "writer registration": {"wrong type": _wrong_type(("writer",), "0")},
    "commit record": {"claimed size": _claim_rows("frames", 1 << 32),
                      "claimed size (segment capacity)": _claim_segment_capacity,
                      "wrong type": _wrong_type_commit, "overlapping ranges": _overlap_commit},
    "checkpoint": {"claimed size": _claim_checkpoint_rows, "wrong type": _wrong_type_checkpoint,
                   "overlapping ranges": _overlap_checkpoint},
    "state record": {"wrong type": _wrong_type(("arrays",), ["x"])},
    "state payload": {"claimed size": _claim_npy_shape, "wrong type": _pickled_payload},
    "fragment chunk": {"claimed size": sparse_far, "wrong type": _other_array("_step")},
    "fragment index chunk": {"claimed size": sparse_far, "wrong type": _other_array("_reset")},
    "shard": {"claimed size": sparse_far, "wrong type": _other_array("reward")},
    "shard index": {"claimed size": _claim_shard_index, "overlapping ranges": _overlap_shard_index},
    "segment chunk": {"claimed size": sparse_far, "wrong type": _other_array("_step"),
                      "overlapping ranges": _overlap_segment},
    "segment offsets": {"claimed size": sparse_far, "wrong type": _other_array("_step")},
    "segment index chunk": {"claimed size": sparse_far, "wrong type": _other_array("_step")},
}
"""Per kind, the damages specific to it (claimed sizes, wrong types, overlapping ranges)."""

GENERIC_KINDS = {k for k in KINDS if k != "shard index"}  # (the generic damages of a shard are the shard's)


@dataclass(frozen=True)
class Case:
    """One object kind under one damage."""

    kind: str
    damage: str

    @property
    def id(self) -> str:
        return f"{self.kind} / {self.damage}"

    def apply(self, root: Path) -> None:
        path = KINDS[self.kind](root)
        fn = GENERIC.get(self.damage) or SPECIFIC[self.kind][self.damage]
        fn(root, path)


def cases() -> list[Case]:
    """Every case of the corpus: each kind under each generic damage, then its specific ones."""
    out = [Case(k, d) for k in KINDS if k in GENERIC_KINDS for d in GENERIC]
    out += [Case(k, d) for k, ds in SPECIFIC.items() for d in ds]
    return out



# -- the worker: runs cases, one JSON line per operation -----------------------------------------------
class _Hang(BaseException):
    """Raised by the alarm (a BaseException: library code catching Exception cannot swallow it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


@dataclass
class Expected:
    """What the honest store shows, per table: row ids, every record, the scan; and the state slot."""

    rows: dict[str, np.ndarray]
    data: dict[str, dict[str, np.ndarray]]
    scans: dict[str, Any]
    state: list[tuple[dict[str, Any], dict[str, np.ndarray]]]
    store: Any  # the honest store, opened


def _expected(root: str) -> Expected:
    import pyarrow as pa

    from replaystore.store import open_store

    st = open_store(root, mode="r")
    rows = {t: st.table(t).row_ids() for t in st.tables}
    data = {t: st.table(t).read(rows[t]) for t in st.tables}
    scans = {t: pa.Table.from_batches(list(st.table(t).scan())) for t in st.tables}
    v0 = ({"v": 0}, {"x": np.arange(10)})
    v1 = ({"v": 1}, {"x": np.arange(10) * 2})
    return Expected(rows, data, scans, [v1, v0], st)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _cli(args: list[str]) -> tuple[str, str]:
    """Run a ``replaystore`` command in-process: (outcome, detail)."""
    from replaystore.tools.cli import EXIT_CODES, EXIT_INTERNAL
    from replaystore.tools.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(args)
    text = err.getvalue().strip()
    detail = f"exit {code}: {text[:300]}"
    if "MemoryError" in text:
        return "memory", detail
    if code not in EXIT_CODES or code == EXIT_INTERNAL or "Traceback" in text or (code and text.count("\n")):
        return "raw", detail
    return ("ok" if code == 0 else "typed"), detail


def _run_op(op: str, root: str, expected: Expected, scratch: Path) -> tuple[str, str]:
    """Run one operation on the (damaged) store at ``root``: (outcome, detail)."""
    import pyarrow as pa

    from replaystore.loaders import UniformSampler
    from replaystore.store import open_store
    from replaystore.store.maintenance import verify_store

    if op.startswith("cli "):
        cmd = op[4:]
        if cmd == "copy":
            dst = str(scratch / f"copy-{time.monotonic_ns()}")
            outcome, detail = _cli(["copy", root, dst])
            if outcome == "ok":
                copied = open_store(dst, mode="r")
                for t, rows in expected.rows.items():
                    if not (np.array_equal(copied.table(t).row_ids(), rows)
                            and _same(copied.table(t).read(rows), expected.data[t])):
                        return "wrong", f"the copy's table {t!r} differs from the honest store's"
            return outcome, detail
        outcome, detail = _cli([cmd, root])
        if cmd == "verify" and outcome == "ok":
            return "wrong", "replaystore verify passed a damaged store"
        if cmd == "verify" and detail.startswith("exit 1:"):
            return "ok", detail  # (damage reported)
        return outcome, detail
    st = open_store(root, mode="r")
    if op == "open":
        return "ok", ""
    if op == "verify":
        problems = verify_store(st)
        return ("ok", str(problems[0])[:300]) if problems else ("wrong", "verify passed a damaged store")
    if op == "load_state":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = st.load_state(SLOT)
        if got is None:
            return ("ok", "no intact version (warned)") if caught else ("wrong", "None without a warning")
        for i, (doc, arrays) in enumerate(expected.state):
            if got[0] == doc and _same(got[1], arrays):
                return ("ok", "") if i == 0 or caught else ("wrong", "an older version without a warning")
        return "wrong", f"load_state returned {got[0]!r}"
    for t, rows in expected.rows.items():
        table = st.table(t)
        if op == "read":
            got_rows = table.row_ids()
            if not np.array_equal(got_rows, rows):
                return "wrong", f"table {t!r}: {len(got_rows)} row ids, expected {len(rows)}"
            if not _same(table.read(got_rows), expected.data[t]):
                return "wrong", f"table {t!r}: records differ"
        elif op == "scan":
            got = pa.Table.from_batches(list(table.scan()), schema=table.scan_schema())
            if not got.equals(expected.scans[t]):
                return "wrong", f"table {t!r}: the scan differs"
        elif op == "sample":
            req = UniformSampler(st, batch_size=16, seed=0, table=t).sample()
            drawn = np.asarray(req.rows).reshape(-1)
            if not np.isin(drawn, rows).all():
                return "wrong", f"table {t!r}: drew row ids that do not exist"
            if not _same(table.read(drawn), expected.store.table(t).read(drawn)):
                return "wrong", f"table {t!r}: drawn records differ"
    return "ok", ""


def _classify(exc: BaseException) -> str:
    from replaystore.errors import ReplayStoreError

    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, ReplayStoreError):
        return "typed"
    return "raw"


def _limit_memory() -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def worker(base: str, ids: list[str], emit: Callable[[dict[str, Any]], None]) -> int:
    """Run the cases ``ids`` on copies of ``base``, calling ``emit`` with each operation's outcome.

    Returns 0, or 3 after a hang (threads may be stuck: the caller starts a new worker).
    """
    import replaystore.loaders  # noqa: F401 - (imports before the limit: torch, numba)
    import replaystore.tools.cli  # noqa: F401

    expected = _expected(base)
    by_id = {c.id: c for c in cases()}
    _limit_memory()
    signal.signal(signal.SIGALRM, _alarm)
    for case_id in ids:
        case = by_id[case_id]
        scratch = Path(tempfile.mkdtemp(prefix="hostile-case-", dir=scratch_dir()))
        try:
            root = scratch / "st"
            shutil.copytree(base, root, symlinks=True)
            case.apply(root)
            for op in OPS:
                started = time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, OP_TIMEOUT_S)
                try:
                    outcome, detail = _run_op(op, str(root), expected, scratch)
                except _Hang:
                    outcome, detail = "hang", f"no answer in {OP_TIMEOUT_S:g} s"
                except BaseException as exc:  # noqa: BLE001 - classified, never swallowed silently
                    outcome, detail = _classify(exc), f"{type(exc).__name__}: {str(exc)[:300]}"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                emit({"case": case_id, "op": op, "outcome": outcome, "detail": detail,
                      "s": round(time.monotonic() - started, 3)})
                if outcome == "hang":
                    return 3
        finally:
            with contextlib.suppress(OSError):
                signal.setitimer(signal.ITIMER_REAL, 0)
            shutil.rmtree(scratch, ignore_errors=True)  # (the store, its copies, what a damage moved outside it)
        emit({"case": case_id, "done": True})
    return 0


# -- the driver: workers in subprocesses, restarted after a hang or a crash ---------------------------
def run(base: str, selected: list[Case] | None = None, workers: int = 2,
        log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run the corpus on ``base`` (built by :func:`build_base`): one result per case and operation.

    Cases are split between ``workers`` worker processes; a worker that hangs or dies is
    replaced, and the operation it was running (and the rest of that case) recorded as a
    hang or a crash.
    """
    todo = [c.id for c in (selected if selected is not None else cases())]
    queues = [todo[i::workers] for i in range(workers)]
    results: list[dict[str, Any]] = []
    procs: dict[int, tuple[subprocess.Popen[bytes], list[str], bytes]] = {}
    sel = selectors.DefaultSelector()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))

    def start(i: int) -> None:
        if not queues[i]:
            return
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", base, *queues[i]],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        procs[i] = (proc, [], b"")
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        sel.register(proc.stdout, selectors.EVENT_READ, i)

    def finish(i: int, why: str) -> None:
        proc, done_ops, _ = procs.pop(i)
        sel.unregister(proc.stdout)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if queues[i]:  # the case in flight: its next operation is what hung or crashed
            case_id = queues[i][0]
            ran = [r for r in results if r.get("case") == case_id]
            left = [op for op in OPS if op not in {r["op"] for r in ran}]
            if left and not any(r["outcome"] == "hang" for r in ran):  # (a hang it reported ended it)
                results.append({"case": case_id, "op": left[0], "outcome": why, "detail": f"worker {why}"})
                if log:
                    log(f"{case_id}: {left[0]}: {why}")
            queues[i].pop(0)
        start(i)

    for i in range(workers):
        start(i)
    last_seen = {i: time.monotonic() for i in procs}
    while procs:
        for key, _ in sel.select(timeout=1.0):
            i = key.data
            proc, ops, buf = procs[i]
            chunk = proc.stdout.read() if proc.stdout else b""  # type: ignore[union-attr]
            if not chunk:
                rc = proc.wait()
                finish(i, "hang" if rc == 3 else "crash" if rc else "crash")
                last_seen[i] = time.monotonic()
                continue
            last_seen[i] = time.monotonic()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            procs[i] = (proc, ops, buf)
            for line in lines:
                r = json.loads(line)
                if r.get("done"):
                    queues[i].pop(0)
                    continue
                results.append(r)
                if log and r["outcome"] in BAD:
                    log(f"{r['case']}: {r['op']}: {r['outcome']}: {r['detail']}")
        for i in list(procs):
            if time.monotonic() - last_seen.get(i, time.monotonic()) > SILENCE_S:
                finish(i, "hang")
                last_seen[i] = time.monotonic()
    return results


def summary(results: list[dict[str, Any]]) -> str:
    """The table the lead quotes: cases, operations, outcomes per operation and in all."""
    case_ids = sorted({r["case"] for r in results})
    worst: dict[str, str] = {}
    for r in results:
        o = r["outcome"]
        w = worst.get(r["case"], "ok")
        worst[r["case"]] = o if OUTCOMES.index(o) > OUTCOMES.index(w) else w
    count = collections.Counter((r["op"], r["outcome"]) for r in results)
    width = max(len(op) for op in OPS) + 2
    lines = [f"hostile-store corpus: {len(case_ids)} cases x {len(OPS)} operations = {len(results)} outcomes",
             "operation".ljust(width) + "".join(o.rjust(8) for o in OUTCOMES)]
    for op in OPS:
        lines.append(op.ljust(width) + "".join(str(count[(op, o)]).rjust(8) for o in OUTCOMES))
    total = collections.Counter(r["outcome"] for r in results)
    lines.append("all".ljust(width) + "".join(str(total[o]).rjust(8) for o in OUTCOMES))
    per_case = collections.Counter(worst.values())
    lines.append("cases (worst)".ljust(width) + "".join(str(per_case[o]).rjust(8) for o in OUTCOMES))
    return "\n".join(lines)


def matrix(results: list[dict[str, Any]]) -> str:
    """One line per case: the outcome of each operation, in the order of :data:`OPS`."""
    got = {(r["case"], r["op"]): r["outcome"] for r in results}
    ids = [c.id for c in cases() if any(k[0] == c.id for k in got)]
    width = max(len(i) for i in ids) + 2
    lines = ["case".ljust(width) + "  ".join(op.split()[-1][:6].ljust(6) for op in OPS)]
    for i in ids:
        lines.append(i.ljust(width) + "  ".join(got.get((i, op), "-").ljust(6) for op in OPS))
    return "\n".join(lines)


def bad(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results with a bad outcome (raw exception, hang, memory, wrong, crash)."""
    return [r for r in results if r["outcome"] in BAD]


@contextlib.contextmanager
def base_store() -> Iterator[str]:
    """A temporary base store (built in a subprocess-free way here), removed afterwards."""
    top = tempfile.mkdtemp(prefix="hostile-corpus-", dir=scratch_dir())
    try:
        root = os.path.join(top, "base")
        build_base(root)
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Standalone: build a base store, run the corpus, print the summary (and the bad outcomes)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs="+", metavar=("BASE", "CASE"), help=argparse.SUPPRESS)
    p.add_argument("--cases", action="store_true", help="list the cases and exit")
    p.add_argument("-k", default="", help="run only the cases whose id contains this text")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print every outcome as JSON lines")
    p.add_argument("--matrix", action="store_true", help="print each case's outcome per operation")
    args = p.parse_args(argv)
    if args.worker:
        def emit(r: dict[str, Any]) -> None:
            sys.stdout.write(json.dumps(r) + "\n")
            sys.stdout.flush()
        code = worker(args.worker[0], args.worker[1:], emit)
        sys.stdout.flush()
        os._exit(code)  # (stuck threads after a hang must not block the exit)
    chosen = [c for c in cases() if args.k in c.id]
    if args.cases:
        print("\n".join(c.id for c in chosen))
        return 0
    started = time.monotonic()
    with base_store() as base:
        results = run(base, chosen, args.workers)
    if args.json:
        for r in results:
            print(json.dumps(r))
    if args.matrix:
        print(matrix(results))
    print(summary(results))
    for r in bad(results):
        print(f"  {r['outcome']}: {r['case']}: {r['op']}: {r['detail']}")
    print(f"({time.monotonic() - started:.0f} s)")
    return 1 if bad(results) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (support.batches)
    sys.exit(main())
