"""The write path: multi-buffer object writes, and compaction on the writer's background thread
(records stay dense and time-ordered, merges of vanished inputs are abandoned, close drains)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import zarr

from replaystore.schemas import dqn
from replaystore.store.format import layout, records
from replaystore.store.write import sizing
from support.batches import dqn_batch
from support.storecheck import Backend, assert_same, columns_of

DQN = dqn(16, 2, actions=9)


def test_write_objects_stores_each_object_as_its_buffers_concatenated(backend: Backend) -> None:
    storage = backend.storage()
    values = np.arange(6, dtype="<i4").reshape(3, 2)
    storage.write_objects({
        "w/a/zarr.json": [b"{}"],
        "w/a/c/0/0": [values.reshape(-1).view(np.uint8), b"tail"],
        "w/b": [b"x", b"", b"yz"],
    })
    assert storage.read("w/a/zarr.json") == b"{}"
    assert storage.read("w/a/c/0/0") == values.tobytes() + b"tail"
    assert storage.read("w/b") == b"xyz"
    assert sorted(storage.list("w")) == ["a", "b"]


def _commit_records(backend: Backend, writer: int) -> list[dict]:
    storage = backend.storage()
    names = storage.list(layout.commits_dir(writer))
    return [records.decode(n, storage.read(f"{layout.commits_dir(writer)}/{n}")) for n in names]


def _commit_each(w: Any, rng: np.random.Generator, commits: int, records: int, streams: int) -> list[Any]:
    """``commits`` DQN batches of ``records``, one commit each, round-robin over ``streams``."""
    batches = []
    for i in range(commits):
        batches.append(dqn_batch(rng, records, extra=0))
        w.append(batches[-1], stream=i % streams)
        w.commit()
    return batches


def test_background_merges_keep_records_dense_ordered_and_readable(fast_backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st = fast_backend.open(DQN)
    w = st.writer()
    batches = _commit_each(w, rng, commits=70, records=3, streams=4)
    w.close()
    bodies = _commit_records(fast_backend, w.id)
    assert [b["seq"] for b in bodies] == list(range(len(bodies)))  # no gap a reader would stop at
    times = [b["time_ns"] for b in bodies]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    kinds = [b["kind"] for b in bodies]
    assert kinds.count("append") == 70 and kinds.count("compact") >= 1  # how many: depends on timing
    names = [d["name"] for b in bodies for t in b["tables"].values() for d in t.get("add", [])]
    assert len(names) == len(set(names))  # fragment names are never reused
    # close() drained the policy: no run of 8 one-commit fragments is left
    fragments = st.table("records").reader.fragments
    assert sum(f.rows == 3 for f in fragments) < 8 and len(fragments) < 70
    for handle in (st, fast_backend.open(mode="r")):
        assert_same(handle.read(handle.row_ids()), columns_of(DQN, batches))
    if fast_backend.kind == "local":  # merges describe rows of the writer's segment (format 2, no copy)
        merged = max(fragments, key=lambda f: f.rows)
        assert merged.segment is not None and len(merged.segment.crc32c["obs"]) == len(merged.parts)
        group = zarr.open_group(f"{fast_backend.url}/{merged.path}", mode="r")
        rows = slice(merged.segment.row, merged.segment.row + merged.rows)
        merged_rows = np.arange(merged.first_id, merged.first_id + merged.rows)
        assert np.array_equal(group["obs"][rows], st.read(merged_rows)["obs"])


def test_a_merge_whose_inputs_are_gone_is_abandoned(fast_backend: Backend) -> None:
    rng = np.random.default_rng(4)
    st = fast_backend.open(DQN)
    w = st.writer()
    for i in range(8):
        w.append(dqn_batch(rng, 2, extra=0), stream=i)
        w.commit()
    originals = [f for f in st.table("records").reader.all_fragments if f.rows == 2]
    w.close()  # the 8 were merged and replaced
    before = _commit_records(fast_backend, w.id)
    assert [b["kind"] for b in before[-2:]] == ["compact", "close"]
    data = fast_backend.storage()
    merged_dirs = set(data.list(f"{layout.writer_dir(w.id)}/data/records"))
    # inputs no longer live in the writer's log: the merge must not publish
    w._compactor.merge("records", originals)
    # inputs deleted (reclaimed) under the merge: StaleReadError inside, abandoned as well
    for f in originals:
        data.delete(f.path)
    w._compactor.merge("records", originals)
    assert _commit_records(fast_backend, w.id) == before
    gone = {f.path.rsplit("/", 1)[-1] for f in originals}  # (their segment, on local storage)
    assert set(data.list(f"{layout.writer_dir(w.id)}/data/records")) == merged_dirs - gone
    assert len(fast_backend.open(mode="r")) == 16


def test_compact_merges_a_writers_fragments_up_to_the_size_cap(fast_backend: Backend) -> None:
    rng = np.random.default_rng(5)
    st = fast_backend.open(DQN)
    w = st.writer()
    batches = _commit_each(w, rng, commits=30, records=4, streams=3)
    pending = dqn_batch(rng, 2, extra=0)
    w.append(pending, stream=0)
    assert len(st.table("records").reader.fragments) > 1
    assert w.compact() >= 1
    fragments = st.table("records").reader.fragments
    assert len(fragments) == 1 and fragments[0].rows == 120
    assert [tuple(p) for p in fragments[0].parts] == [
        (b["seq"], b["time_ns"], 4) for b in _commit_records(fast_backend, w.id) if b["kind"] == "append"]
    assert w.compact() == 0  # nothing left to merge
    w.close()  # the pending append is committed as its own fragment (local: close right-sizes the segment into one)
    for handle in (st, fast_backend.open(mode="r")):
        frags = handle.table("records").reader.fragments
        assert len(frags) == (1 if frags[0].segment is not None else 2)
        assert_same(handle.read(handle.row_ids()), columns_of(DQN, [*batches, pending]))
        assert handle.rows(0)[1].tolist() == list(range(10 * 4 + 2))


def test_compact_respects_the_fragment_cap_of_a_capped_store(fast_backend: Backend,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "SEGMENT_FLOOR_BYTES", 0)  # local: segments of capacity // 4 rows too
    rng = np.random.default_rng(6)
    st = fast_backend.open(DQN, capacity=48)  # fragments hold at most 48 // 4 = 12 records
    with st.writer() as w:
        for i in range(12):
            w.append(dqn_batch(rng, 2, extra=0), stream=i % 2)
            w.commit()
        w.compact()
    fragments = st.table("records").reader.fragments
    assert all(f.rows <= 12 for f in fragments) and len(fragments) == 2 and len(st) == 24


def test_append_keeps_its_own_copy_of_the_callers_buffers(fast_backend: Backend) -> None:
    """A collector that refills its numpy buffers (or the tensors over them) between appends
    stores what it appended, not what the buffers hold at commit time."""
    rng = np.random.default_rng(5)
    st = fast_backend.open(DQN)
    first = dataclasses.asdict(dqn_batch(rng, 4, extra=0))
    want = {k: np.array(v) for k, v in first.items() if isinstance(v, np.ndarray)}
    with st.writer() as w:
        w.append(first | {"obs": torch.from_numpy(first["obs"])}, stream=0)
        first["obs"][...] = -1.0  # refill in place
        first["rewards"][...] = 7.0
        first["legal_ids"][...] = 0
        w.append(first, stream=0)
    got = st.read(np.arange(8))
    for name in ("obs", "rewards"):
        np.testing.assert_array_equal(got[name][:4], want[name])
        np.testing.assert_array_equal(got[name][4:], first[name])
    np.testing.assert_array_equal(got["legal_ids"][:len(want["legal_ids"])], want["legal_ids"])
