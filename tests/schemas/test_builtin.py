"""Built-in schemas match the producers' batch formats, and realistic batches validate against them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replaystore.schemas import (
    BatchMeta,
    Columns,
    Dense,
    Ragged,
    Schema,
    deep_cfr_advantage,
    deep_cfr_strategy,
    dqn,
    episode,
    episode_columns,
    ppo,
    rollout,
    rollout_columns,
    transitions,
    validate_tables,
)
from replaystore.schemas.builtin import BUILTINS, EXAMPLE_ARGS
from support.batches import (
    BATCHES,
    AlphaZeroBatch,
    DeepCfrBatch,
    DqnBatch,
    PpoBatch,
    TreeStrapBatch,
    alphazero_batch,
    deep_cfr_batch,
    dqn_batch,
    episode_batch,
    ppo_batch,
    rollout_batch,
    transitions_batch,
    treestrap_batch,
)

F32, F64, I64, BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.bool_)

# The formats, written out: (name, kind, dtype, trailing shape or offsets name, id bound).
# Sizes are EXAMPLE_ARGS: observation_size=16, heads=2, actions=9.
EXPECTED: dict[str, list[tuple[str, str, Any, Any, int | None]]] = {
    "treestrap": [
        ("obs", "dense", F32, (16,), None),
        ("players", "dense", I64, (), None),
        ("targets", "dense", F64, (2, 9), None),
        ("masks", "dense", F32, (2,), None),
        ("telemetry", "meta", None, None, None),
    ],
    "dqn": [
        ("obs", "dense", F32, (16,), None),
        ("next_obs", "dense", F32, (16,), None),
        ("players", "dense", I64, (), None),
        ("actions", "dense", I64, (), 9),
        ("rewards", "dense", F64, (), None),
        ("dones", "dense", BOOL, (), None),
        ("can_bootstrap", "dense", BOOL, (), None),
        ("discounts", "dense", F64, (), None),
        ("masks", "dense", F32, (2,), None),
        ("legal_ids", "ragged", I64, "legal_offsets", 9),
        ("next_legal_ids", "ragged", I64, "next_legal_offsets", 9),
    ],
    "ppo": [
        ("obs", "dense", F32, (16,), None),
        ("players", "dense", I64, (), None),
        ("actions", "dense", I64, (), 9),
        ("behavior_log_probs", "dense", F64, (), None),
        ("advantages", "dense", F64, (), None),
        ("returns", "dense", F64, (), None),
        ("values", "dense", F64, (), None),
        ("legal_ids", "ragged", I64, "legal_offsets", 9),
        ("telemetry", "meta", None, None, None),
    ],
    "alphazero": [
        ("obs", "dense", F32, (16,), None),
        ("players", "dense", I64, (), None),
        ("policy_targets", "dense", F64, (9,), None),
        ("value_targets", "dense", F64, (), None),
        ("policy_weights", "dense", F64, (), None),
        ("legal_ids", "ragged", I64, "legal_offsets", 9),
    ],
    "deep_cfr_advantage": [
        ("advantage_obs", "dense", F32, (16,), None),
        ("advantage_iterations", "dense", I64, (), None),
        ("advantage_legal_ids", "ragged", I64, "advantage_legal_offsets", 9),
        ("advantage_targets", "ragged", F64, "advantage_legal_offsets", None),
        ("telemetry", "meta", None, None, None),
    ],
    "deep_cfr_strategy": [
        ("strategy_obs", "dense", F32, (16,), None),
        ("strategy_iterations", "dense", I64, (), None),
        ("strategy_players", "dense", I64, (), None),
        ("strategy_legal_ids", "ragged", I64, "strategy_legal_offsets", 9),
        ("strategy_probs", "ragged", F64, "strategy_legal_offsets", None),
        ("telemetry", "meta", None, None, None),
    ],
    # rl_mind containers (obs_shape=(16,), default dtypes, action count unknown)
    "transitions": [
        ("obs", "dense", F32, (16,), None),
        ("action", "dense", I64, (), None),
        ("reward", "dense", F32, (), None),
        ("next_obs", "dense", F32, (16,), None),
        ("terminated", "dense", BOOL, (), None),
    ],
    "episode": [
        ("obs", "dense", F32, (16,), None),
        ("action", "dense", I64, (), None),
        ("reward", "dense", F32, (), None),
        ("next_obs", "dense", F32, (16,), None),
        ("terminated", "dense", BOOL, (), None),
        ("truncated", "dense", BOOL, (), None),
    ],
    # one frame per record (frame_shape=(84, 84), actions=6)
    "frames": [
        ("frame", "dense", np.dtype(np.uint8), (84, 84), None),
        ("action", "dense", I64, (), 6),
        ("reward", "dense", F32, (), None),
        ("terminated", "dense", BOOL, (), None),
        ("truncated", "dense", BOOL, (), None),
    ],
}
EXPECTED["rollout"] = EXPECTED["episode"]

PRODUCER_BATCH = {
    "treestrap": TreeStrapBatch,
    "dqn": DqnBatch,
    "ppo": PpoBatch,
    "alphazero": AlphaZeroBatch,
}


def example(name: str, **overrides: Any) -> Schema:
    return BUILTINS[name](**{**EXAMPLE_ARGS[name], **overrides})


def test_there_are_ten_builtins_with_example_sizes() -> None:
    assert sorted(BUILTINS) == sorted(EXPECTED) == sorted(EXAMPLE_ARGS)
    assert len(BUILTINS) == 10
    for name, factory in BUILTINS.items():
        assert factory(**EXAMPLE_ARGS[name]).name == name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_fields_exactly_as_the_format_says(name: str) -> None:
    schema = example(name)
    actual = []
    for f in schema.fields:
        if isinstance(f, Dense):
            actual.append((f.name, "dense", f.dtype, f.shape, f.id_bound))
        elif isinstance(f, Ragged):
            actual.append((f.name, "ragged", f.dtype, f.offsets, f.id_bound))
        else:
            assert isinstance(f, BatchMeta)
            actual.append((f.name, "meta", None, None, None))
    assert actual == EXPECTED[name]
    for f in schema.fields:
        if isinstance(f, (Dense, Ragged)):
            assert f.dtype.isnative
            # every float field forbids NaN/inf; no other does
            assert f.finite is (f.dtype.kind == "f"), f.name
            assert f.description, f"{name}.{f.name} has no description"


@pytest.mark.parametrize("name", sorted(PRODUCER_BATCH))
def test_engine_batch_names_are_the_schema_input_names(name: str) -> None:
    # the producer's batch object carries exactly the schema's fields plus its CSR offsets arrays
    names = {f.name for f in dataclasses.fields(PRODUCER_BATCH[name])}
    assert names == set(example(name).input_names)


def test_deep_cfr_batch_splits_into_the_two_stream_schemas() -> None:
    adv, strat = example("deep_cfr_advantage"), example("deep_cfr_strategy")
    batch_names = {f.name for f in dataclasses.fields(DeepCfrBatch)}
    assert set(adv.input_names) | set(strat.input_names) == batch_names
    assert set(adv.input_names) & set(strat.input_names) == {"telemetry"}
    assert adv.offsets_groups == {"advantage_legal_offsets": ("advantage_legal_ids", "advantage_targets")}
    assert strat.offsets_groups == {"strategy_legal_offsets": ("strategy_legal_ids", "strategy_probs")}


def test_dtype_rules_hold_across_engine_builtins() -> None:
    for name in ("treestrap", "dqn", "ppo", "alphazero", "deep_cfr_advantage", "deep_cfr_strategy"):
        for f in example(name).fields:
            if isinstance(f, BatchMeta):
                continue
            if f.name == "obs" or f.name.endswith("_obs"):
                assert f.dtype == F32, f.name
            elif f.name == "masks":
                assert f.dtype == F32
            elif f.dtype.kind == "f":
                assert f.dtype == F64, f"{name}.{f.name}"
            elif f.dtype.kind in "iu":
                assert f.dtype == I64, f"{name}.{f.name}"
            else:
                assert f.dtype == BOOL and f.name in {"dones", "can_bootstrap"}


def test_action_count_is_optional_for_dqn_ppo_and_deep_cfr() -> None:
    for schema in (dqn(16, 2), ppo(16), deep_cfr_advantage(16), deep_cfr_strategy(16)):
        assert all(f.id_bound is None for f in schema.fields if not isinstance(f, BatchMeta))
        assert "actions" not in schema.metadata
    assert dqn(16, 2, actions=5).metadata == {"observation_size": 16, "heads": 2, "actions": 5}


def test_container_schemas_take_shapes_and_dtypes() -> None:
    schema = transitions((3, 4), action_shape=(2,), action_dtype=np.float32, obs_dtype=np.uint8,
                         reward_dtype=np.float64, actions=7)
    assert schema.field("obs").dtype == np.uint8 and schema.field("obs").shape == (3, 4)
    assert schema.field("next_obs").shape == (3, 4)
    action = schema.field("action")
    assert action.dtype == F32 and action.shape == (2,) and action.id_bound is None  # continuous actions
    assert schema.field("reward").dtype == F64
    discrete = episode(4, actions=7)
    assert discrete.field("obs").shape == (4,) and discrete.field("action").id_bound == 7
    assert discrete.metadata == {"actions": 7}


# -- realistic batches ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize("records", [0, 1, 17])
def test_every_factory_batch_validates(name: str, records: int) -> None:
    rng = np.random.default_rng(records)
    batch = BATCHES[name](rng, records)
    cols = example(name).validate(batch)
    assert isinstance(cols, Columns)
    assert len(cols) >= records
    for f in example(name).dense_fields:
        assert cols[f.name].shape == (len(cols), *f.shape)


def test_record_counts_are_floors() -> None:
    rng = np.random.default_rng(3)
    for make, name in [(treestrap_batch, "treestrap"), (dqn_batch, "dqn"), (ppo_batch, "ppo"),
                       (alphazero_batch, "alphazero")]:
        cols = example(name).validate(make(rng, 10, extra=5))
        assert len(cols) == 15  # more than asked for is a valid batch
        first = example(name).dense_fields[0].name
        assert len(cols[first]) == 15


def test_dqn_tails_cannot_bootstrap() -> None:
    rng = np.random.default_rng(11)
    batch = dqn_batch(rng, 300)
    cols = example("dqn").validate(batch)
    next_counts = np.diff(cols["next_legal_offsets"])
    tails = ~cols["can_bootstrap"]
    assert tails.sum() > 10 and (~tails).sum() > 10
    # the format's invariant: can_bootstrap exactly when the next legal slice is non-empty
    np.testing.assert_array_equal(cols["can_bootstrap"], next_counts > 0)
    assert (cols["discounts"][tails] == 0).all()
    assert (cols["discounts"][~tails] > 0).all() and (cols["discounts"] <= 1).all()
    # dones marks episode end, not the bootstrap rule: some tails are not done (truncations)
    assert cols["dones"][tails].any() and not cols["dones"][tails].all()
    assert not cols["dones"][~tails].any()
    # the chosen action is one of the record's current legal actions
    for i in range(len(cols)):
        lo, hi = cols["legal_offsets"][i], cols["legal_offsets"][i + 1]
        assert cols["actions"][i] in cols["legal_ids"][lo:hi]


def test_dqn_batch_of_only_tails() -> None:
    schema = example("dqn")
    n = 4
    batch = vars(dqn_batch(np.random.default_rng(0), n, extra=0))
    batch.update(can_bootstrap=np.zeros(n, bool), discounts=np.zeros(n), dones=np.ones(n, bool),
                 next_legal_ids=np.zeros(0, np.int64), next_legal_offsets=np.zeros(n + 1, np.int64))
    cols = schema.validate(batch)
    assert len(cols["next_legal_ids"]) == 0 and (cols["next_legal_offsets"] == 0).all()


def test_alphazero_value_only_rows() -> None:
    cols = example("alphazero").validate(alphazero_batch(np.random.default_rng(5), 30))
    counts = np.diff(cols["legal_offsets"])
    value_only = counts == 0
    assert value_only.sum() >= 10
    assert (cols["policy_weights"][value_only] == 0).all()
    assert (cols["policy_weights"][~value_only] == 1).all()
    assert (cols["policy_targets"][value_only] == 0).all()
    np.testing.assert_allclose(cols["policy_targets"][~value_only].sum(axis=1), 1.0)
    assert np.isfinite(cols["value_targets"]).all()


def test_deep_cfr_streams_of_different_sizes_split_into_two_tables() -> None:
    tables = {"advantage": example("deep_cfr_advantage"), "strategy": example("deep_cfr_strategy")}
    batch = deep_cfr_batch(np.random.default_rng(9), 23, 7, iteration=4)
    out = validate_tables(tables, batch)
    assert set(out) == {"advantage", "strategy"}
    adv, strat = out["advantage"], out["strategy"]
    assert (len(adv), len(strat)) == (23, 7)
    assert adv.schema is tables["advantage"] and strat.schema is tables["strategy"]
    assert set(adv.arrays) == {"advantage_obs", "advantage_iterations", "advantage_legal_ids",
                               "advantage_targets", "advantage_legal_offsets"}
    assert set(strat.arrays) == {"strategy_obs", "strategy_iterations", "strategy_players",
                                 "strategy_legal_ids", "strategy_probs", "strategy_legal_offsets"}
    # telemetry goes to every table that declares it
    assert adv.meta == strat.meta == {"telemetry": {"traversals": 8, "iteration": 4}}
    assert (adv["advantage_iterations"] == 4).all()
    np.testing.assert_allclose(np.add.reduceat(strat["strategy_probs"], strat["strategy_legal_offsets"][:-1]), 1.0)
    # zero-copy: the validated columns are the producer's arrays
    assert np.shares_memory(adv["advantage_targets"], batch.advantage_targets)


def test_deep_cfr_with_an_empty_stream() -> None:
    tables = {"advantage": example("deep_cfr_advantage"), "strategy": example("deep_cfr_strategy")}
    out = validate_tables(tables, deep_cfr_batch(np.random.default_rng(1), 6, 0))
    assert len(out["advantage"]) == 6 and len(out["strategy"]) == 0
    np.testing.assert_array_equal(out["strategy"]["strategy_legal_offsets"], [0])


# -- containers -------------------------------------------------------------------------


@pytest.mark.parametrize("terminated", [True, False])
def test_episode_columns_keep_all_t_plus_one_observations(terminated: bool) -> None:
    rng = np.random.default_rng(2)
    ep = episode_batch(rng, 8, obs_dim=4, actions=3, terminated=terminated)
    cols = episode_columns(episode(4, actions=3), ep)
    assert len(cols) == 8
    np.testing.assert_array_equal(cols["obs"], ep.obs)
    np.testing.assert_array_equal(cols["next_obs"][:-1], ep.obs[1:])
    np.testing.assert_array_equal(cols["next_obs"][-1], ep.final_obs)
    all_obs = np.concatenate([cols["obs"], cols["next_obs"][-1:]])  # s_0 .. s_T
    np.testing.assert_array_equal(all_obs[1:], cols["next_obs"])
    np.testing.assert_array_equal(cols["action"], ep.action)
    np.testing.assert_array_equal(cols["reward"], ep.reward)
    # the last step ends the episode: terminated, or truncated (to be bootstrapped), never both
    assert cols["terminated"].tolist() == [False] * 7 + [terminated]
    assert cols["truncated"].tolist() == [False] * 7 + [not terminated]


def test_single_step_episode() -> None:
    ep = episode_batch(np.random.default_rng(0), 1, terminated=False)
    cols = episode_columns(episode(4, actions=3), ep)
    assert len(cols) == 1
    np.testing.assert_array_equal(cols["next_obs"][0], ep.final_obs)
    assert cols["truncated"].tolist() == [True] and cols["terminated"].tolist() == [False]


def test_episode_from_torch_tensors() -> None:
    import torch

    ep = episode_batch(np.random.default_rng(4), 5)
    tensors = {"obs": torch.from_numpy(ep.obs), "action": torch.from_numpy(ep.action),
               "reward": torch.from_numpy(ep.reward), "final_obs": torch.from_numpy(ep.final_obs),
               "terminated": torch.tensor(True)}
    cols = episode_columns(episode(4, actions=3), tensors)
    np.testing.assert_array_equal(cols["next_obs"][-1], ep.final_obs)
    assert cols["terminated"][-1]


def test_rollout_columns_stream_major_with_reset_flags() -> None:
    rng = np.random.default_rng(6)
    steps, envs = 9, 4
    ro = rollout_batch(rng, steps, envs)
    ro.terminated[2, 1] = True  # make sure both kinds of boundary occur
    ro.truncated[2, 1] = False
    ro.truncated[5, 3] = True
    ro.terminated[5, 3] = False
    cols, t, b, reset = rollout_columns(rollout(4, actions=3), ro)
    assert (t, b) == (steps, envs) and len(cols) == steps * envs
    assert reset.dtype == np.bool_ and reset.shape == (steps * envs,)
    for slot in range(envs):
        for step in range(steps):
            r = slot * steps + step  # B streams of T records
            np.testing.assert_array_equal(cols["obs"][r], ro.obs[step, slot])
            np.testing.assert_array_equal(cols["next_obs"][r], ro.next_obs[step, slot])
            assert cols["action"][r] == ro.action[step, slot]
            assert cols["reward"][r] == ro.reward[step, slot]
            assert cols["terminated"][r] == ro.terminated[step, slot]
            assert cols["truncated"][r] == ro.truncated[step, slot]
            previous_done = step > 0 and (ro.terminated[step - 1, slot] or ro.truncated[step - 1, slot])
            assert reset[r] == previous_done
    assert reset[1 * steps + 3] and reset[3 * steps + 6]
    assert not reset[::steps].any()  # the first step of each slot continues whatever came before


def test_transitions_batch_validates_with_action_count() -> None:
    cols = transitions(4, actions=3).validate(transitions_batch(np.random.default_rng(0), 12))
    assert len(cols) == 12 and cols["action"].max() < 3


# -- custom schemas and metadata --------------------------------------------------------


def test_custom_schema_in_a_few_lines() -> None:
    schema = Schema("gridworld", [
        Dense("obs", np.float32, (8, 8)),
        Dense("action", np.int64, id_bound=4),
        Dense("reward", np.float32),
        Ragged("legal_ids", np.int64, offsets="legal_offsets", id_bound=4),
        BatchMeta("telemetry"),
    ], metadata={"env_id": "GridWorld-v0", "actions": 4})
    cols = schema.validate({
        "obs": np.zeros((2, 8, 8), np.float32),
        "action": np.array([1, 3]),
        "reward": np.array([0.0, 1.0], np.float32),
        "legal_ids": np.array([0, 1, 3]),
        "legal_offsets": np.array([0, 2, 3]),
        "telemetry": {"fps": 1200},
    })
    assert len(cols) == 2
    assert cols.ragged("legal_ids")[0].tolist() == [0, 1, 3]
    assert cols.meta == {"telemetry": {"fps": 1200}}
    assert schema.input_names == ("obs", "action", "reward", "legal_ids", "telemetry", "legal_offsets")
    assert schema.record_names == ("obs", "action", "reward", "legal_ids")
    assert [(s.name, s.role) for s in schema.zarr_layout()] == [
        ("obs", "dense"), ("action", "dense"), ("reward", "dense"),
        ("legal_offsets", "offsets"), ("legal_ids", "values")]


def test_batch_metadata_is_optional() -> None:
    items = vars(ppo_batch(np.random.default_rng(0), 3))
    del items["telemetry"]
    assert example("ppo").validate(items).meta == {"telemetry": {}}


METADATA = {
    "actions": 9,
    "action_frame": "encoder-head",
    "env_id": "LeducHoldem-v1",
    "observation": {"layout": "flat", "size": 16, "description": "one-hot cards, pot, history"},
    "producer": {"name": "rl-engine", "version": "3.2.1"},
}


def _rich_schema() -> Schema:
    return dqn(16, 2, actions=9, metadata=METADATA)


def test_metadata_is_kept_and_merged_with_sizes() -> None:
    schema = _rich_schema()
    assert schema.metadata == {"observation_size": 16, "heads": 2, **METADATA}
    assert "LeducHoldem-v1" in schema.describe()


def test_metadata_survives_json() -> None:
    schema = _rich_schema()
    back = Schema.from_json(schema.to_json())
    assert back == schema and back.metadata == schema.metadata
    assert json.loads(schema.to_json(indent=2))["metadata"]["producer"] == {"name": "rl-engine", "version": "3.2.1"}


def test_metadata_survives_arrow() -> None:
    schema = _rich_schema()
    back = Schema.from_arrow(schema.to_arrow())
    assert back == schema and back.metadata["observation"] == METADATA["observation"]


def test_metadata_and_data_survive_a_parquet_file(tmp_path: Path) -> None:
    schema = _rich_schema()
    cols = schema.validate(dqn_batch(np.random.default_rng(8), 25))
    path = tmp_path / "dqn.parquet"
    pq.write_table(pa.Table.from_batches([cols.to_arrow()]), path)
    table = pq.read_table(path)
    back = Schema.from_arrow(table.schema)
    assert back == schema
    assert back.metadata == schema.metadata
    assert back.metadata["action_frame"] == "encoder-head" and back.metadata["env_id"] == "LeducHoldem-v1"
    assert Schema.from_arrow(pq.read_schema(path)) == schema
    restored = Columns.from_arrow(back, table)
    assert len(restored) == len(cols)
    for name, arr in cols.arrays.items():
        assert restored[name].dtype == arr.dtype and restored[name].tobytes() == arr.tobytes(), name
