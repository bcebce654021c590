"""A reader that follows the log sees exactly what a reader opened afresh sees.

``TableReader.sync`` moves its per-fragment state by what changed between two views of the
live fragments (the longest common prefix and suffix of fragments that are the same objects,
visible from the same row, are kept), ``CommitLog.fragments``
splices in the fragments of the writers it applied, and ``CommitLog.refresh`` lists
``writers/`` only when a directory came or went there (local filesystems that count
subdirectories). Random histories exercise all three: three long-lived writers appending DQN
records (ragged legal ids) to shared int and str streams, committing, compacting and being
replaced by a new writer (a new number: its fragments come after every other's), and short
sessions (a writer, one commit, close) made between them, so that older writers' changes land
in the middle of the fragment list; with and without a capacity; on local disk, and on
``memory://`` read through a chunk cache (object storage's lazy layouts: a fragment is mapped
when a read first touches it, so the reader reads a random part of the rows before all of
them). Eviction's order is checked on its own in test_retention.py.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.schemas import dqn
from replaystore.store import Store, open_store
from replaystore.store.read import table as table_module
from replaystore.store.read.table import TableReader
from replaystore.store.storage import LocalStorage
from replaystore.store.storage.cache import ChunkCache
from support.batches import dqn_batch
from support.indexops import fresh_at
from support.storecheck import assert_same, snapshot

SCHEMA = dqn(16, 2, actions=9)
KEYS = [0, 1, "a"]
_counter = itertools.count()

OP = hs.one_of(
    hs.tuples(hs.just("append"), hs.integers(0, 2), hs.sampled_from(KEYS), hs.integers(1, 30)),
    # append + commit, twice as likely as the rest: most ops then change what a reader sees
    hs.tuples(hs.just("write"), hs.integers(0, 2), hs.sampled_from(KEYS), hs.integers(1, 30)),
    hs.tuples(hs.just("write"), hs.integers(0, 2), hs.sampled_from(KEYS), hs.integers(1, 30)),
    hs.tuples(hs.just("commit"), hs.integers(0, 2)),
    hs.tuples(hs.just("compact"), hs.integers(0, 2)),
    hs.tuples(hs.just("replace"), hs.integers(0, 2)),
    hs.tuples(hs.just("session"), hs.integers(1, 12)),
)
# each op with whether the reader looks after it: changes pile up between looks, in several places
OPS = hs.lists(hs.tuples(OP, hs.booleans()), min_size=1, max_size=40)

STATE = ("visible_from", "first_ids", "ends", "cum", "_edges", "_base", "_cum_ends", "_shown", "_live_from")


@pytest.fixture(scope="session")
def new_place(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[str, ChunkCache | None]]:
    """A fresh store URL on ``kind`` ("local" or "memory") and the chunk cache its reader uses."""
    base = tmp_path_factory.mktemp("follow")

    def place(kind: str) -> tuple[str, ChunkCache | None]:
        n = next(_counter)
        if kind == "local":
            return str(base / f"st{n}"), None
        return f"memory://follow-{uuid.uuid4().hex}", ChunkCache(base / f"cache{n}")

    return place


def _drop(url: str) -> None:
    """Keep the process-global memory filesystem small."""
    if url.startswith("memory://"):
        fs = fsspec.filesystem("memory")
        fs.rm(url, recursive=True)


def _same_state(got: TableReader, want: TableReader) -> None:
    def names(frags: list[Any]) -> list[tuple[int, str, int]]:
        return [(f.writer, f.name, f.rows) for f in frags]

    assert names(got.fragments) == names(want.fragments)
    assert names(got.all_fragments) == names(want.all_fragments)
    gv, wv = got.view, want.view
    for attr in STATE:
        assert np.array_equal(getattr(gv, attr), getattr(wv, attr)), attr
    assert gv._run_start == wv._run_start
    assert gv._nnz.keys() == wv._nnz.keys()
    for off in gv._nnz:
        assert np.array_equal(gv._nnz[off], wv._nnz[off]), off
    assert gv._max_nnz == wv._max_nnz


def _check(reader: Store, url: str, rng: np.random.Generator) -> None:
    fresh = fresh_at(url, reader)
    got, want = reader.default.reader, fresh.default.reader
    _same_state(got, want)
    assert snapshot(reader) == snapshot(fresh)
    ids = reader.default.row_ids()
    per_fragment = TableReader(got.storage, got.log, got.name, got.schema, got.capacity, contiguous=False)
    some = rng.permutation(ids)[:len(ids) // 2]  # lazy layouts: some fragments mapped, some not, before all
    assert_same(reader.default.read(some), per_fragment.read(some))
    assert_same(reader.default.read(ids), per_fragment.read(ids))
    assert np.array_equal(reader.default.rows_at(np.arange(len(ids))), ids)


@pytest.mark.parametrize("kind,always_follow", [("local", False), ("local", True), ("memory", True)])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=OPS, capacity=hs.one_of(hs.none(), hs.integers(20, 120)))
def test_followed_reader_equals_a_fresh_one(new_place: Callable[[str], tuple[str, ChunkCache | None]], kind: str,
                                            always_follow: bool, plan: list[tuple[Any, bool]],
                                            capacity: int | None) -> None:
    """``always_follow``: the reader follows every change however large (it otherwise redoes
    its view where more than max(8, a quarter of the fragments) changed)."""
    saved = table_module._FOLLOW_MIN, table_module._REDO_UP_TO
    # the histories here stay under _REDO_UP_TO fragments: the reader follows them all the same
    table_module._FOLLOW_MIN, table_module._REDO_UP_TO = (1 << 30 if always_follow else saved[0]), -1
    url, cache = new_place(kind)
    try:
        _run(url, cache, plan, capacity)
    finally:
        table_module._FOLLOW_MIN, table_module._REDO_UP_TO = saved
        _drop(url)


def _run(url: str, cache: ChunkCache | None, plan: list[tuple[Any, bool]], capacity: int | None) -> None:
    st = open_store(url, SCHEMA, mode="w", capacity=capacity)
    reader = open_store(url, mode="r", cache=cache)
    assert (reader.default.reader._unmapped is not None) is (cache is not None)  # lazy layouts where cached
    rng = np.random.default_rng(len(plan))
    writers = [st.writer() for _ in range(3)]
    sessions = 0
    try:
        for op, look in plan:
            if op[0] in ("append", "write"):
                writers[op[1]].append(dqn_batch(rng, op[3], extra=0), stream=op[2])
                if op[0] == "append":
                    continue
                writers[op[1]].commit()
            if op[0] == "commit" and writers[op[1]].commit() is None:
                continue
            if op[0] == "compact" and not writers[op[1]].compact():
                continue
            if op[0] == "replace":
                writers[op[1]].close()
                writers[op[1]] = st.writer()
            if op[0] == "session":
                sessions += 1
                with st.writer() as w:
                    w.append(dqn_batch(rng, op[1], extra=0), stream=f"session-{sessions}")
            if look:
                _check(reader, url, rng)
    finally:
        for w in writers:
            w.close()
    _check(reader, url, rng)


def test_two_collectors_with_sessions_between_them_are_followed(tmp_path: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two long-lived collectors (the first and the last writer) with 30 closed sessions between
    them both commit before the learner refreshes: the two changes, at both ends of the list,
    are followed without redoing the view, and the view is a fresh reader's."""
    url = str(tmp_path / "st")
    st = open_store(url, SCHEMA, mode="w")
    rng = np.random.default_rng(0)
    first = st.writer()
    first.append(dqn_batch(rng, 5, extra=0), stream="first")
    first.commit()
    for i in range(30):
        with st.writer() as w:
            w.append(dqn_batch(rng, 3, extra=0), stream=f"session-{i}")
    last = st.writer()
    reader = open_store(url, mode="r")
    followed = reader.default.reader
    monkeypatch.setattr(table_module, "_REDO_UP_TO", 8)  # fewer fragments here than the default
    redone = []
    monkeypatch.setattr(TableReader, "_fresh", lambda self, *a: redone.append(self is followed) or _SYNC_ALL(self, *a))
    try:
        for _ in range(5):
            for w, key in ((first, "first"), (last, "last")):
                w.append(dqn_batch(rng, 7, extra=0), stream=key)
                w.commit()
            assert reader.refresh()
            _check(reader, url, rng)
    finally:
        first.close()
        last.close()
    assert not any(redone)


_SYNC_ALL = TableReader._fresh


def test_the_writers_listing_is_skipped_only_while_no_directory_came(tmp_path: Any) -> None:
    """The subdirectory count of ``writers/`` stands for its listing where the filesystem keeps it
    (here: the test's temporary directory); a new writer's directory always shows."""
    storage = LocalStorage(str(tmp_path))
    os.makedirs(tmp_path / "writers" / "000000")
    names, token = storage.list_changed("writers", None)
    assert names == ["000000"]
    if token is None:
        pytest.fail(f"{tmp_path} does not count subdirectories in its link count; the test needs one that does")
    assert storage.list_changed("writers", token) == (None, token)
    (tmp_path / "writers" / "note").write_text("a file is not a writer")  # files are not tracked
    assert storage.list_changed("writers", token) == (None, token)
    os.makedirs(tmp_path / "writers" / "000001")
    names, token2 = storage.list_changed("writers", token)
    assert names == ["000000", "000001", "note"] and token2 != token
    assert storage.list_changed("writers", token2) == (None, token2)


def test_a_reader_sees_a_writer_registered_after_its_last_listing(tmp_path: Any) -> None:
    url = str(tmp_path / "st")
    st = open_store(url, SCHEMA, mode="w")
    reader = open_store(url, mode="r")
    rng = np.random.default_rng(0)
    for i in range(3):
        assert reader.refresh() is (i > 0)
        assert reader.refresh() is False  # nothing new: the listing is skipped
        with st.writer() as w:
            w.append(dqn_batch(rng, 5, extra=0), stream=i)
    assert reader.refresh()
    assert len(reader) == 15 and sorted(reader.streams()) == [0, 1, 2]
