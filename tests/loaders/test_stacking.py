"""Frame stacking (``stack=``): every sampler against stacks built by hand from the raw frames, and resume."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import ResumeMismatchError, SamplerParameterError
from replaystore.loaders import (
    EmptyStoreError,
    EpochSampler,
    PrioritizedSampler,
    SequenceSampler,
    UniformSampler,
    gather,
)
from replaystore.schemas import frames
from replaystore.store import open_store
from support.framesref import FRAME, SAMPLERS, Ref, fill, plans


def check(batch: dict[str, Any], ref: Ref, k: int, padding: str) -> None:
    """Every drawn row is drawable and its stacks equal the hand-built ones."""
    drawable = ref.drawable()
    for i, row in enumerate(batch["indices"].tolist()):
        assert row in drawable
        obs, nxt = ref.stacks(row, k, padding)
        np.testing.assert_array_equal(batch["obs"][i].numpy(), obs)
        np.testing.assert_array_equal(batch["next_obs"][i].numpy(), nxt)


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans, k=st.integers(1, 5), padding=st.sampled_from(["reset", "zero"]), seed=st.integers(0, 99))
def test_stacks_match_hand_built_reference(kind: str, plan: list[tuple[int, int, bool]], k: int, padding: str,
                                           seed: int) -> None:
    store = open_store(f"memory://stacking/{kind}-{seed}-{k}-{len(plan)}-{id(plan)}", frames(FRAME, 4,
                       frame_dtype=np.int32), mode="w+")
    ref = fill(store, plan, seed)
    sampler = SAMPLERS[kind](store, seed=seed, stack=k, stack_padding=padding)
    if not ref.drawable():
        with pytest.raises(EmptyStoreError):
            sampler.sample()
        return
    seen: list[int] = []
    for _ in range(4):
        batch = gather(store.default, sampler.sample())
        check(batch, ref, k, padding)
        seen += batch["indices"].tolist()
        if kind == "prioritized":
            assert batch["weights"].shape == (len(batch["indices"]),)
            sampler.update(batch["indices"], np.abs(batch["reward"].numpy()) + 0.1)
    if kind == "epoch":  # a pass covers the drawable rows exactly once
        sampler = EpochSampler(store, batch_size=16, seed=seed, stack=k, stack_padding=padding)
        one_pass = [r for req in sampler for r in req.rows.tolist()]
        assert sorted(one_pass) == sorted(ref.drawable())


@settings(max_examples=25, deadline=None)
@given(plan=plans, k=st.integers(1, 4), padding=st.sampled_from(["reset", "zero"]), seed=st.integers(0, 99),
       length=st.integers(1, 4), burn_in=st.integers(0, 2))
def test_sequence_stacks_match_reference(plan: list[tuple[int, int, bool]], k: int, padding: str, seed: int,
                                         length: int, burn_in: int) -> None:
    store = open_store(f"memory://stacking/seq-{seed}-{id(plan)}", frames(FRAME, 4, frame_dtype=np.int32),
                       mode="w+")
    ref = fill(store, plan, seed)
    sampler = SequenceSampler(store, length=length, burn_in=burn_in, batch_size=8, seed=seed, stack=k,
                              stack_padding=padding)
    try:
        req = sampler.sample()
    except EmptyStoreError:
        return
    batch = gather(store.default, req)
    rows = batch["indices"].numpy()
    assert batch["obs"].shape == (*rows.shape, k, *FRAME)
    assert "frame" not in batch
    drawable = ref.drawable()
    for (b, j), row in np.ndenumerate(rows):
        if row < 0:
            assert not batch["obs"][b, j].any() and not batch["next_valid"][b, j]
            continue
        obs, nxt = ref.stacks(int(row), k, padding)
        np.testing.assert_array_equal(batch["obs"][b, j].numpy(), obs)
        assert bool(batch["next_valid"][b, j]) == (int(row) in drawable)
        if nxt is not None:
            np.testing.assert_array_equal(batch["next_obs"][b, j].numpy(), nxt)
        else:
            assert not batch["next_obs"][b, j, -1].any()


def test_terminal_step_next_obs_is_the_final_frame() -> None:
    store = open_store("memory://stacking/final", frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    ref = fill(store, [(0, 3, True)], 0)  # rows 0 1 2 are steps, row 3 the final frame
    batch = gather(store.default, EpochSampler(store, batch_size=8, stack=2).sample())
    assert sorted(batch["indices"].tolist()) == [0, 1, 2]
    last = batch["indices"].tolist().index(2)
    assert bool(batch["terminated"][last])
    np.testing.assert_array_equal(batch["next_obs"][last, -1].numpy(), ref.frames[3])


def test_new_step_becomes_drawable_after_refresh(new_url: Callable[[], str]) -> None:
    url = new_url()
    store = open_store(url, frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    one = {"frame": np.ones((1, *FRAME), np.int32), "action": np.zeros(1, np.int64),
           "reward": np.zeros(1, np.float32), "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)}
    with store.writer() as w:
        w.append(one, reset=True)
        w.commit()
    samplers = [UniformSampler(store, batch_size=4, stack=2), PrioritizedSampler(store, batch_size=4, stack=2)]
    for s in samplers:
        with pytest.raises(EmptyStoreError):
            s.sample()
    with store.writer() as w:
        w.append({**one, "frame": np.full((1, *FRAME), 2, np.int32)})
        w.commit()
    store.refresh()
    for s in samplers:
        batch = gather(store.default, s.sample())
        assert batch["indices"].tolist() == [0, 0, 0, 0]
        assert batch["next_obs"][:, -1].eq(2).all()


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_resume_with_stack_is_exact(kind: str, new_url: Callable[[], str]) -> None:
    url = new_url()
    store = open_store(url, frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    fill(store, [(0, 20, True), (1, 7, True), (0, 30, False), (1, 12, True)], 5)
    a = SAMPLERS[kind](store, seed=3, stack=4, name="s")
    for _ in range(3):
        req = a.sample()
        if kind == "prioritized":
            a.update(req.rows, np.arange(len(req.rows)) + 1.0)
    a.save()
    after = [a.sample() for _ in range(3)]
    b = SAMPLERS[kind](open_store(url), seed=3, stack=4, name="s", resume=True)
    for want in after:
        got = b.sample()
        np.testing.assert_array_equal(got.rows, want.rows)
        np.testing.assert_array_equal(got.parts["stack"].frames, want.parts["stack"].frames)
        for key in want.outputs:
            np.testing.assert_array_equal(got.outputs[key], want.outputs[key])
    with pytest.raises(ResumeMismatchError):
        SAMPLERS[kind](open_store(url), seed=3, stack=2, name="s", resume=True)


def test_bad_stack_arguments() -> None:
    store = open_store("memory://stacking/bad", frames(FRAME, 4), mode="w+")
    for kwargs, name in (({"stack": 0}, "stack"), ({"stack": True}, "stack"),
                         ({"stack": 2, "stack_padding": "zeros!"}, "stack_padding"),
                         ({"stack": 2, "stack_field": "obs"}, "stack_field")):
        with pytest.raises(SamplerParameterError) as err:
            UniformSampler(store, batch_size=2, **kwargs)
        assert err.value.field == name


def test_frames_schema() -> None:
    schema = frames((84, 84), 6)
    assert schema.names == ("frame", "action", "reward", "terminated", "truncated")
    assert schema.field("frame").dtype == np.uint8 and schema.field("frame").shape == (84, 84)


def test_prioritized_never_draws_a_row_without_next_frame_even_after_update() -> None:
    store = open_store("memory://stacking/prio-mask", frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    ref = fill(store, [(0, 3, True), (0, 2, True)], 1)  # rows 3 and 6 are final frames
    sampler = PrioritizedSampler(store, batch_size=64, alpha=1.0, stack=2, seed=0)
    sampler.update(np.array([3, 6, 0]), np.array([1e6, 1e6, 1.0]))  # 3 and 6 are ignored
    slots, found = sampler.slots.lookup(np.array([3, 6]))
    assert found.all() and not sampler.tree.leaves()[slots].any()
    for _ in range(5):
        assert set(sampler.sample().rows.tolist()) <= ref.drawable()


def test_stacked_minibatches_through_dataloader_workers(new_url: Callable[[], str]) -> None:
    from replaystore.loaders import make_loader

    url = new_url()
    store = open_store(url, frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    ref = fill(store, [(0, 6, True), (1, 4, True), (0, 9, False)], 2)
    loader = make_loader(store, UniformSampler(store, batch_size=8, stack=3, stack_padding="zero", seed=4,
                                               num_batches=4), num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert len(batches) == 4
    for batch in batches:
        check(batch, ref, 3, "zero")


def test_frames_codec_passes_through_or_is_refused() -> None:
    from replaystore.errors import SchemaError
    from replaystore.schemas import Dense

    assert frames((84, 84), 6, codec="zstd").field("frame").codec is not None  # type: ignore[union-attr]
    with pytest.raises(SchemaError, match="frame"):
        frames((84, 84), 6, codec="bogus")
    assert frames((84, 84), 6).field("frame") == Dense("frame", np.uint8, (84, 84), description=frames(
        (84, 84), 6).field("frame").description)  # type: ignore[union-attr]
