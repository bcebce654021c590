"""make_loader(transform=): applied where minibatches are gathered (main process, fork and spawn workers),
checked before workers start, its exceptions reaching the caller with their traceback; collate_fn refused."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import LoaderArgumentError, TransformError
from replaystore.loaders import HER, UniformSampler, make_loader
from replaystore.schemas import transitions
from replaystore.store import Store, open_store
from support.goalenv import distance_reward, double_reward, failing_transform, goal_store


def small_store(url: str) -> Store:
    st = open_store(url, transitions(4), mode="w+")
    with st.writer() as w:
        w.append({"obs": np.arange(80, dtype=np.float32).reshape(20, 4), "action": np.arange(20),
                  "reward": np.arange(20, dtype=np.float32), "next_obs": np.zeros((20, 4), np.float32),
                  "terminated": np.zeros(20, bool)})
        w.commit()
    return st


def batches(st: Store, workers: int = 0, transform: Any = None, **kw: Any) -> list[dict[str, Any]]:
    sampler = UniformSampler(st, batch_size=8, seed=0, num_batches=3)
    return list(make_loader(st, sampler, num_workers=workers, transform=transform, **kw))


def test_transform_runs_in_process_before_tensors(new_url: Callable[[], str]) -> None:
    """num_workers=0: the transform sees numpy arrays in this process; its output becomes tensors."""
    st = small_store(new_url())
    seen: list[type] = []

    def spy(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append(type(batch["reward"]))
        return double_reward(batch)

    plain, done = batches(st), batches(st, transform=spy)
    assert seen == [np.ndarray] * 3
    for p, d in zip(plain, done, strict=True):
        torch.testing.assert_close(d["reward"], p["reward"] * 2)
        assert isinstance(d["pid"], torch.Tensor) and (d["pid"] == os.getpid()).all()


def test_fork_workers_apply_the_transform(new_url: Callable[[], str]) -> None:
    """Fork workers run the transform (their pid), giving the in-process minibatches otherwise; a lambda is
    fine with fork (nothing is pickled)."""
    st = small_store(new_url())
    plain = batches(st)
    done = batches(st, 2, double_reward, multiprocessing_context="fork")
    for p, d in zip(plain, done, strict=True):
        torch.testing.assert_close(d["reward"], p["reward"] * 2)
        assert (d["pid"] != os.getpid()).all()
    lam = batches(st, 1, lambda b: {**b, "reward": b["reward"] + 1}, multiprocessing_context="fork")
    torch.testing.assert_close(lam[0]["reward"], plain[0]["reward"] + 1)


def test_spawn_worker_applies_her_then_the_transform(new_url: Callable[[], str]) -> None:
    """A spawn worker receives the pickled transform and HER's compute_reward: relabelled, then transformed,
    equal to the same pipeline in-process."""
    st, _ = goal_store(new_url(), seed=1)

    def run(workers: int) -> list[dict[str, Any]]:
        sampler = UniformSampler(st, batch_size=32, seed=4, num_batches=3,
                                 her=HER("future", 4, distance_reward, seed=5))
        kw = {"multiprocessing_context": "spawn"} if workers else {}
        return list(make_loader(st, sampler, num_workers=workers, transform=double_reward, **kw))

    local, spawned = run(0), run(1)
    for x, y in zip(local, spawned, strict=True):
        assert (y["pid"] != os.getpid()).all()
        for key in x.keys() - {"pid"}:
            torch.testing.assert_close(x[key], y[key])
        mask = x["her_goal_rows"] >= 0
        assert mask.any()
        torch.testing.assert_close(x["reward"][mask], 2 * torch.from_numpy(
            distance_reward(x["next_achieved_goal"][mask].numpy(), x["desired_goal"][mask].numpy(), None)))


def test_unpicklable_transform_is_refused_before_spawn_workers_start(new_url: Callable[[], str]) -> None:
    """A local function cannot reach spawn workers: a TransformError from make_loader itself, naming the fix."""
    st = small_store(new_url())
    sampler = UniformSampler(st, batch_size=8, seed=0, num_batches=1)
    with pytest.raises(TransformError, match="cannot be pickled for spawn workers.*module level"):
        make_loader(st, sampler, num_workers=1, transform=lambda b: b, multiprocessing_context="spawn")
    with pytest.raises(TransformError, match="callable"):
        make_loader(st, sampler, transform="double")


def test_exception_in_transform_reaches_the_caller_with_its_traceback(new_url: Callable[[], str]) -> None:
    """In-process and from a fork worker: a TransformError whose message holds the transform's traceback
    (the frame that raised, and the original exception)."""
    st = small_store(new_url())
    with pytest.raises(TransformError) as info:
        batches(st, transform=failing_transform)
    assert isinstance(info.value.__cause__, ValueError)
    assert "_inner_failure" in str(info.value) and "bad minibatch of 8 records" in str(info.value)
    with pytest.raises(TransformError) as info:
        batches(st, 1, failing_transform, multiprocessing_context="fork")
    text = str(info.value)
    assert "DataLoader worker process" in text and "_inner_failure" in text and "ValueError" in text
    with pytest.raises(TransformError, match="returned list"):
        batches(st, transform=lambda b: [b])


def test_collate_fn_is_a_typed_error_pointing_to_transform(new_url: Callable[[], str]) -> None:
    """torch's collate_fn (which make_loader sets itself) is refused with the way to do it instead."""
    st = small_store(new_url())
    sampler = UniformSampler(st, batch_size=8, seed=0, num_batches=1)
    with pytest.raises(LoaderArgumentError, match="transform=") as info:
        make_loader(st, sampler, collate_fn=lambda b: b)
    assert isinstance(info.value, TypeError)
    with pytest.raises(LoaderArgumentError, match="batch_size"):
        make_loader(st, sampler, batch_size=4)
