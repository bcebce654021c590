"""Recorders keep an env spec that JSON cannot hold as it is: values converted, a UserWarning names them,
the spec remakes the environment, and recording goes on."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from replaystore.gym import RecordEpisodes, RecordVectorEpisodes
from replaystore.gym.spaces import env_spec_json
from replaystore.store import open_store

DESC = np.array([list(row) for row in ["SFFF", "FHFH", "FFFH", "HFFG"]])


def test_frozenlake_with_an_array_desc_is_recorded_with_its_spec(tmp_path: Path) -> None:
    env = gym.make("FrozenLake-v1", desc=DESC, is_slippery=False)
    with pytest.warns(UserWarning, match=r"kwargs\['desc'\] \(ndarray, kept as a list\)"):
        rec = RecordEpisodes(env, str(tmp_path / "fl"))
    rec.reset(seed=0)
    for a in [2, 2, 1, 1, 1, 2]:  # right, right, down, down, down, right: reaches the goal
        _, _, term, trunc, _ = rec.step(a)
        if term or trunc:
            break
    rec.close()
    st = open_store(str(tmp_path / "fl"))
    assert len(st) == 6 and bool(st.read(np.arange(6))["terminated"][-1])
    spec = EnvSpec.from_json(st.schema.metadata["env_spec"])
    assert st.schema.metadata["env_id"] == "FrozenLake-v1"
    remade = gym.make(spec).unwrapped
    np.testing.assert_array_equal(remade.desc, np.asarray(DESC, dtype="c"))  # type: ignore[attr-defined]


def test_record_episode_statistics_over_a_same_step_vector_env(tmp_path: Path) -> None:
    venv = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    venv = gym.wrappers.vector.RecordEpisodeStatistics(venv)
    with pytest.warns(UserWarning, match=r"autoreset_mode'\] \(AutoresetMode, kept as its value 'SameStep'\)"):
        rec = RecordVectorEpisodes(venv, str(tmp_path / "cp"))
    rec.reset(seed=1)
    for _ in range(30):
        rec.step(np.zeros(2, dtype=np.int64))
    rec.close()
    st = open_store(str(tmp_path / "cp"))
    assert len(st) == 60
    spec = EnvSpec.from_json(st.schema.metadata["env_spec"])
    assert spec.kwargs["vector_kwargs"] == {"autoreset_mode": "SameStep"}
    assert gym.make_vec(spec, 2).metadata["autoreset_mode"] == AutoresetMode.SAME_STEP


class Colour(enum.Enum):
    RED = "red"


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_each_conversion_is_named_and_the_rest_is_kept() -> None:
    gym.register("SpecFallbackTest-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
    try:
        spec = gym.spec("SpecFallbackTest-v0")
        env = gym.make(spec, render_mode=None).unwrapped
        object.__setattr__(env, "spec", EnvSpec("SpecFallbackTest-v0", entry_point=spec.entry_point,
                                                max_episode_steps=9,
                                                kwargs={"a": np.float32(0.5), "b": Colour.RED, "c": Opaque(),
                                                        "d": (1, np.arange(2)), "e": "kept"}))
        with pytest.warns(UserWarning) as got:
            text = env_spec_json(env)
        message = str(got[0].message)
        for part in ["spec.kwargs['a'] (float32, kept as a number)", "spec.kwargs['b'] (Colour, kept as its value "
                     "'red')", "spec.kwargs['c'] (Opaque, replaced by its repr)",
                     "spec.kwargs['d'][1] (ndarray, kept as a list)"]:
            assert part in message
        assert text is not None
        doc = json.loads(text)
        assert doc["kwargs"] == {"a": 0.5, "b": "red", "c": "Opaque()", "d": [1, [0, 1]], "e": "kept"}
        assert doc["max_episode_steps"] == 9 and "name" not in doc and "namespace" not in doc
        assert EnvSpec.from_json(text).id == "SpecFallbackTest-v0"
    finally:
        gym.registry.pop("SpecFallbackTest-v0", None)


def test_a_serialisable_spec_gives_no_warning() -> None:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = env_spec_json(gym.make("CartPole-v1"))
    assert text is not None and json.loads(text)["id"] == "CartPole-v1"
