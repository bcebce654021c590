"""Storage without a trustworthy create-if-absent is refused (docs/FORMAT.md, "Object storage").

- fsspec filesystems other than s3 and memory: ``StorageError`` at open, in every mode,
  before anything is written;
- an S3-API endpoint that ignores ``If-None-Match: *`` (a loopback server forwarding to the
  moto server with that header removed, see support.s3proxy): refused at the first
  create-if-absent (creating a store, registering a writer, saving state, ``w+``), with
  nothing created; reading through it still works.
"""

from __future__ import annotations

import gc
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.store import open_store
from replaystore.store.storage import StorageError, open_storage
from replaystore.store.store import MODES  # every mode, the zarr/h5py spellings included
from support.procs import crash_batch, schema, stream_batch
from support.s3 import S3Server
from support.s3proxy import options_via, unconditional_s3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["local://", "dir::memory://", "simplecache::memory://"])
def test_fsspec_without_create_if_absent_is_refused_at_open(tmp_path: Path, kind: str, mode: str) -> None:
    target = tmp_path / "store"
    url = f"local://{target}" if kind == "local://" else f"{kind}rs-{uuid.uuid4().hex}/store"
    with pytest.raises(StorageError, match="no known create-if-absent primitive.*refuses it rather than risk lost"):
        open_store(url, schema(), mode=mode)
    assert not target.exists() and list(tmp_path.iterdir()) == []  # nothing was created (nor deleted)


def test_local_url_through_file_scheme_is_accepted(tmp_path: Path) -> None:
    """The same directory via ``file://`` (link(2)-based create-if-absent) works."""
    st = open_store(f"file://{tmp_path / 'store'}", schema(), mode="w")
    with st.writer() as w:
        w.append(crash_batch(1, "f", 0, 4), stream="s")
    assert len(open_store(str(tmp_path / "store"), mode="r")) == len(crash_batch(1, "f", 0, 4)["rewards"])


@pytest.fixture
def bad_endpoint(s3_server: S3Server) -> Iterator[dict[str, Any]]:
    """storage_options reaching the moto server through an endpoint that ignores conditional writes."""
    with unconditional_s3(s3_server.endpoint_url) as endpoint:
        yield options_via(s3_server.storage_options, endpoint)


def keys(server: S3Server, prefix: str) -> list[str]:
    out = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix + "/")
    return sorted(o["Key"] for o in out.get("Contents", []))


def test_the_unconditional_endpoint_really_overwrites(s3_server: S3Server, bad_endpoint: dict[str, Any]) -> None:
    """The hazard the probe guards against: through this endpoint a second create succeeds."""
    prefix = f"raw-{uuid.uuid4().hex}"
    direct = open_storage(s3_server.url(prefix), s3_server.storage_options)
    assert direct.create("x.json", b"1") and not direct.create("x.json", b"2")
    bad = open_storage(s3_server.url(prefix), bad_endpoint)
    assert bad._conditional_put(bad._p("y.json"), b"1") and bad._conditional_put(bad._p("y.json"), b"2")
    assert direct.read("y.json") == b"2" and direct.read("x.json") == b"1"


def test_s3_endpoint_ignoring_if_none_match_is_refused(s3_server: S3Server, bad_endpoint: dict[str, Any]) -> None:
    prefix = f"noconditional-{uuid.uuid4().hex}"
    url = s3_server.url(prefix)
    refusal = "ignores conditional writes.*refuses it rather than risk lost commits"

    # creating a store through it: refused, nothing created (the probe is gone too)
    for mode in ("a", "w"):
        with pytest.raises(StorageError, match=refusal):
            open_store(url, schema(), mode=mode, storage_options=bad_endpoint)
        assert keys(s3_server, prefix) == []

    # a store created through a conforming endpoint, with one committed batch
    st = open_store(url, schema(), mode="w", storage_options=s3_server.storage_options)
    with st.writer() as w:
        w.append(stream_batch(3, 0, 0, 0), stream="good")
    before = keys(s3_server, prefix)

    # through the bad endpoint: reading works (readers never create) ...
    for mode in ("r", "a"):
        reader = open_store(url, mode=mode, storage_options=bad_endpoint)
        assert len(reader) == len(stream_batch(3, 0, 0, 0)["rewards"])
        assert np.array_equal(reader.read(reader.row_ids())["obs"], stream_batch(3, 0, 0, 0)["obs"])
    # ... registering a writer, saving state and replacing the store are refused, creating nothing
    with pytest.raises(StorageError, match=refusal):
        reader.writer()
    with pytest.raises(StorageError, match=refusal):
        reader.save_state("sampler", {"k": 1})
    with pytest.raises(StorageError, match=refusal):
        open_store(url, schema(), mode="w+", storage_options=bad_endpoint)
    assert keys(s3_server, prefix) == before  # w+ refused before deleting anything

    # the conforming endpoint still writes (the refusal is per endpoint, and stays in force)
    w = open_store(url, mode="a", storage_options=s3_server.storage_options).writer()
    assert w.id == 1
    w.close()
    with pytest.raises(StorageError, match=refusal):
        open_store(url, mode="a", storage_options=bad_endpoint).writer()


class _Finalized:
    """Cyclic garbage whose finalizer yields the GIL, as real finalizers (files, sockets) may."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def test_memory_storage_is_safe_from_many_threads() -> None:
    """fsspec's ``memory://`` walks one process-wide dict of every file (``rm``, ``find``, ``ls``);
    a collection running a finalizer in the middle of a walk lets another thread add or remove a
    file, and the walk fails with "dictionary changed size". A writer deletes reclaimed
    fragments on I/O threads while its caller appends, so every call is serialized."""
    storage = open_storage(f"memory://rs-threads-{uuid.uuid4().hex}")
    for i in range(2000):  # a full dict: long walks (a test session's memory:// holds thousands)
        storage.write(f"full/{i}", b"z")
    errors: list[BaseException] = []

    def churn(k: int) -> None:
        try:
            for i in range(100):
                _Finalized()
                storage.write(f"d{k}/{i}/a", b"x")
                storage.write(f"d{k}/{i}/b", b"y")
                storage.delete(f"d{k}/{i}")
                assert storage.list(f"d{k}") == []
        except BaseException as exc:
            errors.append(exc)

    threshold = gc.get_threshold()
    gc.set_threshold(50, 5, 5)  # collections often, so some land inside a walk
    try:
        threads = [threading.Thread(target=churn, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*threshold)
        storage.delete("")
    assert errors == []


def _use_memory_storage(url: str) -> None:
    storage = open_storage(url)
    storage.write("child/a", b"from the child")
    assert storage.read("parent/a") == b"from the parent" and storage.list("child") == ["a"]


def test_a_child_forked_while_a_thread_is_inside_a_memory_call_can_use_memory_storage() -> None:
    """The lock of ``memory://`` calls is made anew in a forked child (a DataLoader worker): a
    parent thread inside a call at the fork must not leave the child's copy held forever."""
    import multiprocessing

    from replaystore.store.storage import objects as storage_module

    url = f"memory://rs-fork-{uuid.uuid4().hex}"
    open_storage(url).write("parent/a", b"from the parent")
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:  # a thread in the middle of a memory:// call
        with storage_module._MEMORY_LOCK:
            inside.set()
            leave.wait()
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        child = multiprocessing.get_context("fork").Process(target=_use_memory_storage, args=(url,))
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode == 0
    finally:
        leave.set()
        holder.join()
    open_storage(url).delete("")
