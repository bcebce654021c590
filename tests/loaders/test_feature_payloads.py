"""Features hand their work to the gather through one slot: ``Request.parts``, a payload per feature.

A request carries rows, the sampler's outputs, the sequence flag and stream keys, and the features' payloads
(small picklable arrays, never an index, a table or a user function); where the minibatch is gathered every
feature's worker half runs on it through ``Feature.apply``, in the sampler's feature order, the transform
last. A feature written outside the package goes through the same path, in spawn workers too.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any

import numpy as np
import pytest

from replaystore.loaders import Request, UniformSampler, make_loader
from replaystore.loaders.dataset import gather_arrays
from replaystore.loaders.feature import Feature
from replaystore.loaders.follow import EntryFollower
from replaystore.loaders.her import HER
from replaystore.store import Store, Table
from support.gridref import GAMMA, N_STEP, STACK, build, goal_reward


class _Recorder(pickle.Pickler):
    """Pickles like ``pickle.dumps`` and notes the type of every object pickled."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.types: set[type] = set()

    def persistent_id(self, obj: Any) -> None:
        self.types.add(type(obj))
        return None


def pickled_types(obj: Any) -> set[type]:
    rec = _Recorder()
    rec.dump(obj)
    return rec.types


@dataclasses.dataclass
class Scaled:
    """A payload that applies itself and reads its field itself (so the plain gather leaves it out)."""

    scale: float

    def reads(self) -> tuple[str, ...]:
        return ("reward",)

    def apply(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        assert "reward" not in batch and "obs" in batch  # left out of the plain read; after stacking
        batch["scaled_reward"] = table.read(batch["indices"], columns=["reward"])["reward"] * self.scale
        return batch


class Scaling(Feature):
    """A feature from outside the package: its payload is a ``Scaled``."""

    name = "scaling"

    def prepare(self, request: Request) -> None:
        request.parts[self.name] = Scaled(3.0)


def test_a_request_has_no_field_per_feature() -> None:
    assert [f.name for f in dataclasses.fields(Request)] == ["rows", "outputs", "sequence", "stream_keys", "parts"]


def test_payloads_are_small_arrays_without_indexes_tables_or_functions(tmp_path: Any) -> None:
    store, _, _ = build(str(tmp_path / "st"), later=False)
    stacked = UniformSampler(store, batch_size=16, seed=1, stack=STACK, n_step=N_STEP, gamma=GAMMA)
    relabelled = UniformSampler(store, batch_size=16, seed=1, her=HER("future", 4, compute_reward=goal_reward))
    for sampler, names in ((stacked, ["stack", "n_step"]), (relabelled, ["her"])):
        request = sampler.sample()
        assert list(request.parts) == names  # the sampler's feature order
        types = pickled_types(request)
        for kind in (Table, Store, EntryFollower, Feature, HER):
            assert not any(issubclass(t, kind) for t in types), (kind, types)
        assert not any(callable(v) for v in request.parts.values())
        assert len(pickle.dumps(request)) < 4096  # 16 rows: a few small arrays
    for sampler in (stacked, relabelled):  # what each worker gets once: the halves, no index either
        types = pickled_types(make_loader(store, sampler).dataset)
        assert not any(issubclass(t, (Table, Store, EntryFollower)) for t in types), types
    assert stacked.sample().parts["stack"].next_frames is not None  # n-step's next_obs stacks, read with obs
    her_request = relabelled.sample()
    assert her_request.parts["her"] is her_request.outputs["her_goal_rows"]  # pickled once


def test_her_relabels_only_through_its_worker_half(tmp_path: Any) -> None:
    """A request alone gathers stacks and n-step windows; HER's relabelling needs its half (the loader's)."""
    store, _, _ = build(str(tmp_path / "st"), later=False)
    sampler = UniformSampler(store, batch_size=64, seed=2, her=HER("final", 4, compute_reward=goal_reward))
    request = sampler.sample()
    goals = request.parts["her"]
    assert (goals >= 0).any()
    plain = gather_arrays(store.default, request)
    whole = gather_arrays(store.default, request, [f.worker() for f in sampler.features])
    np.testing.assert_array_equal(plain["her_goal_rows"], goals)
    want = sampler.her.relabel(store.default, dict(plain))
    for name in ("desired_goal", "next_desired_goal", "reward"):
        np.testing.assert_array_equal(whole[name], want[name])
    assert list(whole) == list(plain)
    relabelled = goals >= 0
    assert not np.array_equal(whole["desired_goal"][relabelled], plain["desired_goal"][relabelled])


@pytest.mark.parametrize("workers", [0, 1])
def test_a_feature_from_outside_goes_through_the_same_path(tmp_path: Any, workers: int) -> None:
    """A feature appended to a sampler's parts is prepared in the main process and applied where gathered
    (a spawn worker too), after stacking; the field its payload reads itself is not read by the gather."""
    url = str(tmp_path / "st")
    store, ref, _ = build(url, later=False)
    ref.follow(url)
    sampler = UniformSampler(store, batch_size=16, seed=3, num_batches=3, stack=STACK)
    sampler.features.append(Scaling())
    kw: dict[str, Any] = {"multiprocessing_context": "spawn"} if workers else {}
    batches = list(make_loader(store, sampler, num_workers=workers, **kw))
    assert len(batches) == 3
    for b in batches:
        rows = b["indices"].numpy()
        assert "reward" not in b and tuple(b["obs"].shape) == (16, STACK, 2)
        np.testing.assert_array_equal(b["scaled_reward"].numpy(), ref.col("reward", rows) * 3.0)
