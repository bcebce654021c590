"""Property: for random episode lengths, sub-env counts, autoreset modes, commit cadences and step
counts, the vector recorder stores exactly what a reference recorder built from single envs sees,
info keys (with Gymnasium's ``_key`` masks) and episode metadata included."""

from __future__ import annotations

import tempfile

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.gym import RecordVectorEpisodes
from replaystore.store import open_store
from support.gymref import assert_episodes_equal, assert_stream_equals, drive_vector, vector_truth


class Countdown(gym.Env):
    """Episodes of 1-6 steps (seeded), ending by termination or truncation; the observation
    echoes the step and the last action; info ``t`` on odd steps only, ``score`` always."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length = int(self.np_random.integers(1, 7))
        self.truncates = bool(self.np_random.integers(0, 2))
        self.t = 0
        return np.array([0, -1], np.float32), {"start": True}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        info = {"score": float(self.np_random.normal())}
        if self.t % 2:
            info["t"] = self.t
        obs = np.array([self.t, action], np.float32)
        reward = float(self.np_random.normal())
        return obs, reward, done and not self.truncates, done and self.truncates, info


MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=hs.integers(1, 3), mode=hs.sampled_from(MODES), steps=hs.integers(0, 30), seed=hs.integers(0, 10_000),
       commit_every=hs.integers(1, 25), action_seed=hs.integers(0, 100))
def test_vector_recorder_matches_reference(n, mode, steps, seed, commit_every, action_seed):
    acts = list(np.random.default_rng(action_seed).integers(0, 4, (steps, n)))
    venv = SyncVectorEnv([Countdown] * n, autoreset_mode=mode)
    with tempfile.TemporaryDirectory() as root:
        rec = RecordVectorEpisodes(venv, f"{root}/p", commit_every=commit_every, info_keys={"t": np.int64,
                                                                                             "score": np.float64})
        drive_vector(rec, mode, seed, acts)
        keys = rec.recorder.stream_keys
        rec.close()
        truths = vector_truth(Countdown, n, mode, seed, acts)
        st = open_store(f"{root}/p", mode="r")
        for key, truth in zip(keys, truths, strict=True):
            assert_stream_equals(st, key, truth, info_keys=("t", "score"))
        assert_episodes_equal(st, keys, truths)
        assert len(st) == sum(len(t.obs) for t in truths)
        st.close()
