"""Pipelined commits (``commit(wait=False)``) on local disk, where records go to segments whose
files the committer thread syncs while the writer appends on: rollovers, capped reclaim, a
failed commit, and no descriptor left open. (The generic suite runs them on every backend,
the property test against its model, tests/system/test_crash.py under SIGKILL.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import dqn
from replaystore.store import Store, open_store
from replaystore.store.format import layout, records
from replaystore.store.write import liveness
from support.batches import dqn_batch
from support.storecheck import assert_same, columns_of, descriptors_under

DQN = dqn(16, 2, actions=9)


def _batches(seed: int, sizes: list[int]) -> list[object]:
    rng = np.random.default_rng(seed)
    return [dqn_batch(rng, n, extra=0) for n in sizes]


def _squat(st: Store, writer: int, seq: int) -> None:
    """Create writer ``writer``'s commit record ``seq`` (an empty commit) before it does."""
    body = {"writer": writer, "seq": seq, "time_ns": 1, "kind": "append", "metadata": {}, "tables": {}}
    assert st.storage.create(layout.commit_record(writer, seq), records.encode(body))


@pytest.mark.parametrize("wait", [True, False])
def test_rollovers_close_sealed_segments_once_their_commit_is_made(tmp_path: Path, wait: bool) -> None:
    """Segments of 16 rows (capacity 64): most commits seal one, some appends that a discard
    drops too. A pipelined commit's files are being synced by the committer thread, so a
    sealed segment is closed only after; none stays open (each holds 16 descriptors)."""
    batches = _batches(1, [5, 7, 3, 9, 6, 4, 8, 5] * 4)
    st = open_store(str(tmp_path / "st"), DQN, mode="w", capacity=64)
    w = st.writer()
    for i, b in enumerate(batches):
        if i % 5 == 4:
            w.append(batches[0], stream="a")
            w.append(b, stream="a")  # rolls over more often than not
            w.discard()
        w.append(b, stream="a")
        w.commit(wait=wait)
    assert descriptors_under(tmp_path) >= 16  # the open segment's files
    w.close()
    st.close()
    assert descriptors_under(tmp_path) == 0
    final = open_store(str(tmp_path / "st"), mode="r")
    total = sum(len(b.rewards) for b in batches)  # type: ignore[attr-defined]
    assert len(final) == 64
    assert final.rows("a")[1].tolist() == list(range(total - 64, total))
    want = columns_of(DQN, batches)
    assert_same(final.read(final.row_ids()), want.take(np.arange(total - 64, total)), "dqn")


def test_capped_reclaim_keeps_a_segment_an_in_flight_commit_references(tmp_path: Path) -> None:
    """A's segment S holds 4 records that B's commits then evict; A appends 10 more into S and 5
    that roll over, and commits them with wait=False. Its store handle does not know that
    commit yet, so S looks like a sealed segment whose records are all evicted: reclaiming it
    then would delete records that are being committed."""
    url = str(tmp_path / "st")
    a_batches = _batches(2, [4, 10, 5])
    st_a = open_store(url, DQN, mode="w", capacity=64)  # segments of 16 rows
    a = st_a.writer()
    a.append(a_batches[0], stream="a")
    a.commit()
    st_b = open_store(url, mode="a")
    with st_b.writer() as b:
        for batch in _batches(3, [10] * 10):  # 100 records: A's 4 are past capacity + grace (80)
            b.append(batch, stream="b")
            b.commit()
    a.append(a_batches[1], stream="a")  # S: 14 of 16 rows
    a.append(a_batches[2], stream="a")  # does not fit: S is sealed, a new segment opened
    a.commit(wait=False)
    a.close()  # waits for the commit and for the I/O threads' deletions
    final = open_store(url, mode="r")
    rows, steps = final.rows("a")
    assert steps.tolist() == list(range(4, 19))
    assert_same(final.read(rows), columns_of(DQN, a_batches[1:]), "dqn")


def test_a_failed_pipelined_commit_breaks_the_writer(tmp_path: Path) -> None:
    """The record a pipelined commit would create exists already (as when two writers share a
    number): the next call reports it, the writer refuses everything but close(), writes no
    close record, and releases its liveness lock; the store is as it was."""
    url = str(tmp_path / "st")
    batches = _batches(4, [3, 4, 5])
    st = open_store(url, DQN, mode="w")
    w = st.writer()
    w.append(batches[0], stream="a")
    w.commit()
    _squat(st, w.id, 1)
    w.append(batches[1], stream="a")
    assert w.commit(wait=False) is not None  # returns before the record is made
    w.append(batches[2], stream="a")
    with pytest.raises(StoreError, match=r"wait=False failed .*already exists"):
        w.commit()
    with pytest.raises(StoreError, match="is broken"):
        w.append(batches[2], stream="a")
    with pytest.raises(StoreError, match="is broken"):
        w.wait()
    w.close()  # already reported: close releases without raising
    assert w.closed
    assert liveness.is_dead(st.storage, w.id)
    reader = open_store(url, mode="r")
    assert len(reader) == 3 and sorted(c["seq"] for c in reader.commits()) == [0, 1]  # (time order)
    assert not reader.log.writers[w.id].closed  # no close record after the squatter
    assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches[:1]), "dqn")
    with open_store(url, mode="a").writer() as w2:  # a new writer goes on
        w2.append(batches[1], stream="b")
    assert len(open_store(url, mode="r")) == 7


def test_close_reports_a_failure_it_finds_and_still_releases(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    batch = _batches(5, [3])[0]
    st = open_store(url, DQN, mode="w")
    w = st.writer()
    _squat(st, w.id, 0)
    w.append(batch, stream="a")
    w.commit(wait=False)
    with pytest.raises(StoreError, match="wait=False failed"):
        w.close()
    assert w.closed and liveness.is_dead(st.storage, w.id)
    w.close()  # closed: nothing more to do


def test_an_exception_in_the_writer_block_keeps_the_pipelined_commit_before_it(tmp_path: Path) -> None:
    """Leaving ``with st.writer()`` on an exception discards what is pending, but a commit made
    with wait=False before it is waited for and kept; the writer closes (a close record)."""
    url = str(tmp_path / "st")
    batches = _batches(6, [4, 3])
    st = open_store(url, DQN, mode="w")
    with pytest.raises(RuntimeError, match="collector crashed"), st.writer() as w:
        w.append(batches[0], stream="a")
        w.commit(wait=False)
        w.append(batches[1], stream="a")
        raise RuntimeError("collector crashed")
    assert w.closed
    reader = open_store(url, mode="r")
    assert len(reader) == 4 and reader.log.writers[w.id].closed
    assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches[:1]), "dqn")
