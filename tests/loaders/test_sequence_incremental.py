"""SequenceSampler windows followed across store changes equal a fresh sampler's, and draw alike.

The store changes as in tests/store/test_index_incremental.py (three writers, interleaved
streams, out-of-order arrival, resets, step gaps, compaction, eviction by capacity). After
every change the sampler that followed it (never rebuilt) has exactly the legal windows,
in the same draw order, as a sampler built afresh on a store opened at the same point; a
fresh sampler loaded with its state draws the same next minibatch (what resume relies on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.loaders import SequenceSampler
from replaystore.store import open_store
from replaystore.store.format.layout import ROW_BITS
from support.indexops import Scenario, ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_request(a: Any, b: Any) -> None:
    assert np.array_equal(a.rows, b.rows)
    assert a.outputs.keys() == b.outputs.keys()
    for k in a.outputs:
        assert np.array_equal(a.outputs[k], b.outputs[k]), k
    assert a.stream_keys == b.stream_keys


@SETTINGS
@given(plan=ops, capacity=hs.one_of(hs.none(), hs.integers(3, 30)), length=hs.integers(1, 4),
       burn_in=hs.integers(0, 3), subset=hs.booleans())
def test_followed_windows_equal_fresh_sampler(new_url: Callable[[], str], plan: list[Any], capacity: int | None,
                                              length: int, burn_in: int, subset: bool) -> None:
    sc = Scenario(new_url(), capacity)
    rows = (np.concatenate([(w.id << ROW_BITS) + np.arange(0, 200, 2) for w in sc.writers]) if subset else None)
    kw = {"length": length, "burn_in": burn_in, "batch_size": 16, "seed": 3, "subset": rows}
    reader = open_store(sc.url, mode="r")
    sampler = SequenceSampler(reader, **kw)
    sampler.windows()
    followed = sampler._windows
    for _ in sc.run(plan):
        fresh_store = sc.same_snapshot(reader)
        fresh = SequenceSampler(fresh_store, **kw)
        got, want = sampler.windows(), fresh.windows()
        assert sampler._windows is followed, "the windows were recomputed instead of followed"
        for name in ("learn", "start", "pad"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        if not len(got.learn):
            continue
        fresh.load_state_dict(sampler.state_dict())
        same_request(sampler.sample(), fresh.sample())
