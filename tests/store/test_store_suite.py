"""The generic store suite (in the style of zarr-python's testing/store.py): every test
runs on a local directory, memory:// and S3 (a moto server on loopback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr

from replaystore.errors import RowError, StepOrderError, StoreError
from replaystore.schemas import Schema, alphazero, dqn, ppo, treestrap
from replaystore.store import Store
from replaystore.store.format import layout, records
from replaystore.store.read import log as log_module
from support.batches import alphazero_batch, dqn_batch, ppo_batch, treestrap_batch
from support.storecheck import Backend, assert_same, columns_of

KINDS: dict[str, tuple[Schema, Callable[..., Any]]] = {
    "dqn": (dqn(16, 2, actions=9), dqn_batch),
    "alphazero": (alphazero(16, 9), alphazero_batch),
    "ppo": (ppo(16, actions=9), ppo_batch),
    "treestrap": (treestrap(16, 2, 9), treestrap_batch),
}
DQN = KINDS["dqn"][0]


def _dqn(rng: np.random.Generator, n: int) -> Any:
    return dqn_batch(rng, n, extra=0)


# -- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_round_trip_is_bit_identical(backend: Backend, kind: str) -> None:
    schema, make = KINDS[kind]
    rng = np.random.default_rng(11)
    batches = [make(rng, n) for n in (7, 1, 12)]
    st = backend.open(schema, mode="w")
    with st.writer() as w:
        w.append(batches[0], stream=0)
        w.append(batches[1], stream="b")
        w.commit()
        w.append(batches[2], stream=0)
    want = columns_of(schema, batches)
    for handle in (st, backend.open(mode="r")):
        assert len(handle) == len(want)
        ids = handle.row_ids()
        assert ids.tolist() == list(range(len(want)))  # one writer: row ids 0..n-1
        assert_same(handle.read(ids), want, kind)
        # an arbitrary selection: unordered, repeated rows
        pick = rng.integers(0, len(want), 25)
        assert_same(handle.read(pick), want.take(pick), kind)
        assert_same(handle.read(pick[:0]), want.take(pick[:0]), kind)
        assert_same(handle.read(np.int64(3)), want.take(np.array([3])), kind)
        cols = handle.default.read_columns(pick)
        assert cols.schema == schema and len(cols) == len(pick)
        assert_same(dict(cols.arrays), want.take(pick), kind)


def test_ragged_reads_rebase_and_keep_empty_slices(backend: Backend) -> None:
    schema, _ = KINDS["alphazero"]
    rng = np.random.default_rng(2)
    batch = alphazero_batch(rng, 30, extra=0)
    st = backend.open(schema)
    with st.writer() as w:
        w.append(batch, stream=1)
    empty = np.flatnonzero(np.diff(batch.legal_offsets) == 0)
    assert len(empty) == 10  # every third record is value-only
    pick = np.array([empty[3], 0, empty[0], 29, 5])
    got = st.read(pick)
    counts = np.diff(batch.legal_offsets)[pick]
    assert got["legal_offsets"][0] == 0
    assert np.diff(got["legal_offsets"]).tolist() == counts.tolist()
    for i, r in enumerate(pick):
        lo, hi = batch.legal_offsets[r], batch.legal_offsets[r + 1]
        assert got["legal_ids"][got["legal_offsets"][i]:got["legal_offsets"][i + 1]].tolist() \
            == batch.legal_ids[lo:hi].tolist()
    only_empty = st.read(empty[:4])
    assert only_empty["legal_offsets"].tolist() == [0, 0, 0, 0, 0] and len(only_empty["legal_ids"]) == 0


def test_reading_rows_that_do_not_exist(backend: Backend) -> None:
    st = backend.open(DQN)
    with pytest.raises(RowError):
        st.read([0])
    with st.writer() as w:
        w.append(_dqn(np.random.default_rng(0), 5), stream=1)
    for bad in ([5], [-1], [0, 99], [1 << 40]):
        with pytest.raises(RowError):
            st.read(bad)
        with pytest.raises(KeyError):  # RowError is also a KeyError
            st.read(bad)
    assert len(st.read([4])["obs"]) == 1


# -- visibility --------------------------------------------------------------------------------
def test_uncommitted_appends_are_invisible_and_refresh_sees_commits(backend: Backend) -> None:
    rng = np.random.default_rng(1)
    st = backend.open(DQN)
    reader = backend.open(mode="r")
    w = st.writer()
    w.append(_dqn(rng, 4), stream=1)
    assert len(st) == 0 and len(reader) == 0
    assert reader.refresh() is False and len(reader) == 0
    assert len(backend.open(mode="r")) == 0
    result = w.commit(metadata={"n": 1})
    assert result is not None and result.rows == {"records": (0, 4)}
    assert len(st) == 4  # the writer's own store sees its commit at once
    assert len(reader) == 0  # the other handle does not until it refreshes
    assert reader.refresh() is True
    assert len(reader) == 4 and reader.streams() == [1]
    assert reader.refresh() is False
    w.append(_dqn(rng, 3), stream=2)
    w.commit()
    assert len(reader) == 4
    reader.refresh()
    assert len(reader) == 7 and sorted(reader.streams()) == [1, 2]
    assert w.commit() is None  # nothing pending, no metadata: nothing written
    assert len(st.commits()) == 2
    w.close()


def test_pipelined_commits_become_visible_in_order_once_waited_for(backend: Backend) -> None:
    """``commit(wait=False)`` returns at once; each commit lands whole and in order, and is
    durable and visible once ``wait()``, the next commit or ``close()`` has returned."""
    rng = np.random.default_rng(5)
    batches = [_dqn(rng, n) for n in (5, 3, 8, 2, 4, 6)]
    st = backend.open(DQN, mode="w")
    reader = backend.open(mode="r")
    w = st.writer()
    results = []
    for i, b in enumerate(batches[:4]):
        w.append(b, stream=i % 2)
        results.append(w.commit(metadata={"i": i}, wait=False))
    assert [r.seq for r in results] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert [r.rows["records"] for r in results] == [(0, 5), (5, 8), (8, 16), (16, 18)]  # type: ignore[union-attr]
    w.wait()
    assert len(st) == 18  # wait() refreshed the writer's own handle
    reader.refresh()
    assert len(reader) == 18
    assert [c["metadata"] for c in reader.commits()] == [{"i": i} for i in range(4)]
    assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches[:4]), "dqn")
    w.append(batches[4], stream="x")
    w.commit(wait=False)
    w.append(batches[5], stream="x")
    w.commit(wait=False)  # returns once the one before is durable
    assert len(backend.open(mode="r")) in (22, 28)
    assert w.commit() is None  # nothing pending: waits for the last one
    assert len(backend.open(mode="r")) == 28
    w.append(batches[0], stream="x")
    w.commit(wait=False)
    w.close()  # waits for it too
    final = backend.open(mode="r")
    assert len(final) == 33 and final.rows("x")[1].tolist() == list(range(15))
    assert_same(final.read(final.row_ids()), columns_of(DQN, [*batches, batches[0]]), "dqn")


def test_writer_context_commits_on_exit_and_discards_on_exception(backend: Backend) -> None:
    rng = np.random.default_rng(2)
    st = backend.open(DQN)
    with st.writer() as w:
        w.append(_dqn(rng, 3), stream="a")
    assert w.closed and len(st) == 3
    with pytest.raises(RuntimeError, match="collector crashed"), st.writer() as w2:
        w2.append(_dqn(rng, 5), stream="a")
        raise RuntimeError("collector crashed")
    assert w2.closed
    st.refresh()
    assert len(st) == 3 and len(backend.open(mode="r")) == 3
    with st.writer() as w3:  # the discarded steps are free again
        w3.append(_dqn(rng, 2), stream="a")
    assert st.rows("a")[1].tolist() == [0, 1, 2, 3, 4]


def test_commits_carry_metadata_and_telemetry(backend: Backend) -> None:
    schema, _ = KINDS["ppo"]
    rng = np.random.default_rng(3)
    st = backend.open(schema)
    b1, b2, b3 = (ppo_batch(rng, n, extra=0) for n in (3, 4, 2))
    b1.telemetry = {"fps": 1200, "games": 4}
    b2.telemetry = {"fps": np.float64(850.5), "note": "ok"}
    b3.telemetry = {}
    w = st.writer()
    w.append(b1, stream=0)
    w.append(b2, stream=1)
    w.commit(metadata={"learner_step": 10, "tags": ["a", "b"]})
    w.append(b3, stream=0)
    w.commit()
    w.commit(metadata={"marker": True})  # metadata alone is a commit too
    w.close()
    for handle in (st, backend.open(mode="r")):
        commits = [c for c in handle.commits() if c["kind"] == "append"]
        assert len(commits) == 3
        first, second, third = commits
        assert first["metadata"] == {"learner_step": 10, "tags": ["a", "b"]}
        assert first["writer"] == w.id and first["seq"] == 0
        appends = first["tables"]["records"]["appends"]
        assert [a["rows"] for a in appends] == [[0, 3], [3, 7]]
        assert [a["meta"] for a in appends] == [{"telemetry": {"fps": 1200, "games": 4}},
                                                 {"telemetry": {"fps": 850.5, "note": "ok"}}]
        assert second["metadata"] == {}
        assert second["tables"]["records"]["appends"] == [{"rows": [7, 9], "meta": {"telemetry": {}}}]
        assert third["metadata"] == {"marker": True} and third["tables"] == {}
        assert second["time_ns"] > first["time_ns"]
        assert len(handle) == 9


# -- streams and steps -----------------------------------------------------------------------------
def test_int_and_str_streams_auto_increment(backend: Backend) -> None:
    rng = np.random.default_rng(4)
    st = backend.open(DQN)
    w = st.writer()
    w.append(_dqn(rng, 3), stream=7)
    w.append(_dqn(rng, 2), stream="7")
    w.append(_dqn(rng, 2), stream=np.int64(7))
    w.append(_dqn(rng, 4), stream=["actor-a", 7, "actor-a", "7"])
    w.append(_dqn(rng, 1), stream=np.str_("actor-a"))
    w.commit()
    w.append(_dqn(rng, 2), stream=7)
    w.commit()
    w.close()
    for handle in (st, backend.open(mode="r")):
        assert sorted(handle.streams(), key=repr) == sorted([7, "7", "actor-a"], key=repr)
        assert all(type(k) in (int, str) for k in handle.streams())
        rows7, steps7 = handle.rows(7)
        assert steps7.tolist() == list(range(8))
        assert rows7.tolist() == [0, 1, 2, 5, 6, 8, 12, 13]
        assert handle.rows("7")[1].tolist() == [0, 1, 2] and handle.rows("7")[0].tolist() == [3, 4, 10]
        assert handle.rows("actor-a")[0].tolist() == [7, 9, 11]
        assert handle.rows("actor-a")[1].tolist() == [0, 1, 2]
        keys, steps, resets = handle.default.index_of(np.arange(len(handle)))
        assert keys.tolist() == [7, 7, 7, "7", "7", 7, 7, "actor-a", 7, "actor-a", "7", "actor-a", 7, 7]
        assert steps.tolist() == [0, 1, 2, 0, 1, 3, 4, 0, 5, 1, 2, 2, 6, 7]
        assert not resets.any()


def test_per_record_key_arrays_int_str_and_torch(backend: Backend) -> None:
    """Per-record keys as numpy int and str arrays and a torch tensor (coded without a Python
    object per record) behave like the same keys as a list: steps per stream, and with
    ``reset=True`` a reset on each stream's first record of the append."""
    import torch

    rng = np.random.default_rng(14)
    st = backend.open(DQN)
    with st.writer() as w:
        w.append(_dqn(rng, 5), stream=np.array([9, 4, 9, 9, 4], dtype=np.int32), reset=True)
        w.append(_dqn(rng, 4), stream=np.array(["x", "y", "x", "x"]), reset=True)
        w.append(_dqn(rng, 3), stream=torch.tensor([4, 9, 4]))
        w.append(_dqn(rng, 2), stream=["y", 9])
    for handle in (st, backend.open(mode="r")):
        keys, steps, resets = handle.default.index_of(handle.row_ids())
        assert keys.tolist() == [9, 4, 9, 9, 4, "x", "y", "x", "x", 4, 9, 4, "y", 9]
        assert all(type(k) in (int, str) for k in keys.tolist())
        assert steps.tolist() == [0, 0, 1, 2, 1, 0, 0, 1, 2, 2, 3, 3, 1, 4]
        assert np.flatnonzero(resets).tolist() == [0, 1, 5, 6]


def test_explicit_steps_runs_and_lookup(backend: Backend) -> None:
    rng = np.random.default_rng(5)
    st = backend.open(DQN)
    w = st.writer()
    w.append(_dqn(rng, 3), stream="s", step=np.array([0, 1, 2]))
    w.append(_dqn(rng, 2), stream="s", step=np.array([5, 6]))
    w.commit()
    w.append(_dqn(rng, 1), stream="s", step=10)
    w.append(_dqn(rng, 2), stream="s")  # auto: continues after the highest step, 11, 12
    w.append(_dqn(rng, 4), stream=["s", 3, 3, "s"], step=np.array([20, 100, 102, 21]))
    w.commit()
    w.close()
    for handle in (st, backend.open(mode="r")):
        rows, steps = handle.rows("s")
        assert steps.tolist() == [0, 1, 2, 5, 6, 10, 11, 12, 20, 21]
        assert rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 11]
        assert handle.runs("s").tolist() == [[0, 2], [5, 6], [10, 12], [20, 21]]
        assert handle.runs(3).tolist() == [[100, 100], [102, 102]]
        assert handle.lookup("s", np.array([0, 3, 5, 10, 12, 13, 21, 22])).tolist() == [0, -1, 3, 5, 7, -1, 11, -1]
        assert int(handle.lookup("s", 6)) == 4
        assert handle.lookup(3, np.array([100, 101, 102])).tolist() == [9, -1, 10]
        assert handle.lookup(3, np.array([[100], [102]])).tolist() == [[9], [10]]


def test_reset_flags(backend: Backend) -> None:
    rng = np.random.default_rng(6)
    st = backend.open(DQN)
    with st.writer() as w:
        w.append(_dqn(rng, 3), stream="a", reset=True)  # first record of each stream in the append
        w.append(_dqn(rng, 3), stream="a")  # default: no reset
        w.append(_dqn(rng, 4), stream=["b", "c", "b", "c"], reset=True)
        w.append(_dqn(rng, 4), stream="a", reset=np.array([False, True, False, True]))
        w.append(_dqn(rng, 2), stream="b", reset=False)
    for handle in (st, backend.open(mode="r")):
        _keys, _steps, resets = handle.default.index_of(handle.row_ids())
        assert np.flatnonzero(resets).tolist() == [0, 6, 7, 11, 13]
        k, s, r = handle.default.index_of([13, 0, 13])
        assert k.tolist() == ["a", "a", "a"] and s.tolist() == [9, 0, 9] and r.tolist() == [True, True, True]
    with pytest.raises(Exception) as info:
        st.writer().append(_dqn(rng, 2), stream="a", reset=np.array([1, 0]))
    assert "reset" in str(info.value)
    with pytest.raises(RowError):
        st.default.index_of([99])


def test_a_new_writer_continues_the_steps_of_existing_streams(backend: Backend) -> None:
    rng = np.random.default_rng(7)
    st = backend.open(DQN)
    with st.writer() as w:
        w.append(_dqn(rng, 3), stream="a")
        w.append(_dqn(rng, 2), stream=5, step=np.array([10, 11]))
    st.close()
    st2 = backend.open(DQN)
    with st2.writer() as w2:
        assert w2.id == 1
        w2.append(_dqn(rng, 2), stream="a")
        w2.append(_dqn(rng, 1), stream=5)
        w2.append(_dqn(rng, 1), stream="new")
    assert st2.rows("a")[1].tolist() == [0, 1, 2, 3, 4]
    assert st2.rows(5)[1].tolist() == [10, 11, 12]
    assert st2.rows("new")[1].tolist() == [0]
    assert st2.writers == [0, 1]
    # rows of the second writer have ids W << 40 | local
    assert st2.rows("a")[0].tolist() == [0, 1, 2, 1 << 40, (1 << 40) + 1]
    assert len(st2) == 9 and len(st2.row_ids()) == 9


def test_a_stream_handed_over_to_an_older_handle_continues_its_steps(backend: Backend) -> None:
    """Handle A was opened before writer B extended stream "k"; A's new writer must not reuse
    B's steps (a stream is written by one writer at a time, not by one writer forever)."""
    rng = np.random.default_rng(12)
    a, b = backend.open(DQN), backend.open(DQN)
    with b.writer() as wb:
        wb.append(_dqn(rng, 4), stream="k")
    with a.writer() as wa:
        wa.append(_dqn(rng, 3), stream="k")
        wa.append(_dqn(rng, 1), stream="k", step=9)
    for handle in (a, backend.open(mode="r")):
        rows, steps = handle.rows("k")
        assert steps.tolist() == [0, 1, 2, 3, 4, 5, 6, 9]
        assert (rows >> layout.ROW_BITS).tolist() == [wb.id] * 4 + [wa.id] * 4
    with pytest.raises(StepOrderError), backend.open(DQN).writer() as w:  # checked against B's steps too
        w.append(_dqn(rng, 1), stream="k", step=9)


def test_new_streams_get_steps_without_the_stream_index(backend: Backend) -> None:
    """A collector appending fresh episodes (new stream keys) learns they have no stored steps
    from the fragments' stream lists, without building or following the (stream, step) index;
    keys that another writer did write still continue its steps."""
    rng = np.random.default_rng(13)
    other = backend.open(DQN)
    with other.writer() as w:
        w.append(_dqn(rng, 3), stream="shared")
    st = backend.open(DQN)
    reader = st.default.reader
    with st.writer() as w:
        for i in range(4):
            w.append(_dqn(rng, 4), stream=np.repeat([f"ep{2 * i}", f"ep{2 * i + 1}"], 2), reset=True)
            w.commit()
        assert reader._streams._index is None  # fresh keys never asked the index
        assert not reader.lists_stream("ep8") and reader.lists_stream("ep0") and reader.lists_stream("shared")
        w.append(_dqn(rng, 2), stream="shared")  # written by the other writer: its steps continue
        w.append(_dqn(rng, 2), stream="ep1")  # this writer's own: from its cached last step
    assert st.rows("shared")[1].tolist() == [0, 1, 2, 3, 4]
    assert st.rows("ep1")[1].tolist() == [0, 1, 2, 3]
    assert all(st.rows(f"ep{i}")[1].tolist() == [0, 1] for i in (0, 2, 7))
    # never a subset of the streams with visible records; on a fresh handle (nothing evicted or
    # compacted away since it opened) exactly those streams
    fresh = backend.open(mode="r").default.reader
    for key in [*st.streams(), "never", 5]:
        assert fresh.lists_stream(key) == (key in st.streams())


def test_two_writers_interleave_and_readers_merge(backend: Backend) -> None:
    rng = np.random.default_rng(8)
    st_a, st_b = backend.open(DQN), backend.open(DQN)
    wa, wb = st_a.writer(), st_b.writer()
    assert wa.id != wb.id
    batches: dict[int, list[Any]] = {wa.id: [], wb.id: []}
    for i in range(3):
        for w, key in ((wa, "a"), (wb, "b")):
            b = _dqn(rng, 2 + i)
            w.append(b, stream=key)
            w.commit()
            batches[w.id].append(b)
    reader = backend.open(mode="r")
    assert len(reader) == 2 * (2 + 3 + 4)
    ids = reader.row_ids()
    for wid, bs in batches.items():
        mine = ids[(ids >> layout.ROW_BITS) == wid]
        assert_same(reader.read(mine), columns_of(DQN, bs), f"writer {wid}")
    assert reader.rows("a")[1].tolist() == list(range(9)) and reader.rows("b")[1].tolist() == list(range(9))
    assert sorted(reader.writers) == sorted([wa.id, wb.id])


@pytest.mark.parametrize("capacity", [None, 1000])
def test_a_commit_shows_itself_and_reads_other_writers_only_in_a_capped_store(
        backend: Backend, capacity: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a commit the writer's store handle shows it, without reading it back; other
    writers' commits appear there after refresh(), except in a capped store, whose writers read
    them at each commit (eviction needs them). A checkpoint a commit writes holds every
    writer's newest state."""
    rng = np.random.default_rng(21)
    st_a = backend.open(DQN, capacity=capacity)
    st_b = backend.open(mode="a")
    wa, wb = st_a.writer(), st_b.writer()
    wa.append(_dqn(rng, 2), stream="a")  # (an append to a stream new to the writer reads everything)
    wa.commit()
    wb.append(_dqn(rng, 3), stream="b")
    wb.commit()
    wa.append(_dqn(rng, 1), stream="a")
    read: list[str] = []
    read_many = st_a.storage.read_many
    monkeypatch.setattr(st_a.storage, "read_many", lambda paths: read.extend(paths) or read_many(paths))
    wa.commit()
    monkeypatch.undo()
    # (its own record: applied from what it created; on S3 the replace check reads the manifest and the
    # claim of a replace, not records of the log)
    read = [p for p in read if p != layout.MANIFEST and not p.startswith("replace-")]
    assert bool(read) == (capacity is not None)
    assert len(st_b) == 5 and len(st_a) == (3 if capacity is None else 6)
    assert st_a.refresh() == (capacity is None) and len(st_a) == 6
    wb.append(_dqn(rng, 1), stream="b")
    wb.commit()
    st_a.log.since_checkpoint = log_module.CHECKPOINT_EVERY  # due at wa's next commit
    wa.append(_dqn(rng, 1), stream="a")
    wa.commit()
    assert st_a.log.checkpoint is not None and st_a.log.since_checkpoint == 0
    opened = backend.open(mode="r")
    assert opened.log.checkpoint == st_a.log.checkpoint and len(opened) == 8
    saved = records.decode("", backend.storage().read(layout.checkpoint(st_a.log.checkpoint)))["writers"]
    assert {int(w): doc["next_seq"] for w, doc in saved.items()} == {wa.id: 3, wb.id: 2}
    wa.close()
    wb.close()


def test_rows_of_a_stream_without_visible_records(backend: Backend) -> None:
    st = backend.open(DQN)
    assert st.streams() == []
    with st.writer() as w:
        w.append(_dqn(np.random.default_rng(0), 2), stream=1)
    rows, steps = st.rows("never")
    assert len(rows) == 0 and len(steps) == 0
    assert st.runs("never").shape == (0, 2)
    assert st.lookup("never", np.array([0, 1])).tolist() == [-1, -1]


# -- compaction ------------------------------------------------------------------------------------
def test_many_small_commits_are_compacted_without_changing_reads(backend: Backend) -> None:
    rng = np.random.default_rng(9)
    commits = 40 if backend.kind != "s3" else 12
    st = backend.open(DQN)
    reader = backend.open(mode="r")
    w = st.writer()
    batches = []
    for i in range(commits):
        b = _dqn(rng, 10)
        w.append(b, stream=i % 3)
        w.commit()
        batches.append(b)
        if i % 7 == 3:  # a reader following along sees every committed record, in order
            reader.refresh()
            assert len(reader) == 10 * (i + 1)
            assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches), f"after commit {i}")
    w.close()
    fragments = st.table("records").reader.fragments
    assert len(fragments) <= 8 < commits  # 8 = the merge fan-in: fewer fragments than commits
    assert sum(f.rows for f in fragments) == 10 * commits
    kinds = [c["kind"] for c in st.commits()]
    assert kinds.count("append") == commits and kinds.count("compact") >= 1
    for handle in (st, backend.open(mode="r")):
        assert len(handle) == 10 * commits
        assert handle.row_ids().tolist() == list(range(10 * commits))
        assert_same(handle.read(handle.row_ids()), columns_of(DQN, batches))
        for s in range(3):
            assert handle.rows(s)[1].tolist() == list(range(len(range(s, commits, 3)) * 10))
    assert len(backend.open(mode="r").table("records").reader.fragments) == len(fragments)


# -- state slots -----------------------------------------------------------------------------------
def test_state_slots_round_trip(backend: Backend) -> None:
    st = backend.open(DQN)
    assert st.load_state("sampler") is None
    rng_state = np.random.default_rng(1).bit_generator.state
    arrays = {"priorities": np.linspace(0, 1, 7), "ids": np.arange(5, dtype=np.int32),
              "grid": np.ones((2, 3), dtype=np.float32), "empty": np.zeros(0, dtype=np.int64)}
    doc = {"rng": rng_state, "cursor": 3, "name": "uniform", "nested": {"a": [1, 2.5, None]}}
    v0 = st.save_state("sampler", doc, arrays)
    for handle in (st, backend.open(mode="r")):
        loaded = handle.load_state("sampler")
        assert loaded is not None
        got_doc, got_arrays = loaded
        assert got_doc == doc
        assert set(got_arrays) == set(arrays)
        for k, a in arrays.items():
            assert got_arrays[k].dtype == a.dtype and got_arrays[k].shape == a.shape
            assert np.array_equal(got_arrays[k], a)
    v1 = st.save_state("sampler", {"cursor": 4})
    assert v1 > v0
    assert backend.open(mode="r").load_state("sampler") == ({"cursor": 4}, {})
    other = backend.open()
    other.save_state("sampler", {"cursor": 5}, {"x": np.arange(2)})
    doc5, arr5 = st.load_state("sampler")  # latest version wins, whoever saved it
    assert doc5 == {"cursor": 5} and arr5["x"].tolist() == [0, 1]
    assert st.load_state("reservoir") is None
    st.save_state("reservoir", {"seen": 10})
    assert st.load_state("reservoir")[0] == {"seen": 10}
    assert st.load_state("sampler")[0] == {"cursor": 5}
    for bad in ("", "a/b"):
        with pytest.raises(StoreError):
            st.save_state(bad, {})


def test_state_slots_keep_their_newest_versions(backend: Backend) -> None:
    st = backend.open(DQN)
    for i in range(5):
        st.save_state("sampler", {"i": i}, {"a": np.full(3, i)})
    assert st.state_slots()["sampler"]["versions"] == [3, 4]
    assert len([n for n in backend.storage().list("state/sampler") if n.startswith("payload-")]) == 2
    for i in range(5, 8):
        st.save_state("sampler", {"i": i}, {"a": np.full(3, i)}, keep_last=5)
    assert st.state_slots()["sampler"]["versions"] == [3, 4, 5, 6, 7]
    st.vacuum(older_than_s=0)
    assert st.state_slots()["sampler"]["versions"] == [6, 7]
    doc, arrays = backend.open(mode="r").load_state("sampler")
    assert doc == {"i": 7} and arrays["a"].tolist() == [7, 7, 7]


# -- third-party readability -----------------------------------------------------------------------
def _zarr_group(backend: Backend, path: str) -> zarr.Group:
    if backend.kind == "local":
        return zarr.open_group(f"{backend.url}/{path}", mode="r")
    from zarr.storage import FsspecStore

    store = FsspecStore.from_url(f"{backend.url}/{path}", storage_options=backend.storage_options,
                                 read_only=True)
    return zarr.open_group(store, mode="r")


def test_fragments_open_with_zarr_python(backend: Backend) -> None:
    schema, _ = KINDS["alphazero"]
    rng = np.random.default_rng(10)
    st = backend.open(schema)
    batches = [alphazero_batch(rng, 9, extra=0), alphazero_batch(rng, 4, extra=0)]
    with st.writer() as w:
        w.append(batches[0], stream="x")
        w.commit()
        w.append(batches[1], stream="y", step=np.array([3, 4, 8, 9]))
    want = columns_of(schema, batches)
    frags = st.table("records").reader.fragments
    # local: the closing writer right-sized its segment, one fragment for both commits (test_sizes.py)
    assert len(frags) == (1 if backend.kind == "local" else 2)
    start = 0
    for frag in frags:
        g = _zarr_group(backend, frag.path)
        seg = frag.segment
        if seg is None:  # a group of its own
            assert g.attrs["replaystore"]["rows"] == frag.rows
            rows = slice(None)
        else:  # rows of its writer's segment (format 2, local storage; docs/FORMAT.md "Segments")
            assert backend.kind == "local" and g.attrs["replaystore"]["segment"] == seg.name
            rows = slice(seg.row, seg.row + frag.rows)
        ours = st.read(np.arange(frag.first_id, frag.first_id + frag.rows))
        expected = want.take(np.arange(start, start + frag.rows))
        for name, arr in expected.arrays.items():
            if seg is None or name not in schema.offsets_groups and schema.field(name).kind != "ragged":
                theirs = g[name][rows]
            elif name in schema.offsets_groups:  # the segment's offsets, rebased to the fragment
                theirs = g[name][seg.row:seg.row + frag.rows + 1] - seg.values[name]
            else:
                off = schema.field(name).offsets
                theirs = g[name][seg.values[off]:seg.values[off] + frag.nnz[off]]
            assert theirs.dtype == arr.dtype and np.array_equal(theirs, arr), name
            assert np.array_equal(theirs, ours[name]), name
        streams = np.array(frag.streams, dtype=object)[g["_stream"][rows]]
        keys, steps, resets = st.default.index_of(np.arange(frag.first_id, frag.first_id + frag.rows))
        assert streams.tolist() == keys.tolist()
        assert g["_step"][rows].tolist() == steps.tolist() and g["_reset"][rows].tolist() == resets.tolist()
        start += frag.rows
    assert g["_step"][rows].tolist()[-4:] == [3, 4, 8, 9]


def test_store_repr_and_info(backend: Backend) -> None:
    st: Store = backend.open(DQN, capacity=100)
    with st.writer() as w:
        w.append(_dqn(np.random.default_rng(0), 5), stream=1)
    info = st.info()
    assert info["format_version"] == layout.FORMAT_VERSION and info["capacity"] == 100
    assert info["tables"]["records"]["records"] == 5 and info["tables"]["records"]["streams"] == 1
    assert info["writers"] == 1 and info["writers_closed"] == 1 and info["bytes"] > 0
    assert "records" in repr(st)


# -- the storage guarantees the format relies on ---------------------------------------------------
def test_create_if_absent(backend: Backend) -> None:
    storage = backend.storage()
    assert storage.create("x/record.json", b"first") is True
    assert storage.create("x/record.json", b"second") is False  # S3: conditional PUT, 412
    assert storage.read("x/record.json") == b"first"
    assert storage.list("x") == ["record.json"]
    storage.write("x/data", b"abc")
    assert storage.size("x/data") == 3 and storage.exists("x/data")
    assert sorted(storage.list("x")) == ["data", "record.json"]
    storage.delete("x")
    assert not storage.exists("x/record.json") and storage.list("x") == []
    with pytest.raises(FileNotFoundError):
        storage.read("x/record.json")


def test_read_many_returns_each_object_in_order_and_none_where_absent(backend: Backend) -> None:
    storage = backend.storage()
    for i in (0, 2, 3):
        storage.write(f"m/{i}", b"object %d" % i)
    assert storage.read_many([f"m/{i}" for i in (3, 1, 0, 2, 4)]) == [b"object 3", None, b"object 0", b"object 2", None]
    assert storage.read_many(["m/0"]) == [b"object 0"] and storage.read_many([]) == []


def test_refresh_reads_many_new_commits_of_many_writers_in_order(backend: Backend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Refresh reads the log in rounds over all writers, reading further ahead each round (1, 2,
    4, 4, ... records here): 3 writers with 0, 1 and 12 new commits, one closing meanwhile."""
    monkeypatch.setattr(log_module, "READ_AHEAD", 4)
    rng = np.random.default_rng(9)
    st = backend.open(DQN)
    reader = backend.open(mode="r")
    writers = [st.writer() for _ in range(3)]
    batches: dict[int, list] = {w.id: [] for w in writers}
    for w, commits in zip(writers, (0, 1, 12), strict=True):
        for _ in range(commits):
            batches[w.id].append(_dqn(rng, 1))
            w.append(batches[w.id][-1], stream=w.id)
            w.commit()
    writers[1].close()
    assert reader.refresh()
    for w, appends in zip(writers, (0, 1, 12), strict=True):
        mine = [c for c in reader.commits() if c["writer"] == w.id]
        assert [c["seq"] for c in mine] == list(range(len(mine)))  # (compactions take seqs too)
        assert sum(c["kind"] == "append" for c in mine) == appends
    assert reader.log.writers[writers[1].id].closed and not reader.log.writers[writers[2].id].closed
    for w in writers[1:]:
        assert_same(reader.read(reader.rows(w.id)[0]), columns_of(DQN, batches[w.id]))
    assert not reader.refresh()  # nothing new
