"""Bad input: every mistake raises the exact typed error from replaystore.errors, naming the field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from replaystore.errors import (
    DeviceError,
    DTypeError,
    FieldError,
    IdRangeError,
    MetadataError,
    MissingFieldError,
    NonFiniteError,
    OffsetsError,
    RaggedAlignmentError,
    RecordCountError,
    ReplayStoreError,
    SchemaError,
    ShapeError,
    UnknownFieldError,
    ValidationError,
)
from replaystore.schemas import (
    BatchMeta,
    Columns,
    Dense,
    Ragged,
    Schema,
    alphazero,
    deep_cfr_advantage,
    deep_cfr_strategy,
    dqn,
    episode,
    episode_columns,
    ppo,
    rollout,
    rollout_columns,
    treestrap,
    validate_tables,
)
from support.batches import (
    alphazero_batch,
    deep_cfr_batch,
    dqn_batch,
    episode_batch,
    ppo_batch,
    rollout_batch,
    treestrap_batch,
)

OBS, HEADS, ACTIONS = 16, 2, 9


def raises(exc_type: type[Exception], field: str, fn: Any, *args: Any) -> FieldError:
    """Call ``fn(*args)``; it must raise exactly ``exc_type`` naming ``field``."""
    with pytest.raises(exc_type) as info:
        fn(*args)
    exc = info.value
    assert type(exc) is exc_type, f"expected exactly {exc_type.__name__}, got {type(exc).__name__}: {exc}"
    assert isinstance(exc, FieldError)
    assert exc.field == field
    assert f"'{field}'" in str(exc)
    return exc


def schema_error(fn: Any, *args: Any, names: str, **kwargs: Any) -> SchemaError:
    """Call ``fn(*args, **kwargs)``; it must raise exactly SchemaError, quoting ``names``."""
    with pytest.raises(SchemaError) as info:
        fn(*args, **kwargs)
    assert type(info.value) is SchemaError
    assert f"'{names}'" in str(info.value)
    return info.value


def snapshot(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in batch.items() if isinstance(v, np.ndarray)}


def assert_unchanged(batch: dict[str, Any], before: dict[str, np.ndarray]) -> None:
    for name, old in before.items():
        now = batch[name]
        assert now.dtype == old.dtype and now.shape == old.shape, name
        assert now.tobytes() == old.tobytes(), name


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


@pytest.fixture
def dqn_schema() -> Schema:
    return dqn(OBS, HEADS, actions=ACTIONS)


@pytest.fixture
def dqn_items(rng: np.random.Generator) -> dict[str, Any]:
    return dict(vars(dqn_batch(rng, 12, extra=0)))


@pytest.fixture
def adv_schema() -> Schema:
    return deep_cfr_advantage(OBS, actions=ACTIONS)


@pytest.fixture
def adv_items(rng: np.random.Generator) -> dict[str, Any]:
    b = deep_cfr_batch(rng, 10, 4)
    return {k: v for k, v in vars(b).items() if k.startswith("advantage_") or k == "telemetry"}


def test_errors_form_one_hierarchy() -> None:
    for exc in (MissingFieldError, UnknownFieldError, DTypeError, ShapeError, RecordCountError, OffsetsError,
                RaggedAlignmentError, IdRangeError, NonFiniteError, DeviceError, MetadataError):
        assert issubclass(exc, FieldError) and issubclass(exc, ValidationError)
        assert issubclass(exc, ReplayStoreError) and issubclass(exc, ValueError)
    assert issubclass(SchemaError, ReplayStoreError) and issubclass(SchemaError, ValueError)
    assert issubclass(DTypeError, TypeError)
    exc = DTypeError("obs", "dtype float32", "dtype float64", "no casts")
    assert (exc.field, exc.expected, exc.actual) == ("obs", "dtype float32", "dtype float64")
    assert str(exc) == "field 'obs': expected dtype float32, got dtype float64 (no casts)"


# -- field set ----------------------------------------------------------------------------


def test_missing_dense_field(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    del dqn_items["rewards"]
    raises(MissingFieldError, "rewards", dqn_schema.validate, dqn_items)


def test_missing_offsets_array(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    del dqn_items["next_legal_offsets"]
    raises(MissingFieldError, "next_legal_offsets", dqn_schema.validate, dqn_items)


def test_missing_field_of_attribute_object(rng: np.random.Generator) -> None:
    # a plain attribute object (not a mapping, not a dataclass) lacking one field
    obj = type("Obj", (), {})()
    obj.__dict__.update({k: v for k, v in vars(treestrap_batch(rng, 5)).items() if k != "masks"})
    raises(MissingFieldError, "masks", treestrap(OBS, HEADS, ACTIONS).validate, obj)


def test_unknown_field(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["reward"] = dqn_items["rewards"]  # a typo'd duplicate
    exc = raises(UnknownFieldError, "reward", dqn_schema.validate, dqn_items)
    assert "'dqn'" in str(exc)


def test_telemetry_on_a_schema_without_batch_metadata(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    # DqnBatch has no telemetry field; passing one is an unknown field, not silently dropped
    dqn_items["telemetry"] = {"fps": 10}
    raises(UnknownFieldError, "telemetry", dqn_schema.validate, dqn_items)


# -- dtypes -------------------------------------------------------------------------------


def test_float64_observations_are_not_cast(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["obs"] = dqn_items["obs"].astype(np.float64)
    before = snapshot(dqn_items)
    exc = raises(DTypeError, "obs", dqn_schema.validate, dqn_items)
    assert "float32" in str(exc) and "float64" in str(exc)
    assert_unchanged(dqn_items, before)


def test_int32_action_ids(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["actions"] = dqn_items["actions"].astype(np.int32)
    exc = raises(DTypeError, "actions", dqn_schema.validate, dqn_items)
    assert "int64" in str(exc) and "int32" in str(exc)


def test_int32_legal_ids(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["next_legal_ids"] = dqn_items["next_legal_ids"].astype(np.int32)
    raises(DTypeError, "next_legal_ids", dqn_schema.validate, dqn_items)


def test_big_endian_float32(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["next_obs"] = dqn_items["next_obs"].astype(">f4")
    exc = raises(DTypeError, "next_obs", dqn_schema.validate, dqn_items)
    assert ">f4" in str(exc)


def test_float32_targets_where_float64_expected(rng: np.random.Generator) -> None:
    items = vars(treestrap_batch(rng, 6))
    items["targets"] = items["targets"].astype(np.float32)
    raises(DTypeError, "targets", treestrap(OBS, HEADS, ACTIONS).validate, items)


def test_float64_masks_where_float32_expected(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["masks"] = dqn_items["masks"].astype(np.float64)
    raises(DTypeError, "masks", dqn_schema.validate, dqn_items)


def test_integer_flags_where_bool_expected(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["dones"] = dqn_items["dones"].astype(np.int64)
    raises(DTypeError, "dones", dqn_schema.validate, dqn_items)


def test_float_ragged_values_wrong_precision(adv_schema: Schema, adv_items: dict[str, Any]) -> None:
    adv_items["advantage_targets"] = adv_items["advantage_targets"].astype(np.float32)
    raises(DTypeError, "advantage_targets", adv_schema.validate, adv_items)


# -- shapes -------------------------------------------------------------------------------


def test_wrong_trailing_shape(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["obs"] = dqn_items["obs"][:, :-1].copy()
    exc = raises(ShapeError, "obs", dqn_schema.validate, dqn_items)
    assert "(records, 16)" in str(exc) and "(12, 15)" in str(exc)


def test_wrong_trailing_shape_multi_dim(rng: np.random.Generator) -> None:
    items = vars(treestrap_batch(rng, 6, extra=0))
    items["targets"] = np.zeros((6, ACTIONS, HEADS))  # heads and actions swapped
    exc = raises(ShapeError, "targets", treestrap(OBS, HEADS, ACTIONS).validate, items)
    assert "(records, 2, 9)" in str(exc)


@pytest.mark.parametrize("shape", [(12, 1), (), (1, 12)])
def test_wrong_ndim_scalar_field(dqn_schema: Schema, dqn_items: dict[str, Any], shape: tuple[int, ...]) -> None:
    dqn_items["rewards"] = np.zeros(shape)
    raises(ShapeError, "rewards", dqn_schema.validate, dqn_items)


def test_flattened_multi_dim_field(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["masks"] = dqn_items["masks"].reshape(-1)
    raises(ShapeError, "masks", dqn_schema.validate, dqn_items)


def test_two_dimensional_values_array(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["legal_ids"] = dqn_items["legal_ids"][:, None]
    exc = raises(ShapeError, "legal_ids", dqn_schema.validate, dqn_items)
    assert "1-D" in str(exc)


# -- record counts and CSR ----------------------------------------------------------------


def test_unequal_dense_record_counts(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["discounts"] = dqn_items["discounts"][:-1]
    exc = raises(RecordCountError, "discounts", dqn_schema.validate, dqn_items)
    assert "12 records" in str(exc) and "11 records" in str(exc)


def test_dense_and_offsets_disagree_on_record_count(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    # one more record's worth of offsets than there are dense rows: the offsets are the wrong length
    offs = dqn_items["legal_offsets"]
    dqn_items["legal_offsets"] = np.append(offs, offs[-1])
    exc = raises(OffsetsError, "legal_offsets", dqn_schema.validate, dqn_items)
    assert "length 13 (records + 1)" in str(exc)


def test_two_offsets_groups_disagree_without_dense_fields() -> None:
    schema = Schema("csr_only", [Ragged("a", np.int64, "a_offsets"), Ragged("b", np.int64, "b_offsets")])
    batch = {"a": np.arange(3), "a_offsets": np.array([0, 1, 3]),
             "b": np.arange(3), "b_offsets": np.array([0, 1, 2, 3])}
    raises(OffsetsError, "b_offsets", schema.validate, batch)


def test_offsets_not_starting_at_zero(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    offs = dqn_items["legal_offsets"].copy()
    offs[0] = 1
    dqn_items["legal_offsets"] = offs
    exc = raises(OffsetsError, "legal_offsets", dqn_schema.validate, dqn_items)
    assert "starting at 0" in str(exc)


def test_decreasing_offsets(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    offs = dqn_items["legal_offsets"].copy()
    offs[4] = offs[3] - 1  # record 3 ends before it starts; the last offset is unchanged
    dqn_items["legal_offsets"] = offs
    before = snapshot(dqn_items)
    exc = raises(OffsetsError, "legal_offsets", dqn_schema.validate, dqn_items)
    assert "non-decreasing" in str(exc)
    assert_unchanged(dqn_items, before)


def test_offsets_not_ending_at_values_length(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["legal_ids"] = dqn_items["legal_ids"][:-1]
    exc = raises(OffsetsError, "legal_offsets", dqn_schema.validate, dqn_items)
    assert "len(legal_ids)" in str(exc)


@pytest.mark.parametrize("offsets", [np.zeros(0, np.int64), np.zeros((), np.int64), np.zeros((13, 1), np.int64)],
                         ids=["empty", "0-d", "2-D"])
def test_offsets_of_wrong_shape(dqn_schema: Schema, dqn_items: dict[str, Any], offsets: np.ndarray) -> None:
    dqn_items["legal_offsets"] = offsets
    raises(OffsetsError, "legal_offsets", dqn_schema.validate, dqn_items)


def test_offsets_of_wrong_dtype(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["legal_offsets"] = dqn_items["legal_offsets"].astype(np.int32)
    exc = raises(DTypeError, "legal_offsets", dqn_schema.validate, dqn_items)
    assert "int64" in str(exc)


def test_unsigned_offsets_are_refused(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["next_legal_offsets"] = dqn_items["next_legal_offsets"].astype(np.uint64)
    raises(DTypeError, "next_legal_offsets", dqn_schema.validate, dqn_items)


def test_aligned_ragged_fields_differ_in_length(adv_schema: Schema, adv_items: dict[str, Any]) -> None:
    adv_items["advantage_targets"] = adv_items["advantage_targets"][:-2]
    exc = raises(RaggedAlignmentError, "advantage_targets", adv_schema.validate, adv_items)
    assert "'advantage_legal_ids'" in str(exc)


def test_aligned_strategy_probs_longer_than_ids(rng: np.random.Generator) -> None:
    b = vars(deep_cfr_batch(rng, 3, 6))
    items = {k: v for k, v in b.items() if k.startswith("strategy_") or k == "telemetry"}
    items["strategy_probs"] = np.append(items["strategy_probs"], 0.5)
    raises(RaggedAlignmentError, "strategy_probs", deep_cfr_strategy(OBS, actions=ACTIONS).validate, items)


# -- id ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, ACTIONS, ACTIONS + 100])
def test_dense_action_id_out_of_range(dqn_schema: Schema, dqn_items: dict[str, Any], bad: int) -> None:
    actions = dqn_items["actions"].copy()
    actions[5] = bad
    dqn_items["actions"] = actions
    exc = raises(IdRangeError, "actions", dqn_schema.validate, dqn_items)
    assert "[0, 9)" in str(exc) and f"{bad} at index 5" in str(exc)


@pytest.mark.parametrize("name", ["legal_ids", "next_legal_ids"])
@pytest.mark.parametrize("bad", [-3, ACTIONS])
def test_csr_legal_id_out_of_range(dqn_schema: Schema, dqn_items: dict[str, Any], name: str, bad: int) -> None:
    ids = dqn_items[name].copy()
    ids[-1] = bad
    dqn_items[name] = ids
    raises(IdRangeError, name, dqn_schema.validate, dqn_items)


def test_ppo_action_id_out_of_range(rng: np.random.Generator) -> None:
    items = vars(ppo_batch(rng, 8))
    items["actions"] = items["actions"] + ACTIONS
    raises(IdRangeError, "actions", ppo(OBS, actions=ACTIONS).validate, items)


def test_alphazero_legal_ids_checked_against_action_count(rng: np.random.Generator) -> None:
    items = vars(alphazero_batch(rng, 8))
    schema = alphazero(OBS, actions=5)  # the batch was made with 9 actions
    items["policy_targets"] = items["policy_targets"][:, :5].copy()
    raises(IdRangeError, "legal_ids", schema.validate, items)


def test_ids_unchecked_when_action_count_unknown(dqn_items: dict[str, Any]) -> None:
    dqn_items["actions"] = dqn_items["actions"] + 1000
    cols = dqn(OBS, HEADS).validate(dqn_items)  # no actions=: no bound known, nothing to check
    assert cols["actions"].min() >= 1000


# -- finiteness ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_observation(dqn_schema: Schema, dqn_items: dict[str, Any], value: float) -> None:
    obs = dqn_items["obs"].copy()
    obs[7, 3] = value
    dqn_items["obs"] = obs
    exc = raises(NonFiniteError, "obs", dqn_schema.validate, dqn_items)
    assert "at index 7" in str(exc)


def test_inf_reward(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    rewards = dqn_items["rewards"].copy()
    rewards[0] = np.inf
    dqn_items["rewards"] = rewards
    before = snapshot(dqn_items)
    raises(NonFiniteError, "rewards", dqn_schema.validate, dqn_items)
    assert_unchanged(dqn_items, before)


def test_nan_in_ragged_advantage_targets(adv_schema: Schema, adv_items: dict[str, Any]) -> None:
    targets = adv_items["advantage_targets"].copy()
    targets[4] = np.nan
    adv_items["advantage_targets"] = targets
    exc = raises(NonFiniteError, "advantage_targets", adv_schema.validate, adv_items)
    assert "at index 4" in str(exc)


def test_nan_in_multi_dim_targets_and_masks(rng: np.random.Generator) -> None:
    schema = treestrap(OBS, HEADS, ACTIONS)
    items = vars(treestrap_batch(rng, 6))
    items["targets"] = items["targets"].copy()
    items["targets"][2, 1, 8] = np.nan
    raises(NonFiniteError, "targets", schema.validate, items)
    items = vars(treestrap_batch(rng, 6))
    items["masks"] = items["masks"].copy()
    items["masks"][0, 0] = np.nan
    raises(NonFiniteError, "masks", schema.validate, items)


def test_nan_allowed_where_field_is_declared_finite_false() -> None:
    schema = Schema("probe", [
        Dense("q", np.float32, (2,), finite=False),
        Dense("r", np.float64),
        Ragged("log_probs", np.float64, "lp_offsets", finite=False),
    ])
    assert schema.field("r").finite is True and schema.field("q").finite is False
    batch = {"q": np.array([[np.nan, 1.0], [np.inf, -np.inf]], np.float32), "r": np.zeros(2),
             "log_probs": np.array([-np.inf, np.nan, 0.0]), "lp_offsets": np.array([0, 2, 3])}
    cols = schema.validate(batch)
    assert np.isnan(cols["q"][0, 0]) and np.isposinf(cols["q"][1, 0]) and np.isnan(cols["log_probs"][1])
    batch["r"] = np.array([0.0, np.nan])
    raises(NonFiniteError, "r", schema.validate, batch)


# -- array types and devices -------------------------------------------------------------


def test_python_list_instead_of_array(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["rewards"] = dqn_items["rewards"].tolist()
    exc = raises(DTypeError, "rewards", dqn_schema.validate, dqn_items)
    assert "list" in str(exc)


def test_torch_bfloat16_tensor(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["obs"] = torch.from_numpy(dqn_items["obs"]).to(torch.bfloat16)
    exc = raises(DTypeError, "obs", dqn_schema.validate, dqn_items)
    assert "bfloat16" in str(exc)


def test_torch_float64_tensor_is_not_cast(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["masks"] = torch.from_numpy(dqn_items["masks"].astype(np.float64))
    raises(DTypeError, "masks", dqn_schema.validate, dqn_items)


def test_tensor_on_another_device(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    # a "meta" tensor is a real non-CPU device, standing in for CUDA
    dqn_items["obs"] = torch.empty((12, OBS), dtype=torch.float32, device="meta")
    exc = raises(DeviceError, "obs", dqn_schema.validate, dqn_items)
    assert "meta" in str(exc) and ".cpu()" in str(exc)


def test_offsets_tensor_on_another_device(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    dqn_items["legal_offsets"] = torch.empty(13, dtype=torch.int64, device="meta")
    raises(DeviceError, "legal_offsets", dqn_schema.validate, dqn_items)


def test_non_contiguous_cpu_tensor_is_accepted(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    expected_obs = dqn_items["obs"].copy()
    transposed = torch.from_numpy(np.ascontiguousarray(expected_obs.T)).T  # same values, column-major
    assert not transposed.is_contiguous()
    every_other = torch.from_numpy(np.repeat(dqn_items["rewards"], 2))[::2]
    assert not every_other.is_contiguous()
    dqn_items["obs"], dqn_items["rewards"] = transposed, every_other
    dqn_items["actions"] = torch.from_numpy(dqn_items["actions"])  # contiguous tensors pass straight through
    cols = dqn_schema.validate(dqn_items)
    assert cols["obs"].flags.c_contiguous and cols["rewards"].flags.c_contiguous
    assert cols["obs"].tobytes() == expected_obs.tobytes()
    np.testing.assert_array_equal(cols["rewards"], every_other.numpy())
    assert np.shares_memory(cols["actions"], dqn_items["actions"].numpy())


def test_requires_grad_tensor_is_read(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    rewards = torch.from_numpy(dqn_items["rewards"].copy()).requires_grad_()
    dqn_items["rewards"] = rewards
    cols = dqn_schema.validate(dqn_items)
    np.testing.assert_array_equal(cols["rewards"], rewards.detach().numpy())


# -- batch metadata -----------------------------------------------------------------------


@pytest.mark.parametrize("telemetry", [[("fps", 1)], "fps=1", 3.0], ids=["list", "str", "float"])
def test_telemetry_not_a_mapping(rng: np.random.Generator, telemetry: Any) -> None:
    items = vars(ppo_batch(rng, 4))
    items["telemetry"] = telemetry
    raises(MetadataError, "telemetry", ppo(OBS, actions=ACTIONS).validate, items)


@pytest.mark.parametrize("value", [{1, 2}, np.arange(3), object(), float("nan")],
                         ids=["set", "ndarray", "object", "nan"])
def test_telemetry_with_non_json_value(rng: np.random.Generator, value: Any) -> None:
    items = vars(ppo_batch(rng, 4))
    items["telemetry"] = {"fps": 1200, "bad": value}
    raises(MetadataError, "telemetry", ppo(OBS, actions=ACTIONS).validate, items)


def test_telemetry_numpy_scalars_become_json_numbers(rng: np.random.Generator) -> None:
    items = vars(ppo_batch(rng, 4))
    items["telemetry"] = {"fps": np.float32(1.5), "games": np.int64(4), "ok": np.bool_(True)}
    cols = ppo(OBS, actions=ACTIONS).validate(items)
    assert cols.meta == {"telemetry": {"fps": 1.5, "games": 4, "ok": True}}
    assert type(cols.meta["telemetry"]["games"]) is int


# -- schema definitions -------------------------------------------------------------------


def test_schema_duplicate_field_names() -> None:
    schema_error(Schema, "x", [Dense("a", np.float32), Dense("a", np.int64)], names="a")


def test_schema_field_and_batch_meta_share_a_name() -> None:
    schema_error(Schema, "x", [Dense("telemetry", np.float32), BatchMeta("telemetry")], names="telemetry")


@pytest.mark.parametrize("dtype", [object, str, np.complex64, "datetime64[ns]", "V8"])
def test_schema_bad_dtype(dtype: Any) -> None:
    schema_error(Dense, "a", dtype, names="a")
    schema_error(Ragged, "r", dtype, "r_offsets", names="r")


def test_schema_unparseable_dtype() -> None:
    schema_error(Dense, "a", "not-a-dtype", names="a")


@pytest.mark.parametrize("shape", [(-1,), (0,), (3, -2), (2.5,)])
def test_schema_non_positive_shape(shape: tuple[Any, ...]) -> None:
    schema_error(Dense, "a", np.float32, shape, names="a")


def test_schema_offsets_clash_with_field_name() -> None:
    schema_error(Schema, "x", [Dense("legal_offsets", np.int64), Ragged("legal_ids", np.int64, "legal_offsets")],
                 names="legal_offsets")
    schema_error(Ragged, "ids", np.int64, "ids", names="ids")


def test_schema_id_bound_on_float_field() -> None:
    schema_error(Dense, "q", np.float32, (), None, 4, names="q")
    schema_error(Ragged, "p", np.float64, "p_offsets", id_bound=4, names="p")


@pytest.mark.parametrize("bound", [0, -5, 2.0])
def test_schema_id_bound_not_a_positive_int(bound: Any) -> None:
    schema_error(Dense, "a", np.int64, id_bound=bound, names="a")


@pytest.mark.parametrize("name", ["_private", "__dunder", "has space", "1st", "class", ""])
def test_schema_bad_field_names(name: str) -> None:
    schema_error(Dense, name, np.float32, names=name)


def test_schema_bad_offsets_name() -> None:
    schema_error(Ragged, "ids", np.int64, "_offsets", names="_offsets")


def test_schema_needs_a_record_field_and_valid_header() -> None:
    with pytest.raises(SchemaError, match="at least one dense or ragged"):
        Schema("only_meta", [BatchMeta("telemetry")])
    with pytest.raises(SchemaError, match="schema name"):
        Schema("", [Dense("a", np.float32)])
    with pytest.raises(SchemaError, match="schema version"):
        Schema("x", [Dense("a", np.float32)], version=0)
    with pytest.raises(SchemaError, match="not a Dense, Ragged or BatchMeta"):
        Schema("x", [("a", np.float32)])  # type: ignore[list-item]


def test_schema_metadata_must_be_json() -> None:
    with pytest.raises(SchemaError, match="JSON-serialisable"):
        Schema("x", [Dense("a", np.float32)], metadata={"actions": np.arange(3)})
    with pytest.raises(SchemaError, match="mapping"):
        Schema("x", [Dense("a", np.float32)], metadata=[("actions", 3)])  # type: ignore[arg-type]


def test_malformed_schema_documents() -> None:
    good = dqn(OBS, HEADS, actions=ACTIONS).to_dict()
    with pytest.raises(SchemaError, match="does not parse"):
        Schema.from_json("{not json")
    with pytest.raises(SchemaError, match="not a replaystore schema"):
        Schema.from_dict({**good, "format": "something/9"})
    with pytest.raises(SchemaError, match="malformed"):
        Schema.from_dict({k: v for k, v in good.items() if k != "fields"})
    bad_kind = {**good, "fields": [{**good["fields"][0], "kind": "sparse"}]}
    with pytest.raises(SchemaError, match="unknown kind 'sparse'"):
        Schema.from_dict(bad_kind)


def test_field_lookup_of_unknown_name() -> None:
    schema_error(dqn(OBS, HEADS).field, "reward", names="reward")


# -- several tables -----------------------------------------------------------------------


def deep_cfr_tables() -> dict[str, Schema]:
    return {"advantage": deep_cfr_advantage(OBS, actions=ACTIONS), "strategy": deep_cfr_strategy(OBS, actions=ACTIONS)}


def test_validate_tables_field_no_table_claims(rng: np.random.Generator) -> None:
    items = vars(deep_cfr_batch(rng, 5, 3))
    items["exploitability"] = np.zeros(5)
    tables = deep_cfr_tables()
    exc = raises(UnknownFieldError, "exploitability", validate_tables, tables, items)
    assert "'advantage'" in str(exc) and "'strategy'" in str(exc)


def test_validate_tables_missing_field_of_one_table(rng: np.random.Generator) -> None:
    items = vars(deep_cfr_batch(rng, 5, 3))
    del items["strategy_players"]
    tables = deep_cfr_tables()
    raises(MissingFieldError, "strategy_players", validate_tables, tables, items)


def test_validate_tables_reports_errors_of_either_stream(rng: np.random.Generator) -> None:
    items = vars(deep_cfr_batch(rng, 5, 3))
    items["strategy_probs"] = items["strategy_probs"].copy()
    items["strategy_probs"][0] = np.nan
    tables = deep_cfr_tables()
    raises(NonFiniteError, "strategy_probs", validate_tables, tables, items)


# -- containers ---------------------------------------------------------------------------


def test_episode_final_obs_of_wrong_shape_and_dtype(rng: np.random.Generator) -> None:
    schema = episode(4, actions=3)
    ep = episode_batch(rng, 5)
    ep.final_obs = np.zeros(5, np.float32)
    raises(ShapeError, "final_obs", episode_columns, schema, ep)
    ep.final_obs = np.zeros(4, np.float64)
    raises(DTypeError, "final_obs", episode_columns, schema, ep)


def test_episode_terminated_must_be_a_bool(rng: np.random.Generator) -> None:
    ep = episode_batch(rng, 5)
    ep.terminated = np.array([True, False])
    raises(DTypeError, "terminated", episode_columns, episode(4, actions=3), ep)
    ep.terminated = 1
    raises(DTypeError, "terminated", episode_columns, episode(4, actions=3), ep)


def test_episode_without_steps_or_fields(rng: np.random.Generator) -> None:
    ep = episode_batch(rng, 5)
    ep.obs = np.zeros((0, 4), np.float32)
    raises(ShapeError, "obs", episode_columns, episode(4, actions=3), ep)
    raises(MissingFieldError, "final_obs", episode_columns, episode(4, actions=3),
           {"obs": ep.obs, "action": ep.action, "reward": ep.reward, "terminated": True})


def test_episode_action_out_of_range(rng: np.random.Generator) -> None:
    ep = episode_batch(rng, 5, actions=3)
    ep.action = ep.action + 3
    raises(IdRangeError, "action", episode_columns, episode(4, actions=3), ep)


def test_rollout_leading_shapes_must_agree(rng: np.random.Generator) -> None:
    ro = rollout_batch(rng, 6, 3)
    ro.reward = ro.reward[:, :2]
    raises(ShapeError, "reward", rollout_columns, rollout(4, actions=3), ro)
    ro = rollout_batch(rng, 6, 3)
    ro.obs = ro.obs[:, 0, 0]
    raises(ShapeError, "obs", rollout_columns, rollout(4, actions=3), ro)


def test_rollout_missing_truncated(rng: np.random.Generator) -> None:
    ro = vars(rollout_batch(rng, 6, 3))
    del ro["truncated"]
    raises(MissingFieldError, "truncated", rollout_columns, rollout(4, actions=3), ro)


# -- Arrow input --------------------------------------------------------------------------


def test_arrow_column_with_nulls(dqn_schema: Schema, dqn_items: dict[str, Any]) -> None:
    batch = dqn_schema.validate(dqn_items).to_arrow()
    i = batch.schema.get_field_index("rewards")
    rewards = pa.array([None, *batch.column(i).to_pylist()[1:]], type=pa.float64())
    holed = batch.set_column(i, batch.schema.field(i), rewards)
    with pytest.raises(SchemaError, match="'rewards'"):
        Columns.from_arrow(dqn_schema, holed)


def test_arrow_schema_missing_a_column() -> None:
    schema = dqn(OBS, HEADS, actions=ACTIONS)
    arrow = schema.to_arrow()
    with pytest.raises(SchemaError, match="next_obs"):
        Schema.from_arrow(arrow.remove(arrow.get_field_index("next_obs")))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16])
@pytest.mark.parametrize("bound", [1, 100, 127, 128, 200, 255])
def test_id_range_checked_exactly_for_every_integer_width(dtype: type, bound: int) -> None:
    """The one-reduction range check (negatives read as unsigned) and its fallback for bounds
    beyond the signed half agree with a plain comparison at each width's edges and the bound's."""
    schema = Schema("ids", [Dense("a", dtype, id_bound=bound)])
    info = np.iinfo(dtype)
    for v in sorted(x for x in {info.min, -100, -1, 0, bound - 1, bound, info.max} if info.min <= x <= info.max):
        values = np.zeros(4, dtype=dtype)
        values[2] = v
        if 0 <= v < bound:
            assert schema.validate({"a": values})["a"][2] == v
        else:
            exc = raises(IdRangeError, "a", schema.validate, {"a": values})
            assert f"{v} at index 2" in str(exc)
