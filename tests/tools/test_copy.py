"""``replaystore copy``: the committed state of a store into a new location, sparse segment files
kept sparse, garbage left behind, the result verified; and ``info``'s sizes and state slots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError, StoreExistsError, StoreNotFoundError
from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.maintenance.verify import verify
from replaystore.tools.copy import copy_store
from support.batches import dqn_batch

SCHEMA = dqn(16, 2, actions=9)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replaystore.tools.cli", *args], capture_output=True, text=True,
                          timeout=120)


def _files(root: Path) -> dict[str, os.stat_result]:
    return {os.path.relpath(os.path.join(d, n), root): os.stat(os.path.join(d, n))
            for d, _, names in os.walk(root) for n in names}


def _store(root: Path, capacity: int | None = None, running: list | None = None) -> object:
    """A local store with two writers' segments, a crash leftover (an unreferenced fragment
    directory) and two state slots. The writers close (which right-sizes their segments), or
    with ``running`` the second one is left open there, its segment partly filled: sparse."""
    st = open_store(str(root), SCHEMA, mode="w", capacity=capacity)
    rng = np.random.default_rng(4)
    for k in range(2):
        w = st.writer()
        for i in range(30):
            w.append(dqn_batch(rng, 7, extra=0), stream=f"{k}-{i % 3}")
            w.commit(metadata={"k": k, "i": i})
        if running is not None and k == 1:
            running.append(w)
        else:
            w.close()
    for i in range(3):
        st.save_state("sampler", {"i": i}, {"prio": np.full(50, i, dtype=np.float32)})
    st.save_state("other", {"x": 1})
    leftover = root / layout.fragment_dir(0, "records", "s9999999999")
    leftover.mkdir(parents=True)
    (leftover / "zarr.json").write_text("{}")
    return st


@pytest.mark.parametrize("capacity", [None, 1000, 100])  # 100: records evicted, segments reclaimed
def test_copy_keeps_sparse_files_sparse_and_copies_committed_state_only(tmp_path: Path, capacity: int | None) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    running: list = []
    st = _store(src, capacity, running)
    live = {f.path for f in st.table("records").reader.fragments}
    sparse = [p for p, s in _files(src).items() if s.st_size > 2 * s.st_blocks * 512 + 4096
              and any(p.startswith(f"{unit}/") for unit in live)]
    assert sparse or capacity == 100  # the running writer's segment: what a plain copy would write out at full size
    r = cli("copy", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout
    copied = open_store(str(dst), mode="r")
    assert verify(copied) == []
    assert np.array_equal(copied.row_ids(), st.row_ids())
    assert all(np.array_equal(a, b) for a, b in zip(copied.read(st.row_ids()).values(),
                                                     st.read(st.row_ids()).values(), strict=True))
    assert copied.commits() == st.commits()
    assert copied.load_state("sampler")[1]["prio"].tolist() == [2.0] * 50
    assert copied.state_slots().keys() == {"sampler", "other"}
    src_files, dst_files = _files(src), _files(dst)
    assert not any("s9999999999" in p for p in dst_files)  # garbage is not copied
    assert set(dst_files) <= set(src_files)
    for path, s in dst_files.items():  # holes stay holes: no file takes more blocks than its source
        assert s.st_size == src_files[path].st_size, path
        assert s.st_blocks <= src_files[path].st_blocks + 8, path
    copied_sparse = [p for p in sparse if p in dst_files]
    assert copied_sparse or capacity == 100
    assert all(dst_files[p].st_size > 2 * dst_files[p].st_blocks * 512 for p in copied_sparse)
    running[0].close()


def test_copy_refuses_an_existing_destination_and_a_missing_source(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _store(src)
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match="not empty"):
        copy_store(str(src), str(dst))
    assert os.listdir(dst) == ["keep.txt"]
    r = cli("copy", str(src), str(dst))
    assert r.returncode != 0 and "not empty" in r.stderr
    with pytest.raises(StoreNotFoundError):
        copy_store(str(tmp_path / "nothing"), str(tmp_path / "dst2"))
    assert not (tmp_path / "dst2").exists() or not os.listdir(tmp_path / "dst2")


def test_copy_to_object_storage_reads_back_the_same_records(tmp_path: Path) -> None:
    st = _store(tmp_path / "src", 100)
    copy_store(str(tmp_path / "src"), "memory://copy-test")
    copied = open_store("memory://copy-test", mode="r")
    assert np.array_equal(copied.row_ids(), st.row_ids())
    assert verify(copied) == []


def test_info_shows_allocated_and_apparent_sizes_and_state_slots(tmp_path: Path) -> None:
    st = _store(tmp_path / "src")
    info = st.info()
    assert info["apparent_bytes"] > 2 * info["bytes"]  # local: sparse segment files
    assert info["state"] == {"other": {"versions": [0], "bytes": st.storage.total_size("state/other")},
                             "sampler": {"versions": [1, 2], "bytes": st.storage.total_size("state/sampler")}}
    assert info["state"]["sampler"]["bytes"] > 0
    r = cli("info", str(tmp_path / "src"))
    assert r.returncode == 0, r.stderr
    assert "allocated" in r.stdout and "apparent" in r.stdout
    assert "state     2 slots: other, sampler" in r.stdout  # the short summary names them; --verbose details them
    r = cli("info", "--verbose", str(tmp_path / "src"))
    assert r.returncode == 0, r.stderr
    assert "'sampler': 2 version(s) 1..2" in r.stdout and "'other': 1 version(s) 0..0" in r.stdout


@pytest.mark.parametrize("damage", ["no arrays", "arrays not a mapping", "payload of another slot", "no doc"])
def test_copy_refuses_a_damaged_state_record_as_open_does(tmp_path: Path, damage: str) -> None:
    """A checksum-valid state record that load_state would skip as damaged: copy raises CorruptObjectError naming
    it (the CLI: one line, exit 4), never a KeyError (exit 70), and writes no store at the destination."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    st = _store(src)
    path = layout.state_record("other", 0)
    body = records.decode(path, st.storage.read(path))
    if damage == "no arrays":
        del body["arrays"]
    elif damage == "arrays not a mapping":
        body["arrays"] = ["x"]
    elif damage == "payload of another slot":
        body["arrays"] = {"prio.npy": layout.state_payload("sampler", "ab12", "prio.npy")}
    else:
        del body["doc"]
    (src / path).write_bytes(records.encode(body))
    with pytest.warns(UserWarning, match="damaged"):
        assert open_store(str(src), mode="r").load_state("other") is None  # what open does with it
    with pytest.raises(CorruptObjectError) as err:
        copy_store(str(src), str(dst))
    assert err.value.path == path
    assert not (dst / layout.MANIFEST).exists()
    r = cli("copy", str(src), str(tmp_path / "dst2"))
    assert r.returncode == 4, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and path in r.stderr and "Traceback" not in r.stderr
