"""Nested fields: random Dict/Tuple structures written to a store read back equal (a property test),
the schema document round trip, and the typed errors of bad nested definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import SchemaError
from replaystore.schemas import Dense, Schema, nested
from replaystore.store import open_store

DTYPES = [np.uint8, np.int32, np.int64, np.float32, np.float64, np.bool_]
KEYS = hs.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True).filter(lambda k: "__" not in k)
_urls = itertools.count()


def leaf():
    return hs.builds(lambda dt, shape: Dense("x", dt, tuple(shape)),
                     hs.sampled_from(DTYPES), hs.lists(hs.integers(1, 3), max_size=2))


def structures():
    return hs.recursive(
        leaf(),
        lambda inner: hs.one_of(hs.dictionaries(KEYS, inner, min_size=1, max_size=3),
                                hs.lists(inner, min_size=1, max_size=3).map(tuple)),
        max_leaves=6,
    ).filter(lambda s: not isinstance(s, Dense))


def values(draw, node, n):
    if isinstance(node, Dense):
        rng = np.random.default_rng(draw(hs.integers(0, 2**31)))
        if node.dtype == np.bool_:
            return rng.random((n, *node.shape)) < 0.5
        return (rng.normal(size=(n, *node.shape)) * 50).astype(node.dtype)
    if isinstance(node, dict):
        return {k: values(draw, v, n) for k, v in node.items()}
    return tuple(values(draw, v, n) for v in node)


def take(value, rows):
    """The reference: ``rows`` of every leaf, structure kept."""
    if isinstance(value, dict):
        return {k: take(v, rows) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(take(v, rows) for v in value)
    return value[rows]


def assert_same(got, want):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hs.data(), structure=structures(), n=hs.integers(1, 6))
def test_nested_write_read_round_trip(data, structure, n):
    schema = Schema("p", [nested("obs", structure), Dense("step_id", np.int64)])
    assert Schema.from_json(schema.to_json()) == schema
    obs = values(data.draw, structure, n)
    st = open_store(f"memory://nesting-{next(_urls)}", schema)
    with st.writer() as w:
        w.append({"obs": obs, "step_id": np.arange(n)}, stream=0)
    got = st.default.read(np.arange(n))
    assert list(got) == ["obs", "step_id"]
    assert_same(got["obs"], obs)
    rows = np.array(data.draw(hs.lists(hs.integers(0, n - 1), min_size=1, max_size=5)))
    only = st.default.read(rows, columns=["obs"])
    assert_same(only["obs"], take(obs, rows))


def test_leaf_names_and_document():
    obs = nested("obs", {"image": Dense("i", np.uint8, (2, 2)), "pos": (Dense("a", np.float32), Dense("b", np.int8))})
    schema = Schema("s", [obs, Dense("action", np.int64)])
    assert schema.names == ("obs__image", "obs__pos__0", "obs__pos__1", "action")
    doc = schema.to_dict()
    assert doc["nested"] == {"obs": "dict", "obs__pos": "tuple"}
    assert "nested" not in Schema("flat", [Dense("x", np.int64)]).to_dict()  # flat documents unchanged


@pytest.mark.parametrize("make, match", [
    (lambda: nested("obs", {"a__b": Dense("x", np.int64)}), "without '__'"),
    (lambda: nested("obs", {"_a": Dense("x", np.int64)}), "'_a'"),
    (lambda: nested("obs", {}), "empty"),
    (lambda: nested("obs", {"a": ()}), "empty tuple"),
    (lambda: nested("obs", {"a": 3}), "got int"),
    (lambda: nested("obs__x", {"a": Dense("x", np.int64)}), "obs__x"),
    (lambda: Schema("s", [nested("obs", {"a": Dense("x", np.int64)}), Dense("obs", np.int64)]), "same name"),
    (lambda: Schema("s", [Dense("obs__a", np.int64)], nested={"obs": "tuple"}), "0..0"),
    (lambda: Schema("s", [Dense("obs__a", np.int64)], nested={"obs": "list"}), "kind 'list'"),
    (lambda: Schema("s", [Dense("x", np.int64)], nested={"obs": "dict"}), "no leaf"),
])
def test_bad_nested_definitions_are_schema_errors(make, match):
    with pytest.raises(SchemaError, match=match):
        make()


def test_append_with_a_wrong_nested_structure_is_refused(tmp_path):
    schema = Schema("s", [nested("obs", {"a": Dense("x", np.int64), "b": Dense("y", np.int64)})])
    st = open_store(str(tmp_path / "s"), schema)
    with st.writer() as w:
        with pytest.raises(SchemaError, match=r"keys \['a', 'b'\]"):
            w.append({"obs": {"a": np.arange(2)}}, stream=0)
        w.append({"obs": {"a": np.arange(2), "b": np.arange(2)}}, stream=0)
    assert len(st) == 2
