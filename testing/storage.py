"""The storage conformance suite (:class:`StorageTests`)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.storage import ObjectInfo, ObjectStream, Storage, StorageError

FLAGS = ("remote", "supports_atomic_create", "supports_consistent_listing", "supports_local_paths",
         "supports_memory_map", "supports_in_place_writes")
"""The flags a backend declares (``Storage``'s class attributes)."""


class StorageTests:
    """The conformance suite of a :class:`~replaystore.store.storage.Storage` backend.

    Subclass it in a test module under a name pytest collects (``TestMyStorage``) and
    define a ``storage`` fixture that returns a fresh, empty backend (a root no other
    test uses) and removes what it holds afterwards if it must. Each test checks one
    method of the protocol as the format relies on it (docs/FORMAT.md, "Storage
    guarantees"): whole-object reads and writes, create-if-absent (raced by threads),
    listings that see every write and delete, recursive deletes, sizes, batched reads,
    streams, arrays, errors for absent objects, and, where the flags declare them,
    local files and in-place writes. :meth:`test_store_round_trip` then holds a store
    on the backend (``open_store`` on the instance). A backend that passes can hold a
    store.

    Examples
    --------
    >>> import pytest
    >>> from replaystore.testing import StorageTests
    >>> class TestMyStorage(StorageTests):
    ...     @pytest.fixture
    ...     def storage(self, tmp_path):
    ...         return MyStorage(tmp_path / "root")  # doctest: +SKIP
    """

    @pytest.fixture
    def storage(self) -> Storage:
        """A fresh, empty backend: subclasses define this fixture.

        Returns
        -------
        Storage
            The backend under test.
        """
        raise NotImplementedError("subclass StorageTests and define a `storage` fixture returning a fresh backend")

    # -- flags --------------------------------------------------------------------------------
    def test_flags_are_declared(self, storage: Storage) -> None:
        """Every capability flag is a bool, and the two the format needs are set."""
        for flag in FLAGS:
            assert isinstance(getattr(storage, flag), bool), flag
        assert storage.supports_atomic_create and storage.supports_consistent_listing
        assert not storage.supports_local_paths or storage.supports_memory_map  # local files map
        assert isinstance(storage.url, str) and storage.url

    # -- whole objects ------------------------------------------------------------------------
    def test_write_then_read(self, storage: Storage) -> None:
        """A written object reads back whole; a second write replaces it; memoryviews are taken."""
        storage.write("a/b/obj", b"hello")
        assert storage.read("a/b/obj") == b"hello"
        storage.write("a/b/obj", memoryview(b"replaced, longer"))
        assert storage.read("a/b/obj") == b"replaced, longer"
        storage.write("empty", b"")
        assert storage.read("empty") == b"" and storage.size("empty") == 0

    def test_absent_objects_raise_file_not_found(self, storage: Storage, tmp_path: os.PathLike[str]) -> None:
        """Reading, sizing or downloading an absent object raises FileNotFoundError."""
        storage.write("present", b"x")
        for call in (lambda: storage.read("absent"), lambda: storage.size("absent"),
                     lambda: storage.read_capped("absent", 10), lambda: storage.read("a/absent/obj"),
                     lambda: storage.download("absent", os.path.join(tmp_path, "got"))):
            with pytest.raises(FileNotFoundError):
                call()

    def test_read_capped(self, storage: Storage) -> None:
        """An object within the limit reads whole; a larger one is refused as corrupt."""
        storage.write("doc", b"0123456789")
        assert storage.read_capped("doc", 10) == b"0123456789"
        with pytest.raises(CorruptObjectError):
            storage.read_capped("doc", 9)

    def test_download(self, storage: Storage, tmp_path: os.PathLike[str]) -> None:
        """``download`` writes the object's bytes to a local file."""
        data = bytes(range(256)) * 40
        storage.write("big", data)
        local = os.path.join(tmp_path, "downloaded")
        storage.download("big", local)
        with open(local, "rb") as f:
            assert f.read() == data

    def test_read_many_and_sizes(self, storage: Storage) -> None:
        """Batched reads and sizes answer in order, None where absent."""
        storage.write("x/1", b"one")
        storage.write("x/2", b"three")
        assert storage.read_many(["x/1", "x/absent", "x/2"]) == [b"one", None, b"three"]
        assert storage.sizes(["x/2", "nope", "x/1"]) == [5, None, 3]
        assert storage.read_many([]) == [] and storage.sizes([]) == []

    # -- create-if-absent ---------------------------------------------------------------------
    def test_create_if_absent(self, storage: Storage) -> None:
        """``create`` writes only where nothing is, and says which."""
        assert storage.create("log/000001", b"first")
        assert not storage.create("log/000001", b"second")
        assert storage.read("log/000001") == b"first"
        storage.check_create()  # a backend that passes honours it

    def test_create_races_have_one_winner(self, storage: Storage) -> None:
        """Threads creating the same path at once: exactly one succeeds, and its bytes stay."""
        if not storage.supports_atomic_create:
            pytest.skip("the backend declares no atomic create-if-absent")
        start = threading.Barrier(8)

        def create(i: int) -> bool:
            start.wait()
            return storage.create("race", f"writer {i}".encode())

        with ThreadPoolExecutor(8) as pool:
            won = list(pool.map(create, range(8)))
        assert sum(won) == 1, won
        assert storage.read("race") == f"writer {won.index(True)}".encode()

    # -- listings -----------------------------------------------------------------------------
    def test_exists_and_is_dir(self, storage: Storage) -> None:
        """Objects and the prefixes above them exist; only prefixes are directories."""
        storage.write("p/q/obj", b"1")
        assert storage.exists("p/q/obj") and storage.exists("p/q") and storage.exists("p")
        assert not storage.exists("p/q/other") and not storage.exists("nothing")
        assert storage.is_dir("p") and storage.is_dir("p/q")
        assert not storage.is_dir("p/q/obj") and not storage.is_dir("nothing")

    def test_list(self, storage: Storage) -> None:
        """Names directly under a prefix, sorted; empty for an absent prefix."""
        assert storage.list("") == [] or storage.list("") is not None
        for path in ("d/b", "d/a", "d/sub/c", "top"):
            storage.write(path, b"x")
        assert storage.list("d") == ["a", "b", "sub"]
        assert storage.list("d/sub") == ["c"]
        assert {"d", "top"} <= set(storage.list(""))
        assert storage.list("absent") == []
        names, token = storage.list_changed("d", None)
        assert names == ["a", "b", "sub"]
        storage.write("d/new/x", b"x")
        names, _ = storage.list_changed("d", token)
        assert names is not None and "new" in names  # a directory came: never reported unchanged

    def test_listings_see_every_write_and_delete(self, storage: Storage) -> None:
        """Read-after-write: a listing right after a write or delete shows it."""
        if not storage.supports_consistent_listing:
            pytest.skip("the backend declares no consistent listings")
        for i in range(5):
            storage.write(f"w/{i:03d}", b"x")
            assert storage.list("w") == [f"{j:03d}" for j in range(i + 1)]
        storage.delete("w/002")
        assert "002" not in storage.list("w") and not storage.exists("w/002")

    # -- deletes ------------------------------------------------------------------------------
    def test_delete(self, storage: Storage) -> None:
        """An object, or a prefix recursively; absent paths are ignored."""
        for path in ("k/a", "k/sub/b", "k/sub/deeper/c", "keep"):
            storage.write(path, b"x")
        storage.delete("k/a")
        assert not storage.exists("k/a") and storage.exists("k/sub/b")
        storage.delete("k/sub")
        assert not storage.exists("k/sub/b") and not storage.exists("k/sub/deeper/c")
        storage.delete("k/never")
        storage.delete("never/at/all")
        storage.write("m/1", b"1")
        storage.write("m/2", b"2")
        storage.delete_objects(["m/1", "m/absent", "m/2"])
        assert storage.read_many(["m/1", "m/2"]) == [None, None]
        assert storage.read("keep") == b"x"

    # -- sizes --------------------------------------------------------------------------------
    def test_sizes(self, storage: Storage) -> None:
        """``size`` per object; ``total_size`` and ``apparent_size`` cover a prefix recursively."""
        storage.write("s/a", b"x" * 100)
        storage.write("s/sub/b", b"y" * 28)
        assert storage.size("s/a") == 100 and storage.size("s/sub/b") == 28
        assert storage.apparent_size("s") >= 128 and storage.total_size("s") > 0
        assert storage.total_size("s/sub") <= storage.total_size("s")
        if not storage.supports_local_paths:  # (files count blocks and directory entries too)
            assert storage.total_size("s") == storage.apparent_size("s") == 128

    def test_walk(self, storage: Storage) -> None:
        """Every object under a prefix with its size and time, sorted by path."""
        storage.write("t/b", b"12")
        storage.write("t/a/c", b"123")
        storage.write("u", b"1")
        infos = storage.walk("t")
        assert [(i.path, i.size) for i in infos] == [("t/a/c", 3), ("t/b", 2)]
        assert all(isinstance(i, ObjectInfo) and i.mtime_ns > 0 for i in infos)
        assert [i.path for i in storage.walk()] == ["t/a/c", "t/b", "u"]

    # -- streams, batched writes, arrays ------------------------------------------------------
    def test_streams_and_write_objects(self, storage: Storage) -> None:
        """A stream takes pieces and truncations; ``write_objects`` concatenates buffers and completes streams."""
        stream = storage.open_stream("o/streamed")
        assert isinstance(stream, ObjectStream) and stream.path == "o/streamed"
        buf = bytearray(b"abc")
        stream.write([bytes(buf), memoryview(b"defg")])
        buf[:] = b"zzz"  # the caller may reuse its buffers
        stream.write([np.arange(4, dtype=np.uint8)])
        assert stream.size == 11
        stream.truncate(9)
        assert stream.size == 9
        array = np.arange(6, dtype=np.int32)
        storage.write_objects({"o/joined": [b"head", memoryview(b"-"), array.view(np.uint8)], "o/one": [b"1"]},
                              [stream])
        stream.close()
        assert storage.read("o/joined") == b"head-" + array.tobytes()
        assert storage.read("o/one") == b"1"
        assert storage.read("o/streamed") == b"abcdefg" + bytes([0, 1])
        storage.sync_dirs(["o/one"])

    def test_read_array(self, storage: Storage) -> None:
        """Items from a byte offset as an array; none asked, zeros of the shape; too few, ValueError."""
        values = np.arange(20, dtype=np.float64)
        storage.write("arr", b"\0" * 8 + values.tobytes())
        got = storage.read_array("arr", np.dtype(np.float64), (4, 5), offset=8)
        np.testing.assert_array_equal(got, values.reshape(4, 5))
        assert storage.read_array("arr", np.dtype(np.int64), (0, 3)).shape == (0, 3)
        with pytest.raises(ValueError):
            storage.read_array("arr", np.dtype(np.float64), (30,))
        with pytest.raises(FileNotFoundError):
            storage.read_array("absent", np.dtype(np.float64), (2,))

    # -- what the flags declare ---------------------------------------------------------------
    def test_local_files(self, storage: Storage) -> None:
        """``supports_local_paths``: each object is a file; otherwise neither path nor descriptor."""
        storage.write("f/obj", b"on disk")
        path, fd = storage.local_path("f/obj"), storage.open_local("f/obj")
        if not storage.supports_local_paths:
            assert path is None and fd is None
            return
        assert path is not None and fd is not None
        with open(path, "rb") as f:
            assert f.read() == b"on disk"
        with open(fd, "rb", closefd=True) as f:
            assert f.read() == b"on disk"
        with pytest.raises(FileNotFoundError):
            storage.open_local("f/absent")

    def test_in_place_writes(self, storage: Storage) -> None:
        """``supports_in_place_writes``: preallocated files written through descriptors, then a create after them."""
        if not storage.supports_in_place_writes:
            with pytest.raises(NotImplementedError):
                storage.create_sized({"seg/a": 8})
            return
        fds = storage.create_sized({"seg/a": 8, "seg/b": 4})
        try:
            with pytest.raises(FileExistsError):
                storage.create_sized({"seg/a": 8})
            os.pwrite(fds["seg/a"], b"abcd", 2)
            storage.write_objects({}, created=fds)
            checked: list[bool] = []
            assert storage.create_after("seg/record", b"r", list(fds.values()), lambda: checked.append(True))
            assert checked == [True]
            assert not storage.create_after("seg/record", b"other", [])
        finally:
            for fd in fds.values():
                os.close(fd)
        assert storage.read("seg/a") == b"\0\0abcd\0\0" and storage.read("seg/b") == b"\0" * 4
        assert storage.read("seg/record") == b"r"

    # -- a store on it ------------------------------------------------------------------------
    def test_store_round_trip(self, storage: Storage) -> None:
        """``open_store`` on the backend: create, append, commit, read back, reopen and read again."""
        schema = transitions(obs_shape=2)
        rng = np.random.default_rng(7)
        batch: dict[str, np.ndarray] = {"obs": rng.random((5, 2), dtype=np.float32), "action": np.arange(5),
                 "reward": rng.random(5, dtype=np.float32), "next_obs": rng.random((5, 2), dtype=np.float32),
                 "terminated": np.array([False, False, True, False, True])}
        st = open_store(storage, schema, mode="x")
        assert st.url == storage.url
        with st.writer() as w:
            w.append(batch, stream="s0")
        with st.writer() as w:
            w.append({k: v[:2] for k, v in batch.items()}, stream="s1")
        assert len(st) == 7
        got = st.read(np.arange(5))
        for name, want in batch.items():
            np.testing.assert_array_equal(got[name], want)
        st.close()
        again = open_store(storage, mode="r")
        assert len(again) == 7 and again.streams() == ["s0", "s1"]
        reread = again.read(np.arange(5))
        for name, want in batch.items():
            np.testing.assert_array_equal(reread[name], want)
        again.close()
        with pytest.raises(StorageError):  # options belong to the backend itself
            open_store(storage, mode="r", storage_options={"anon": True})
