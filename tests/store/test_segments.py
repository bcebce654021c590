"""Format 2 segments (docs/FORMAT.md, "Segments"): an uncapped store on local disk puts a
writer's commits into one open segment per table, written in place and never rewritten.

The store suite (tests/store/test_store_suite.py) runs everything else on segments too (its
local backend is uncapped); here: what is particular to them. The crash runs
(tests/system/test_crash.py) kill writers in the middle of segment appends and commits.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from replaystore.errors import NonFiniteError, StoreError
from replaystore.schemas import dqn, transitions
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.segment import MAX_STREAMS
from replaystore.store.maintenance.verify import verify
from replaystore.store.store import Store
from replaystore.store.write import sizing
from replaystore.store.write.writer import Writer
from support.batches import dqn_batch, transitions_batch
from support.storecheck import assert_same, columns_of

DQN = dqn(16, 2, actions=9)


def _fragments(st: Store) -> list[Fragment]:
    st.refresh()
    return st.table("records").reader.fragments


def test_commits_share_one_segment_and_a_reader_follows_it_as_it_grows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    w = st.writer()
    batches = [dqn_batch(rng, 7, extra=0)]
    w.append(batches[0], stream="a")
    w.commit()
    reader = open_store(url, mode="r")
    assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches))  # maps the segment once
    for i in range(5):
        batches.append(dqn_batch(rng, 3 + i, extra=0))
        w.append(batches[-1], stream="ab"[i % 2])
        w.commit()
    reader.refresh()
    assert_same(reader.read(reader.row_ids()), columns_of(DQN, batches))
    assert reader.rows("b")[1].tolist() == list(range(4 + 6))  # steps 0.. of stream b: 4 + 6 records
    frags = _fragments(st)
    assert len({f.segment.name for f in frags}) == 1 and len(frags) == 6
    rows = [(f.segment.row, f.rows) for f in frags]
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(rows))  # adjacent, in order
    seg = frags[0].segment
    chunk = tmp_path / "st" / frags[0].path / "obs" / "c" / "0" / "0"
    assert chunk.stat().st_size == seg.capacity * 16 * 4  # created at full length, never grown
    g = zarr.open_group(str(tmp_path / "st" / frags[0].path), mode="r")
    n = sum(f.rows for f in frags)
    assert np.array_equal(g["obs"][:n], reader.read(reader.row_ids())["obs"])
    assert not g["obs"][n:n + 8].any()  # past the commits: zeros (nothing written there)
    w.close()
    assert verify(open_store(url, mode="r")) == []


def test_discarded_and_failed_appends_leave_committed_bytes_alone(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    kept = [dqn_batch(rng, 5, extra=0)]
    with st.writer() as w:
        w.append(kept[0], stream=0)
        w.commit()
        w.append(dqn_batch(rng, 9, extra=0), stream=0)  # written into the segment, then discarded
        w.discard()
        bad = dict(vars(dqn_batch(rng, 4, extra=0)))
        bad["rewards"] = np.full(4, np.nan)  # rejected before anything is written
        with pytest.raises(NonFiniteError, match="rewards"):
            w.append(bad, stream=0)
        kept.append(dqn_batch(rng, 6, extra=0))
        w.append(kept[1], stream=0)  # takes the discarded records' place
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, kept))
    assert st.row_ids().tolist() == list(range(11)) and st.rows(0)[1].tolist() == list(range(11))
    assert verify(st) == []


def test_an_append_that_does_not_fit_opens_a_new_segment_in_the_same_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "MAX_FRAGMENT_ROWS", 16)  # segments of 16 rows, 8 x 16 values
    rng = np.random.default_rng(2)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    batches = []
    with st.writer() as w:
        for n in (10, 5, 4):  # the third no longer fits in 16 rows: a second segment, same commit
            batches.append(dqn_batch(rng, n, extra=0))
            w.append(batches[-1], stream="x")
        result = w.commit()
        batches.append(dqn_batch(rng, 40, extra=0))  # larger than a segment: one of its own size
        w.append(batches[-1], stream="x")
    assert result.rows == {"records": (0, 19)}
    body = records.decode("r", (tmp_path / "st" / layout.commit_record(0, 0)).read_bytes())
    added = body["tables"]["records"]["add"]
    assert [(d["segment"]["name"], d["segment"]["row"], d["rows"]) for d in added] == [
        ("s0000000000", 0, 15), ("s0000000001", 0, 4)]
    assert [a["rows"] for a in body["tables"]["records"]["appends"]] == [[0, 10], [10, 15], [15, 19]]
    st = open_store(url, mode="r")
    assert len({f.segment.name for f in st.table("records").reader.fragments}) == 3
    assert st.table("records").reader.fragments[-1].segment.capacity == 40
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert st.rows("x")[1].tolist() == list(range(59))
    assert verify(st) == []


def test_values_and_stream_keys_beyond_a_segment_open_the_next(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "MAX_FRAGMENT_ROWS", 64)
    rng = np.random.default_rng(3)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    batches = [dqn_batch(rng, 8, extra=0)]
    with st.writer() as w:
        w.append(batches[0], stream=0)
        w.commit()
        dense = dqn_batch(rng, 4, extra=0)
        ids = np.tile(np.arange(9), 4 * 20)[: 4 * 180]  # 180 legal ids a record: more values than fit
        dense.legal_ids, dense.legal_offsets = ids, np.arange(5) * 180
        batches.append(dense)
        w.append(dense, stream=0)
        w.commit()
        many = dqn_batch(rng, 3, extra=0)
        batches.append(many)
        w.append(many, stream=[f"k{i}" for i in range(3)])
        w.commit()  # (looked at before close, which right-sizes the segments: tests/store/test_sizes.py)
        frags = open_store(url, mode="r").table("records").reader.fragments
        assert [f.segment.name for f in frags] == ["s0000000000", "s0000000002", "s0000000002"]
    keys = np.arange(MAX_STREAMS + 1)  # more keys than a segment may hold: each batch its own segment
    st = open_store(url, mode="a")
    with st.writer() as w:
        batch = dqn_batch(rng, len(keys) - 1, extra=0)
        w.append(batch, stream=keys[:-1])
        w.append(dqn_batch(rng, 1, extra=0), stream=keys[-1:])
        batches += [batch]
    segs = {f.segment.name for f in open_store(url, mode="r").table("records").reader.fragments if f.writer == 1}
    assert len(segs) == 2
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()[: 15]), columns_of(DQN, batches[:3]))
    assert verify(st) == []


def test_many_commits_coalesce_without_moving_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    batches = []
    with st.writer() as w:
        for i in range(20):
            batches.append(dqn_batch(rng, 3, extra=0))
            w.append(batches[-1], stream=i % 4)
            w.commit()
        chunk = tmp_path / "st" / _fragments(st)[0].path / "obs" / "c" / "0" / "0"
        mtime = chunk.stat().st_mtime_ns
        w.compact()  # (waits for the background merges; the open segment is not right-sized)
        # (looked at before close, which right-sizes the segment: tests/store/test_sizes.py)
        frags = _fragments(st)
        assert len(frags) < 8 and sum(len(f.parts) for f in frags) == 20
        assert all(len(f.segment.crc32c["obs"]) == len(f.parts) for f in frags)
        assert chunk.stat().st_mtime_ns == mtime  # the merges wrote commit records only
        kinds = [c["kind"] for c in st.commits()]
        assert kinds.count("compact") >= 2 and os.listdir(tmp_path / "st" / layout.writer_dir(0) /
                                                          "data/records") == ["s0000000000"]
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []


def test_verify_checks_each_commit_of_a_segment_and_ignores_what_no_commit_covers(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    w = st.writer()
    for _ in range(3):
        w.append(dqn_batch(rng, 4, extra=0), stream=0)
        w.commit()
    w.append(dqn_batch(rng, 4, extra=0), stream=0)  # pending: in the segment, covered by no commit
    frag = _fragments(st)[-1]
    chunk = tmp_path / "st" / frag.path / "rewards" / "c" / "0"
    with open(chunk, "r+b") as f:  # a byte of the pending records
        f.seek(13 * 8 + 3)
        f.write(b"\x7f")
    assert verify(open_store(url, mode="r")) == []
    with open(chunk, "r+b") as f:  # a byte of the second commit's records
        f.seek(5 * 8 + 3)
        f.write(b"\x7f")
    problems = verify(open_store(url, mode="r"))
    assert len(problems) == 1 and problems[0].path == f"{frag.path}/rewards/c/0"
    assert "crc32c" in problems[0].problem and "commit 1 " in problems[0].problem
    w.discard()
    w.close()


def test_a_version_1_store_is_read_and_appended_to_in_version_1(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    manifest = records.decode("m", (tmp_path / "st" / layout.MANIFEST).read_bytes())
    (tmp_path / "st" / layout.MANIFEST).write_bytes(records.encode({**manifest, "format_version": 1}))
    rng = np.random.default_rng(6)
    batches = [dqn_batch(rng, 5, extra=0), dqn_batch(rng, 3, extra=0)]
    st = open_store(url, mode="a")
    with st.writer() as w:
        for b in batches:
            w.append(b, stream=0)
            w.commit()
    frags = _fragments(st)
    assert len(frags) == 2 and all(f.segment is None for f in frags)  # a fragment per commit
    assert sorted(os.listdir(tmp_path / "st" / layout.writer_dir(0) / "data/records")) == [
        "f0000000000", "f0000000001"]
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []


def test_a_commit_into_a_segment_deleted_meanwhile_fails_instead_of_publishing_it(tmp_path: Path) -> None:
    """A vacuum with a threshold shorter than a writer's pause may delete a segment that no commit
    references yet; the commit must then fail, not reference data that is gone."""
    rng = np.random.default_rng(7)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    w = st.writer()
    w.append(dqn_batch(rng, 4, extra=0), stream=0)
    assert [u.kind for u in open_store(url, mode="a").vacuum(older_than_s=0).deleted] == ["fragment"]
    with pytest.raises(StoreError, match="deleted while"):
        w.commit()
    w.discard()
    batch = dqn_batch(rng, 3, extra=0)
    w.append(batch, stream=0)  # a new segment
    w.close()
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, [batch]))
    assert verify(st) == []


def test_a_capped_store_reclaims_full_segments_and_never_a_live_writers_open_one(tmp_path: Path) -> None:
    """Capacity 40: segments of 10 rows. Writer A commits a few records and goes quiet, its open
    segment not full; writer B evicts them and reclaims its own full segments, but must leave
    A's segment alone: A may (and does) append to it again."""
    rng = np.random.default_rng(8)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=40)
    a = st.writer()
    a.append(dqn_batch(rng, 3, extra=0), stream="a")
    a.commit()
    (seg_a,) = {f.segment.name for f in _fragments(st) if f.writer == a.id}
    data = tmp_path / "st" / layout.writer_dir(a.id) / "data/records"
    b = open_store(url, mode="a").writer()
    for _ in range(30):
        b.append(dqn_batch(rng, 4, extra=0), stream="b")
        b.commit()
    st = open_store(url, mode="r")
    assert len(st) == 40 and all(f.writer == b.id for f in st.table("records").reader.fragments)
    assert os.listdir(data) == [seg_a]  # wholly evicted, but not full: A's, and A is alive
    late = dqn_batch(rng, 2, extra=0)
    a.append(late, stream="a")  # into the same segment, after its evicted records
    a.commit()
    assert {f.segment.name for f in _fragments(a.store) if f.writer == a.id} == {seg_a}
    a.close()
    b.close()  # (its reclaimed segments are deleted on its I/O thread, its spare at close)
    kept = sorted(os.listdir(tmp_path / "st" / layout.writer_dir(b.id) / "data/records"))
    assert 0 < len(kept) <= 7  # 120 records in 12 segments of 10 rows; full and evicted ones went
    st = open_store(url, mode="r")
    rows = [r for r in st.row_ids().tolist() if r >> layout.ROW_BITS == a.id]
    assert_same(st.read(rows), columns_of(DQN, [late]))
    assert verify(st) == []


def _rows_on_disk(url: str, writers: int) -> int:
    """Records whose ``obs`` (4 KiB each: one filesystem block) take disk space in the segments
    still stored: allocated blocks, so the sparse rest of a segment counts for nothing."""
    held = 0
    for w in range(writers):
        for chunk in Path(url, layout.writer_dir(w), "data/records").glob("*/obs/c/0/0"):
            held += chunk.stat().st_blocks * 512
    return held // 4096


def _io_done(w: Writer) -> None:
    """Return once the writer's two I/O threads have finished what they were given (deletions of
    reclaimed segments, spares): white-box, each thread then runs one task waiting on a barrier."""
    barrier = threading.Barrier(3)
    tasks = [w._io.submit(barrier.wait) for _ in range(2)]
    barrier.wait(timeout=60)
    for task in tasks:
        task.result()


@pytest.mark.parametrize(("obs", "capacity", "rows"), [
    (4, 4_000, 4_000),  # small records: the floor is above the capacity, a segment holds all of it
    (16_384, 1_600, 512),  # 128 KiB records: 64 MiB of them, more than capacity // 4 = 400
    (16_384, 8_000, 2_000),  # capacity // 4 is above the floor
])
def test_a_capped_store_sizes_its_segments_to_a_floor_in_bytes(tmp_path: Path, obs: int, capacity: int,
                                                                rows: int) -> None:
    st = open_store(str(tmp_path / "st"), transitions(obs), mode="w", capacity=capacity)
    with st.writer() as w:
        w.append(transitions_batch(np.random.default_rng(0), 3, obs), stream=0)
        w.commit()
        assert {f.segment.capacity for f in _fragments(st)} == {rows}  # (close copies it into a right-sized one)


def test_a_capped_store_on_floor_sized_segments_keeps_storage_near_twice_its_capacity(tmp_path: Path) -> None:
    """Capacity 64 of 8 KiB records (segments of the whole capacity): a segment is reclaimed
    once every record in it is older than the newest capacity + grace (80), so the records on
    disk peak at about two segments and a grace: 2.25 x capacity, plus the batch in flight."""
    rng = np.random.default_rng(15)
    url = str(tmp_path / "st")
    cap = 64
    st = open_store(url, dqn(1024, 2, actions=9), mode="w", capacity=cap)
    batch = dqn_batch(rng, 4, observation_size=1024, extra=0)
    held = []
    with st.writer() as w:
        for _ in range(100):
            w.append(batch, stream=0)
            w.commit()
            _io_done(w)
            held.append(_rows_on_disk(url, 1))
        assert {f.segment.capacity for f in _fragments(st)} == {cap}  # (close right-sizes the last one)
    assert max(held) <= 2.25 * cap + 4 and held[-1] >= cap


def test_many_writers_keep_storage_near_capacity(tmp_path: Path) -> None:
    """16 collectors take turns into a replay of 64 records (segments of the whole capacity: the
    floor in bytes is above it): each fills its segment 16 times slower than the store turns
    over. A segment is sealed once eviction
    reaches its records, so it is reclaimed with them; before, each writer kept the evicted
    records of its open segment until the segment was full (here ~4x capacity in all)."""
    rng = np.random.default_rng(14)
    url = str(tmp_path / "st")
    cap, writers = 64, 16
    open_store(url, dqn(1024, 2, actions=9), mode="w", capacity=cap)
    ws = [open_store(url, mode="a").writer() for _ in range(writers)]
    batch = dqn_batch(rng, 2, observation_size=1024, extra=0)
    for _ in range(24):
        for i, w in enumerate(ws):
            w.append(batch, stream=i)
            w.commit()
    for w in ws:
        w.close()  # (waits for its deletions)
    assert len(open_store(url, mode="r")) == cap
    assert _rows_on_disk(url, writers) <= 3 * cap


def test_a_spare_segment_is_made_ahead_taken_at_rollover_and_replaced_if_vacuumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capacity 40: segments of 10 rows. Half full, the writer creates the next segment ahead
    (a spare, unreferenced); a rollover takes it. A vacuum that deletes a spare makes the writer
    create another instead of writing into unlinked files; close deletes the last spare."""
    monkeypatch.setattr(sizing, "SEGMENT_FLOOR_BYTES", 0)  # segments of capacity // 4 rows
    rng = np.random.default_rng(12)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=40)
    data = tmp_path / "st" / layout.writer_dir(0) / "data/records"
    batches = []
    w = st.writer()

    def put(n: int) -> None:
        batches.append(dqn_batch(rng, n, extra=0))
        w.append(batches[-1], stream=0)
        w.commit()

    put(6)  # 6 of 10 rows: a spare is made
    spare = w._segments.spares["records"].result()
    (first,) = {f.segment.name for f in _fragments(st)}
    assert sorted(os.listdir(data)) == sorted([first, spare.name])
    put(6)  # rolls over into the spare
    assert {f.segment.name for f in _fragments(st)} == {first, spare.name}
    second = w._segments.spares["records"].result()  # after a rollover, the next spare is made at once
    assert open_store(url, mode="a").vacuum(older_than_s=0).deleted  # the unreferenced spare goes
    assert not (data / second.name).exists()
    put(6)  # does not fit: a new segment, not the vacuumed spare
    names = {f.segment.name for f in _fragments(st)}
    assert second.name not in names and len(names) == 3
    w.close()  # (its last segment is copied into a right-sized one: the original stays for the grace)
    assert set(os.listdir(data)) == names | {f.segment.name for f in _fragments(st)}  # the last spare went
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []


def test_a_spare_too_small_for_the_append_is_dropped_for_a_new_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 10 rows (capacity 40): an append of 15 records does not fit the spare made
    ahead, so the writer deletes the spare and opens a segment large enough for the batch."""
    monkeypatch.setattr(sizing, "SEGMENT_FLOOR_BYTES", 0)  # segments of capacity // 4 rows
    rng = np.random.default_rng(13)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=40)
    data = tmp_path / "st" / layout.writer_dir(0) / "data/records"
    batches = [dqn_batch(rng, 6, extra=0), dqn_batch(rng, 15, extra=0)]
    w = st.writer()
    w.append(batches[0], stream=0)
    w.commit()
    spare = w._segments.spares["records"].result()
    w.append(batches[1], stream=0)
    w.commit()
    names = {f.segment.name for f in _fragments(st)}
    assert len(names) == 2 and spare.name not in names and not (data / spare.name).exists()
    assert max(f.segment.capacity for f in _fragments(st)) == 15
    w.close()  # (under-filled segments are copied into right-sized ones: the originals stay for the grace)
    assert set(os.listdir(data)) == names | {f.segment.name for f in _fragments(st)}  # the spare made
    # after the rollover went at close
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []
