"""Episode / Rollout appends reject unknown items and keep ``truncated`` as given; steps outside
the format's range are rejected. Each bad append leaves the store exactly as it was."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from replaystore.errors import StepOrderError, StepRangeError, UnknownFieldError
from replaystore.schemas import episode, rollout, transitions
from replaystore.store.format.streamkeys import MAX_STEP
from support.batches import episode_batch, rollout_batch, transitions_batch
from support.storecheck import Backend, snapshot


def _seeded(backend: Backend, schema):  # a store holding one committed batch
    st = backend.open(schema, mode="w")
    return st


@pytest.mark.parametrize("extra", ["info", "rewards", "next_obs"])
def test_episode_with_unknown_item_is_rejected_store_unchanged(fast_backend: Backend, extra: str) -> None:
    rng = np.random.default_rng(0)
    st = _seeded(fast_backend, episode(4))
    with st.writer() as w:
        w.append(episode_batch(rng, 3), stream="a")
    before = snapshot(st)
    bad = {**asdict(episode_batch(rng, 3)), extra: np.zeros(3, dtype=np.float32)}
    with st.writer() as w:
        with pytest.raises(UnknownFieldError) as err:
            w.append(bad, stream="a")
        assert err.value.field == extra and extra in str(err.value)
        w.commit()
    st.refresh()
    assert snapshot(st) == before


def test_rollout_with_unknown_item_is_rejected_store_unchanged(fast_backend: Backend) -> None:
    rng = np.random.default_rng(1)
    st = _seeded(fast_backend, rollout(4))
    with st.writer() as w:
        w.append(rollout_batch(rng, 4, 2))
    before = snapshot(st)
    bad = {**asdict(rollout_batch(rng, 4, 2)), "dones": np.zeros((4, 2), dtype=bool)}
    with st.writer() as w:
        with pytest.raises(UnknownFieldError, match="dones") as err:
            w.append(bad)
        assert err.value.field == "dones"
        w.commit()
    st.refresh()
    assert snapshot(st) == before


@pytest.mark.parametrize(("terminated", "truncated"), [(False, False), (True, True), (False, True), (True, False)])
def test_episode_truncated_is_stored_as_given(fast_backend: Backend, terminated: bool, truncated: bool) -> None:
    rng = np.random.default_rng(2)
    st = _seeded(fast_backend, episode(4))
    ep = {**asdict(episode_batch(rng, 3, terminated=terminated)), "truncated": truncated}
    with st.writer() as w:
        w.append(ep, stream="a")
    got = st.read(st.rows("a")[0])
    assert got["terminated"].tolist() == [False, False, terminated]
    assert got["truncated"].tolist() == [False, False, truncated]


def test_episode_without_truncated_marks_unterminated_end_truncated(fast_backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st = _seeded(fast_backend, episode(4))
    with st.writer() as w:
        w.append(episode_batch(rng, 2, terminated=False), stream="a")
    assert st.read(st.rows("a")[0])["truncated"].tolist() == [False, True]


def test_rollout_truncated_is_stored_as_given(fast_backend: Backend) -> None:
    rng = np.random.default_rng(4)
    st = _seeded(fast_backend, rollout(4))
    r = rollout_batch(rng, 5, 3)
    r.truncated = rng.random((5, 3)) < 0.5
    r.terminated = rng.random((5, 3)) < 0.5  # both flags at once included
    with st.writer() as w:
        w.append(r)
    for b in range(3):
        got = st.read(st.rows(b)[0])
        assert got["truncated"].tolist() == r.truncated[:, b].tolist()
        assert got["terminated"].tolist() == r.terminated[:, b].tolist()


@pytest.mark.parametrize("step", [
    MAX_STEP - 1,  # scalar start: the batch's last steps run past the range
    np.array([MAX_STEP - 2, MAX_STEP - 1, MAX_STEP, MAX_STEP + 1], dtype=np.uint64),
    np.array([2**63, 2**63 + 1, 2**63 + 2, 2**63 + 3], dtype=np.uint64),  # would wrap negative
    np.array([-4, -3, -2, -1]),
    2**64,
])
def test_steps_outside_the_format_range_are_rejected(fast_backend: Backend, step) -> None:
    rng = np.random.default_rng(5)
    st = _seeded(fast_backend, transitions(4))
    with st.writer() as w:
        w.append(transitions_batch(rng, 2), stream="s", step=0)
    before = snapshot(st)
    with st.writer() as w:
        with pytest.raises(StepRangeError) as err:
            w.append(transitions_batch(rng, 4), stream="s", step=step)
        assert isinstance(err.value, StepOrderError) and err.value.field == "step"
        w.commit()
    st.refresh()
    assert snapshot(st) == before


def test_auto_steps_past_the_range_are_rejected(fast_backend: Backend) -> None:
    rng = np.random.default_rng(6)
    st = _seeded(fast_backend, transitions(4))
    with st.writer() as w:
        w.append(transitions_batch(rng, 2), stream="s", step=MAX_STEP - 1)  # the last two steps allowed
    before = snapshot(st)
    assert st.rows("s")[1].tolist() == [MAX_STEP - 1, MAX_STEP]
    with st.writer() as w:
        with pytest.raises(StepRangeError, match="step"):
            w.append(transitions_batch(rng, 1), stream="s")
        w.commit()
    st.refresh()
    assert snapshot(st) == before
