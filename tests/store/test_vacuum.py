"""Store.vacuum on every backend (local, memory://, S3 on loopback moto): what no live commit
references goes once it is old enough; everything committed stays readable and verifies.

The leftovers here are what crashes leave (tests/system/test_crash.py kills real writers and
vacuums after every kill, on local and S3): an uncommitted fragment (a committed one's objects
under the next, never-committed name), a create's temporary object, a state payload no record
names; and what a writer that exits right after compacting leaves: the merged-away originals.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from replaystore.errors import ReadOnlyError, StoreError
from replaystore.schemas import dqn
from replaystore.store.format import layout
from replaystore.store.maintenance.compaction import COMPACT_FANIN
from replaystore.store.maintenance.verify import verify
from support.batches import dqn_batch
from support.storecheck import Backend, assert_same, columns_of, snapshot

HOUR_S = 3600.0
DQN = dqn(16, 2, actions=9)
ORPHAN = layout.fragment_dir(0, "records", layout.fragment_name(99))  # a commit that never got its record


def _objects(backend: Backend) -> dict[str, int]:
    return {o.path: o.size for o in backend.storage().walk("")}


def _committed_store(backend: Backend, commits: int = 2) -> list:
    rng = np.random.default_rng(4)
    st = backend.open(DQN, mode="w")
    batches = []
    with st.writer() as w:
        for i in range(commits):
            batches.append(dqn_batch(rng, 6, extra=0))
            w.append(batches[-1], stream=i % 2)
            w.commit()
    # a closing writer right-sizes its segments, which leaves their sparse originals to vacuum
    # (tests/store/test_sizes.py): they go first, so that only the leftovers planted here remain
    backend.open(mode="a").vacuum(older_than_s=0)
    return batches


def _plant_leftovers(backend: Backend) -> set[str]:
    """What a killed writer and a killed saver leave; returns the garbage units' paths."""
    storage = backend.storage()
    src = backend.open(mode="r").table("records").reader.fragments[-1].path  # on local storage a segment
    for o in storage.walk(src):  # (a segment's chunk files are large and sparse: a stand-in does)
        storage.write(ORPHAN + o.path[len(src):], storage.read(o.path) if o.size < 1 << 16 else b"\0" * 64)
    tmp = f"{layout.commits_dir(0)}/.tmp-0123456789abcdef"  # create() killed before its link
    storage.write(tmp, b'{"body": {"wri')
    payload = layout.state_payload("sampler", "deadbeef", "priorities.npy")  # save_state killed before its record
    storage.write(payload, b"\x93NUMPY")
    return {ORPHAN, tmp, os.path.dirname(payload)}


def _assert_intact(backend: Backend, batches: list, before: dict | None = None) -> None:
    st = backend.open(mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []
    if before is not None:
        assert snapshot(st) == before


def test_vacuum_deletes_crash_leftovers_only_once_old_enough(backend: Backend) -> None:
    batches = _committed_store(backend)
    st = backend.open(mode="a")
    st.save_state("sampler", {"n": 1}, {"priorities": np.arange(4.0)})
    before = snapshot(backend.open(mode="r"))
    clean = _objects(backend)
    garbage = _plant_leftovers(backend)
    planted = _objects(backend)

    dry = st.vacuum(older_than_s=0, dry_run=True)
    assert dry.dry_run and {u.path for u in dry.deleted} == garbage
    assert dry.bytes == sum(size for path, size in planted.items() if path not in clean) > 0
    assert _objects(backend) == planted  # a dry run deletes nothing

    young = st.vacuum(older_than_s=HOUR_S)  # just planted: younger than the threshold, kept
    assert young.deleted == [] and {u.path for u in young.recent} == garbage
    assert _objects(backend) == planted

    done = st.vacuum(older_than_s=0)
    assert {u.path for u in done.deleted} == garbage and done.objects == len(planted) - len(clean)
    assert _objects(backend) == clean  # exactly the leftovers went
    _assert_intact(backend, batches, before)
    assert st.load_state("sampler")[1]["priorities"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert st.vacuum(older_than_s=0).deleted == []  # nothing left to do
    with st.writer() as w:  # and writing goes on
        w.append(dqn_batch(np.random.default_rng(5), 3, extra=0), stream="after")
    assert len(backend.open(mode="r")) == len(columns_of(DQN, batches)) + 3


def test_vacuum_removes_compacted_originals_of_a_writer_that_exited_at_once(backend: Backend) -> None:
    rng = np.random.default_rng(8)
    st = backend.open_fragments(DQN)  # compaction rewrites fragments (a segment's merge moves nothing)
    batches = []
    with st.writer() as w:  # exits right after its compaction: the originals' 30 s grace never ran out
        for i in range(COMPACT_FANIN):
            batches.append(dqn_batch(rng, 5, extra=0))
            w.append(batches[-1], stream=i % 3)
            w.commit()
    removed = {layout.fragment_dir(c["writer"], t, name) for c in st.commits() if c["kind"] == "compact"
               for t, change in c["tables"].items() for name in change["remove"]}
    assert len(removed) == COMPACT_FANIN
    storage = backend.storage()
    assert all(storage.walk(path) for path in removed)  # still on storage after the writer is gone
    before = snapshot(backend.open(mode="r"))

    assert st.vacuum(older_than_s=HOUR_S).deleted == []  # removed just now: within the threshold
    report = st.vacuum(older_than_s=0)
    assert {u.path for u in report.deleted} == removed and all(u.kind == "fragment" for u in report.deleted)
    assert not any(storage.walk(path) for path in removed)
    _assert_intact(backend, batches, before)


def test_vacuum_after_eviction_keeps_a_capped_store_consistent(backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st = backend.open(DQN, mode="w", capacity=20)
    with st.writer() as w:
        for i in range(12):
            w.append(dqn_batch(rng, 4, extra=0), stream=i % 2)
            w.commit()
    before = snapshot(backend.open(mode="r"))
    assert before["len"] == 20
    st.vacuum(older_than_s=0)
    after = backend.open(mode="r")
    assert snapshot(after) == before and verify(after) == []


def test_vacuum_arguments_and_read_only_handles(backend: Backend) -> None:
    _committed_store(backend, commits=1)
    reader = backend.open(mode="r")
    with pytest.raises(ReadOnlyError, match="vacuum"):
        reader.vacuum(older_than_s=0)
    assert reader.vacuum(older_than_s=0, dry_run=True).deleted == []  # looking is allowed
    for bad in (-1, "1h", None, True, float("nan")):
        with pytest.raises(StoreError, match="older_than_s"):
            backend.open(mode="a").vacuum(older_than_s=bad)


def test_age_counts_from_removal_not_from_writing(tmp_path) -> None:
    """Local only (file times can be set): old objects a commit removed just now are kept;
    old objects no commit ever named are deleted."""
    backend = Backend(str(tmp_path / "st"))
    rng = np.random.default_rng(6)
    st = backend.open_fragments(DQN)  # compaction rewrites fragments (a segment's merge moves nothing)
    with st.writer() as w:
        for i in range(COMPACT_FANIN):
            w.append(dqn_batch(rng, 3, extra=0), stream=i)
            w.commit()
    _plant_leftovers(backend)
    past = time.time() - 2 * HOUR_S
    for o in backend.storage().walk(f"{layout.writer_dir(0)}/data"):  # every fragment written two hours ago
        os.utime(backend.storage().local_path(o.path), (past, past))
    report = st.vacuum(older_than_s=HOUR_S)
    assert [u.path for u in report.deleted] == [ORPHAN]
    assert {u.kind for u in report.recent} == {"fragment", "temporary", "payload"}
    assert len([u for u in report.recent if u.kind == "fragment"]) == COMPACT_FANIN  # removed just now
    assert not os.path.exists(backend.storage().local_path(ORPHAN))  # its directories went too


def test_empty_fragment_directories_of_a_killed_writer_go(tmp_path) -> None:
    """Local only: a writer killed right after creating a fragment's directories leaves them empty."""
    backend = Backend(str(tmp_path / "st"))
    batches = _committed_store(backend)
    os.makedirs(backend.storage().local_path(f"{ORPHAN}/obs/c"))
    st = backend.open(mode="a")
    kept = st.vacuum(older_than_s=HOUR_S)
    assert kept.deleted == [] and [(u.path, u.objects) for u in kept.recent] == [(ORPHAN, ())]
    assert [u.path for u in st.vacuum(older_than_s=0).deleted] == [ORPHAN]
    assert not os.path.exists(backend.storage().local_path(ORPHAN))
    _assert_intact(backend, batches)


def test_a_registration_killed_before_its_record_is_a_leftover_not_damage(backend: Backend) -> None:
    """A writer killed while registering leaves ``writers/<W>/`` holding only a create's temporary
    object; once vacuum took that, an empty directory may stay (local disk). Neither is damage:
    verify passes and new writers register. A writer with commits but no record is damage."""
    _committed_store(backend)
    storage = backend.storage()
    storage.write(f"{layout.writer_dir(7)}/.tmp-0123456789abcdef", b'{"body": {"wri')
    st = backend.open(mode="a")
    assert verify(st) == []
    assert {u.kind for u in st.vacuum(older_than_s=0).deleted} == {"temporary"}
    assert verify(backend.open(mode="r")) == []
    with backend.open(mode="a").writer() as w:
        w.append(dqn_batch(np.random.default_rng(5), 3, extra=0), stream=9)
    assert verify(backend.open(mode="r")) == []
    storage.delete(layout.writer_record(0))
    problems = verify(backend.open(mode="r"))
    assert [p.path for p in problems] == [layout.writer_record(0)]
