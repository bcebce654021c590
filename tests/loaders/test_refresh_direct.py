"""``refresh_every`` / ``refresh_every_s`` make direct ``sample()`` calls follow other processes' commits, for
every sampler kind, as iteration does; without them ``sample()`` never refreshes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from replaystore.loaders import (
    EpochSampler,
    PrioritizedSampler,
    ReservoirSampler,
    SequenceSampler,
    StoreSampler,
    UniformSampler,
)
from replaystore.store import Store, open_store
from support.ratelimitprocs import Child, batch, schema

KINDS: dict[str, Callable[..., StoreSampler]] = {
    "uniform": lambda st, **kw: UniformSampler(st, 64, **kw),
    "prioritized": lambda st, **kw: PrioritizedSampler(st, 64, **kw),
    "epoch": lambda st, **kw: EpochSampler(st, 50, **kw),  # a pass of the 100 old records: 2 minibatches
    "sequence": lambda st, **kw: SequenceSampler(st, length=2, batch_size=64, **kw),
    "reservoir": lambda st, **kw: ReservoirSampler(st, 50, 64, **kw),
}


def _old(url: str) -> tuple[Store, set[int]]:
    """A store of 100 records; a read-only handle on it and its row ids."""
    st = open_store(url, schema(), mode="w")
    with st.writer() as w:
        w.append(batch(100, 0), stream="old")
    reader = open_store(url, mode="r")
    return reader, {int(r) for r in reader.row_ids()}


def _commit_100_from_another_process(url: str) -> None:
    child = Child("collector", url=url, records=100, commits=1, pace=0)
    try:
        assert child.result(60) == {"committed": 100}  # returned once committed and closed
    finally:
        child.kill()


def _drawn(sampler: StoreSampler, calls: int) -> set[int]:
    rows = np.concatenate([sampler.sample().rows.ravel() for _ in range(calls)])
    return {int(r) for r in rows[rows >= 0]}


@pytest.mark.parametrize("refresh", [{"refresh_every": 1}, {"refresh_every_s": 1e-9}], ids=["every", "every_s"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_direct_sample_calls_follow_another_processes_commits(kind: str, refresh: dict[str, Any],
                                                              new_url: Callable[[], str]) -> None:
    url = new_url()
    reader, old = _old(url)
    sampler = KINDS[kind](reader, seed=3, **refresh)
    _commit_100_from_another_process(url)
    drawn = _drawn(sampler, 5)  # no iteration, no auto_refresh() by hand
    assert drawn - old, "five direct sample() calls drew none of the 100 new records"
    assert len(reader) == 200


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_without_refresh_every_sample_never_refreshes(kind: str, new_url: Callable[[], str]) -> None:
    url = new_url()
    reader, old = _old(url)
    sampler = KINDS[kind](reader, seed=3)
    _commit_100_from_another_process(url)
    assert _drawn(sampler, 5) <= old and len(reader) == 100


def test_auto_refresh_called_by_hand_as_well_refreshes_on_the_same_schedule(new_url: Callable[[], str]) -> None:
    """``refresh_every=2`` with ``auto_refresh()`` before each ``sample()`` (what the guide said to do): a refresh
    before minibatches 2 and 4 only, as without the hand calls."""
    url = new_url()
    reader, _ = _old(url)
    sampler = UniformSampler(reader, 2000, refresh_every=2)
    refreshed, sizes = [], []
    other = open_store(url)
    with other.writer() as w:
        for i in range(5):
            refreshed.append(sampler.auto_refresh())
            sizes.append(len({int(r) for r in sampler.sample().rows}))
            w.append(batch(10, i + 1), stream=f"new-{i}")
            w.commit()
    assert refreshed == [False, False, True, False, True]
    assert sizes == [100, 100, 120, 120, 140]
