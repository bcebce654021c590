"""State slots keep their newest ``keep_last`` versions: saves and vacuum reclaim the rest, and a
saver killed at any point of that leaves the slot loadable."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.format import layout, records
from support import procs


def _payload_dirs(root, slot: str) -> set[str]:
    top = root / layout.state_dir(slot)
    return {n for n in os.listdir(top) if n.startswith("payload-")} if top.exists() else set()


@pytest.mark.parametrize("keep_last", [1, 2, 3])
def test_many_saves_keep_exactly_keep_last_versions(tmp_path, keep_last):
    st = open_store(str(tmp_path / "s"), transitions(4))
    for i in range(12):
        assert st.save_state("slot", {"i": i}, {"a": np.full(10, i)}, keep_last=keep_last) == i
        kept = list(range(max(0, i + 1 - keep_last), i + 1))
        assert st._state_versions("slot") == kept
        assert len(_payload_dirs(tmp_path / "s", "slot")) == len(kept)  # no orphaned arrays
    doc, arrays = st.load_state("slot")
    assert doc == {"i": 11} and arrays["a"].tolist() == [11] * 10


def test_sampler_save_keeps_two_versions_by_default(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    for i in range(5):
        st.save_state("slot", {"i": i})
    assert st._state_versions("slot") == [3, 4]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_keep_last_is_refused_before_anything_is_written(tmp_path, bad):
    st = open_store(str(tmp_path / "s"), transitions(4))
    with pytest.raises(StoreError, match="keep_last"):
        st.save_state("slot", {"i": 0}, {"a": np.zeros(3)}, keep_last=bad)
    assert not (tmp_path / "s" / layout.STATE).exists()


def test_vacuum_reclaims_versions_beyond_keep_last(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    for i in range(6):
        st.save_state("slot", {"i": i}, {"a": np.full(10, i)}, keep_last=10)
    st.save_state("other", {"i": 0}, {"a": np.zeros(2)})
    assert st._state_versions("slot") == list(range(6))
    dry = st.vacuum(older_than_s=0, dry_run=True)
    assert sorted(u.path for u in dry.deleted if u.kind == "state") == [
        layout.state_record("slot", v) for v in range(4)]
    assert st._state_versions("slot") == list(range(6))  # (dry run)
    st.vacuum(older_than_s=0)
    assert st._state_versions("slot") == [4, 5]
    assert st._state_versions("other") == [0]
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 2
    assert st.load_state("slot")[0] == {"i": 5}
    st.vacuum(older_than_s=0, state_keep_last=1)
    assert st._state_versions("slot") == [5]
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 1
    assert st.load_state("slot")[1]["a"].tolist() == [5] * 10


def test_vacuum_keeps_recent_versions_and_slots_with_an_unreadable_record(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    for i in range(4):
        st.save_state("slot", {"i": i}, {"a": np.full(3, i)}, keep_last=10)
    assert {u.path for u in st.vacuum().recent if u.kind == "state"} == {
        layout.state_record("slot", v) for v in range(2)}  # (an hour by default)
    assert st._state_versions("slot") == list(range(4))
    (tmp_path / "s" / layout.state_record("slot", 0)).write_bytes(b'{"body"')
    st.vacuum(older_than_s=0)
    assert st._state_versions("slot") == list(range(4))


def test_saver_killed_mid_reclaim_leaves_the_newest_version_loadable(tmp_path):
    url = str(tmp_path / "s")
    st = open_store(url, transitions(4))
    st.save_state("slot", {"i": -2}, {"a": np.full(100, -2)})
    st.save_state("slot", {"i": -1}, {"a": np.full(100, -1)})
    with procs.Child("state-saver", url=url, slot="slot", keep_last=2, hold_delete=True) as child:
        assert child.readline(timeout=60) == "d", child.stderr()  # the new record exists; reclaim started
        child.kill()
    assert st._state_versions("slot") == [0, 1, 2]
    doc, arrays = st.load_state("slot")
    assert doc == {"i": 0} and arrays["a"].tolist() == [0] * 100
    st.save_state("slot", {"i": 1}, {"a": np.full(100, 1)})  # the next save reclaims what was left
    assert st._state_versions("slot") == [2, 3]
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 2


def test_saver_killed_at_random_points_leaves_a_loadable_slot(tmp_path):
    url = str(tmp_path / "s")
    st = open_store(url, transitions(4))
    rng = np.random.default_rng(7)
    last = -1
    for _ in range(3):
        with procs.Child("state-saver", url=url, slot="slot", keep_last=2) as child:
            for _ in range(int(rng.integers(1, 30))):
                line = child.readline(timeout=60)
                assert line is not None and line.startswith("s "), child.stderr()
                last = int(line.split()[1])
            child.kill()  # somewhere in the next save: its arrays, its record or its reclaim
        versions = st._state_versions("slot")
        assert versions[-1] >= last and len(versions) <= 3  # (the child may run ahead of what was read)
        doc, arrays = st.load_state("slot")
        body = records.decode("", (tmp_path / "s" / layout.state_record("slot", versions[-1])).read_bytes())
        assert doc == body["doc"] and arrays["a"].tolist() == [doc["i"]] * 100
    st.vacuum(older_than_s=0)
    assert len(st._state_versions("slot")) == 2
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 2


def test_concurrent_savers_leave_the_newest_versions_whole(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    barrier = threading.Barrier(6)

    def save(i: int) -> None:
        barrier.wait()
        for j in range(5):
            st.save_state("slot", {"saver": i, "j": j}, {"values": np.full(100, 10 * i + j, dtype=np.int64)})

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = st._state_versions("slot")
    # (a saver that listed before others' saves may recreate a number they deleted: not always 0..29)
    assert 2 <= len(versions) <= 7 and versions[-1] <= 29  # (at most the two kept and one per other saver)
    doc, arrays = st.load_state("slot")
    assert arrays["values"].tolist() == [10 * doc["saver"] + doc["j"]] * 100
    st.vacuum(older_than_s=0)
    assert st._state_versions("slot") == versions[-2:]
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 2
    assert st.load_state("slot")[0] == doc


def test_vacuum_removes_an_empty_payload_directory_a_killed_saver_left(tmp_path):
    """A saver killed between creating its payload directory and writing into it leaves an empty
    directory: no object names it, and vacuum removes it once old enough."""
    st = open_store(str(tmp_path / "s"), transitions(4))
    st.save_state("slot", {"i": 0}, {"a": np.zeros(3)})
    empty = tmp_path / "s" / "state" / "slot" / f"payload-{'ab' * 16}"
    empty.mkdir()
    assert not st.vacuum(older_than_s=3600).deleted and empty.is_dir()
    report = st.vacuum(older_than_s=0)
    assert [u.path for u in report.deleted] == [f"state/slot/payload-{'ab' * 16}"] and not empty.exists()
    assert len(_payload_dirs(tmp_path / "s", "slot")) == 1 and st.load_state("slot") is not None
