"""A backend is one class plus the conformance suite: a dict-backed ``Storage`` written here,
checked by subclassing ``replaystore.testing.StorageTests``, holds a store through ``open_store``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from replaystore.errors import StoreExistsError
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.storage import ObjectInfo, Storage, StorageError
from replaystore.testing import StorageTests


class DictStorage(Storage):
    """Objects in a dict (path -> (bytes, mtime_ns)), one lock for create-if-absent."""

    supports_atomic_create = True
    supports_consistent_listing = True

    def __init__(self, name: str = "dict") -> None:
        self.url = f"dict://{name}"
        self.objects: dict[str, tuple[bytes, int]] = {}
        self.lock = threading.Lock()

    def read(self, path: str) -> bytes:
        try:
            return self.objects[path][0]
        except KeyError:
            raise FileNotFoundError(path) from None

    def write(self, path: str, data: bytes | memoryview) -> None:
        with self.lock:
            self.objects[path] = (bytes(data), time.time_ns())

    def create(self, path: str, data: bytes) -> bool:
        with self.lock:
            if path in self.objects:
                return False
            self.objects[path] = (bytes(data), time.time_ns())
            return True

    def _under(self, prefix: str) -> list[str]:
        start = f"{prefix}/" if prefix else ""
        with self.lock:
            return [p for p in self.objects if p.startswith(start)]

    def exists(self, path: str) -> bool:
        return path in self.objects or self.is_dir(path)

    def is_dir(self, path: str) -> bool:
        return bool(self._under(path))

    def list(self, prefix: str) -> list[str]:
        start = len(prefix) + 1 if prefix else 0
        return sorted({p[start:].split("/", 1)[0] for p in self._under(prefix)} - {""})

    def delete(self, path: str) -> None:
        for p in [path, *self._under(path)]:
            with self.lock:
                self.objects.pop(p, None)

    def size(self, path: str) -> int:
        return len(self.read(path))

    def walk(self, prefix: str = "") -> list[ObjectInfo]:
        with self.lock:
            return sorted((ObjectInfo(p, len(d), t) for p, (d, t) in self.objects.items()
                           if not prefix or p.startswith(f"{prefix}/")), key=lambda o: o.path)


class TestDictStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Storage:
        return DictStorage()


class NoCreateStorage(DictStorage):
    supports_atomic_create = False


def _batch(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.random((n, 3), dtype=np.float32), "action": rng.integers(0, 4, n),
            "reward": rng.random(n, dtype=np.float32), "next_obs": rng.random((n, 3), dtype=np.float32),
            "terminated": rng.random(n) < 0.2}


def test_a_store_on_a_custom_backend_writes_reads_and_reopens() -> None:
    storage = DictStorage("store")
    st = open_store(storage, transitions(obs_shape=3), mode="x", capacity=50)
    assert st.storage is storage and st.url == "dict://store"
    batches = [_batch(n, i) for i, n in enumerate((20, 25, 30))]
    for b in batches:
        with st.writer() as w:
            w.append(b, stream="actor")
    assert len(st) == 50  # the capacity keeps the newest 50 of 75
    assert any(p.startswith("writers/") for p in storage.objects)  # the store's objects are in the dict
    st.close()
    again = open_store(storage, mode="r")
    assert len(again) == 50 and again.streams() == ["actor"]
    rows = np.concatenate([b.column("row").to_numpy() for b in again.table("records").scan(columns=["row"])])
    got = again.read(rows)
    for k in batches[0]:
        np.testing.assert_array_equal(got[k], np.concatenate([b[k] for b in batches])[-50:])
    again.close()
    with pytest.raises(StoreExistsError):
        open_store(storage, transitions(obs_shape=3), mode="x")


def test_open_store_refuses_a_backend_without_the_guarantees_the_format_needs() -> None:
    storage = NoCreateStorage()
    with pytest.raises(StorageError, match="supports_atomic_create"):
        open_store(storage, transitions(obs_shape=3), mode="w")
    assert storage.objects == {}  # refused before anything was written
