"""Dict observations recorded through RecordEpisodes and RecordVectorEpisodes: one column per leaf,
read back as nested dicts, equal to a ground truth recorded by hand from the same seeds and actions."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from replaystore.errors import UnsupportedSpaceError
from replaystore.gym import RecordEpisodes, RecordVectorEpisodes, schema_from_spaces
from replaystore.store import open_store
from support.dictenv import DictObsEnv
from support.gymref import Truth, drive_vector, single_truth, vector_truth

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def assert_dict_stream(st, key, truth: Truth) -> None:
    """Stream ``key`` holds ``truth``'s transitions, record for record, leaf by leaf."""
    rows, steps = st.rows(key)
    assert len(rows) == len(truth.obs)
    rows = rows[np.argsort(steps)]
    data = st.read(rows)
    assert set(data["obs"]) == {"image", "vec"} and set(data["next_obs"]) == {"image", "vec"}
    for name in ("obs", "next_obs"):
        for leaf in ("image", "vec"):
            want = np.stack([o.item()[leaf] for o in getattr(truth, name)])
            assert data[name][leaf].dtype == want.dtype
            np.testing.assert_array_equal(data[name][leaf], want, err_msg=f"{name}[{leaf}]")
    np.testing.assert_array_equal(data["action"], np.asarray([int(a) for a in truth.action]))
    np.testing.assert_array_equal(data["reward"], truth.reward)
    np.testing.assert_array_equal(data["terminated"], truth.terminated)
    np.testing.assert_array_equal(data["truncated"], truth.truncated)
    _, _, resets = st.default.index_of(rows)
    np.testing.assert_array_equal(resets, truth.reset)


def test_schema_from_a_dict_space_has_one_column_per_leaf():
    env = DictObsEnv()
    schema = schema_from_spaces(env.observation_space, env.action_space)
    assert schema.names == ("obs__image", "obs__vec", "action", "reward", "next_obs__image", "next_obs__vec",
                            "terminated", "truncated")
    assert schema.field("obs__image").dtype == np.uint8 and schema.field("obs__image").shape == (8, 8, 3)
    assert schema.to_dict()["nested"] == {"obs": "dict", "next_obs": "dict"}
    deep = spaces.Dict({"a": spaces.Tuple((spaces.Discrete(4), spaces.Dict({"b": spaces.MultiBinary(2)})))})
    s2 = schema_from_spaces(deep, spaces.Discrete(2))
    assert [n for n in s2.names if n.startswith("obs")] == ["obs__a__0", "obs__a__1__b"]
    assert s2.nesting is not None and s2.nesting.nodes["obs__a"] == "tuple"
    with pytest.raises(UnsupportedSpaceError, match="actions|observations"):
        schema_from_spaces(env.observation_space, spaces.Dict({"x": spaces.Discrete(2)}))
    with pytest.raises(UnsupportedSpaceError, match="Text"):
        schema_from_spaces(spaces.Dict({"t": spaces.Text(5)}), env.action_space)
    with pytest.raises(UnsupportedSpaceError, match="'a-b'"):
        schema_from_spaces(spaces.Dict({"a-b": spaces.Discrete(2)}), env.action_space)


def test_single_env_records_dict_observations(tmp_path):
    rng = np.random.default_rng(3)
    acts = [int(a) for a in rng.integers(0, 3, 60)]
    plan: list[tuple[str, object]] = [("reset", 5)]
    env = DictObsEnv()
    env.reset(seed=5)
    for a in acts:  # the resets a user makes after each episode end
        plan.append(("step", a))
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            plan.append(("reset", None))
            env.reset()
    truth = single_truth(DictObsEnv, plan)
    rec = RecordEpisodes(DictObsEnv(), tmp_path / "s", commit_every=17)
    for kind, arg in plan:
        if kind == "reset":
            rec.reset(seed=arg)
        else:
            rec.step(arg)
    key = rec.recorder.stream_keys[0]
    rec.close()
    st = open_store(str(tmp_path / "s"), mode="r")
    assert_dict_stream(st, key, truth)
    assert any(truth.terminated) and any(truth.truncated)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_vector_env_records_dict_observations(tmp_path, mode):
    n, steps = 3, 40
    venv = SyncVectorEnv([DictObsEnv] * n, autoreset_mode=mode)
    rng = np.random.default_rng(8)
    acts = [rng.integers(0, 3, n) for _ in range(steps)]
    rec = RecordVectorEpisodes(venv, tmp_path / "v", commit_every=20)
    drive_vector(rec, mode, 40, acts)
    keys = rec.recorder.stream_keys
    rec.close()
    truths = vector_truth(DictObsEnv, n, mode, 40, acts)
    st = open_store(str(tmp_path / "v"), mode="r")
    for key, truth in zip(keys, truths, strict=True):
        assert_dict_stream(st, key, truth)
    assert len(st) == sum(len(t.obs) for t in truths)
    assert sum(len(t.episodes) for t in truths) > n


def test_nested_space_json_is_minaris():
    from minari.serialization import deserialize_space, serialize_space

    from replaystore.gym.spaces import space_json

    space = spaces.Dict({"image": spaces.Box(0, 255, (2, 2), np.uint8),
                         "t": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2)))})
    assert space_json(space) == space_json(space, use_minari=False) == serialize_space(space)
    assert deserialize_space(space_json(space)) == space
