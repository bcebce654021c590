"""Reclaiming the last segment of writers that closed or died (docs/FORMAT.md, "Writer liveness").

A capped replay on local disk must not keep one partial segment per writer session: a
collector fleet that restarts often would grow storage without bound. A live writer's
segment is never touched, whether it lives in this process or another one.
"""

from __future__ import annotations

import gc
import signal
from pathlib import Path

import numpy as np
import pytest

from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.maintenance.verify import verify
from replaystore.store.store import Store
from replaystore.store.write import liveness, reclaimer
from support import procs
from support.batches import dqn_batch
from support.storecheck import assert_same, columns_of, descriptors_under, segments_on_disk, segments_retained

DQN = procs.schema()  # the child writers' schema
CAPACITY = 40  # segments of capacity // 4 = 10 rows; grace 10 records


def _batch(rng: np.random.Generator, n: int) -> object:
    return dqn_batch(rng, n, observation_size=procs.OBS, heads=procs.HEADS, actions=procs.ACTIONS, extra=0)


def _writer_segment(st: Store, writer: int) -> str:
    st.refresh()
    (name,) = {f.segment.name for f in st.table("records").reader.all_fragments if f.writer == writer}
    return name


def test_writer_sessions_that_closed_leave_no_segment_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """60 short writer sessions of 4 records each (a restarted collector): each copies its partial
    segment into a right-sized one on close, leaving the original unreferenced. Later sessions'
    commits delete each closed session's original once its close is older than the trash grace (0
    here) and reclaim every right-sized segment whose records are all evicted, so what stays on
    disk is exactly what backs the newest capacity + grace records, and the last session's
    original (no session came after it), which vacuum takes."""
    monkeypatch.setattr(reclaimer, "TRASH_GRACE_NS", 0)
    rng = np.random.default_rng(3)
    url = str(tmp_path / "st")
    open_store(url, DQN, mode="w", capacity=CAPACITY).close()
    batches = []
    for _ in range(60):
        st = open_store(url, mode="a")
        with st.writer() as w:
            batches.append(_batch(rng, 4))
            w.append(batches[-1], stream="collector")
        st.close()
    st = open_store(url, mode="r")
    on_disk, retained = segments_on_disk(tmp_path / "st"), segments_retained(st)
    assert retained <= on_disk and len(retained) == 13  # 50 records in sessions of 4; without reclaiming them, 60
    assert [writer for writer, _ in on_disk - retained] == [w.id]  # the last session's original
    open_store(url, mode="a").vacuum(older_than_s=0)
    assert segments_on_disk(tmp_path / "st") == retained
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches[-CAPACITY // 4:]))
    assert verify(st) == []


def test_collectors_restarting_beside_a_running_writer_leave_no_originals_once_the_grace_passed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived writer commits while 20 collector sessions come and go, each right-sizing its
    segment at close. While the grace lasts (readers may still read an original) the running
    writer keeps every closed collector's original; once it has passed (0 here) its next reclaims
    delete them all, the ones it kept included, so they never pile up; a segment the log still
    needs is never deleted, and the store reads and verifies clean."""
    rng = np.random.default_rng(11)
    url = str(tmp_path / "st")
    root = tmp_path / "st"
    open_store(url, DQN, mode="w", capacity=CAPACITY).close()
    st = open_store(url, mode="a")
    long_lived = st.writer()
    collectors: list[int] = []

    def collector_session() -> None:
        with open_store(url, mode="a").writer() as c:
            c.append(_batch(rng, 4), stream="collector")
        collectors.append(c.id)
        long_lived.append(_batch(rng, 1), stream="learner")
        long_lived.commit()  # its reclaim

    def originals() -> set[tuple[int, str]]:
        st.refresh()
        live = {(f.writer, f.segment.name) for f in st.table("records").reader.all_fragments if f.segment is not None}
        return {(w, n) for w, n in segments_on_disk(root) - live if w in collectors}

    monkeypatch.setattr(reclaimer, "TRASH_GRACE_NS", 10**15)  # (readers may lag that long)
    for _ in range(5):
        collector_session()
    assert {w for w, _ in originals()} == set(collectors)  # each kept: its close is within the grace
    monkeypatch.setattr(reclaimer, "TRASH_GRACE_NS", 0)
    for _ in range(15):
        collector_session()
    long_lived.close()  # (waits for its deletions)
    assert originals() == set()
    on_disk, retained = segments_on_disk(root), segments_retained(st)
    assert retained <= on_disk
    assert {w for w, _ in on_disk - retained} <= {long_lived.id}  # its own original: no writer came after
    st.refresh()
    assert len(st) == CAPACITY
    assert verify(st) == []


def _evict_everything(url: str, rng: np.random.Generator) -> None:
    """One writer appending 2 x capacity records, committing every 5, then closing."""
    with open_store(url, mode="a").writer() as w:
        for _ in range(2 * CAPACITY // 5):
            w.append(_batch(rng, 5), stream="evictor")
            w.commit()


def test_a_killed_writers_segment_is_reclaimed_and_a_live_ones_is_not(tmp_path: Path) -> None:
    """Two writer processes commit a batch and wait. One is killed with SIGKILL (the kernel drops
    its lock); then a third writer evicts both. The dead one's segment goes; the live one's stays,
    and that writer goes on appending to it. Once it has closed, the next eviction reclaims it."""
    rng = np.random.default_rng(5)
    url = str(tmp_path / "st")
    open_store(url, DQN, mode="w", capacity=CAPACITY).close()
    with procs.Child("idle-writer", stdin=True, url=url, seed=1, tag="live", max_records=4) as live, \
            procs.Child("idle-writer", stdin=True, url=url, seed=1, tag="dead", max_records=4) as dead:
        ids = {}
        for tag, child in (("live", live), ("dead", dead)):
            line = child.readline(timeout=120)
            assert line is not None and line.startswith("c "), (tag, line, child.stderr())
            ids[tag] = int(line.split()[1])
        dead.proc.send_signal(signal.SIGKILL)
        assert dead.proc.wait(timeout=60) == -signal.SIGKILL
        st = open_store(url, mode="r")
        segs = {tag: _writer_segment(st, w) for tag, w in ids.items()}
        root = tmp_path / "st"
        assert {(w, segs[tag]) for tag, w in ids.items()} <= segments_on_disk(root)

        _evict_everything(url, rng)
        on_disk = segments_on_disk(root)
        assert (ids["dead"], segs["dead"]) not in on_disk  # dead: its lock is free
        assert (ids["live"], segs["live"]) in on_disk  # alive: never another writer's to delete
        st.refresh()
        assert not any(r >> layout.ROW_BITS in ids.values() for r in st.row_ids().tolist())

        live.proc.stdin.write(b"go\n")  # type: ignore[union-attr]
        live.proc.stdin.flush()  # type: ignore[union-attr]
        assert live.readline(timeout=120) == f"c {ids['live']} 2", live.stderr()
        st.refresh()
        assert _writer_segment(st, ids["live"]) == segs["live"]  # it appended into the same segment
        rows = [r for r in st.row_ids().tolist() if r >> layout.ROW_BITS == ids["live"]]
        assert_same(st.read(rows), procs.crash_batch(1, "live", 1, 4))
        live.close_stdin()
        live.finish(timeout=120)

    assert (ids["live"], segs["live"]) in segments_on_disk(root)  # closed, but its newest records are visible
    _evict_everything(url, rng)
    assert segments_on_disk(root) == segments_retained(st)
    assert not any(w in ids.values() for w, _ in segments_on_disk(root))
    assert verify(st) == []


def _rewrite_registration(st: Store, writer: int, **changes: object) -> None:
    """Replace a writer's registration document (a pop for a value of None)."""
    doc = records.decode(layout.writer_record(writer), st.storage.read(layout.writer_record(writer)))
    for key, value in changes.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    st.storage.write(layout.writer_record(writer), records.encode(doc))


def test_only_a_closed_writer_or_a_dead_one_of_this_host_with_a_lock_is_gone(tmp_path: Path) -> None:
    """Three writer processes commit a batch each. ``old``'s registration is rewritten without
    ``lock`` (a replaystore that took no lock: it may be alive), ``far``'s with another host
    (its lock is not ours to test); both are then killed, so only the rules, not a held lock,
    keep their segments. ``done``, registered on another host too, closes cleanly: its
    ``close`` record says it is gone wherever it ran."""
    rng = np.random.default_rng(6)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=CAPACITY)
    ids = {}
    for tag in ("old", "far", "done"):
        with procs.Child("idle-writer", stdin=True, url=url, seed=2, tag=tag, max_records=4) as child:
            line = child.readline(timeout=120)
            assert line is not None and line.startswith("c "), (tag, line, child.stderr())
            ids[tag] = int(line.split()[1])
            if tag == "old":
                _rewrite_registration(st, ids[tag], lock=None)
            else:
                _rewrite_registration(st, ids[tag], host="some-other-host")
            if tag == "done":
                child.close_stdin()
                child.finish(timeout=120)
            else:
                child.proc.send_signal(signal.SIGKILL)
                assert child.proc.wait(timeout=60) == -signal.SIGKILL
    st.refresh()
    assert [st.log.writers[ids[t]].closed for t in ("old", "far", "done")] == [False, False, True]
    segs = {tag: (w, _writer_segment(st, w)) for tag, w in ids.items()}
    _evict_everything(url, rng)
    on_disk = segments_on_disk(tmp_path / "st")
    assert segs["old"] in on_disk and segs["far"] in on_disk
    assert segs["done"] not in on_disk
    assert not {segs["old"], segs["far"]} & segments_retained(st)  # kept, though wholly evicted
    assert verify(st) == []


def test_a_closed_writer_ends_its_log_with_a_close_record_that_readers_stop_at(tmp_path: Path) -> None:
    """close() creates one last record, kind ``close``, after its commits (merges included):
    readers stop probing that writer for commits, and commits()/SQL do not list it."""
    rng = np.random.default_rng(7)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=CAPACITY)
    reader = open_store(url, mode="r")
    with st.writer() as w:
        for _ in range(3):
            w.append(_batch(rng, 3), stream="s")
            w.commit(metadata={"round": 1})
        reader.refresh()
        assert not reader.log.writers[w.id].closed
    # (seq 3: the compact record of its segment's right-sized copy)
    assert records.decode("", st.storage.read(layout.commit_record(w.id, 3)))["kind"] == "compact"
    close = records.decode("", st.storage.read(layout.commit_record(w.id, 4)))
    assert close["kind"] == "close" and close["tables"] == {} and close["seq"] == 4
    assert not st.storage.exists(layout.commit_record(w.id, 5))
    reader.refresh()
    assert reader.log.writers[w.id].closed and reader.log.writers[w.id].next_seq == 5
    assert [c["kind"] for c in reader.commits()] == ["append"] * 3 + ["compact"]
    assert reader.sql("SELECT count(*) AS n FROM commits")["n"].to_pylist() == [4]
    assert reader.info()["writers_closed"] == 1 and reader.info()["commits"] == 4
    # a record after a close is never read: the log ends there
    st.storage.create(layout.commit_record(w.id, 5), st.storage.read(layout.commit_record(w.id, 0)))
    late = open_store(url, mode="r")
    assert late.log.writers[w.id].next_seq == 5 and len(late) == 9


def test_a_segment_left_half_deleted_by_a_killed_reclaimer_is_finished_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer killed while deleting a reclaimed segment leaves part of its directory (here: all
    but the group's ``zarr.json``); the log still lists it, so the next reclaim deletes the rest
    (it used to skip a directory without ``zarr.json`` forever; the crash soak found it). The
    segment is the closed writer's right-sized copy; its original goes too (trash grace 0 here)."""
    monkeypatch.setattr(reclaimer, "TRASH_GRACE_NS", 0)
    rng = np.random.default_rng(8)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=CAPACITY)
    with st.writer() as w:
        w.append(_batch(rng, 3), stream="s")
    seg = (w.id, _writer_segment(st, w.id))
    group = tmp_path / "st" / layout.fragment_dir(seg[0], "records", seg[1])
    (group / "zarr.json").unlink()
    _evict_everything(url, rng)
    assert not group.exists()
    assert segments_on_disk(tmp_path / "st") == segments_retained(st)


def test_is_dead_needs_a_readable_registration_of_this_host_with_a_free_lock(tmp_path: Path) -> None:
    """The flock test itself: a closed writer's lock is free (dead, in this sense); a damaged or
    missing registration, or storage without local files, is never proof of death."""
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=CAPACITY)
    alive = st.writer()
    with st.writer() as w:
        w.append(_batch(np.random.default_rng(9), 2), stream="s")
    assert liveness.is_dead(st.storage, w.id) and not liveness.is_dead(st.storage, alive.id)
    record = tmp_path / "st" / layout.writer_record(w.id)
    record.write_bytes(record.read_bytes()[:-5])  # truncated: its checksum fails
    assert not liveness.is_dead(st.storage, w.id)
    record.unlink()
    assert not liveness.is_dead(st.storage, w.id)
    assert not liveness.is_dead(open_store(f"memory://liveness-{tmp_path.name}", DQN, mode="w").storage, 0)
    alive.close()


def test_a_writer_dropped_without_close_releases_its_files_and_its_lock(tmp_path: Path) -> None:
    """A writer collected unclosed (a notebook cell re-run, a test's leftover) is gone like a
    killed one: its segment descriptors and its liveness lock are released, not leaked for the
    life of the process, and other writers may reclaim its segment."""
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=CAPACITY)
    w = st.writer()
    w.append(_batch(np.random.default_rng(4), 4), stream="a")
    w.commit()
    writer = w.id
    assert descriptors_under(tmp_path) > 16  # its segment's files and its lock
    assert not liveness.is_dead(st.storage, writer)
    del w
    gc.collect()
    assert descriptors_under(tmp_path) == 0
    assert liveness.is_dead(st.storage, writer)
    assert len(open_store(url, mode="r")) == 4


def test_a_killed_writers_spare_segment_is_reclaimed_with_its_other_segments(tmp_path: Path) -> None:
    """A writer process fills its segment past half (it creates its next one ahead, a spare, that
    no commit references) and is killed. The next writer whose eviction reclaims the dead one's
    segment deletes its spare too; every record still visible reads back intact."""
    rng = np.random.default_rng(8)
    url = str(tmp_path / "st")
    root = tmp_path / "st"
    open_store(url, DQN, mode="w", capacity=CAPACITY).close()
    with procs.Child("idle-writer", stdin=True, url=url, seed=3, tag="dead", max_records=4, spares=True) as dead:
        line = dead.readline(timeout=120)
        assert line is not None and line.startswith("c "), (line, dead.stderr())
        writer = int(line.split()[1])
        for i in range(2, 40):  # until its segment is half full: it has made a spare (reported made)
            if len({name for w, name in segments_on_disk(root) if w == writer}) == 2:
                break
            dead.proc.stdin.write(b"go\n")  # type: ignore[union-attr]
            dead.proc.stdin.flush()  # type: ignore[union-attr]
            assert dead.readline(timeout=120) == f"c {writer} {i}", dead.stderr()
        dead.proc.send_signal(signal.SIGKILL)
        assert dead.proc.wait(timeout=60) == -signal.SIGKILL
    st = open_store(url, mode="r")
    committed = _writer_segment(st, writer)
    mine = {name for w, name in segments_on_disk(root) if w == writer}
    assert committed in mine and len(mine) == 2  # its segment and its spare
    (spare,) = mine - {committed}

    batches = []
    with open_store(url, mode="a").writer() as w:
        for _ in range(2 * CAPACITY // 5):
            batches.append(_batch(rng, 5))
            w.append(batches[-1], stream="evictor")
            w.commit()
    assert (writer, committed) not in segments_on_disk(root)
    assert (writer, spare) not in segments_on_disk(root)
    assert segments_on_disk(root) == segments_retained(st)
    st.refresh()
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches[-CAPACITY // 5:]))
    assert verify(st) == []


def test_only_well_formed_unreferenced_segment_names_are_swept() -> None:
    """Names listed under a dead writer's data directory are data: only ``s`` + ten digits that no
    live fragment is backed by are deleted (never fragments, temporaries or anything else)."""
    from replaystore.store.read.retention import unreferenced_segments

    names = ["s0000000001", "s0000000002", "f0000000003", "..", "s12", "s0000000004x", ".tmp-s0000000005",
             "s0000000006"]
    assert unreferenced_segments(names, {"s0000000002"}) == ["s0000000001", "s0000000006"]
