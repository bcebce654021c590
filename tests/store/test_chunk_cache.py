"""The local chunk cache of stores on S3 (store/storage/cache.py): readers memory-map chunk objects
from a directory they share instead of holding them in memory; what it serves is the store's
bytes, also after a ``"w+"`` replace, a corrupt download or a damaged cache file; it keeps to its
budget. S3 is the real moto server on loopback; a denying proxy proves where bytes came from."""

from __future__ import annotations

import mmap
import os
import resource
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError, StaleReadError, StoreError
from replaystore.loaders import UniformSampler, make_loader
from replaystore.loaders.dataset import gather
from replaystore.schemas import dqn
from replaystore.store import ChunkCache, open_store
from replaystore.store.storage import FsspecStorage
from replaystore.store.storage import cache as chunkcache_module
from replaystore.tools.info import print_info
from support.batches import dqn_batch
from support.s3 import S3Server
from support.s3proxy import Faults, faulty_s3, options_via
from support.storecheck import assert_same, columns_of

DQN = dqn(16, 2, actions=9)
CHUNKS = "/c/0"  # every chunk object's key contains this (docs/FORMAT.md, "Fragments")


def _written(url: str, options: dict[str, Any], commits: int = 3, seed: int = 0) -> Any:
    """A store of ``commits`` fragments of 40 records on ``url``; the Columns it holds."""
    rng = np.random.default_rng(seed)
    batches = [dqn_batch(rng, 40, extra=0) for _ in range(commits)]
    st = open_store(url, DQN, mode="w+", storage_options=options, cache=False)
    with st.writer() as w:
        for b in batches:
            w.append(b, stream=0)
            w.commit()
    st.close()
    return columns_of(DQN, batches)


def _mapped(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory is a memory map (not bytes held by the process)."""
    while arr is not None and not isinstance(arr, mmap.mmap):
        arr = getattr(arr, "base", None)  # type: ignore[assignment]
    return isinstance(arr, mmap.mmap)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def gather_rows(want: Any, rows: np.ndarray) -> dict[str, np.ndarray]:
    """``want``'s records at positions ``rows`` (the store's row ids of one writer are 0..n-1)."""
    return want.take(rows).arrays


def test_a_second_reader_is_served_from_the_cache_and_maps_it(s3_server: S3Server, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = s3_server.url("cache-served")
    want = _written(url, s3_server.storage_options)
    cache = ChunkCache(tmp_path / "cache")
    first = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=cache)
    assert_same(first.read(first.default.row_ids()), want)
    files = _files(tmp_path / "cache")
    assert len(files) == 3 * len(DQN.zarr_layout())  # every array of the 3 fragments (read needs no index)
    info = first.info()["chunk_cache"]
    assert info == {"directory": str(next((tmp_path / "cache").iterdir())),
                    "bytes": sum(f.stat().st_size for f in files)}
    print_info(first, verbose=True)  # (the internals: where the chunk cache is)
    assert f"chunk cache     {info['directory']} (" in capsys.readouterr().out
    assert not [f for f in files if f.name.startswith(chunkcache_module.TMP)]
    faults = Faults(deny_reads=CHUNKS)
    with faulty_s3(s3_server.endpoint_url, faults) as endpoint:
        options = options_via(s3_server.storage_options, endpoint)
        second = open_store(url, mode="r", storage_options=options, cache=tmp_path / "cache")
        rows = second.default.row_ids()[::-1]
        got = second.read(rows)
        assert_same(got, gather_rows(want, rows))
        assert faults.denied == 0
        assert second.default.reader._layouts  # one gather per array over the 3 fragments' cached files
        frag = second.default.reader.fragments[0]
        assert _mapped(second.default.reader.data(frag).array("obs"))
        uncached = open_store(url, mode="r", storage_options=options, cache=False)
        with pytest.raises(PermissionError):  # the proxy would have refused every chunk download
            uncached.read(rows)
        assert faults.denied > 0


def test_a_replaced_store_at_the_same_url_is_not_served_the_old_bytes(s3_server: S3Server,
                                                                      tmp_path: Path) -> None:
    url = s3_server.url("cache-replaced")
    cache = ChunkCache(tmp_path / "cache")
    old = _written(url, s3_server.storage_options, seed=1)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=cache)
    assert_same(st.read(st.default.row_ids()), old)
    new = _written(url, s3_server.storage_options, seed=2)  # same object paths, other bytes
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=cache)
    assert_same(st.read(st.default.row_ids()), new)
    assert len(list((tmp_path / "cache").iterdir())) == 2  # one directory per store identity


def test_a_corrupt_download_raises_naming_the_object_and_is_not_kept(s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.url("cache-corrupt")
    _written(url, s3_server.storage_options)
    storage = FsspecStorage(url, s3_server.storage_options)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    frag = st.default.reader.fragments[1]
    path = f"{frag.path}/obs/c/0/0"
    data = bytearray(storage.read(path))
    data[7] ^= 0xFF
    storage.write(path, bytes(data))
    with pytest.raises(CorruptObjectError) as info:
        st.read(st.default.row_ids())
    assert info.value.path == path and "crc32c" in str(info.value)
    kept = [f.relative_to(next((tmp_path / "cache").iterdir())).as_posix() for f in _files(tmp_path / "cache")]
    assert path not in kept and not [k for k in kept if chunkcache_module.TMP in k]


def test_a_damaged_cache_file_is_downloaded_again(s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.url("cache-damaged")
    want = _written(url, s3_server.storage_options)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    assert_same(st.read(st.default.row_ids()), want)
    obs = [f for f in _files(tmp_path / "cache") if f.parent.parent.parent.name == "obs"]
    size = obs[0].stat().st_size
    with open(obs[0], "r+b") as f:  # a torn file (the cache never leaves one: fsync, then rename)
        f.truncate(size // 2)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    assert_same(st.read(st.default.row_ids()), want)
    assert obs[0].stat().st_size == size


def test_dataloader_workers_use_the_openers_cache(s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.url("cache-loader")
    _written(url, s3_server.storage_options)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    sampler = UniformSampler(st, batch_size=16, seed=3, num_batches=4)
    got = list(make_loader(st, sampler, num_workers=2))
    obs = [f for f in _files(tmp_path / "cache") if f.parent.parent.parent.name == "obs"]
    assert obs  # gathered by the workers (this process samples from the index arrays only) into its directory
    reference = UniformSampler(st, batch_size=16, seed=3, num_batches=4)
    for batch, request in zip(got, reference, strict=True):
        want = gather(st.default, request)
        for name, tensor in want.items():
            assert np.array_equal(batch[name].numpy(), tensor.numpy()), name


def test_the_cache_keeps_to_its_budget(s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.url("cache-budget")
    want = _written(url, s3_server.storage_options, commits=6)
    budget = 40_000  # about two fragments' arrays of the six
    cache = ChunkCache(tmp_path / "cache", max_bytes=budget)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=cache)
    rows = st.default.row_ids()
    for lo in range(0, len(rows), 40):  # fragment after fragment
        assert_same(st.read(rows[lo:lo + 40]), gather_rows(want, np.arange(lo, lo + 40)))
        assert cache.size() <= budget
    last = st.default.reader.fragments[-1].path
    kept = {f.relative_to(next((tmp_path / "cache").iterdir())).as_posix() for f in _files(tmp_path / "cache")}
    assert f"{last}/obs/c/0/0" in kept and not {k for k in kept if k.startswith(st.default.reader.fragments[0].path)}


def test_prune_deletes_least_recently_used_first_and_stale_temporary_files(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path, max_bytes=250)
    now = 1_800_000_000 * 10**9
    for i, name in enumerate(["a", "b", "c", "d"]):
        p = tmp_path / "s" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x" * 100)
        os.utime(p, ns=(now + i, now + i))
    stale, fresh = tmp_path / "s" / f"{chunkcache_module.TMP}1-x", tmp_path / "s" / f"{chunkcache_module.TMP}2-y"
    stale.write_bytes(b"y" * 10)
    os.utime(stale, ns=(0, 0))
    fresh.write_bytes(b"y" * 10)
    cache.prune(keep=str(tmp_path / "s" / "a"))  # the oldest, but just filled
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(["a", "d", fresh.name])


def test_a_cache_that_cannot_keep_objects_serves_from_memory_with_a_warning(s3_server: S3Server,
                                                                            tmp_path: Path) -> None:
    url = s3_server.url("cache-unwritable")
    want = _written(url, s3_server.storage_options)
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")  # the cache directory would have to be under a file
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=blocked / "cache")
    with pytest.warns(RuntimeWarning) as warned:
        got = st.read(st.default.row_ids())
    assert_same(got, want)
    _warned_fallbacks(warned)


def _warned_fallbacks(warned: Any) -> None:
    """The reader said it reads per fragment (no views over files it cannot keep), and holds in memory."""
    messages = [str(w.message) for w in warned]
    assert any("contiguous views unavailable" in m and "cannot keep" in m for m in messages), messages
    assert any("holding such objects in memory" in m for m in messages), messages


def test_cache_arguments(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cache"):
        open_store(str(tmp_path / "st"), DQN, mode="w", cache=3)  # type: ignore[arg-type]
    assert not (tmp_path / "st").exists()  # refused before anything was written
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StoreError, match="max_bytes"):
            ChunkCache(tmp_path, max_bytes=bad)  # type: ignore[arg-type]
    local = open_store(str(tmp_path / "st"), DQN, mode="w", cache=tmp_path / "cache")
    # local stores are read in place: not wrapped
    assert local.cache is None and not isinstance(local.storage, chunkcache_module.CachingStorage)
    memory = open_store("memory://cache-args", DQN, mode="w+")
    assert memory.cache is None  # memory:// only when asked
    memory = open_store("memory://cache-args", mode="r", cache=True)
    assert memory.cache is not None and memory.cache.directory == chunkcache_module.default_directory()
    # the cache wraps the backend: chunk reads are mapped from its files, the rest is the backend's
    assert isinstance(memory.storage, chunkcache_module.CachingStorage)
    assert isinstance(memory.storage.inner, FsspecStorage) and memory.storage.supports_memory_map
    assert not memory.storage.inner.supports_memory_map and memory.storage.url == "memory://cache-args"
    assert chunkcache_module.default_directory() == os.environ["REPLAYSTORE_CACHE_DIR"]  # this test session's


def test_a_full_disk_falls_back_to_memory_and_leaves_no_partial_file(tmp_path: Path) -> None:
    """A download the cache's disk cannot hold (``EFBIG`` past ``RLIMIT_FSIZE``, as on a full disk)."""
    url = "memory://cache-full-disk"
    want = _written(url, {})
    st = open_store(url, mode="r", cache=ChunkCache(tmp_path / "cache"))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, limit[1]))  # the obs chunks (40 x 16 x 4 B) exceed it
    try:
        with pytest.warns(RuntimeWarning) as warned:
            got = st.read(st.default.row_ids())
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert_same(got, want)
    _warned_fallbacks(warned)
    files = _files(tmp_path / "cache")
    assert files and all(f.stat().st_size <= 1000 for f in files)  # the small arrays were kept
    assert not [f for f in files if f.name.startswith(chunkcache_module.TMP)]
    assert not [f for f in files if f.parent.parent.parent.name == "obs"]


def test_a_read_downloads_only_the_fragments_it_touches(s3_server: S3Server, tmp_path: Path) -> None:
    """The views over cached files map a fragment when a read first needs it: a few rows of a
    large store on S3 do not download the store."""
    url = s3_server.url("cache-lazy")
    want = _written(url, s3_server.storage_options, commits=4)
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    reader = st.default.reader
    assert reader._layouts and len(reader.fragments) == 4

    def fragments_cached() -> set[str]:
        return {f.relative_to(next((tmp_path / "cache").iterdir())).parts[4] for f in _files(tmp_path / "cache")}

    rows = np.array([45, 41, 70])  # in the second fragment
    assert_same(st.read(rows), gather_rows(want, rows))
    assert fragments_cached() == {reader.fragments[1].name}
    rows = np.array([3, 150, 44])  # the first and the fourth, and the second again
    assert_same(st.read(rows), gather_rows(want, rows))
    assert fragments_cached() == {reader.fragments[i].name for i in (0, 1, 3)}


def _capped_writer(url: str, options: dict[str, Any]) -> Any:
    """A capacity-40 replay at ``url`` with one 40-record commit; ``commit(n)``: n more (each
    evicts the last), then the writer closes (reclaiming what was evicted)."""
    rng = np.random.default_rng(5)
    w = open_store(url, DQN, mode="w+", capacity=40, storage_options=options, cache=False).writer()
    w.append(dqn_batch(rng, 40, extra=0), stream=0)
    w.commit()

    def commit(n: int) -> None:
        for _ in range(n):
            w.append(dqn_batch(rng, 40, extra=0), stream=0)
            w.commit()
        w.close()

    return commit


def test_fragments_that_leave_the_store_are_pruned_first(s3_server: S3Server, tmp_path: Path) -> None:
    """A capped replay evicts; the reader that sees a fragment go marks its cached files least
    recently used, so the budget deletes them before the live ones."""
    url = s3_server.url("cache-departed")
    commit = _capped_writer(url, s3_server.storage_options)
    cache = ChunkCache(tmp_path / "cache")
    st = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=cache)
    first = st.default.reader.fragments[0]
    st.read(st.default.row_ids())
    commit(2)
    st.refresh()
    last = st.default.reader.fragments[-1]
    st.read(st.default.row_ids())
    root = next((tmp_path / "cache").iterdir())
    old, new = _files(root / first.path), _files(root / last.path)
    assert old and new and {f.stat().st_mtime_ns for f in old} == {0} and min(f.stat().st_mtime_ns for f in new) > 0
    cache.prune(target=sum(f.stat().st_size for f in new))
    assert _files(root) == new


def test_a_reader_that_missed_a_reclaim_gets_stale_read_error_and_leaves_no_file(s3_server: S3Server,
                                                                                 tmp_path: Path) -> None:
    """The download of an object reclaimed after the reader's view was taken: StaleReadError (the
    reader's cue to refresh), nothing kept in the cache; after a refresh the store reads."""
    url = s3_server.url("cache-stale")
    commit = _capped_writer(url, s3_server.storage_options)
    stale = open_store(url, mode="r", storage_options=s3_server.storage_options, cache=tmp_path / "cache")
    first = stale.default.reader.fragments[0]
    commit(4)
    assert not FsspecStorage(url, s3_server.storage_options).list(first.path)  # reclaimed
    with pytest.raises(StaleReadError, match="refresh"):
        stale.read(np.arange(5))
    assert not _files(tmp_path / "cache")
    stale.refresh()
    assert len(stale.read(stale.default.row_ids())["obs"]) == 40
