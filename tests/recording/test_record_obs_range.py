"""Recorded observations lie in their space: an integer leaf (Discrete, respecting ``start``, MultiDiscrete,
MultiBinary) outside it is an IdRangeError naming the column, and nothing of that step is stored."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from replaystore.errors import IdRangeError, RecordingError
from replaystore.gym import RecordEpisodes, RecordVectorEpisodes
from replaystore.store import open_store


class Scripted(gym.Env):
    """Returns ``script[0]`` at reset and ``script[t]`` at step t (the last one repeated); never ends."""

    metadata: dict = {}

    def __init__(self, space, script):
        self.observation_space = space
        self.action_space = spaces.Discrete(2)
        self.script = script

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.script[0], {}

    def step(self, action):
        self.t += 1
        return self.script[min(self.t, len(self.script) - 1)], 1.0, False, False, {}


BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
V = np.zeros(2, np.float32)

# (space, a good observation, a bad observation, the column named)
CASES = {
    "discrete": (spaces.Discrete(4), 3, 99, "next_obs"),
    "discrete-negative": (spaces.Discrete(4), 0, -1, "next_obs"),
    "discrete-start": (spaces.Discrete(3, start=-1), -1, 2, "next_obs"),
    "discrete-below-start": (spaces.Discrete(3, start=5), 7, 4, "next_obs"),
    "multidiscrete": (spaces.MultiDiscrete([3, 4]), np.array([2, 3]), np.array([0, 4]), "next_obs"),
    "multidiscrete-start": (spaces.MultiDiscrete([3, 4], start=[-1, 10]), np.array([-1, 13]),
                            np.array([-2, 10]), "next_obs"),
    "multibinary": (spaces.MultiBinary(3), np.array([1, 0, 1], np.int8), np.array([0, 2, 1], np.int8), "next_obs"),
    "dict": (spaces.Dict({"pos": spaces.Discrete(4), "vec": BOX}), {"pos": 3, "vec": V}, {"pos": 99, "vec": V},
             "next_obs__pos"),
    "dict-nested": (spaces.Dict({"inner": spaces.Dict({"bits": spaces.MultiBinary(2)}), "vec": BOX}),
                    {"inner": {"bits": np.array([0, 1], np.int8)}, "vec": V},
                    {"inner": {"bits": np.array([0, 3], np.int8)}, "vec": V}, "next_obs__inner__bits"),
    "tuple": (spaces.Tuple((BOX, spaces.Discrete(4))), (V, 2), (V, -1), "next_obs__1"),
    "tuple-multidiscrete": (spaces.Tuple((spaces.MultiDiscrete([2, 2]), BOX)), (np.array([1, 1]), V),
                            (np.array([1, 2]), V), "next_obs__0"),
}


def _records(path):
    st = open_store(str(path), mode="r")
    rows, steps = st.rows(st.streams()[0]) if st.streams() else (np.array([], np.int64), None)
    return st, (st.read(rows[np.argsort(steps)]) if len(rows) else None)


@pytest.mark.parametrize("case", list(CASES))
def test_next_observation_out_of_its_space_is_refused(tmp_path, case):
    space, good, bad, column = CASES[case]
    env = RecordEpisodes(Scripted(space, [good, good, bad, good]), tmp_path / "s")
    env.reset(seed=0)
    env.step(0)
    with pytest.raises(IdRangeError) as info:
        env.step(1)
    assert info.value.field == column
    assert env.recorder.uncommitted == 1  # nothing of the failed step
    with pytest.raises(RecordingError):
        env.step(0)  # the episode is broken: not recorded on
    env.close()
    st, d = _records(tmp_path / "s")
    assert len(st) == 1
    np.testing.assert_array_equal(d["action"], [0])


@pytest.mark.parametrize("case", list(CASES))
def test_reset_observation_out_of_its_space_is_refused(tmp_path, case):
    space, good, bad, column = CASES[case]
    env = RecordEpisodes(Scripted(space, [bad, good]), tmp_path / "r")
    with pytest.raises(IdRangeError) as info:
        env.reset(seed=0)
    assert info.value.field == column.replace("next_obs", "obs", 1)
    with pytest.raises(RecordingError):
        env.step(0)  # no episode started
    env.close()
    assert len(open_store(str(tmp_path / "r"), mode="r")) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_observations_in_their_space_are_stored(tmp_path, case):
    space, good, _, _ = CASES[case]
    env = RecordEpisodes(Scripted(space, [good] * 3), tmp_path / "g")
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    env.close()
    assert len(open_store(str(tmp_path / "g"), mode="r")) == 2


@pytest.mark.parametrize("case", ["discrete", "multibinary", "dict", "tuple"])
def test_vector_recorder_refuses_one_sub_envs_bad_observation(tmp_path, case):
    space, good, bad, column = CASES[case]
    fns = [lambda: Scripted(space, [good] * 4), lambda: Scripted(space, [good, good, bad, good])]
    venv = RecordVectorEpisodes(SyncVectorEnv(fns), tmp_path / "v")
    venv.reset(seed=0)
    venv.step(np.array([0, 0]))
    with pytest.raises(IdRangeError) as info:
        venv.step(np.array([1, 1]))
    assert info.value.field == column
    assert venv.recorder.uncommitted == 2  # the first step of both sub-envs, nothing of the second
    venv.close()
    st = open_store(str(tmp_path / "v"), mode="r")
    assert len(st) == 2
    np.testing.assert_array_equal(st.read(np.arange(2))["action"], [0, 0])


def test_vector_recorder_refuses_a_bad_reset_observation(tmp_path):
    space = spaces.Discrete(4)
    fns = [lambda: Scripted(space, [1]), lambda: Scripted(space, [4])]
    venv = RecordVectorEpisodes(SyncVectorEnv(fns), tmp_path / "v")
    with pytest.raises(IdRangeError, match="'obs'"):
        venv.reset(seed=0)
    venv.close()
    assert len(open_store(str(tmp_path / "v"), mode="r")) == 0
