"""Round trips: schema <-> JSON / Arrow, batch -> Arrow -> Columns (bit-identical, zero-copy), take, dense_mask."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from replaystore.schemas import (
    BatchMeta,
    Columns,
    Dense,
    Ragged,
    Schema,
    dense_mask,
    episode,
    episode_columns,
    gather_csr,
    rollout,
    rollout_columns,
)
from replaystore.schemas.arrow import FIELD_KEY, META_KEY, SCHEMA_KEY
from replaystore.schemas.builtin import BUILTINS, EXAMPLE_ARGS
from support.batches import BATCHES, dqn_batch, episode_batch, ppo_batch, rollout_batch


def example(name: str) -> Schema:
    return BUILTINS[name](**EXAMPLE_ARGS[name])


def assert_bit_identical(a: Columns, b: Columns) -> None:
    assert a.schema == b.schema
    assert len(a) == len(b)
    assert set(a.arrays) == set(b.arrays)
    for name in a.arrays:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name
    assert dict(a.meta) == dict(b.meta)


def example_columns(name: str, rng: np.random.Generator, records: int) -> Columns:
    schema = example(name)
    if name == "episode":
        return episode_columns(schema, episode_batch(rng, max(records, 1), obs_dim=16, actions=9))
    if name == "rollout":
        return rollout_columns(schema, rollout_batch(rng, 5, 3, obs_dim=16, actions=9))[0]
    return schema.validate(BATCHES[name](rng, records))


# -- schema round trips -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_schema_json_round_trip(name: str) -> None:
    schema = example(name)
    text = schema.to_json()
    back = Schema.from_json(text)
    assert back == schema
    assert back.to_dict() == schema.to_dict() == json.loads(text)
    assert back.fields == schema.fields  # field dataclasses compare equal too
    assert Schema.from_json(schema.to_json(indent=2).encode()) == schema


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_schema_arrow_round_trip(name: str) -> None:
    schema = example(name)
    arrow = schema.to_arrow()
    assert arrow.names == list(schema.record_names)  # batch metadata is not a column
    assert json.loads(arrow.metadata[SCHEMA_KEY]) == schema.to_dict()
    for af in arrow:
        assert not af.nullable
        assert json.loads(af.metadata[FIELD_KEY])["name"] == af.name
    back = Schema.from_arrow(arrow)
    assert back == schema and back.fields == schema.fields


def test_schema_inequality() -> None:
    a = example("dqn")
    assert a != BUILTINS["dqn"](observation_size=16, heads=3, actions=9)
    assert a != BUILTINS["dqn"](observation_size=16, heads=2)
    assert a != Schema("dqn", a.fields, version=2, metadata=a.metadata)
    assert a != Schema("dqn", a.fields, metadata={**a.metadata, "env_id": "x"})
    assert a.__eq__("dqn") is NotImplemented


def test_schema_json_round_trip_of_custom_options() -> None:
    schema = Schema("custom", [
        Dense("img", np.uint8, (3, 4, 5), description="pixels"),
        Dense("q", np.float16, (2,), finite=False),
        Dense("cont", np.float32, finite=True),
        Dense("flag", np.bool_),
        Dense("id", np.uint16, id_bound=1000),
        Ragged("ids", np.int32, "off", id_bound=7),
        Ragged("w", np.float64, "off", finite=False),
        BatchMeta("notes", description="free text"),
    ], version=3, metadata={"producer": {"version": "0.1"}})
    for back in (Schema.from_json(schema.to_json()), Schema.from_arrow(schema.to_arrow())):
        assert back == schema
        assert back.version == 3
        assert back.field("q").finite is False and back.field("id").id_bound == 1000
        assert back.field("notes").description == "free text"
        assert back.offsets_groups == {"off": ("ids", "w")}


def test_big_endian_schema_dtype_is_normalised() -> None:
    f = Dense("x", np.dtype(">f4"))
    assert f.dtype == np.float32 and f.dtype.isnative


# -- Arrow mapping --------------------------------------------------------------------------


def test_arrow_types() -> None:
    arrow = example("treestrap").to_arrow()
    assert arrow.field("obs").type == pa.list_(pa.float32(), 16)
    assert arrow.field("players").type == pa.int64()
    # (records, heads, actions): a fixed-size list of heads, each a fixed-size list of actions
    assert arrow.field("targets").type == pa.list_(pa.list_(pa.float64(), 9), 2)
    assert arrow.field("masks").type == pa.list_(pa.float32(), 2)
    dqn = example("dqn").to_arrow()
    assert dqn.field("legal_ids").type == pa.large_list(pa.int64())
    assert dqn.field("dones").type == pa.bool_()
    adv = example("deep_cfr_advantage").to_arrow()
    assert adv.field("advantage_targets").type == pa.large_list(pa.float64())
    assert "advantage_legal_offsets" not in adv.names  # offsets live inside the list columns


def test_schema_inferred_from_plain_arrow() -> None:
    arrow = pa.schema([pa.field("frame", pa.list_(pa.list_(pa.uint8(), 4), 3)),
                       pa.field("reward", pa.float32()),
                       pa.field("legal", pa.large_list(pa.int64())),
                       pa.field("tags", pa.list_(pa.int16()))])
    schema = Schema.from_arrow(arrow, name="plain")
    assert schema.name == "plain"
    assert schema.field("frame") == Dense("frame", np.uint8, (3, 4))
    assert schema.field("reward") == Dense("reward", np.float32)
    assert schema.field("legal") == Ragged("legal", np.int64, "legal_offsets")
    assert schema.field("tags") == Ragged("tags", np.int16, "tags_offsets")


@pytest.mark.parametrize("name", sorted(BUILTINS))
@pytest.mark.parametrize("records", [0, 1, 13])
def test_batch_arrow_columns_bit_identical(name: str, records: int) -> None:
    cols = example_columns(name, np.random.default_rng(records + 100), records)
    batch = cols.to_arrow()
    assert isinstance(batch, pa.RecordBatch)
    assert batch.num_rows == len(cols)
    assert batch.schema.names == list(cols.schema.record_names)
    back = Columns.from_arrow(cols.schema, batch)
    assert_bit_identical(cols, back)
    # Arrow's own view of each row agrees with the CSR slices
    for f in cols.schema.ragged_fields:
        values, offsets = cols.ragged(f.name)
        as_lists = batch.column(f.name).to_pylist()
        assert as_lists == [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(cols))]
    for f in cols.schema.dense_fields:
        assert np.array(batch.column(f.name).to_pylist(), dtype=f.dtype).reshape(cols[f.name].shape).tobytes() \
            == cols[f.name].tobytes()


def test_batch_metadata_travels_in_arrow_schema_metadata() -> None:
    cols = example("ppo").validate(ppo_batch(np.random.default_rng(0), 4))
    batch = cols.to_arrow()
    assert json.loads(batch.schema.metadata[META_KEY]) == {"telemetry": {"window": 1, "games": 4}}
    assert Columns.from_arrow(cols.schema, batch).meta == cols.meta


def test_ragged_values_and_offsets_are_not_copied_into_arrow() -> None:
    cols = example("dqn").validate(dqn_batch(np.random.default_rng(1), 40))
    batch = cols.to_arrow()
    for name, off in (("legal_ids", "legal_offsets"), ("next_legal_ids", "next_legal_offsets")):
        col = batch.column(name)
        assert isinstance(col, pa.LargeListArray)
        assert col.values.buffers()[1].address == cols[name].ctypes.data
        assert col.offsets.buffers()[1].address == cols[off].ctypes.data
    assert batch.column("obs").values.buffers()[1].address == cols["obs"].ctypes.data
    assert batch.column("rewards").buffers()[1].address == cols["rewards"].ctypes.data


def test_aligned_ragged_fields_share_one_offsets_buffer() -> None:
    cols = example("deep_cfr_advantage").validate(BATCHES["deep_cfr_advantage"](np.random.default_rng(2), 9))
    batch = cols.to_arrow()
    ids, targets = batch.column("advantage_legal_ids"), batch.column("advantage_targets")
    address = cols["advantage_legal_offsets"].ctypes.data
    assert ids.offsets.buffers()[1].address == targets.offsets.buffers()[1].address == address
    assert targets.values.buffers()[1].address == cols["advantage_targets"].ctypes.data


def test_validation_does_not_copy_contiguous_arrays() -> None:
    batch = dqn_batch(np.random.default_rng(3), 10)
    cols = example("dqn").validate(batch)
    for name, arr in cols.arrays.items():
        assert arr.ctypes.data == getattr(batch, name).ctypes.data, name


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_columns_from_arrow_share_arrow_memory(name: str) -> None:
    cols = example_columns(name, np.random.default_rng(7), 11)
    batch = cols.to_arrow()
    back = Columns.from_arrow(cols.schema, batch)
    for f in cols.schema.fields:
        if isinstance(f, BatchMeta):
            continue
        col = batch.column(f.name)
        if isinstance(f, Dense):
            if f.dtype == np.bool_:
                continue  # Arrow bit-packs bools; those are the one copy
            leaf = col
            for _ in f.shape:
                leaf = leaf.values
            assert back[f.name].ctypes.data == leaf.buffers()[1].address, f.name
            assert np.shares_memory(back[f.name], cols[f.name])
        else:
            assert back[f.name].ctypes.data == col.values.buffers()[1].address, f.name
            assert back[f.offsets].ctypes.data == col.offsets.buffers()[1].address, f.offsets


def test_columns_from_a_sliced_batch_and_a_chunked_table() -> None:
    cols = example("dqn").validate(dqn_batch(np.random.default_rng(4), 20, extra=0))
    batch = cols.to_arrow()
    sliced = Columns.from_arrow(cols.schema, batch.slice(5, 7))
    assert_bit_identical(cols.take(np.arange(5, 12)), sliced)
    assert sliced["legal_offsets"][0] == 0
    table = pa.Table.from_batches([batch.slice(0, 8), batch.slice(8)])
    assert table.column("legal_ids").num_chunks == 2
    assert_bit_identical(cols, Columns.from_arrow(cols.schema, table))
    empty = pa.Table.from_batches([], schema=batch.schema)
    assert len(Columns.from_arrow(cols.schema, empty)) == 0


# -- take / gather_csr / dense_mask ---------------------------------------------------------


def naive_take(cols: Columns, rows: list[int]) -> dict[str, Any]:
    n = len(cols)
    rows = [r % n for r in rows]
    out: dict[str, Any] = {}
    for f in cols.schema.dense_fields:
        out[f.name] = np.array([cols[f.name][r] for r in rows], dtype=f.dtype).reshape((len(rows), *f.shape))
    for off_name, names in cols.schema.offsets_groups.items():
        offsets = cols[off_name]
        new = [0]
        for r in rows:
            new.append(new[-1] + int(offsets[r + 1] - offsets[r]))
        out[off_name] = np.array(new, dtype=np.int64)
        for name in names:
            values = cols[name]
            picked: list[Any] = []
            for r in rows:
                picked.extend(values[offsets[r]:offsets[r + 1]].tolist())
            out[name] = np.array(picked, dtype=values.dtype)
    return out


@pytest.mark.parametrize("name", ["dqn", "ppo", "alphazero", "deep_cfr_advantage", "deep_cfr_strategy", "treestrap"])
def test_take_matches_a_naive_loop(name: str) -> None:
    rng = np.random.default_rng(12)
    cols = example(name).validate(BATCHES[name](rng, 25))
    n = len(cols)
    for rows in ([], [0], [n - 1], [3, 3, 3], list(rng.integers(0, n, 40)), [-1, -n, 2, -3], list(range(n))[::-1]):
        taken = cols.take(np.array(rows, dtype=np.int64))
        expected = naive_take(cols, rows)
        assert len(taken) == len(rows)
        assert set(taken.arrays) == set(expected)
        for key, arr in expected.items():
            assert taken[key].dtype == arr.dtype and taken[key].tobytes() == arr.tobytes(), (key, rows)
        assert taken.meta == cols.meta
        # the result is itself valid and round-trips through Arrow
        assert_bit_identical(taken, cols.schema.validate({**taken.arrays, **taken.meta}))
        assert_bit_identical(taken, Columns.from_arrow(cols.schema, taken.to_arrow()))


def test_take_accepts_lists_and_rejects_non_integer_rows() -> None:
    cols = example("dqn").validate(dqn_batch(np.random.default_rng(0), 6, extra=0))
    assert_bit_identical(cols.take([4, 1]), cols.take(np.array([4, 1])))
    assert len(cols.take([])) == 0
    with pytest.raises(TypeError):
        cols.take(np.ones(6, dtype=bool))  # a mask is not a list of rows
    with pytest.raises(TypeError):
        cols.take(np.array([0.0, 1.0]))
    with pytest.raises(IndexError):
        cols.take([6])
    with pytest.raises(IndexError):
        cols.take([-7])


def test_negative_rows_keep_dense_and_ragged_aligned() -> None:
    cols = example("dqn").validate(dqn_batch(np.random.default_rng(21), 8, extra=0))
    last_two = cols.take([-2, -1])
    same = cols.take([6, 7])
    assert_bit_identical(last_two, same)


def test_gather_csr_against_a_loop() -> None:
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 5, 30)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    values = rng.standard_normal(int(offsets[-1]))
    rows = rng.integers(0, 30, 50)
    new_offsets, index = gather_csr(offsets, rows)
    assert new_offsets.dtype == np.int64 and new_offsets[0] == 0
    expected = np.concatenate([values[offsets[r]:offsets[r + 1]] for r in rows])
    np.testing.assert_array_equal(values[index], expected)
    np.testing.assert_array_equal(np.diff(new_offsets), counts[rows])


def test_dense_mask_matches_a_loop() -> None:
    rng = np.random.default_rng(6)
    cols = example("alphazero").validate(BATCHES["alphazero"](rng, 30))
    ids, offsets = cols.ragged("legal_ids")
    mask = dense_mask(ids, offsets, 9)
    expected = np.zeros((len(cols), 9), dtype=bool)
    for i in range(len(cols)):
        for a in ids[offsets[i]:offsets[i + 1]]:
            expected[i, a] = True
    assert mask.dtype == np.bool_ and mask.shape == (len(cols), 9)
    np.testing.assert_array_equal(mask, expected)
    # value-only rows have no legal actions
    assert not mask[np.diff(offsets) == 0].any()
    # the format's own recipe gives the same mask
    rows = np.repeat(np.arange(len(cols)), np.diff(offsets))
    recipe = np.zeros(cols["policy_targets"].shape, dtype=bool)
    recipe[rows, ids] = True
    np.testing.assert_array_equal(mask, recipe)


def test_dense_mask_of_a_gathered_minibatch() -> None:
    rng = np.random.default_rng(7)
    cols = example("ppo").validate(BATCHES["ppo"](rng, 50))
    rows = rng.integers(0, len(cols), 8)
    mini = cols.take(rows)
    full = dense_mask(*cols.ragged("legal_ids"), 9)
    np.testing.assert_array_equal(dense_mask(*mini.ragged("legal_ids"), 9), full[rows])
    assert dense_mask(np.zeros(0, np.int64), np.zeros(1, np.int64), 9).shape == (0, 9)


def test_episode_and_rollout_round_trip_through_arrow() -> None:
    rng = np.random.default_rng(8)
    ep = episode_columns(episode(4, actions=3), episode_batch(rng, 6))
    assert_bit_identical(ep, Columns.from_arrow(ep.schema, ep.to_arrow()))
    ro, *_ = rollout_columns(rollout(4, actions=3), rollout_batch(rng, 4, 2))
    assert_bit_identical(ro, Columns.from_arrow(ro.schema, ro.to_arrow()))
