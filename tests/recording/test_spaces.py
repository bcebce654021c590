"""schema_from_spaces: column layouts per space, Minari's space JSON, the env spec, refused spaces,
and the optional dependency."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from replaystore.errors import SchemaError, UnsupportedSpaceError
from replaystore.gym import schema_from_spaces, space_json
from replaystore.schemas import Schema
from replaystore.store import open_store

SPACES = [
    spaces.Box(-1, 1, (3, 2), np.float32),
    spaces.Box(0, 255, (8, 8, 3), np.uint8),
    spaces.Box(-np.inf, np.inf, (), np.float64),
    spaces.Discrete(5),
    spaces.Discrete(3, start=-1),
    spaces.MultiDiscrete([3, 4, 2]),
    spaces.MultiDiscrete([[2, 3], [4, 5]], dtype=np.int32),
    spaces.MultiBinary(6),
    spaces.MultiBinary((2, 3)),
]


@pytest.mark.parametrize("space", SPACES, ids=repr)
def test_layout_follows_the_space(space):
    schema = schema_from_spaces(space, space)
    assert schema.names == ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    shape = () if isinstance(space, spaces.Discrete) else space.shape
    for name in ("obs", "next_obs", "action"):
        f = schema.field(name)
        assert (f.dtype, f.shape) == (np.dtype(space.dtype), shape), name
    assert schema.field("reward").dtype == np.float64
    assert schema.field("terminated").dtype == schema.field("truncated").dtype == np.bool_
    bound = space.n if isinstance(space, spaces.Discrete) and space.start == 0 else None
    assert schema.field("action").id_bound == bound
    for role in ("observation_space", "action_space"):
        assert schema.metadata[role] == space_json(space)


@pytest.mark.parametrize("space", SPACES, ids=repr)
def test_space_json_is_minaris(space):
    from minari.serialization import deserialize_space, serialize_space

    assert space_json(space) == serialize_space(space)
    assert space_json(space, use_minari=False) == serialize_space(space)  # the form written without Minari
    assert deserialize_space(space_json(space)) == space


@pytest.mark.parametrize("space", [
    spaces.Text(5), spaces.Graph(spaces.Box(0, 1, (2,)), None), spaces.Sequence(spaces.Discrete(2)),
    spaces.OneOf([spaces.Discrete(2)])], ids=lambda s: type(s).__name__)
def test_spaces_without_a_column_layout_are_refused(space):
    for args in ((space, spaces.Discrete(2)), (spaces.Discrete(2), space)):
        with pytest.raises(UnsupportedSpaceError) as info:
            schema_from_spaces(*args)
        assert type(space).__name__ in str(info.value) and "Box, Discrete" in str(info.value)


@pytest.mark.parametrize("space", [spaces.Dict({"a": spaces.Discrete(2)}), spaces.Tuple([spaces.Discrete(2)])],
                         ids=lambda s: type(s).__name__)
def test_dict_and_tuple_are_observations_only(space):
    schema = schema_from_spaces(space, spaces.Discrete(2))  # nested observation fields
    assert schema.nesting is not None and set(schema.nesting.roots) == {"obs", "next_obs"}
    with pytest.raises(UnsupportedSpaceError) as info:
        schema_from_spaces(spaces.Discrete(2), space)
    assert type(space).__name__ in str(info.value) and "observations only" in str(info.value)


def test_env_spec_and_name_from_the_env(tmp_path):
    env = gym.make("CartPole-v1", max_episode_steps=77)
    schema = schema_from_spaces(env.observation_space, env.action_space, env=env, info={"x": (np.int16, (2,))})
    assert schema.name == "CartPole-v1" and schema.metadata["env_id"] == "CartPole-v1"
    assert schema.field("info_x").shape == (2,) and schema.field("info_x_valid").dtype == np.bool_
    spec = EnvSpec.from_json(schema.metadata["env_spec"])
    assert spec.max_episode_steps == 77
    remade = gym.make(spec)
    assert remade.spec.max_episode_steps == 77 and remade.observation_space == env.observation_space
    # kept through the store's schema document
    open_store(str(tmp_path / "s"), schema).close()
    assert open_store(str(tmp_path / "s"), mode="r").schema == schema
    assert Schema.from_json(schema.to_json()).metadata == schema.metadata
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    vschema = schema_from_spaces(venv.single_observation_space, venv.single_action_space, env=venv, name="v")
    assert EnvSpec.from_json(vschema.metadata["env_spec"]).id == "CartPole-v1" and vschema.name == "v"


def test_bad_arguments():
    box = spaces.Box(0, 1, (2,))
    with pytest.raises(SchemaError, match="reward_dtype"):
        schema_from_spaces(box, box, reward_dtype=np.int64)
    with pytest.raises(SchemaError, match="TimeLimit.truncated"):
        schema_from_spaces(box, box, info={"TimeLimit.truncated": np.bool_})


def test_without_gymnasium_the_import_names_the_extra():
    code = ("import sys; sys.modules['gymnasium'] = None\n"
            "try:\n    import replaystore.gym\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert 'pip install "replaystore[gym]"' in out.stdout
    loaded = subprocess.run([sys.executable, "-c", "import sys; sys.modules['gymnasium'] = None; "
                             "import replaystore.store, replaystore.schemas; print('ok')"],
                            capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "ok"  # the rest of the package does not need it
    assert json.loads(space_json(spaces.Discrete(2)))["n"] == 2
