"""The shipped conformance suite (``replaystore.testing.StorageTests``) on the shipped backends:
local files, ``memory://``, S3 (a moto server on loopback), and a chunk-cache wrapper around S3."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from replaystore.store.storage import FsspecStorage, LocalStorage, Storage, open_storage
from replaystore.store.storage.cache import CachingStorage, ChunkCache
from replaystore.testing import StorageTests
from support.s3 import S3Server


class TestLocalStorage(StorageTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        st = open_storage(str(tmp_path / "root"))
        assert isinstance(st, LocalStorage)
        return st


class TestMemoryStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Iterator[Storage]:
        root = f"conformance-{uuid.uuid4().hex}"
        st = open_storage(f"memory://{root}")
        assert isinstance(st, FsspecStorage) and not st.remote
        yield st
        fs = fsspec.filesystem("memory")
        for path in [p for p in list(fs.store) if p.lstrip("/").startswith(root)]:
            fs.store.pop(path, None)
        for path in [p for p in list(fs.pseudo_dirs) if p.lstrip("/").startswith(root)]:
            fs.pseudo_dirs.remove(path)


class TestS3Storage(StorageTests):
    @pytest.fixture
    def storage(self, s3_server: S3Server) -> Iterator[Storage]:
        prefix = f"conformance-{uuid.uuid4().hex}"
        st = open_storage(s3_server.url(prefix), s3_server.storage_options)
        assert isinstance(st, FsspecStorage) and st.remote
        yield st
        s3_server.delete_prefix(s3_server.bucket, prefix)


class TestCachedS3Storage(StorageTests):
    """The chunk cache wraps a backend: the wrapper passes the suite as the backend does."""

    @pytest.fixture
    def storage(self, s3_server: S3Server, tmp_path: Path) -> Iterator[Storage]:
        prefix = f"conformance-{uuid.uuid4().hex}"
        inner = open_storage(s3_server.url(prefix), s3_server.storage_options)
        st = CachingStorage(inner, ChunkCache(tmp_path / "cache").for_store(inner.url, {}))
        assert st.remote and st.supports_memory_map and not st.supports_local_paths
        yield st
        s3_server.delete_prefix(s3_server.bucket, prefix)


def test_shipped_backends_declare_their_flags(tmp_path: Path) -> None:
    """What each shipped backend can do, as the store reads it (no probing)."""
    local, memory = open_storage(str(tmp_path)), open_storage("memory://flags")
    assert (local.supports_local_paths, local.supports_memory_map, local.supports_in_place_writes) == (True,) * 3
    assert (memory.supports_local_paths, memory.supports_memory_map, memory.supports_in_place_writes) == (False,) * 3
    for st in (local, memory):
        assert st.supports_atomic_create and st.supports_consistent_listing and not st.remote


def test_importing_replaystore_does_not_import_pytest() -> None:
    """pytest is the ``test`` extra: only ``replaystore.testing`` imports it."""
    import subprocess
    import sys

    code = ("import sys, replaystore, replaystore.store, replaystore.store.storage, replaystore.loaders\n"
            "assert 'pytest' not in sys.modules, 'pytest imported'\n"
            "import replaystore.testing\n"
            "assert 'pytest' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
