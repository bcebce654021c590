"""SequenceSampler against the sequence replay contract, written independently in support.loaderref.

Every sampled window is checked slot by slot: one stream, consecutive learning steps,
consecutive context cut at the latest reset, padding only before a reset and only on
the left, loss_mask/sequence_valid/steps/indices/reset, data equal to ``table.read``
(zeros and empty lists on padding). The set of legal windows the sampler can draw
from equals the reference's, and a large batch draws every one of them.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import StoreError
from replaystore.loaders import EmptyStoreError, SequenceSampler, gather
from replaystore.loaders.sequence import legal_windows
from replaystore.store import open_store
from support.loaderref import (
    PROBE,
    Append,
    Harness,
    RefStore,
    RefWindow,
    csr_rows,
    legal_of,
    plans,
    probe_arrays,
    ref_windows,
    skey,
    to_numpy_batch,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sampler_windows(sampler: SequenceSampler) -> dict[tuple[Any, int], tuple[int, int]]:
    """The sampler's legal windows as {(stream, first learning step): (first real step, pad)}."""
    w = sampler.windows()
    idx = sampler.table.reader.index
    return {(skey(idx.keys[idx.stream_ids[p]]), int(idx.steps[p])): (int(idx.steps[s]), int(pad))
            for p, s, pad in zip(w.learn, w.start, w.pad, strict=True)}


def function_windows(table: Any, length: int, burn_in: int) -> dict[tuple[Any, int], tuple[int, int]]:
    """Same, from ``legal_windows`` called on the table's (stream, step) index directly."""
    idx = table.reader.index
    w = legal_windows(idx.stream_ids, idx.steps, idx.resets, length, burn_in)
    return {(skey(idx.keys[idx.stream_ids[p]]), int(idx.steps[p])): (int(idx.steps[s]), int(pad))
            for p, s, pad in zip(w.learn, w.start, w.pad, strict=True)}


def summary(windows: dict[tuple[Any, int], RefWindow]) -> dict[tuple[Any, int], tuple[int, int]]:
    return {k: (w.first_real_step, w.pad) for k, w in windows.items()}


def check_windows(table: Any, ref: RefStore, request: Any, batch: dict[str, Any],
                  windows: dict[tuple[Any, int], RefWindow], burn_in: int, length: int) -> set[tuple[Any, int]]:
    """Check one sequence minibatch against the reference; returns the windows it drew."""
    b = to_numpy_batch(batch)
    window = burn_in + length
    rows = np.asarray(request.rows)
    n = rows.shape[0]
    assert rows.shape == (n, window)
    assert b["indices"].shape == (n, window) and np.array_equal(b["indices"], rows)
    for name in ("loss_mask", "sequence_valid", "steps", "reset"):
        assert b[name].shape == (n, window), name
    assert b["loss_mask"].dtype == np.bool_ and b["sequence_valid"].dtype == np.bool_
    drawn = set()
    for i in range(n):
        first_learn = rows[i, burn_in]
        assert first_learn >= 0, "a learning slot is padding"
        rec = ref.rec_of_row(int(first_learn))
        key = (skey(rec.stream), rec.step)
        assert key in windows, f"window {key} is not legal"
        win = windows[key]
        drawn.add(key)
        assert rows[i].tolist() == [r.row if r else -1 for r in win.slots]
        assert b["sequence_valid"][i].tolist() == [r is not None for r in win.slots]
        assert b["loss_mask"][i].tolist() == [j >= burn_in for j in range(window)]
        assert b["steps"][i].tolist() == [r.step if r else -1 for r in win.slots]
        assert b["reset"][i].tolist() == [bool(r and r.reset) for r in win.slots]
        key_out = batch["stream_keys"][i]
        assert type(key_out) is type(rec.stream) and key_out == rec.stream
        assert skey(table.reader.index.keys[int(b["stream"][i])]) == skey(rec.stream)
        # the independent rules, restated on the drawn window itself
        real = [r for r in win.slots if r is not None]
        assert all(skey(r.stream) == key[0] for r in real), "window crosses a stream switch"
        assert all(b2.step == a.step + 1 for a, b2 in itertools.pairwise(real)), "window crosses a step gap"
        assert not any(r.reset for r in real[1:burn_in - win.pad]), "context runs past a reset"
        if win.pad:
            assert real[0].reset, "padding before a record that is not a reset"
    # indices map to the right (stream, step) through the store's own index
    real = rows >= 0
    flat_rows = rows[real]
    streams, steps, resets = table.index_of(flat_rows)
    recs = [ref.rec_of_row(int(r)) for r in flat_rows]
    assert [skey(s) for s in streams] == [skey(r.stream) for r in recs]
    assert steps.tolist() == [r.step for r in recs]
    assert resets.tolist() == [r.reset for r in recs]
    # data: equal to table.read of the real rows, zeros / empty lists on padding
    read = table.read(flat_rows)
    want = probe_arrays([r.tag for r in recs])
    real_flat = real.reshape(-1)
    for f in PROBE.dense_fields:
        got = b[f.name]
        assert got.shape == (n, window, *f.shape) and got.dtype == f.dtype, f.name
        got = got.reshape(n * window, *f.shape)
        assert np.array_equal(got[real_flat], read[f.name]) and np.array_equal(read[f.name], want[f.name])
        assert not got[~real_flat].any(), f"{f.name}: padding is not zero"
    offsets = b["legal_offsets"]
    assert offsets.shape == (n * window + 1,) and offsets[0] == 0
    counts = np.diff(offsets)
    assert not counts[~real_flat].any(), "padding has legal ids"
    got_lists = [x for x, ok in zip(csr_rows(b["legal_ids"], offsets), real_flat, strict=True) if ok]
    assert got_lists == csr_rows(read["legal_ids"], read["legal_offsets"])
    assert got_lists == [legal_of(r.tag).tolist() for r in recs]
    return drawn


@SETTINGS
@given(plan=plans(), length=hs.integers(1, 4), burn_in=hs.integers(0, 3), seed=hs.integers(0, 2**16))
def test_windows_follow_the_contract(new_url: Any, plan: Any, length: int, burn_in: int, seed: int) -> None:
    h = Harness(new_url(), plan.capacity).run(plan)
    windows = ref_windows(h.ref.visible(), length, burn_in)
    sampler = SequenceSampler(h.store, length=length, burn_in=burn_in, batch_size=8, seed=seed)
    assert function_windows(h.store.default, length, burn_in) == summary(windows)
    assert sampler_windows(sampler) == summary(windows)
    if not windows:
        with pytest.raises(EmptyStoreError):
            sampler.sample()
        return
    for _ in range(3):
        req = sampler.sample()
        check_windows(h.store.default, h.ref, req, gather(h.store.default, req), windows, burn_in, length)
    # the sampler can produce every legal window: one large batch draws them all
    sampler.batch_size = 40 * len(windows)
    req = sampler.sample()
    drawn = check_windows(h.store.default, h.ref, req, gather(h.store.default, req), windows, burn_in, length)
    assert drawn == set(windows)


@SETTINGS
@given(plan=plans(), seed=hs.integers(0, 2**16))
def test_transition_sampling_covers_every_visible_record(new_url: Any, plan: Any, seed: int) -> None:
    """burn_in=0, length=1 is plain transition sampling: every visible record is a window."""
    h = Harness(new_url(), plan.capacity).run(plan)
    visible = h.ref.visible()
    windows = ref_windows(visible, 1, 0)
    assert set(windows) == {(skey(r.stream), r.step) for r in visible}
    sampler = SequenceSampler(h.store, length=1, burn_in=0, batch_size=40 * len(visible), seed=seed)
    req = sampler.sample()
    batch = gather(h.store.default, req)
    check_windows(h.store.default, h.ref, req, batch, windows, 0, 1)
    assert set(np.asarray(req.rows).reshape(-1).tolist()) == {r.row for r in visible}
    assert batch["loss_mask"].all() and batch["sequence_valid"].all()


@SETTINGS
@given(plan=plans(), length=hs.integers(1, 3), burn_in=hs.integers(0, 2), seed=hs.integers(0, 2**16),
       data=hs.data())
def test_subset_restricts_the_first_learning_step(new_url: Any, plan: Any, length: int, burn_in: int,
                                                  seed: int, data: Any) -> None:
    h = Harness(new_url(), plan.capacity).run(plan)
    total = len(h.ref.committed)
    subset = data.draw(hs.lists(hs.integers(0, total + 2), max_size=total + 3))
    windows = {k: w for k, w in ref_windows(h.ref.visible(), length, burn_in).items()
               if w.slots[burn_in].row in set(subset)}  # type: ignore[union-attr]
    sampler = SequenceSampler(h.store, length=length, burn_in=burn_in, batch_size=8, seed=seed, subset=subset)
    assert sampler_windows(sampler) == summary(windows)
    if not windows:
        with pytest.raises(EmptyStoreError):
            sampler.sample()
        return
    sampler.batch_size = 40 * len(windows)
    req = sampler.sample()
    drawn = check_windows(h.store.default, h.ref, req, gather(h.store.default, req), windows, burn_in, length)
    assert drawn == set(windows)


def _write(st: Any, ref: RefStore, key: Any, steps: list[int], resets: list[bool]) -> None:
    """Commit records of one stream at explicit ``steps`` (through the reference's gaps)."""
    last = ref.last.get(RefStore._k(key), -1)
    gaps = tuple(int(g) for g in np.diff([last, *steps]) - 1)
    kw = ref.stage(Append((key,) * len(steps), True, gaps, "array", tuple(resets)))
    assert [r.step for r in ref.pending] == steps
    with st.writer() as w:
        w.append(kw["batch"], stream=kw["stream"], step=kw["step"], reset=kw["reset"])
    ref.commit(w.id)


def test_a_worked_example(new_url: Any) -> None:
    """Stream "s": steps 0-4 (reset at 0), a gap, 7-12 (reset at 11); stream 9: steps 0-2, no reset."""
    st = open_store(new_url(), PROBE)
    ref = RefStore(None)
    _write(st, ref, "s", [0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12], [True] + [False] * 8 + [True, False])
    _write(st, ref, 9, [0, 1, 2], [False] * 3)
    sampler = SequenceSampler(st, length=2, burn_in=2, batch_size=64, seed=0)
    # learn 0, 1: padded up to the reset at 0; 2, 3: full context; 4: crosses the gap;
    # 7, 8: context cut by the gap without a reset; 9, 10: full context (a reset inside the
    # learning steps is fine); 11: padded at its own reset; 12: no second learning step.
    assert sampler_windows(sampler) == {
        (("str", "s"), 0): (0, 2), (("str", "s"), 1): (0, 1), (("str", "s"), 2): (0, 0),
        (("str", "s"), 3): (1, 0), (("str", "s"), 9): (7, 0), (("str", "s"), 10): (8, 0),
        (("str", "s"), 11): (11, 2),
    }
    req = sampler.sample()
    drawn = check_windows(st.default, ref, req, gather(st.default, req), ref_windows(ref.visible(), 2, 2), 2, 2)
    assert drawn == set(sampler_windows(sampler))
    short = SequenceSampler(st, length=2, burn_in=0, batch_size=4, seed=0)
    assert set(sampler_windows(short)) == {(("str", "s"), s) for s in (0, 1, 2, 3, 7, 8, 9, 10, 11)} | {
        (("int", 9), 0), (("int", 9), 1)}


def test_windows_never_cross_a_stream_switch_even_when_steps_continue(new_url: Any) -> None:
    """Stream "a" holds steps 0-3 and stream 1 steps 4-7: consecutive numbers, different streams."""
    st = open_store(new_url(), PROBE)
    ref = RefStore(None)
    _write(st, ref, "a", [0, 1, 2, 3], [False] * 4)
    _write(st, ref, 1, [4, 5, 6, 7], [False] * 4)
    _write(st, ref, "1", [8, 9], [True, False])  # str "1" is yet another stream
    sampler = SequenceSampler(st, length=2, burn_in=0, batch_size=200, seed=0)
    want = {(("str", "a"), s) for s in (0, 1, 2)} | {(("int", 1), s) for s in (4, 5, 6)} | {(("str", "1"), 8)}
    assert set(sampler_windows(sampler)) == want == set(ref_windows(ref.visible(), 2, 0))
    req = sampler.sample()
    assert check_windows(st.default, ref, req, gather(st.default, req), ref_windows(ref.visible(), 2, 0), 0,
                         2) == want
    context = SequenceSampler(st, length=1, burn_in=1, batch_size=8, seed=0)
    assert set(sampler_windows(context)) == {(("str", "a"), s) for s in (1, 2, 3)} | {
        (("int", 1), s) for s in (5, 6, 7)} | {(("str", "1"), 8), (("str", "1"), 9)}


def test_eviction_removes_context_and_the_reset_with_it(new_url: Any) -> None:
    """Once capacity evicts a stream's reset, its first visible steps have no legal context."""
    st = open_store(new_url(), PROBE, capacity=6)
    ref = RefStore(6)
    _write(st, ref, "s", [0, 1, 2, 3], [True, False, False, False])
    sampler = SequenceSampler(st, length=1, burn_in=2, batch_size=16, seed=1)
    assert sampler_windows(sampler) == {(("str", "s"), s): (f, p)
                                        for s, f, p in ((0, 0, 2), (1, 0, 1), (2, 0, 0), (3, 1, 0))}
    _write(st, ref, "s", [4, 5, 6, 7], [False] * 4)  # evicts steps 0 and 1 (the reset)
    assert sampler_windows(sampler) == {(("str", "s"), s): (s - 2, 0) for s in (4, 5, 6, 7)}
    req = sampler.sample()
    check_windows(st.default, ref, req, gather(st.default, req), ref_windows(ref.visible(), 1, 2), 2, 1)


def test_no_window_and_no_records_raise_empty_store_error(new_url: Any) -> None:
    st = open_store(new_url(), PROBE)
    with pytest.raises(EmptyStoreError):
        SequenceSampler(st, length=1, batch_size=2).sample()
    with st.writer() as w:
        w.append(probe_arrays([0, 1, 2]), stream="s")  # no reset: no room for 2 context steps
    with pytest.raises(EmptyStoreError) as err:
        SequenceSampler(st, length=2, burn_in=2, batch_size=2).sample()
    assert not isinstance(err.value, AssertionError)
    assert SequenceSampler(st, length=3, burn_in=0, batch_size=2).sample().rows.shape == (2, 3)


def test_bad_arguments_are_store_errors(new_url: Any) -> None:
    st = open_store(new_url(), PROBE)
    for kwargs in ({"length": 0}, {"length": 2, "burn_in": -1}, {"length": 1.5}, {"length": 2, "batch_size": 0}):
        with pytest.raises(StoreError):
            SequenceSampler(st, **kwargs)
