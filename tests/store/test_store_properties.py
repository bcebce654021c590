"""Property test: random sequences of appends (int and str streams, random sizes, explicit
steps with gaps, resets), commits (also pipelined: ``commit(wait=False)``), refreshes and
reopened readers/writers, with and without capacity, checked after every commit against a
small in-memory reference model.

Runs on the local and memory:// backends (S3 runs the example-based suite)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from replaystore.errors import StaleReadError
from replaystore.schemas import Dense, Ragged, Schema
from replaystore.store import Store, Writer, open_store
from replaystore.store.format import layout
from replaystore.store.read import log as log_module

SCHEMA = Schema("prop", [Dense("uid", np.int64), Dense("obs", np.float32, (3,)),
                         Ragged("ids", np.int64, "offsets")])
# each writer slot owns two streams (a stream is written by one writer at a time)
STREAMS = {0: [0, "s0"], 1: [1, "s1"]}
SHM = "/dev/shm"


@dataclass
class Rec:
    uid: int
    key: int | str
    step: int
    reset: bool
    row: int = -1  # row id, known once committed


@dataclass
class Slot:
    """One writer slot: the live Writer, its store handle, and what the model knows of both."""

    store: Store
    writer: Writer
    committed_rows: int = 0
    pending: list[Rec] = field(default_factory=list)
    last: dict[Any, int] = field(default_factory=dict)  # the writer's known last step per stream
    view: int | None = 0  # len(model.committed) at this handle's last refresh (None: unknown)
    last_committed: dict[Any, int] = field(default_factory=dict)  # ``last`` as of the last commit
    flying: bool = False  # a commit(wait=False) may still be in flight


class Model:
    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.committed: list[Rec] = []  # commit order; inside a commit, row order
        self.max_step: dict[Any, int] = {}
        self.uid = 0

    def visible(self, view: int | None = None, writer: int | None = None) -> list[Rec]:
        """What a handle shows that read every commit up to ``view`` and, later, only those of
        ``writer`` (its own: a commit shows itself through its writer's handle)."""
        end = len(self.committed) if view is None else view
        recs = self.committed[:end] + [r for r in self.committed[end:] if writer is not None
                                        and r.row >> layout.ROW_BITS == writer]
        return recs if self.capacity is None else recs[max(len(recs) - self.capacity, 0):]

    def last_visible(self, key: Any, view: int) -> int | None:
        steps = [r.step for r in self.visible(view) if r.key == key]
        return max(steps) if steps else None


def content(uid: int) -> tuple[np.ndarray, list[int]]:
    """Deterministic record content from its uid."""
    obs = np.array([uid, -uid, uid * 0.5], dtype=np.float32)
    return obs, list(range(uid % 4))


def batch_of(uids: list[int]) -> dict[str, np.ndarray]:
    obs = np.stack([content(u)[0] for u in uids])
    ids = [content(u)[1] for u in uids]
    offsets = np.zeros(len(uids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    return {"uid": np.array(uids, dtype=np.int64), "obs": obs,
            "ids": np.array([i for x in ids for i in x], dtype=np.int64), "offsets": offsets}


def check(handle: Store, model: Model, view: int | None = None, writer: int | None = None) -> None:
    """``handle`` shows exactly the model's visible records (as of ``view``, plus ``writer``'s)."""
    vis = sorted(model.visible(view, writer), key=lambda r: r.row)
    assert len(handle) == len(vis)
    rows = handle.row_ids()
    assert rows.tolist() == [r.row for r in vis]
    got = handle.read(rows)
    assert got["uid"].tolist() == [r.uid for r in vis]
    for i, r in enumerate(vis):
        obs, ids = content(r.uid)
        assert got["obs"][i].tobytes() == obs.tobytes()
        assert got["ids"][got["offsets"][i]:got["offsets"][i + 1]].tolist() == ids
    keys = {r.key for r in vis}
    assert sorted(handle.streams(), key=repr) == sorted(keys, key=repr)
    for key in [k for ks in STREAMS.values() for k in ks]:
        mine = sorted((r for r in vis if r.key == key), key=lambda r: r.step)
        srows, ssteps = handle.rows(key)
        assert ssteps.tolist() == [r.step for r in mine]
        assert srows.tolist() == [r.row for r in mine]
        steps = np.array([r.step for r in mine], dtype=np.int64)
        if len(steps):
            cuts = np.flatnonzero(np.diff(steps) != 1) + 1
            runs = np.stack([steps[np.r_[0, cuts]], steps[np.r_[cuts, len(steps)] - 1]], axis=1).tolist()
        else:
            runs = []
        assert handle.runs(key).tolist() == runs
        probe = sorted({0, *(s for s in steps.tolist()), *(s + 1 for s in steps.tolist())})
        by_step = {r.step: r.row for r in mine}
        assert handle.lookup(key, np.array(probe)).tolist() == [by_step.get(s, -1) for s in probe]
        if mine:
            k, s, resets = handle.default.index_of(srows)
            assert k.tolist() == [key] * len(mine) and s.tolist() == ssteps.tolist()
            assert resets.tolist() == [r.reset for r in mine]


def check_view(handle: Store, model: Model, view: int, writer: int | None = None) -> None:
    """Check a handle that has not refreshed since ``view`` (but shows ``writer``'s commits).
    Its data are guaranteed readable while it lags by at most the reclaim grace; beyond that
    StaleReadError is the contract."""
    lag = len(model.committed) - view
    if model.capacity is None or lag <= max(model.capacity // 4, 1):
        check(handle, model, view, writer)
        return
    try:
        check(handle, model, view, writer)
    except StaleReadError:
        event("stale view refused")


APPEND = st.tuples(st.just("append"), st.integers(0, 1), st.sampled_from(["a", "b", "mixed"]),
                   st.integers(1, 8), st.booleans(), st.booleans())
# a burst: many one- or two-record commits in a row (what makes compaction merge fragments)
BURST = st.tuples(st.just("burst"), st.integers(0, 1), st.sampled_from(["a", "b"]), st.integers(8, 12),
                  st.integers(1, 2))
OPS = st.lists(st.one_of(APPEND, APPEND, APPEND, BURST,
                         st.tuples(st.just("commit"), st.integers(0, 1)),
                         st.tuples(st.just("commit"), st.integers(0, 1)),
                         st.tuples(st.just("pipelined"), st.integers(0, 1)),
                         st.tuples(st.just("pipelined"), st.integers(0, 1)),
                         st.tuples(st.just("refresh")),
                         st.tuples(st.just("reopen_reader")),
                         st.tuples(st.just("reopen_writer"), st.integers(0, 1)),
                         st.tuples(st.just("discard"), st.integers(0, 1))),
               min_size=10, max_size=40)


def _url(kind: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    if kind == "local":
        # the same LocalStorage code path; on tmpfs (when there is one) its many fsyncs are cheap,
        # which is what lets hypothesis run hundreds of commits (durability is tested elsewhere)
        base = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else str(tmp_path_factory.getbasetemp())
        return os.path.join(tempfile.mkdtemp(prefix="replaystore-prop-", dir=base), "st")
    return f"memory://prop-{uuid.uuid4().hex}"


@pytest.mark.parametrize("kind", ["local", "memory"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, capacity=st.sampled_from([None, 7, 16, 64]), checkpoint_every=st.sampled_from([None, 2, 5]),
       data=st.data())
def test_store_matches_reference_model(kind: str, tmp_path_factory: pytest.TempPathFactory, ops: list[tuple],
                                       capacity: int | None, checkpoint_every: int | None,
                                       data: st.DataObject) -> None:
    """``checkpoint_every``: writers save a log checkpoint every few records, so reopened
    readers and writers start from one (None: the default interval, never reached here)."""
    url = _url(kind, tmp_path_factory)
    default_every = log_module.CHECKPOINT_EVERY
    log_module.CHECKPOINT_EVERY = checkpoint_every or default_every
    try:
        _run(url, ops, capacity, data)
    finally:
        log_module.CHECKPOINT_EVERY = default_every
        if kind == "local":
            shutil.rmtree(os.path.dirname(url), ignore_errors=True)
        if kind == "memory":
            fs = fsspec.filesystem("memory")
            root = url[len("memory://"):]
            for p in [p for p in list(fs.store) if p.lstrip("/").startswith(root)]:
                fs.store.pop(p, None)


def _open_slot(url: str, model: Model) -> Slot:
    handle = open_store(url, SCHEMA, capacity=model.capacity)
    return Slot(handle, handle.writer(), view=len(model.committed))


def _commit(slot: Slot, model: Model, wait: bool = True) -> None:
    """A commit; ``wait=False``: pipelined, its records in the model at once (they are
    committed in this order) but visible only once :func:`_settle` has waited for them."""
    result = slot.writer.commit(wait=wait)
    assert (result is None) == (not slot.pending)
    if result is None:  # nothing to commit: nothing written, the handle is not refreshed either
        if wait:
            check_view(slot.store, model, slot.view, slot.writer.id)  # type: ignore[arg-type]
        return
    assert result.rows["records"] == (slot.writer.id << layout.ROW_BITS | slot.committed_rows,
                                      slot.writer.id << layout.ROW_BITS | slot.committed_rows + len(slot.pending))
    for r in slot.pending:
        r.row = (slot.writer.id << layout.ROW_BITS) | slot.committed_rows
        slot.committed_rows += 1
        model.committed.append(r)
    slot.pending = []
    slot.last_committed = dict(slot.last)
    if not wait:  # the writer's handle refreshed while the commit may still have been in flight
        slot.view, slot.flying = None, True
        return
    if model.capacity is not None or slot.store.log.since_checkpoint == 0:
        # a capped store's commit reads every writer's commits, as does one that wrote a checkpoint;
        # otherwise the handle shows its own commits on top of what it last read
        slot.view = len(model.committed)
    check(slot.store, model, slot.view, slot.writer.id)


def _settle(slots: list[Slot], model: Model) -> None:
    """Wait for the pipelined commits: from here on every handle sees them once refreshed.
    A handle that refreshed while one may have been in flight refreshes again."""
    for slot in slots:
        if slot.flying:
            slot.writer.wait()
            slot.flying = False
    for slot in slots:
        if slot.view is None:
            slot.store.refresh()
            slot.view = len(model.committed)
            check(slot.store, model)


def _append(slots: list[Slot], s: int, which: str, n: int, explicit: bool, reset: bool, model: Model,
            data: st.DataObject) -> None:
    slot = slots[s]
    a, b = STREAMS[s]
    if which == "mixed":
        keys = data.draw(st.lists(st.sampled_from([a, b]), min_size=n, max_size=n))
        stream: Any = keys
    else:
        keys = [a if which == "a" else b] * n
        stream = keys[0]
    if any(k not in slot.last for k in keys):
        _settle(slots, model)  # what the writer finds there must not depend on a commit's timing
        slot.view = len(model.committed)  # a stream new to the writer: it refreshes its store first
        for k in set(keys) - slot.last.keys():
            # and keeps the last step it finds there, also through a discard of this append
            found = model.last_visible(k, slot.view)
            if found is not None:
                slot.last_committed[k] = found
    steps: list[int] = []
    nxt: dict[Any, int] = {}
    for k in keys:
        if k not in nxt:
            if explicit:  # past every step the stream ever had, with a random gap
                base = max(model.max_step.get(k, -1), slot.last.get(k, -1))
                nxt[k] = base + 1 + data.draw(st.sampled_from([0, 0, 1, 4]))
            else:
                last = slot.last.get(k)
                if last is None:  # the writer asks its (just refreshed) store; evicted steps are forgotten
                    last = model.last_visible(k, slot.view)
                nxt[k] = 0 if last is None else last + 1
        steps.append(nxt[k])
        nxt[k] += data.draw(st.sampled_from([1, 1, 2])) if explicit else 1
    uids = list(range(model.uid, model.uid + n))
    model.uid += n
    kwargs: dict[str, Any] = {"stream": stream, "reset": reset}
    if explicit:
        kwargs["step"] = np.array(steps, dtype=np.int64)
    assert slot.writer.append(batch_of(uids), **kwargs) == n
    seen: set[Any] = set()
    for u, k, stp in zip(uids, keys, steps, strict=True):
        slot.pending.append(Rec(u, k, stp, reset and k not in seen))
        seen.add(k)
        slot.last[k] = stp
        model.max_step[k] = max(model.max_step.get(k, -1), stp)


def _run(url: str, ops: list[tuple], capacity: int | None, data: st.DataObject) -> None:
    model = Model(capacity)
    slots = [_open_slot(url, model), _open_slot(url, model)]
    reader = open_store(url, mode="r")
    reader_view = 0
    for op in ops:
        name = op[0]
        if name == "append":
            _, slot_i, which, n, explicit, reset = op
            _append(slots, slot_i, which, n, explicit, reset, model, data)
            continue
        if name == "pipelined":
            _commit(slots[op[1]], model, wait=False)
            continue
        _settle(slots, model)  # every other step observes the store
        if name == "burst":
            _, slot_i, which, count, n = op
            for _ in range(count):
                _append(slots, slot_i, which, n, False, False, model, data)
                _commit(slots[slot_i], model)
        elif name == "commit":
            _commit(slots[op[1]], model)
        elif name == "discard":  # drops the pending appends and the steps they took
            slot = slots[op[1]]
            slot.writer.discard()
            slot.pending = []
            slot.last = dict(slot.last_committed)
        elif name == "refresh":
            check_view(reader, model, reader_view)  # a handle shows nothing new until it refreshes
            changed = reader.refresh()
            # new commits must show; without them only a writer's background merge can (same records)
            assert changed or reader_view == len(model.committed)
            reader_view = len(model.committed)
            check(reader, model)
        elif name == "reopen_reader":
            reader = open_store(url, mode="r")
            reader_view = len(model.committed)
            check(reader, model)
        elif name == "reopen_writer":
            s = op[1]
            _commit(slots[s], model)  # close() commits what is pending
            slots[s].writer.close()
            slots[s] = _open_slot(url, model)
    _settle(slots, model)
    for slot in slots:
        _commit(slot, model)
    final = open_store(url, mode="r")
    check(final, model)
    event(f"opened from a log checkpoint: {final.log.checkpoint is not None}")
    kinds = [c["kind"] for c in final.commits()]
    event(f"compacted: {'compact' in kinds}")
    event(f"evicted: {capacity is not None and len(model.committed) > capacity}")
    event(f"writers: {len(final.writers)}")
