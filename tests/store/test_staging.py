"""Fragments are staged record batch by record batch (store/format/staging.py; appends buffered, merges
straight to the files): the committed fragment is a plain Zarr v3 group holding exactly the
added records; failed, discarded and crashed appends leave nothing; local storage fsyncs only
directories whose entries are not yet durable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

from replaystore.schemas import dqn
from replaystore.store.format import layout
from replaystore.store.format.fragment import FragmentData
from replaystore.store.format.staging import StagedFragment
from replaystore.store.format.zarrio import CRC_BYTES, chunk_path, verify_chunk
from replaystore.store.storage import LocalStorage
from support.batches import dqn_batch
from support.storecheck import Backend, assert_same, columns_of

DQN = dqn(16, 2, actions=9)


def _index(n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(start, start + n, dtype=np.int64), np.zeros(n, dtype=bool)


def _check_chunks(storage, frag, schema) -> None:  # noqa: ANN001 - test helper
    """Every chunk object of ``frag`` is intact (size and CRC32C), as `replaystore verify` checks."""
    data = FragmentData(storage, schema, frag)
    for spec in schema.zarr_layout():
        arr = data.array(spec.name)
        if len(arr):
            raw = storage.read(chunk_path(f"{frag.path}/{spec.name}", arr.ndim))
            assert verify_chunk(raw, arr.dtype, arr.shape) is None, spec.name
            assert len(raw) == arr.nbytes + CRC_BYTES


@pytest.mark.parametrize("buffered", [False, True])
def test_a_fragment_staged_in_several_adds_holds_them_concatenated(fast_backend: Backend, buffered: bool) -> None:
    rng = np.random.default_rng(0)
    storage = fast_backend.storage()
    batches = [dqn_batch(rng, n, extra=0) for n in (5, 1, 7)]
    staged = StagedFragment(storage, DQN, 0, "records", "f0000000000", 0, buffered)
    start = 0
    for i, b in enumerate(batches):
        cols = DQN.validate(b)
        steps, resets = _index(len(cols), start)
        start += len(cols)
        codes = np.arange(len(cols), dtype=np.int32) % 2  # two streams per batch, keys overlap across batches
        staged.add(cols, codes, [f"s{i}", "shared"], steps, resets)
    frag = staged.finish([(0, 1, 13)])
    staged.close()
    assert frag.rows == 13 and frag.streams == ["s0", "shared", "s1", "s2"]
    want = columns_of(DQN, batches)
    data = FragmentData(storage, DQN, frag)
    assert_same({k: v for k, v in data.columns().arrays.items()}, want)
    assert data.array("_stream").tolist() == [0, 1, 0, 1, 0, 2, 3, 1, 3, 1, 3, 1, 3]
    assert np.array_equal(data.array("_step"), np.arange(13))
    _check_chunks(storage, frag, DQN)
    if fast_backend.kind == "local":  # zarr-python reads it as it is
        group = zarr.open_group(f"{fast_backend.url}/{frag.path}", mode="r")
        assert np.array_equal(group["legal_offsets"][:], want.arrays["legal_offsets"])
        assert group.attrs["replaystore"] == frag.to_dict()


@pytest.mark.parametrize("buffered", [False, True])
def test_rollback_and_a_failed_add_leave_the_fragment_as_it_was(fast_backend: Backend, buffered: bool) -> None:
    rng = np.random.default_rng(1)
    storage = fast_backend.storage()
    first, second = DQN.validate(dqn_batch(rng, 4, extra=0)), DQN.validate(dqn_batch(rng, 6, extra=0))
    staged = StagedFragment(storage, DQN, 0, "records", "f0000000000", 0, buffered)
    staged.add(first, np.zeros(4, np.int32), [7], *_index(4))
    mark = staged.mark()
    staged.add(second, np.zeros(6, np.int32), [8], *_index(6, 4))
    staged.rollback(mark)
    broken = dict(second.arrays)
    del broken["next_legal_ids"]  # fails after the arrays before it were written
    with pytest.raises(KeyError):
        staged.add(type(second)(DQN, 6, broken), np.zeros(6, np.int32), [9], *_index(6, 4))
    assert not staged.broken
    frag = staged.finish([(0, 1, 4)])
    staged.close()
    assert frag.rows == 4 and frag.streams == [7] and frag.nnz == {k: int(first.arrays[k][-1])
                                                                    for k in DQN.offsets_groups}
    assert_same(FragmentData(storage, DQN, frag).columns().arrays, first)
    _check_chunks(storage, frag, DQN)


def test_finish_again_after_a_failed_commit_rewrites_checksums_and_descriptor(fast_backend: Backend) -> None:
    rng = np.random.default_rng(2)
    storage = fast_backend.storage()
    cols = DQN.validate(dqn_batch(rng, 5, extra=0))
    staged = StagedFragment(storage, DQN, 0, "records", "f0000000000", 0)
    staged.add(cols, np.zeros(5, np.int32), [0], *_index(5))
    staged.finish([(0, 1, 5)])
    frag = staged.finish([(1, 2, 5)])  # e.g. the commit record could not be created, and a merge took seq 0
    staged.close()
    group = storage.read(f"{frag.path}/zarr.json")
    assert b'"parts": [[1, 2, 5]]' in group
    assert_same(FragmentData(storage, DQN, frag).columns().arrays, cols)
    _check_chunks(storage, frag, DQN)


def test_appends_write_nothing_referenced_before_the_commit_and_discard_drops_them(fast_backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st = fast_backend.open(DQN)
    storage = fast_backend.storage()
    data = f"{layout.writer_dir(0)}/data/records"
    with st.writer() as w:
        w.append(dqn_batch(rng, 5, extra=0), stream=0)
        # buffered in memory; on local storage written into the writer's new open segment (format 2)
        assert len(storage.list(data)) == (fast_backend.kind == "local")
        assert len(fast_backend.open(mode="r")) == 0
        w.discard()
        assert storage.list(data) == []
        batch = dqn_batch(rng, 3, extra=0)
        w.append(batch, stream=1)
        w.commit()  # (counted before close, which right-sizes the segment: tests/store/test_sizes.py)
        assert len(storage.list(data)) == 1 and len(st) == 3
    assert_same(st.read(st.row_ids()), columns_of(DQN, [batch]))


def test_a_writer_killed_between_append_and_commit_leaves_nothing_behind(tmp_path) -> None:  # noqa: ANN001
    url = str(tmp_path / "st")
    child = textwrap.dedent(f"""
        import os
        import numpy as np
        from replaystore.schemas import dqn
        from replaystore.store import open_store
        from support.batches import dqn_batch
        st = open_store({url!r}, dqn(16, 2, actions=9), mode="w")
        w = st.writer()
        w.append(dqn_batch(np.random.default_rng(0), 6, extra=0), stream=0)
        w.commit()
        w.append(dqn_batch(np.random.default_rng(1), 9, extra=0), stream=0)
        os._exit(0)  # no commit, no close: the process dies with a staged fragment
    """)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", child], check=True, env=env)
    from replaystore.store import open_store

    st = open_store(url, mode="a")
    assert len(st) == 6
    data = f"{layout.writer_dir(0)}/data/records"
    assert len(os.listdir(os.path.join(url, data))) == 1  # the committed fragment only
    assert st.vacuum(older_than_s=0).deleted == []


def test_local_storage_fsyncs_a_directory_again_only_after_new_entries(tmp_path) -> None:  # noqa: ANN001
    storage = LocalStorage(str(tmp_path / "root"))
    root = storage.root
    a = os.path.join(root, "a")
    ab, ac = os.path.join(a, "b"), os.path.join(a, "c")

    def todo(*paths: str) -> dict[str, list[str]]:
        return {d: children for d, _, children in storage._unsynced(paths)}

    storage.write_objects({"a/b/one": [b"1"]})  # made a and a/b: their parents were fsynced after
    # a directory made before is known durable after one more fsync of its parent, then never again
    assert todo("a/b/one") == {a: [ab], root: [a]}
    storage.write_objects({"a/b/two": [b"2"]})
    assert todo("a/b/one", "a/b/two") == {}
    stream = storage.open_stream("a/c/three")  # a new entry in a, and a new directory
    stream.write([b"3"])
    assert todo("a/c/three") == {a: [], ac: []}
    storage.write_objects({}, [stream])
    stream.close()
    assert todo("a/b/two") == {}
    assert storage.read("a/c/three") == b"3" and storage.read("a/b/two") == b"2"
    other = LocalStorage(root)  # a new handle knows nothing: it fsyncs every level above once
    assert {d: c for d, _, c in other._unsynced(["a/b/one"])} == {root: [a], a: [ab]}


def test_deleting_a_directory_forgets_what_local_storage_knew_about_it(tmp_path) -> None:  # noqa: ANN001
    storage = LocalStorage(str(tmp_path / "root"))
    stream = storage.open_stream("a/b/c/one")  # dirties a/b/c, a/b, a and the root
    stream.write([b"1"])
    stream.close()
    storage.delete("a/b")  # abandoned before completion: nothing under a/b is tracked any more
    b = os.path.join(storage.root, "a", "b")
    assert not any(d == b or d.startswith(b + os.sep) for d in (*storage._dirty, *storage._durable))
    storage.write_objects({"a/b/c/two": [b"2"]})  # made again: every new entry fsynced with it
    assert not [d for d in storage._dirty if d.startswith(storage.root)]  # (the root's parent: never synced)
    a = os.path.join(storage.root, "a")  # directories it made count as durable after one more parent fsync
    assert {d: c for d, _, c in storage._unsynced(["a/b/c/two"])} == {
        b: [os.path.join(b, "c")], a: [b], storage.root: [a]}
    assert storage.read("a/b/c/two") == b"2"
