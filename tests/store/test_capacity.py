"""Capacity: a replay keeps the newest N records across writers, reports the gaps eviction
leaves, refuses reads of evicted rows and reclaims their storage. Runs on every backend."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from replaystore.errors import RowError, StaleReadError
from replaystore.schemas import Dense, Ragged, Schema
from replaystore.store import Store
from replaystore.store.format import layout
from replaystore.store.write.writer import Writer
from support.storecheck import Backend

# one unique id per record, a realistic observation and a ragged field
SCHEMA = Schema("replay", [Dense("uid", np.int64), Dense("obs", np.float32, (64,)),
                           Ragged("ids", np.int64, "offsets")])


class Source:
    """Records with consecutive uids; remembers each record's content for checking."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.next_uid = 0
        self.obs: dict[int, bytes] = {}
        self.ids: dict[int, list[int]] = {}

    def batch(self, n: int) -> dict[str, np.ndarray]:
        uid = np.arange(self.next_uid, self.next_uid + n, dtype=np.int64)
        self.next_uid += n
        obs = self.rng.standard_normal((n, 64), dtype=np.float32)
        counts = self.rng.integers(0, 4, n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ids = self.rng.integers(0, 100, int(offsets[-1])).astype(np.int64)
        for i, u in enumerate(uid.tolist()):
            self.obs[u] = obs[i].tobytes()
            self.ids[u] = ids[offsets[i]:offsets[i + 1]].tolist()
        return {"uid": uid, "obs": obs, "ids": ids, "offsets": offsets}

    def check(self, st: Store) -> list[int]:
        """The visible uids (in row-id order), after checking every visible record's content."""
        got = st.read(st.row_ids())
        uids = got["uid"].tolist()
        for i, u in enumerate(uids):
            assert got["obs"][i].tobytes() == self.obs[u]
            assert got["ids"][got["offsets"][i]:got["offsets"][i + 1]].tolist() == self.ids[u]
        return uids


def test_two_writers_never_exceed_capacity_and_keep_the_newest(backend: Backend) -> None:
    cap = 40
    commits = 30 if backend.kind != "s3" else 12
    st_a, st_b = backend.open(SCHEMA, capacity=cap), backend.open(SCHEMA)
    assert st_b.capacity == cap
    wa, wb = st_a.writer(), st_b.writer()
    reader = backend.open(mode="r")
    src = Source(1)
    order: list[int] = []  # uids in commit order
    for i in range(commits):
        w = (wa, wb)[i % 2]
        b = src.batch(int(src.rng.integers(1, 16)))
        w.append(b, stream=f"w{w.id}")
        w.commit()
        order += b["uid"].tolist()
        reader.refresh()
        assert len(reader) == min(cap, len(order))
        visible = src.check(reader)
        assert sorted(visible) == order[-cap:]  # exactly the newest records, across both writers
    for handle in (st_a, st_b, backend.open(mode="r")):
        handle.refresh()
        assert len(handle) == cap and sorted(src.check(handle)) == order[-cap:]
        assert len(handle.row_ids()) == cap
        ids = handle.row_ids()
        assert handle.default.rows_at(np.arange(cap)).tolist() == ids.tolist()
    wa.close()
    wb.close()


def test_one_commit_bigger_than_capacity(backend: Backend) -> None:
    st = backend.open(SCHEMA, capacity=10)
    src = Source(2)
    with st.writer() as w:
        w.append(src.batch(25), stream=0)
    assert len(st) == 10
    assert src.check(st) == list(range(15, 25))
    assert st.rows(0)[1].tolist() == list(range(15, 25))
    assert st.row_ids().tolist() == list(range(15, 25))


def test_eviction_gaps_lookups_and_evicted_rows(backend: Backend) -> None:
    cap = 20
    st = backend.open(SCHEMA, capacity=cap)
    src = Source(3)
    w = st.writer()
    w.append(src.batch(6), stream="old")  # steps 0..5, will be evicted entirely
    w.commit()
    w.append(src.batch(10), stream="a", step=np.r_[0:5, 10:15])  # an explicit gap: 5..9 missing
    w.commit()
    assert st.runs("a").tolist() == [[0, 4], [10, 14]]
    assert sorted(st.streams()) == ["a", "old"]
    w.append(src.batch(8), stream="a")  # steps 15..22
    w.commit()
    w.append(src.batch(6), stream="b")
    w.commit()
    w.close()
    for handle in (st, backend.open(mode="r")):
        assert len(handle) == cap
        # "old" (uids 0..5) and the oldest 4 of "a" are gone: a leading gap in "a"
        assert sorted(handle.streams()) == ["a", "b"]
        assert len(handle.rows("old")[0]) == 0 and handle.runs("old").shape == (0, 2)
        _rows, steps = handle.rows("a")
        assert steps.tolist() == [4, 10, 11, 12, 13, 14] + list(range(15, 23))
        assert handle.runs("a").tolist() == [[4, 4], [10, 22]]
        assert handle.lookup("a", np.array([0, 3, 4, 9, 10, 22, 23])).tolist()[:2] == [-1, -1]
        found = handle.lookup("a", np.array([0, 3, 4, 9, 10, 22, 23]))
        assert (found >= 0).tolist() == [False, False, True, False, True, True, False]
        assert handle.lookup("old", np.arange(6)).tolist() == [-1] * 6
        assert handle.read(found[found >= 0])["uid"].tolist() == [10, 11, 23]
        for evicted in ([0], [5], [9], [0, 12]):  # uids 0..9 had row ids 0..9
            with pytest.raises(RowError):
                handle.read(evicted)
        with pytest.raises(RowError):
            handle.default.index_of([3])
        assert handle.read([10])["uid"].tolist() == [10]


def _data_bytes(b: Backend) -> int:
    storage = b.storage()
    return sum(storage.total_size(f"{layout.writer_dir(int(w))}/data") for w in storage.list(layout.WRITERS))


def _fill_and_check_reclaimed(backend: Backend, cap: int, commit_size: int, multiple: int = 20) -> None:
    st = backend.open(SCHEMA, capacity=cap)
    src = Source(4)
    w = st.writer()
    reference = None
    while src.next_uid < multiple * cap:
        w.append(src.batch(commit_size), stream=0)
        w.commit()
        if reference is None and src.next_uid >= cap:
            reference = _data_bytes(backend)  # what `cap` records take, written the same way
    w.close()
    assert reference is not None and len(st) == cap
    data = _data_bytes(backend)
    assert data < 2 * reference, (data, reference)
    # every fragment still stored holds some of the newest capacity + grace records
    grace = max(cap // 4, 1)
    stored = backend.storage().list(f"{layout.writer_dir(w.id)}/data/records")
    assert len(stored) * commit_size <= cap + grace + 8 * commit_size + cap // 4, len(stored)
    newest = list(range((multiple - 1) * cap, multiple * cap))
    assert src.check(st) == newest and src.check(backend.open(mode="r")) == newest


def test_storage_of_evicted_records_is_reclaimed(backend: Backend) -> None:
    """After 20x capacity records the stored data stays within a small multiple of what
    capacity records take."""
    if backend.kind == "s3":
        _fill_and_check_reclaimed(backend, cap=10, commit_size=10)
    else:
        _fill_and_check_reclaimed(backend, cap=60, commit_size=10)


def test_storage_is_reclaimed_with_compaction(fast_backend: Backend) -> None:
    """Commits small enough to be compacted: the merged-away originals must go as soon as
    their records are evicted, not only after the 30 s grace for stale readers."""
    _fill_and_check_reclaimed(fast_backend, cap=40, commit_size=1, multiple=6)
    kinds = [c["kind"] for c in fast_backend.open(mode="r").commits()]
    assert kinds.count("compact") > 10


def test_capacity_applies_per_table(backend: Backend) -> None:
    from replaystore.schemas import deep_cfr_advantage, deep_cfr_strategy
    from support.batches import deep_cfr_batch

    st = backend.open({"advantage": deep_cfr_advantage(16, actions=9),
                       "strategy": deep_cfr_strategy(16, actions=9)}, capacity=12)
    rng = np.random.default_rng(5)
    with st.writer() as w:
        for i in range(4):
            w.append(deep_cfr_batch(rng, 5, 2, iteration=i), stream=0)
            w.commit()
    assert len(st.table("advantage")) == 12 and len(st.table("strategy")) == 8
    adv = st.table("advantage")
    assert adv.rows(0)[1].tolist() == list(range(8, 20))
    assert adv.read(adv.row_ids())["advantage_iterations"].tolist() == [1] * 2 + [2] * 5 + [3] * 5


def test_a_stale_reader_gets_a_typed_error_and_recovers_by_refreshing(backend: Backend) -> None:
    cap = 10
    st = backend.open(SCHEMA, capacity=cap)
    src = Source(6)
    w = st.writer()
    w.append(src.batch(cap), stream=0)
    w.commit()
    stale = backend.open(mode="r")
    assert len(stale) == cap
    for _ in range(4):  # far beyond capacity + grace: the first fragment is reclaimed
        w.append(src.batch(cap), stream=0)
        w.commit()
    w.close()
    assert not backend.storage().exists(f"{layout.writer_dir(w.id)}/data/records/{layout.fragment_name(0)}/zarr.json")
    with pytest.raises(StaleReadError, match="refresh"):
        stale.read(np.arange(cap))
    with pytest.raises(StaleReadError):
        stale.rows(0)
    assert stale.refresh()
    assert len(stale) == cap and src.check(stale) == list(range(4 * cap, 5 * cap))
    with pytest.raises(RowError):
        stale.read([0])


def test_a_writer_with_a_stale_view_can_still_append(backend: Backend) -> None:
    """Writer A commits rarely; B commits far more than capacity + grace meanwhile, so the
    fragments A's view references are reclaimed. A's next appends must still work."""
    cap = 8
    st_a, st_b = backend.open(SCHEMA, capacity=cap), backend.open(SCHEMA)
    src = Source(7)
    wa, wb = st_a.writer(), st_b.writer()
    wa.append(src.batch(4), stream="a")
    wa.commit()
    uids = []
    for _ in range(4):
        b = src.batch(cap)
        wb.append(b, stream="b")
        wb.commit()
        uids += b["uid"].tolist()
    wa.append(src.batch(2), stream="a")      # continues its own stream: steps 4, 5
    wa.append(src.batch(2), stream="new")    # a stream it never wrote
    wa.append(src.batch(1), stream="b", step=100)  # explicit step, checked against B's
    wa.commit()
    for handle in (st_a, backend.open(mode="r")):
        assert len(handle) == cap
        assert handle.rows("a")[1].tolist() == [4, 5] and handle.rows("new")[1].tolist() == [0, 1]
        assert handle.rows("b")[1].tolist()[-1] == 100
        assert sorted(src.check(handle)) == list(range(src.next_uid - cap, src.next_uid))
    wa.close()
    wb.close()


def _fill_deleting_through(backend: Backend, monkeypatch: pytest.MonkeyPatch, src: Source,
                           delete: Callable[[Callable[[str], None], str], None]) -> Writer:
    """30 commits of 5 records into capacity 20 (local: 5-row segments, reclaimed often), the
    writer's deletions going through ``delete(real_delete, path)``; the writer, still open."""
    st = backend.open(SCHEMA, capacity=20)
    w = st.writer()
    monkeypatch.setattr(w._segments, "segment_rows", lambda table: 5)
    real = w.storage.delete
    monkeypatch.setattr(w.storage, "delete", lambda path: delete(real, path))
    for _ in range(30):
        w.append(src.batch(5), stream=0)
        w.commit()
    return w


def test_a_failed_deletion_of_reclaimed_storage_is_tried_again(fast_backend: Backend,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Deletions run on the writer's I/O threads; one that fails (an S3 503, say) is repeated at
    the next reclaim instead of leaking the unit: the log no longer lists it once retired."""
    failed: list[str] = []

    def flaky(real: Callable[[str], None], path: str) -> None:
        if len(failed) < 3:
            failed.append(path)
            raise OSError(f"{path}: 503 SlowDown")
        real(path)
    src = Source(7)
    _fill_deleting_through(fast_backend, monkeypatch, src, flaky).close()
    storage = fast_backend.storage()
    assert len(failed) == 3
    assert not any(storage.exists(path) for path in failed)
    assert src.check(fast_backend.open(mode="r")) == list(range(130, 150))


def test_a_deletion_still_failing_at_close_is_reported_and_left_to_vacuum(fast_backend: Backend,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    refused: list[str] = []

    def refusing(real: Callable[[str], None], path: str) -> None:
        if not refused or refused[0] == path:
            refused.append(path)
            raise PermissionError(f"{path}: access denied")
        real(path)
    src = Source(8)
    w = _fill_deleting_through(fast_backend, monkeypatch, src, refusing)
    with pytest.warns(UserWarning, match="could not delete 1 reclaimed unit.*access denied.*replaystore vacuum"):
        w.close()
    assert len(refused) > 1 and fast_backend.storage().exists(refused[0])  # tried at every reclaim
    report = fast_backend.open(mode="a").vacuum(older_than_s=0)
    assert refused[0] in [u.path for u in report.deleted]
    assert not fast_backend.storage().exists(refused[0])
    assert src.check(fast_backend.open(mode="r")) == list(range(130, 150))
