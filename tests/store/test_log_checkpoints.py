"""Log checkpoints (docs/FORMAT.md, "Log checkpoints"): opening a store reads the newest
checkpoint and the records after it, on local disk, memory:// and S3; damaged or wrong
checkpoints are never trusted."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import dqn
from replaystore.store import Store
from replaystore.store.format import layout, records
from replaystore.store.format.fragment import Fragment
from replaystore.store.maintenance.verify import verify
from replaystore.store.read import log as log_module
from replaystore.store.read.log import CommitLog, WriterLog, encode_checkpoint
from support.batches import dqn_batch
from support.storecheck import Backend, assert_same, columns_of

DQN = dqn(16, 2, actions=9)
EVERY = 4  # records applied between checkpoints in these tests (1,024 by default)


@pytest.fixture(autouse=True)
def _frequent_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "CHECKPOINT_EVERY", EVERY)


def _write(st: Store, rng: np.random.Generator, commits: int, stream: Any = 0, close: bool = True) -> list[Any]:
    batches = []
    w = st.writer()
    for _ in range(commits):
        batches.append(dqn_batch(rng, int(rng.integers(1, 4)), extra=0))
        w.append(batches[-1], stream=stream)
        w.commit(metadata={"n": len(batches)})
    if close:
        w.close()
    return batches


def _replayed(backend: Backend) -> CommitLog:
    """The log as a reader that ignores checkpoints applies it (every record read)."""
    st = backend.open(mode="r")
    full = CommitLog(st.storage, st.tables, checkpoints=False)
    full.refresh()
    return full


def _state(log: CommitLog) -> dict[int, tuple[int, bool, dict[str, list[dict[str, Any]]]]]:
    return {w: wl.state() for w, wl in log.writers.items()}


def test_open_starts_from_the_newest_checkpoint_and_reads_no_record_before_it(backend: Backend) -> None:
    rng = np.random.default_rng(1)
    st = backend.open(DQN)
    batches = _write(st, rng, 12, stream=0) + _write(st, rng, 9, stream="b")
    numbers = st.log.checkpoint_numbers()
    assert len(numbers) == 2 and numbers[1] == numbers[0] + 1 >= 3  # superseded ones were deleted
    full = _replayed(backend)
    reader = backend.open(mode="r")
    assert reader.log.checkpoint == numbers[-1]
    assert _state(reader.log) == _state(full)  # the same live fragments, positions, closed flags
    want = columns_of(DQN, batches)
    assert len(reader) == len(want)
    assert_same(reader.read(reader.row_ids()), want)
    assert reader.commits() == [c.body for c in full.history() if c.body["kind"] != "close"]
    info = reader.info()
    assert info["commits"] == len(reader.commits()) and info["log_checkpoint"] == numbers[-1]

    # the records the checkpoint summarises are not read at all: with them gone the store still opens
    # whole (the format never deletes them: this only proves where opening reads from)
    storage = backend.storage()
    body = records.decode(layout.checkpoint(numbers[-1]), storage.read(layout.checkpoint(numbers[-1])))
    covered = [layout.commit_record(int(w), s) for w, d in body["writers"].items() for s in range(d["next_seq"])]
    storage.delete_objects(covered)
    again = backend.open(mode="r")
    assert_same(again.read(again.row_ids()), want)
    with pytest.raises(StoreError, match="commit record missing"):
        again.commits()  # the history is read from the records, and one is gone
    problems = verify(again)  # both checkpoints summarise records that are gone
    ours = [p for p in problems if p.path.startswith(layout.CHECKPOINTS)]
    assert [p.path for p in ours] == [layout.checkpoint(n) for n in numbers]
    assert all("commit records cannot be read back" in p.problem for p in ours)
    # and the writers whose first records are gone: readers without the checkpoint stop at the gap
    assert all(p.path.startswith(layout.WRITERS) and "is missing" in p.problem for p in problems if p not in ours)


def test_a_store_keeps_growing_from_a_checkpoint_and_a_writer_continues_its_streams(backend: Backend) -> None:
    rng = np.random.default_rng(2)
    st = backend.open(DQN, capacity=20)
    batches = _write(st, rng, 10, stream=0)
    reopened = backend.open(mode="a")
    assert reopened.log.checkpoint is not None
    batches += _write(reopened, rng, 10, stream=0)  # auto steps continue from what the checkpoint lists
    final = backend.open(mode="r")
    assert _state(final.log) == _state(_replayed(backend))
    want = columns_of(DQN, batches)
    steps = final.rows(0)[1]
    assert len(final) == 20 and steps.tolist() == list(range(len(want) - 20, len(want)))
    assert_same(final.read(final.rows(0)[0]), want.take(np.arange(len(want) - 20, len(want))))
    assert verify(final) == []


def test_a_damaged_checkpoint_is_skipped_and_verify_names_it(backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st = backend.open(DQN)
    want = columns_of(DQN, _write(st, rng, 12))
    storage = backend.storage()
    older, newest = st.log.checkpoint_numbers()
    path = layout.checkpoint(newest)
    valid = storage.read(path)
    not_a_checkpoint = records.encode({**records.decode(path, valid), "kind": "append"})
    for damaged in (valid[: len(valid) // 2], valid.replace(b'"closed":', b'"Closed":', 1), b"garbage",
                    not_a_checkpoint):
        storage.delete(path)
        assert storage.create(path, damaged)
        reader = backend.open(mode="r")
        assert reader.log.checkpoint == older  # the one before it
        assert_same(reader.read(reader.row_ids()), want)
        assert [p.path for p in verify(reader)] == [path]
    storage.delete(layout.checkpoint(older))  # none usable: every record is read
    reader = backend.open(mode="r")
    assert reader.log.checkpoint is None
    assert_same(reader.read(reader.row_ids()), want)


def test_a_checkpoint_deleted_after_the_listing_is_passed_over(fast_backend: Backend,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer writer deleted a superseded checkpoint between a reader's listing and its read:
    the reader takes the next one listed, and verify has nothing to report about it."""
    rng = np.random.default_rng(6)
    st = fast_backend.open(DQN)
    want = columns_of(DQN, _write(st, rng, 12))
    newest = st.log.checkpoint_numbers()[-1]
    reader = fast_backend.open(mode="r")
    listed = reader.storage.list
    gone = f"{newest + 5:010d}.json"  # listed, then deleted before it was read
    monkeypatch.setattr(reader.storage, "list", lambda prefix: [*listed(prefix), gone] if prefix == layout.CHECKPOINTS
                        else listed(prefix))
    again = Store(reader.storage, reader.manifest, "r")
    assert again.log.checkpoint == newest
    assert_same(again.read(again.row_ids()), want)
    assert verify(again) == []


def test_verify_reports_a_checkpoint_that_differs_from_its_records(fast_backend: Backend) -> None:
    """A well-formed checkpoint whose content is wrong (here: a fragment left out, a seq moved)."""
    rng = np.random.default_rng(4)
    st = fast_backend.open(DQN)
    _write(st, rng, 12)
    storage = fast_backend.storage()
    newest = st.log.checkpoint_numbers()[-1]
    good = storage.read(layout.checkpoint(newest))
    doc = records.decode("", good)
    writer = next(iter(doc["writers"]))
    for mutate in ("drop a fragment", "move next_seq"):
        w = json.loads(json.dumps(doc["writers"][writer]))
        if mutate == "drop a fragment":
            w["tables"]["records"] = w["tables"]["records"][:-1]
        else:
            w["next_seq"] -= 1
        frags = {t: {d["name"]: Fragment.from_dict(int(writer), t, d) for d in ds} for t, ds in w["tables"].items()}
        wlog = WriterLog(int(writer), w["next_seq"], w["closed"], frags)
        storage.delete(layout.checkpoint(newest))
        assert storage.create(layout.checkpoint(newest), encode_checkpoint(newest, {int(writer): wlog}, doc["time_ns"]))
        problems = verify(fast_backend.open(mode="r"))
        assert [p.path for p in problems] == [layout.checkpoint(newest)], mutate
        # (a next_seq moved below a live fragment's part is malformed on its face: refused when decoded)
        assert ("differs from writer" in problems[0].problem or
                mutate == "move next_seq" and ".parts[" in problems[0].problem), problems
    storage.delete(layout.checkpoint(newest))
    assert storage.create(layout.checkpoint(newest), good)
    assert verify(fast_backend.open(mode="r")) == []


def test_writers_share_one_checkpoint_per_interval_and_a_lost_race_writes_nothing(
        fast_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A due writer that lists a checkpoint newer than it knows adopts it instead of writing
    another; one that finds its number taken (created between its listing and its create)
    writes nothing and fails nothing."""
    rng = np.random.default_rng(5)
    a, b = fast_backend.open(DQN), fast_backend.open(mode="a")
    wa, wb = a.writer(), b.writer()
    for _ in range(EVERY):
        wa.append(dqn_batch(rng, 1, extra=0), stream="a")
        wa.commit()
    first = a.log.checkpoint
    assert first is not None
    storage = fast_backend.storage()
    wb.append(dqn_batch(rng, 1, extra=0), stream="b")
    wb.commit()  # b applied a's records and its own: due, but a's checkpoint is newer than any b knew
    assert b.log.checkpoint == first and b.log.since_checkpoint == 0
    assert storage.list(layout.CHECKPOINTS) == [f"{first:010d}.json"]
    for _ in range(EVERY):
        wb.append(dqn_batch(rng, 1, extra=0), stream="b")
        wb.commit()
    assert b.log.checkpoint == first + 1
    racer = fast_backend.open(mode="r")  # as if it had listed just before b's create
    listed, hidden = racer.storage.list, f"{first + 1:010d}.json"
    monkeypatch.setattr(racer.storage, "list", lambda prefix: [n for n in listed(prefix) if n != hidden])
    racer.log.checkpoint, racer.log.since_checkpoint = first, EVERY
    assert racer.log.write_checkpoint() is None and racer.log.since_checkpoint == 0
    assert storage.list(layout.CHECKPOINTS) == [f"{n:010d}.json" for n in (first, first + 1)]
    assert records.decode("", storage.read(layout.checkpoint(first + 1)))["writers"][str(wb.id)]["next_seq"] > 0
    wa.close()
    wb.close()
    final = fast_backend.open(mode="r")
    assert _state(final.log) == _state(_replayed(fast_backend)) and verify(final) == []


def test_a_closed_writers_close_time_comes_from_its_record_or_the_checkpoint_that_holds_it(
        backend: Backend) -> None:
    """Reclaimers wait a grace past a writer's close before deleting its unreferenced segments: a
    reader that applied the ``close`` record knows its time; one that knows the close only from a
    checkpoint takes the checkpoint's time, which is never earlier."""
    rng = np.random.default_rng(9)
    st = backend.open(DQN)
    _write(st, rng, 3, stream=0)
    _write(st, rng, 9, stream="b")  # (checkpoints after writer 0's close)
    full = _replayed(backend)
    close = records.decode("", st.storage.read(layout.commit_record(0, full.writers[0].next_seq - 1)))
    assert close["kind"] == "close" and full.writers[0].closed_ns == close["time_ns"]
    opened = backend.open(mode="r")
    assert opened.log.checkpoint_numbers()  # (it started from one)
    assert opened.log.writers[0].closed and opened.log.writers[0].closed_ns >= close["time_ns"]
