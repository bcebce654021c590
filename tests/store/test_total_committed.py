"""``Table.total_committed()``: records ever committed to a table, evicted and reclaimed ones included,
kept exact across log checkpoints (their ``committed`` counts), and bounded below by older checkpoints
that have none."""

from __future__ import annotations

import numpy as np
import pytest

from replaystore.schemas import dqn
from replaystore.store import Store
from replaystore.store.format import layout, records
from replaystore.store.maintenance.verify import verify
from replaystore.store.read import log as log_module
from replaystore.store.read.log import CommitLog
from support.batches import dqn_batch
from support.storecheck import Backend

DQN = dqn(16, 2, actions=9)


@pytest.fixture(autouse=True)
def _frequent_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "CHECKPOINT_EVERY", 4)


def _two_tables(backend: Backend, rng: np.random.Generator) -> tuple[Store, int]:
    """A store where writer 0's fragments of table ``a`` were all evicted and removed from its log.

    Writer 0 commits to ``a``, then only to ``b`` while writer 1 fills ``a``: writer 0's
    later commits remove its evicted ``a`` fragments, so no live fragment tells how many
    records it committed to ``a``. Returns the store and the records committed to ``a``.
    """
    st = backend.open_fragments({"a": DQN, "b": DQN}, capacity=20)
    w0, w1 = st.writer(), st.writer()
    total = 0
    for _ in range(12):
        n = int(rng.integers(3, 9))
        w0.append(dqn_batch(rng, n, extra=0), stream="x", table="a")
        w0.commit()
        total += n
    for _ in range(30):
        n = int(rng.integers(3, 9))
        w1.append(dqn_batch(rng, n, extra=0), stream="y", table="a")
        w1.commit()
        total += n
        w0.append(dqn_batch(rng, 2, extra=0), stream="z", table="b")
        w0.commit()
    w0.close()
    w1.close()
    st.refresh()
    return st, total


def _live_ends(log: CommitLog, table: str) -> int:
    """What the live fragments alone tell: the sum over writers of their highest fragment end."""
    return sum(max((f.row_start + f.rows for f in wl.fragments.get(table, {}).values()), default=0)
               for wl in log.writers.values())


def test_total_committed_counts_evicted_and_removed_records_across_checkpoints(fast_backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st, total = _two_tables(fast_backend, rng)
    table = st.table("a")
    assert len(table) == 20 and table.total_committed() == total
    assert _live_ends(st.log, table.name) < total  # whole writers' fragments were removed: not countable from them

    reader = fast_backend.open(mode="r")
    assert reader.log.checkpoint is not None  # opened from a checkpoint, not from the first records
    assert reader.table("a").total_committed() == total
    full = CommitLog(reader.storage, reader.tables, checkpoints=False)
    full.refresh()
    assert full.committed(table.name) == total
    assert verify(reader) == []

    # a later commit is counted after a refresh, never before
    with st.writer() as w:
        w.append(dqn_batch(rng, 5, extra=0), stream="c", table="a")
        w.commit()
    assert reader.table("a").total_committed() == total
    reader.refresh()
    assert reader.table("a").total_committed() == total + 5


def test_checkpoints_without_counts_still_open_and_verify_checks_the_counts_they_carry(fast_backend: Backend) -> None:
    rng = np.random.default_rng(4)
    st, total = _two_tables(fast_backend, rng)
    number = st.log.checkpoint_numbers()[-1]
    path = layout.checkpoint(number)
    storage = fast_backend.storage()
    body = records.decode(path, storage.read(path))
    assert all("committed" in doc for doc in body["writers"].values())

    # a checkpoint written before the counts existed: the live fragments' ends, a lower bound
    old = {**body, "writers": {w: {k: v for k, v in doc.items() if k != "committed"}
                               for w, doc in body["writers"].items()}}
    storage.write(path, records.encode(old))
    reader = fast_backend.open(mode="r")
    assert reader.log.checkpoint == number
    assert reader.table("a").total_committed() == _live_ends(reader.log, "a") < total
    assert verify(reader) == []
    # a writer starting from it writes checkpoints without counts for the writers it knew only so
    upgraded = fast_backend.open(mode="a")
    with upgraded.writer() as w:
        for _ in range(5):
            w.append(dqn_batch(rng, 2, extra=0), stream="new", table="a")
            w.commit()
    assert upgraded.log.checkpoint_numbers()[-1] > number
    assert verify(fast_backend.open(mode="r")) == []
    body = records.decode(path, storage.read(path))

    # a checkpoint whose count differs from its records is damage
    w0 = sorted(body["writers"])[0]
    wrong = {**body, "writers": {**body["writers"], w0: {**body["writers"][w0], "committed": {"a": 1}}}}
    storage.write(path, records.encode(wrong))
    problems = verify(fast_backend.open(mode="r"))
    assert [p.path for p in problems] == [path] and "differs" in problems[0].problem
