"""Safe casts and refusals: an unsafe value is a typed error naming the field, raised before anything
of that step is recorded; the store keeps exactly the steps before it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from replaystore.errors import (
    DTypeError,
    IdRangeError,
    NonFiniteError,
    RecordingError,
    SchemaMismatchError,
    ShapeError,
    UnsafeCastError,
)
from replaystore.gym import RecordEpisodes, RecordVectorEpisodes, recorded_episodes, schema_from_spaces
from replaystore.schemas import Dense, Schema
from replaystore.store import open_store

F32 = np.float32


def _read_stream(st, key):
    rows, steps = st.rows(key)
    return st.read(rows[np.argsort(steps)])


def test_unsafe_actions_raise_before_the_env_steps(tmp_path):
    env = RecordEpisodes(gym.make("CartPole-v1"), tmp_path / "c")
    env.reset(seed=4)
    good = [env.step(a)[0] for a in (0, 1, np.int32(0))]  # Python, numpy and narrower ints cast safely
    state = np.array(env.unwrapped.state)
    pending = env.recorder.uncommitted
    bad = [(3.7, UnsafeCastError), (np.float32(1.0), UnsafeCastError), (2, IdRangeError), (-1, IdRangeError),
           (np.array([0, 1]), ShapeError), ("left", DTypeError), (True, None)]
    for action, error in bad[:-1]:
        with pytest.raises(error) as info:
            env.step(action)
        assert info.value.field == "action"
        np.testing.assert_array_equal(env.unwrapped.state, state)  # the env did not step
        assert env.recorder.uncommitted == pending
    obs, *_ = env.step(True)  # bool -> int64 is a safe cast: action 1
    key = env.recorder.stream_keys[0]
    env.close()
    st = open_store(str(tmp_path / "c"), mode="r")
    d = _read_stream(st, key)
    np.testing.assert_array_equal(d["action"], [0, 1, 0, 1])
    np.testing.assert_array_equal(d["next_obs"], np.stack([*good, obs]))


def test_a_bad_action_in_one_sub_env_steps_none(tmp_path):
    venv = RecordVectorEpisodes(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3), tmp_path / "v")
    obs, _ = venv.reset(seed=0)
    with pytest.raises(IdRangeError, match="'action'"):
        venv.step(np.array([0, 5, 1]))
    with pytest.raises(UnsafeCastError, match="'action'"):
        venv.step(np.array([0.0, 1.0, 1.0]))
    assert venv.recorder.uncommitted == 0
    after, *_ = venv.step(np.array([0, 1, 1]))
    keys = venv.recorder.stream_keys
    venv.close()
    st = open_store(str(tmp_path / "v"), mode="r")
    assert len(st) == 3
    for i, key in enumerate(keys):
        d = _read_stream(st, key)
        np.testing.assert_array_equal(d["obs"][0], obs[i])
        np.testing.assert_array_equal(d["next_obs"][0], after[i])


def test_float64_actions_cast_to_a_float32_box(tmp_path):
    env = RecordEpisodes(gym.make("MountainCarContinuous-v0"), tmp_path / "m")
    env.reset(seed=1)
    env.step(np.array([0.3]))  # float64 -> float32: same kind, values survive
    with pytest.raises(UnsafeCastError, match="'action'"):
        env.step(np.array([1e300]))  # would overflow to inf
    with pytest.raises(NonFiniteError, match="'action'"):
        env.step(np.array([np.nan], F32))
    with pytest.raises(ShapeError, match="'action'"):
        env.step(0.3)
    key = env.recorder.stream_keys[0]
    env.close()
    d = _read_stream(open_store(str(tmp_path / "m"), mode="r"), key)
    np.testing.assert_array_equal(d["action"], np.array([[0.3]], F32))


class Glitchy(gym.Env):
    """Emits a NaN observation at step 3 of every episode."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(2, np.nan if self.t == 3 else self.t, np.float32)
        return obs, 1.0, self.t >= 5, False, {}


def test_a_value_the_env_returns_that_cannot_be_stored(tmp_path):
    env = RecordEpisodes(Glitchy(), tmp_path / "g")
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    with pytest.raises(NonFiniteError, match="'next_obs'"):
        env.step(0)
    assert env.recorder.uncommitted == 2  # nothing of the failed step
    with pytest.raises(RecordingError, match="reset"):
        env.step(1)  # the episode is broken: not recorded on as if nothing happened
    env.reset(seed=1)
    for _ in range(2):
        env.step(0)
    key = env.recorder.stream_keys[0]
    env.close()
    st = open_store(str(tmp_path / "g"), mode="r")
    d = _read_stream(st, key)
    assert len(d["obs"]) == 4
    assert not d["terminated"].any() and not d["truncated"].any()
    eps = recorded_episodes(st)
    assert [(e["first_step"], e["length"], e["seed"], e["terminated"]) for e in eps] == [(0, 2, 0, False),
                                                                                         (2, 2, 1, False)]


def test_a_vector_step_that_cannot_be_stored_stores_nothing_of_it(tmp_path):
    venv = RecordVectorEpisodes(SyncVectorEnv([Glitchy] * 2, autoreset_mode=AutoresetMode.SAME_STEP), tmp_path / "g")
    venv.reset(seed=0)
    venv.step(np.array([0, 0]))
    venv.step(np.array([0, 0]))
    with pytest.raises(NonFiniteError):
        venv.step(np.array([0, 0]))
    assert venv.recorder.uncommitted == 4
    assert not venv.recorder.in_episode.any()
    venv.step(np.array([0, 0]))  # steps 4 and 5: not recorded (no episode in progress) ...
    venv.step(np.array([0, 0]))  # ... the episode ends and the autoreset starts a new one
    venv.step(np.array([1, 1]))
    assert venv.recorder.uncommitted == 6
    venv.close()


def test_step_before_reset_and_after_the_end(tmp_path):
    env = RecordEpisodes(gym.make("CartPole-v1"), tmp_path / "o")
    with pytest.raises(RecordingError):
        env.step(0)
    env.reset(seed=0)
    done = False
    while not done:
        *_, term, trunc, _ = env.step(1)
        done = term or trunc
    with pytest.raises(RecordingError, match="reset"):
        env.step(1)
    env.close()
    with pytest.raises(RecordingError):
        env.step(1)
    venv = RecordVectorEpisodes(SyncVectorEnv([lambda: gym.make("CartPole-v1")]), tmp_path / "o2")
    with pytest.raises(RecordingError):
        venv.step(np.array([0]))
    venv.close()


def test_reward_cast_to_the_schema_float32(tmp_path):
    base = gym.make("CartPole-v1")
    schema = schema_from_spaces(base.observation_space, base.action_space, name="cp32", reward_dtype=F32)
    assert schema.field("reward").dtype == F32
    env = RecordEpisodes(base, tmp_path / "r", schema=schema)
    env.reset(seed=0)
    env.step(0)
    key = env.recorder.stream_keys[0]
    env.close()
    d = _read_stream(open_store(str(tmp_path / "r"), mode="r"), key)
    assert d["reward"].dtype == F32 and d["reward"][0] == 1


def test_existing_store_with_another_layout_is_refused(tmp_path):
    other = Schema("x", [Dense("obs", F32, (3,)), Dense("action", np.int64)])
    open_store(str(tmp_path / "x"), other).close()
    with pytest.raises(SchemaMismatchError, match="obs"):
        RecordEpisodes(gym.make("CartPole-v1"), tmp_path / "x")
    st = open_store(str(tmp_path / "x"), mode="r")
    assert st.schema == other and len(st) == 0 and st.writers == []


def test_recording_on_into_an_existing_store_continues_the_stream(tmp_path):
    for seed in (0, 1):
        env = RecordEpisodes(gym.make("CartPole-v1"), tmp_path / "a", stream="actor")
        env.reset(seed=seed)
        for _ in range(3):
            env.step(0)
        env.close()
    st = open_store(str(tmp_path / "a"), mode="r")
    rows, steps = st.rows("actor")
    np.testing.assert_array_equal(np.sort(steps), np.arange(6))
    assert [e["seed"] for e in recorded_episodes(st)] == [0, 1]
    venv = RecordVectorEpisodes(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2), tmp_path / "b",
                                streams=[7, 9])
    venv.reset(seed=[3, None])
    venv.step(np.array([0, 1]))
    venv.close()
    st = open_store(str(tmp_path / "b"), mode="r")
    assert sorted(st.streams()) == [7, 9]
    assert sorted((e["stream"], e["seed"]) for e in recorded_episodes(st)) == [(7, 3), (9, None)]


def test_info_keys_inferred_or_given(tmp_path):
    class Infos(Glitchy):
        def step(self, action):
            self.t += 1
            info = {"flag": self.t % 2 == 0, "pos": np.array([self.t, -self.t], np.int16),
                    "mixed": self.t if self.t < 3 else 2.5}
            if self.t == 2:
                del info["pos"]
            return np.zeros(2, np.float32), 0.5, self.t >= 4, False, info

    env = RecordEpisodes(Infos(), tmp_path / "i", info_keys=["flag", "pos"])
    env.reset(seed=0)
    assert env.store is None  # created once the first step shows the info dtypes
    for _ in range(4):
        env.step(0)
    key = env.recorder.stream_keys[0]
    env.close()
    st = open_store(str(tmp_path / "i"), mode="r")
    assert st.schema.field("info_pos").dtype == np.int16 and st.schema.field("info_pos").shape == (2,)
    d = _read_stream(st, key)
    np.testing.assert_array_equal(d["info_flag"], [False, True, False, True])
    np.testing.assert_array_equal(d["info_pos_valid"], [True, False, True, True])
    np.testing.assert_array_equal(d["info_pos"], [[1, -1], [0, 0], [3, -3], [4, -4]])
    # a key absent from the first step needs its dtype
    env = RecordEpisodes(Infos(), tmp_path / "j", info_keys=["missing"])
    env.reset(seed=0)
    with pytest.raises(RecordingError, match="missing"):
        env.step(0)
    env.close()
    env = RecordEpisodes(Infos(), tmp_path / "k", info_keys={"missing": np.float32})
    env.reset(seed=0)
    env.step(0)
    env.close()
    d = open_store(str(tmp_path / "k"), mode="r").read([0])
    assert d["info_missing"].dtype == F32 and not d["info_missing_valid"][0]
    # a later value that does not fit the first one's dtype: int64 from step 1, then 2.5
    env = RecordEpisodes(Infos(), tmp_path / "l", info_keys=["mixed"])
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    with pytest.raises(UnsafeCastError, match="'info_mixed'"):
        env.step(0)
    assert env.recorder.uncommitted == 2
    env.close()


def test_vector_env_without_an_autoreset_mode_is_refused(tmp_path):
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    venv.metadata = {k: v for k, v in venv.metadata.items() if k != "autoreset_mode"}
    with pytest.raises(RecordingError, match="autoreset_mode"):
        RecordVectorEpisodes(venv, tmp_path / "m")


def test_an_open_store_stays_open_and_the_callers(tmp_path):
    base = gym.make("CartPole-v1")
    st = open_store(str(tmp_path / "o"), schema_from_spaces(base.observation_space, base.action_space, env=base))
    env = RecordEpisodes(base, st, commit_every=2)
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    env.close()
    assert not st.closed and len(st) == 3  # its own commits show through the caller's handle
    assert st.read(st.row_ids())["action"].tolist() == [0, 0, 0]
