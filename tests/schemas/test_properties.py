"""Property tests: random custom schemas and random valid batches for them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import DTypeError, NonFiniteError, RecordCountError
from replaystore.schemas import BatchMeta, Columns, Dense, Ragged, Schema

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                np.uint32, np.uint64, np.float16, np.float32, np.float64)]
dtypes = st.sampled_from(DTYPES)
shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
json_scalars = st.one_of(st.integers(-1000, 1000), st.text(max_size=8), st.booleans(), st.none(),
                         st.floats(allow_nan=False, allow_infinity=False, width=32))
metadata = st.dictionaries(st.sampled_from(["actions", "env_id", "action_frame", "observation", "producer"]),
                           json_scalars, max_size=3)


@st.composite
def field_options(draw: st.DrawFn, dt: np.dtype) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if dt.kind == "f":
        opts["finite"] = draw(st.sampled_from([None, True, False]))
    if dt.kind in "iu" and draw(st.booleans()):
        opts["id_bound"] = draw(st.integers(1, min(50, int(np.iinfo(dt).max))))
    return opts


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    n_dense = draw(st.integers(0, 3))
    n_ragged = draw(st.integers(0 if n_dense else 1, 3))
    fields: list[Any] = []
    for i in range(n_dense):
        dt = draw(dtypes)
        fields.append(Dense(f"d{i}", dt, draw(shapes), **draw(field_options(dt))))
    for i in range(n_ragged):
        dt = draw(dtypes)
        group = draw(st.integers(0, i))  # ragged field i may share the offsets of an earlier group
        fields.append(Ragged(f"r{i}", dt, f"r_offsets{group}", **draw(field_options(dt))))
    if draw(st.booleans()):
        fields.append(BatchMeta("telemetry"))
    order = draw(st.permutations(range(len(fields))))
    return Schema(draw(st.sampled_from(["probe", "custom", "x"])), [fields[i] for i in order],
                  version=draw(st.integers(1, 3)), metadata=draw(metadata))


def random_values(rng: np.random.Generator, f: Dense | Ragged, shape: tuple[int, ...]) -> np.ndarray:
    dt = f.dtype
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        if f.id_bound is not None:
            return rng.integers(0, f.id_bound, shape).astype(dt)
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    out = (rng.standard_normal(shape) * 100).astype(dt)
    if not f.finite and out.size:
        flat = out.reshape(-1)
        flat[rng.integers(0, out.size, 2)] = [np.nan, -np.inf]
    return out


def random_batch(schema: Schema, seed: int, records: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    batch: dict[str, Any] = {}
    for f in schema.dense_fields:
        batch[f.name] = random_values(rng, f, (records, *f.shape))
    for off_name, names in schema.offsets_groups.items():
        offsets = np.zeros(records + 1, dtype=np.int64)
        np.cumsum(rng.integers(0, 5, records), out=offsets[1:])
        batch[off_name] = offsets
        for name in names:
            f = schema.field(name)
            assert isinstance(f, Ragged)
            batch[name] = random_values(rng, f, (int(offsets[-1]),))
    for m in schema.meta_fields:
        batch[m.name] = {"seed": seed, "records": records}
    return batch


def reference_take(schema: Schema, batch: dict[str, Any], rows: list[int]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in schema.dense_fields:
        out[f.name] = np.stack([batch[f.name][r] for r in rows]) if rows else batch[f.name][:0]
    for off_name, names in schema.offsets_groups.items():
        offsets = batch[off_name]
        slices = [(int(offsets[r]), int(offsets[r + 1])) for r in rows]
        out[off_name] = np.array([0, *np.cumsum([hi - lo for lo, hi in slices])], dtype=np.int64)
        for name in names:
            values = batch[name]
            out[name] = (np.concatenate([values[lo:hi] for lo, hi in slices]) if slices else values[:0])
    return out


def assert_bits(a: np.ndarray, b: np.ndarray, name: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert a.tobytes() == b.tobytes(), name


@SETTINGS
@given(schema=schemas())
def test_schema_round_trips(schema: Schema) -> None:
    via_json = Schema.from_json(schema.to_json())
    via_arrow = Schema.from_arrow(schema.to_arrow())
    assert via_json == schema and via_arrow == schema
    assert via_json.fields == schema.fields and via_arrow.fields == schema.fields
    assert via_arrow.metadata == schema.metadata
    assert via_arrow.offsets_groups == schema.offsets_groups
    layout = schema.zarr_layout()
    assert {s.name for s in layout} == set(schema.input_names) - {m.name for m in schema.meta_fields}


@SETTINGS
@given(schema=schemas(), seed=st.integers(0, 2**32 - 1), records=st.integers(0, 6))
def test_valid_batches_validate_and_round_trip_through_arrow(schema: Schema, seed: int, records: int) -> None:
    batch = random_batch(schema, seed, records)
    cols = schema.validate(batch)
    assert len(cols) == records
    for name in schema.input_names:
        if name in batch and isinstance(batch[name], np.ndarray):
            assert_bits(cols[name], batch[name], name)
            assert np.shares_memory(cols[name], batch[name]) or batch[name].size == 0
    back = Columns.from_arrow(schema, cols.to_arrow())
    assert set(back.arrays) == set(cols.arrays)
    for name, arr in cols.arrays.items():
        assert_bits(back[name], arr, name)
    assert dict(back.meta) == dict(cols.meta)


@SETTINGS
@given(schema=schemas(), seed=st.integers(0, 2**32 - 1), records=st.integers(1, 6), data=st.data())
def test_take_matches_reference(schema: Schema, seed: int, records: int, data: st.DataObject) -> None:
    batch = random_batch(schema, seed, records)
    cols = schema.validate(batch)
    rows = data.draw(st.lists(st.integers(-records, records - 1), max_size=10))
    taken = cols.take(np.array(rows, dtype=np.int64))
    expected = reference_take(schema, batch, [r % records for r in rows])
    assert len(taken) == len(rows)
    for name, arr in expected.items():
        assert_bits(taken[name], arr, name)
    schema.validate({**taken.arrays, **taken.meta})  # a gathered batch is itself valid


@SETTINGS
@given(schema=schemas(), seed=st.integers(0, 2**32 - 1), records=st.integers(1, 6), data=st.data())
def test_corruptions_are_caught_naming_the_field(schema: Schema, seed: int, records: int,
                                                 data: st.DataObject) -> None:
    batch = random_batch(schema, seed, records)
    record_fields = [f for f in schema.fields if not isinstance(f, BatchMeta)]
    f = data.draw(st.sampled_from(record_fields))
    kind = data.draw(st.sampled_from(["dtype", "count", "nan"]))
    if kind == "dtype":
        other = data.draw(st.sampled_from([d for d in DTYPES if d != f.dtype]))
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/large values cast to a narrower type
            batch[f.name] = batch[f.name].astype(other)
        expected: type[Exception] = DTypeError
    elif kind == "count" and isinstance(f, Dense) and len(schema.dense_fields) > 1:
        first = schema.dense_fields[0].name
        victim = f.name if f.name != first else schema.dense_fields[1].name
        batch[victim] = batch[victim][:-1]
        f, expected = schema.field(victim), RecordCountError
    elif kind == "nan" and f.dtype.kind == "f" and f.finite and len(batch[f.name]):
        arr = batch[f.name].copy()
        arr.reshape(-1)[-1] = np.nan
        batch[f.name] = arr
        expected = NonFiniteError
    else:
        return  # this corruption does not apply to this field
    with pytest.raises(expected) as info:
        schema.validate(batch)
    assert info.value.field == f.name  # type: ignore[attr-defined]
    assert f"'{f.name}'" in str(info.value)
