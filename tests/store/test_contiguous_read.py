"""Contiguous views (store/read/spans.py, store/read/vmap.py): every fragment of an array mapped side by side
in one address range, so a read is one gather per array. Checked against the per-fragment read
over random multi-fragment histories, and on damaged or reclaimed files."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import CorruptObjectError, RowError, StaleReadError
from replaystore.schemas import dqn
from replaystore.store import ChunkCache, Store, open_store
from replaystore.store.format import layout
from replaystore.store.format.fragment import Fragment
from replaystore.store.read.table import TableReader
from replaystore.store.read.vmap import PAGE, AddressRange, available
from support.batches import dqn_batch
from support.storecheck import Backend, assert_same

DQN = dqn(16, 2, actions=9)

pytestmark = pytest.mark.skipif(not available(), reason="contiguous views need POSIX mmap placement")


def _per_fragment(st) -> TableReader:
    """A second reader of the same committed view that gathers fragment by fragment."""
    r = st.table("records").reader
    return TableReader(r.storage, r.log, r.name, r.schema, r.capacity, contiguous=False)


OPS = st.lists(st.one_of(st.tuples(st.just("commit"), st.integers(1, 40)), st.just(("compact",)),
                         st.just(("read",))), min_size=1, max_size=25)


@pytest.mark.parametrize("where", ["local", "cached"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, capacity=st.sampled_from([None, 30, 150]), seed=st.integers(0, 2**16))
def test_contiguous_read_equals_the_per_fragment_read(tmp_path_factory: pytest.TempPathFactory, where: str,
                                                      ops: list[tuple], capacity: int | None, seed: int) -> None:
    """``cached``: a memory:// store read through a chunk cache (object storage's path: the
    views map the cache's files; tests/store/test_chunk_cache.py does it on S3)."""
    tmp = tmp_path_factory.mktemp("contig")
    url = str(tmp / "st") if where == "local" else f"memory://contig-{uuid.uuid4().hex}"
    rng = np.random.default_rng(seed)

    def reader_of() -> Store:
        return open_store(url, mode="r", cache=ChunkCache(tmp / "cache") if where == "cached" else None)

    for i, reader in _read_points(url, ops, capacity, rng, reader_of):
        table = reader.table("records")
        ids = table.row_ids()
        assert table.reader._layouts  # the contiguous path is the one under test
        np.testing.assert_array_equal(table.rows_at(np.arange(len(ids))), ids)  # positions, one run of ids
        rows = rng.choice(ids, size=min(3 * len(ids), 300)) if len(ids) else ids
        assert_same(table.read(rows), _per_fragment(reader).read(rows), f"op {i}")


def _read_points(url: str, ops: list[tuple], capacity: int | None, rng: np.random.Generator,
                 reader_of: Callable[[], Store]) -> Iterator[tuple[int, Store]]:
    """Run ``ops`` (then one more read) against a new DQN store at ``url``: at each read, yield the op's
    index and the reader (made by ``reader_of`` first), refreshed."""
    st_w = open_store(url, DQN, mode="w", capacity=capacity)
    reader = reader_of()
    w = st_w.writer()
    for i, op in enumerate([*ops, ("read",)]):
        if op[0] == "commit":
            w.append(dqn_batch(rng, op[1], extra=0), stream=i % 3)
            w.commit()
        elif op[0] == "compact":
            w.compact()
        else:
            reader.refresh()
            yield i, reader
    w.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, capacity=st.sampled_from([None, 30, 150]), seed=st.integers(0, 2**16))
def test_compiled_csr_index_reads_what_numpy_reads(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple],
                                                   capacity: int | None, seed: int) -> None:
    """The numba CSR index (store/read/csrkernels.py) and its numpy twin, through the views and per
    fragment: the same arrays, bit for bit (rows repeated, in any order, empty lists included)."""
    url = str(tmp_path_factory.mktemp("csr") / "st")
    rng = np.random.default_rng(seed)
    for i, reader in _read_points(url, ops, capacity, rng, lambda: open_store(url, mode="r")):
        ids = reader.table("records").row_ids()
        rows = rng.choice(ids, size=min(3 * len(ids), 300)) if len(ids) else ids
        got = {}
        for numba in ("1", "0"):
            with mock.patch.dict(os.environ, {"REPLAYSTORE_NUMBA": numba}):
                for contiguous in (True, False):
                    r = reader.table("records").reader
                    t = TableReader(r.storage, r.log, r.name, r.schema, r.capacity, contiguous=contiguous)
                    got[numba, contiguous] = t.read(rows)
                    if contiguous and len(rows):  # (several fragments without views: no CSR index)
                        assert (t._csr is not None) == (numba == "1")
        for key, arrays in got.items():
            assert_same(arrays, got["0", False], f"op {i}, {key}")


def test_views_stay_valid_and_correct_across_relayouts(tmp_path: Path) -> None:
    """Many small fragments outgrow the reserved space (the layout starts afresh in new ranges)
    while compaction and eviction remove fragments (their part of the range is unmapped). A
    view of an old layout stays whole until it is dropped."""
    rng = np.random.default_rng(1)
    url = str(tmp_path / "st")
    st = Backend(url).open_fragments(DQN, capacity=400)  # a fragment per commit (version 1), not a segment
    reader = open_store(url, mode="r")
    w = st.writer()
    table = reader.table("records")
    lay = table.reader._layouts["records"]
    relayouts = 0
    old_view = old_rows = old_obs = np.empty(0)
    for i in range(80):
        w.append(dqn_batch(rng, 7, extra=0), stream=i % 4)
        w.commit()
        before = lay._ranges.get("obs")
        reader.refresh()
        rows = table.row_ids()
        assert_same(table.read(rows), _per_fragment(reader).read(rows), f"commit {i}")
        if before is not None and lay._ranges.get("obs") is not before:
            relayouts += 1
            assert np.array_equal(old_view.take(old_rows, axis=0), old_obs)
        old_view = lay.array("obs")
        frag_i, local = table.reader.locate(rows)
        old_rows = table.reader.view._bases["records"][frag_i] + local
        old_obs = table.read(rows)["obs"]
    w.close()
    assert relayouts >= 2


def _one_fragment(tmp_path: Path) -> tuple[str, Fragment]:
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    with st.writer() as w:
        w.append(dqn_batch(np.random.default_rng(0), 50, extra=0), stream=0)
    return url, st.table("records").reader.fragments[0]


def test_a_short_chunk_file_is_a_typed_error_not_a_crash(tmp_path: Path) -> None:
    url, frag = _one_fragment(tmp_path)
    chunk = tmp_path / "st" / frag.path / "obs" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[: PAGE // 2])
    reader = open_store(url, mode="r")
    with pytest.raises(CorruptObjectError) as exc:
        reader.read([0])
    assert exc.value.path == f"{frag.path}/obs/c/0/0"


@pytest.mark.parametrize("numba", ["1", "0"])
def test_damaged_offsets_are_a_typed_error_not_a_wild_gather(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              numba: str) -> None:
    """Both CSR index paths: the numba kernel (store/read/csrkernels.py) and numpy."""
    monkeypatch.setenv("REPLAYSTORE_NUMBA", numba)
    url, frag = _one_fragment(tmp_path)
    chunk = tmp_path / "st" / frag.path / "legal_offsets" / "c" / "0"
    first = frag.segment.row if frag.segment else 0  # the fragment's entries in its segment's offsets
    offsets = np.memmap(chunk, dtype="<i8", mode="r+", shape=(frag.rows + 1,), offset=8 * first)
    offsets[10] = 1 << 40  # far past the values, and past the mapped range
    offsets[20] = -(1 << 20)  # negative: would wrap around the view
    assert offsets[30] > 0
    offsets[31] = offsets[30] - 1  # in range, but record 30 would end before it starts
    offsets.flush()
    del offsets
    reader = open_store(url, mode="r")
    assert reader.read([3])["legal_ids"].size  # rows whose offsets are intact still read
    assert (reader.table("records").reader._csr is not None) == (numba == "1")
    for row in (9, 10, 19, 20, 30):  # each damaged offset ends one record and starts the next
        with pytest.raises(CorruptObjectError) as exc:
            reader.read([row])
        assert exc.value.path == f"{frag.path}/legal_offsets"


def test_the_compiled_csr_index_refuses_records_outside_the_offsets() -> None:
    from replaystore.store.read.csrkernels import csr_index

    offsets = np.array([0, 2, 2, 5], dtype=np.int64)  # three records
    out = np.empty(3, dtype=np.int64)
    ok, index = csr_index(offsets, np.array([2, 0]), np.zeros(0, dtype=np.int64), 5, out)
    assert ok and out.tolist() == [0, 3, 5] and index.tolist() == [2, 3, 4, 0, 1]
    for loc in ([3], [-1], [0, 7]):  # past the last record, negative, one bad among good
        ok, index = csr_index(offsets, np.array(loc), np.zeros(0, dtype=np.int64), 5, np.empty(len(loc) + 1, np.int64))
        assert not ok and not index.size
    ok, _ = csr_index(offsets, np.array([1]), np.array([7]), 5, np.empty(2, np.int64))  # shift only moves the index
    assert ok


def test_a_reader_that_missed_a_reclaim_gets_stale_read_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w", capacity=10)
    w = st.writer()
    w.append(dqn_batch(rng, 10, extra=0), stream=0)
    w.commit()
    stale = open_store(url, mode="r")  # sees the first fragment, has mapped nothing yet
    for _ in range(4):
        w.append(dqn_batch(rng, 10, extra=0), stream=0)
        w.commit()
    w.close()
    assert not (tmp_path / "st" / layout.writer_dir(w.id) / "data" / "records" / layout.fragment_name(0)).exists()
    with pytest.raises(StaleReadError, match="refresh"):
        stale.read(np.arange(10))
    stale.refresh()
    assert len(stale.read(stale.row_ids())["obs"]) == 10


def test_address_range_maps_files_at_page_offsets(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(np.arange(5, dtype="<i8").tobytes())
    b.write_bytes(np.arange(100, 103, dtype="<i8").tobytes() + b"crc!")
    rng = AddressRange(4 * PAGE)
    rng.map_file(0, str(a), 40)
    rng.map_file(2 * PAGE, str(b), 24)
    view = rng.view(np.dtype("<i8"), ())
    base_b = 2 * PAGE // 8
    assert view[[4, 0, base_b + 2, base_b]].tolist() == [4, 0, 102, 100]
    assert view[PAGE // 8] == 0  # never mapped: zeros, not a fault
    rng.release(0, 40)  # reserved again (reads as zeros); b stays mapped
    assert view[base_b + 1] == 101 and view[4] == 0
    with pytest.raises(ValueError, match="page-aligned"):
        rng.map_file(100, str(a), 40)
    with pytest.raises(EOFError):
        rng.map_file(PAGE, str(a), 41)
    with pytest.raises(FileNotFoundError):
        rng.map_file(PAGE, str(tmp_path / "missing"), 8)


_LIMITED_READER = """
import resource, sys, warnings
import numpy as np
from replaystore.store import open_store
st = open_store(sys.argv[1], mode="r")
rows = st.row_ids()
want = np.load(sys.argv[2])
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = st.read(rows[::-1])["obs"]
assert np.array_equal(got, want[::-1]), "wrong rows"
assert any("contiguous views unavailable" in str(w.message) for w in caught), [str(w.message) for w in caught]
assert np.array_equal(st.read(rows)["obs"], want)  # and on, per fragment
print("ok")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc (Linux)")
def test_a_refused_address_space_falls_back_to_per_fragment_reads(tmp_path: Path) -> None:
    """Under ``ulimit -v`` the reserved ranges (about a GiB for these 16-KiB rows) are refused:
    the reader warns once and reads per fragment, with the same records."""
    url = str(tmp_path / "st")
    big = dqn(4096, 2, actions=9)
    rng = np.random.default_rng(3)
    st = open_store(url, big, mode="w")
    obs = []
    w = st.writer()
    for i in range(3):
        b = dqn_batch(rng, 40, observation_size=4096, extra=0)
        obs.append(b.obs)
        w.append(b, stream=i)
        w.commit()
    np.save(tmp_path / "obs.npy", np.concatenate(obs))
    # read while the writer is open, as a learner reads a live store (its segment keeps its reserved
    # size; a closed writer's under-filled segment is right-sized and needs no large ranges)
    out = subprocess.run([sys.executable, "-c", _LIMITED_READER, url, str(tmp_path / "obs.npy")],
                         capture_output=True, text=True, timeout=120, check=False)
    w.close()
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_positions_and_rows_of_any_shape(tmp_path: Path) -> None:
    """rows_at/locate check every entry of a 2-d array (one reduction over all of it), as for 1-d."""
    url = str(tmp_path / "st")
    st = open_store(url, DQN, mode="w")
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for _ in range(3):
            w.append(dqn_batch(rng, 7, extra=0), stream=0)
            w.commit()
    reader = open_store(url, mode="r").table("records").reader
    pos = np.arange(12).reshape(3, 4)
    rows = reader.rows_at(pos)
    np.testing.assert_array_equal(rows, reader.row_ids()[:12].reshape(3, 4))
    frag, local = reader.locate(rows)
    assert frag.shape == local.shape == (3, 4)
    for bad in ([[0, -1]], [[0, len(reader)]]):
        with pytest.raises(RowError):
            reader.rows_at(np.array(bad))
    with pytest.raises(RowError):
        reader.locate(np.array([[0, 1 << 41]]))
