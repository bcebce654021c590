"""An int shape is one dimension: ``Dense("x", np.uint8, 84)`` is ``Dense("x", np.uint8, (84,))``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import SchemaError
from replaystore.schemas import Dense, Schema, episode, frames, rollout, transitions
from replaystore.store import open_store


@pytest.mark.parametrize("shape", [84, np.int64(84), np.uint16(84)])
def test_an_int_shape_is_one_dimension(shape: Any) -> None:
    f = Dense("x", np.uint8, shape)
    assert f == Dense("x", np.uint8, (84,))
    assert f.shape == (84,) and type(f.shape[0]) is int


def test_builtin_schemas_take_int_action_and_obs_shapes() -> None:
    for build in (transitions, episode, rollout):
        s = build(np.int64(4), 2)
        assert s.field("obs").shape == (4,) and s.field("action").shape == (2,)
    assert frames(np.int64(84), 4).field("frame").shape == (84,)


@pytest.mark.parametrize("shape", [2.5, None, object(), True, 0, -3, (84, "a"), (84, 2.0), (True,)])
def test_a_bad_shape_is_a_schema_error_naming_the_field(shape: Any) -> None:
    with pytest.raises(SchemaError, match=r"field 'pixels': shape must be"):
        Dense("pixels", np.uint8, shape)


def test_an_int_shape_field_stores_and_reopens(tmp_path: Path) -> None:
    schema = Schema("s", [Dense("x", np.uint8, 84)])
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    data = np.arange(3 * 84, dtype=np.uint8).reshape(3, 84)
    with st.writer() as w:
        w.append({"x": data})
    back = open_store(str(tmp_path / "s"))
    assert back.schema.field("x").shape == (84,)
    np.testing.assert_array_equal(back.read(np.arange(3))["x"], data)
