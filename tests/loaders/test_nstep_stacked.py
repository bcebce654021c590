"""n-step returns over stacked frames (``n_step=`` with ``stack=``) against windows built by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.loaders import gather
from replaystore.schemas import frames
from replaystore.store import open_store
from support.framesref import FRAME, SAMPLERS, Ref, fill, plans


def expected(ref: Ref, reward: np.ndarray, done: np.ndarray, row: int, n: int, gamma: float, k_stack: int,
             padding: str) -> tuple[float, int, np.ndarray, float, bool]:
    """``(reward, k, next_obs, discount, terminated)`` of the window starting at ``row``, by hand.

    The window extends while its last record is not terminal and the next record of the episode
    itself has a next frame (so the stack after the window's last record exists).
    """
    s, e, t = ref.where[row]
    rows = ref.episodes[(s, e)]
    k = 1
    while k < n and not done[rows[t + k - 1]] and t + k + 1 < len(rows):
        k += 1
    total = sum(gamma ** i * float(reward[rows[t + i]]) for i in range(k))
    last = rows[t + k - 1]
    _, nxt = ref.stacks(last, k_stack, padding)
    assert nxt is not None
    terminal = bool(done[last])
    return total, k, nxt, 0.0 if terminal else gamma ** k, terminal


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans, n=st.integers(1, 4), k_stack=st.integers(1, 3), padding=st.sampled_from(["reset", "zero"]),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]), seed=st.integers(0, 99))
def test_nstep_over_stacked_frames_matches_reference(kind: str, plan: list[tuple[int, int, bool]], n: int,
                                                    k_stack: int, padding: str, gamma: float, seed: int) -> None:
    store = open_store(f"memory://nstep-stacked/{kind}-{seed}-{n}-{k_stack}-{id(plan)}",
                       frames(FRAME, 4, frame_dtype=np.int32), mode="w+")
    ref = fill(store, plan, seed)
    if not ref.drawable():
        return
    every = store.default.read(np.arange(len(ref.where)), columns=["reward", "terminated"])
    make: Callable[..., Any] = SAMPLERS[kind]
    sampler = make(store, seed=seed, stack=k_stack, stack_padding=padding, n_step=n, gamma=gamma)
    for _ in range(3):
        batch = gather(store.default, sampler.sample())
        for i, row in enumerate(batch["indices"].tolist()):
            total, k, nxt, discount, terminal = expected(ref, every["reward"], every["terminated"], row, n, gamma,
                                                         k_stack, padding)
            obs, _ = ref.stacks(row, k_stack, padding)
            np.testing.assert_array_equal(batch["obs"][i].numpy(), obs)
            np.testing.assert_array_equal(batch["next_obs"][i].numpy(), nxt)
            assert int(batch["n"][i]) == k
            assert float(batch["reward"][i]) == pytest.approx(total, rel=1e-5, abs=1e-6)
            assert float(batch["discount"][i]) == pytest.approx(discount)
            assert bool(batch["terminated"][i]) == terminal
