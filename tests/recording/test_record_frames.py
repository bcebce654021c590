"""Recording ``FrameStackObservation`` with ``frame_stack=k``: each frame stored once, the stacks given back.

The reference is gymnasium itself: the stacked observations the wrapped environment returned,
compared frame for frame with what ``EpochSampler(stack=k)`` rebuilds from the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import FrameStackObservation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import RecordingError, SchemaMismatchError
from replaystore.gym import RecordEpisodes, RecordVectorEpisodes, recorded_episodes
from replaystore.loaders import EpochSampler, gather
from replaystore.store import open_store

K = 3


class Frames(gym.Env[np.ndarray, int]):
    """Small random uint8 frames; an episode ends (terminated) after ``length`` steps."""

    def __init__(self, length: int = 5) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (5, 6), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.length = length
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(1, 255, (5, 6), dtype=np.uint8), {"n": 0}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        frame = self.np_random.integers(1, 255, (5, 6), dtype=np.uint8)
        return frame, float(action), self.t >= self.length, False, {"n": self.t}


def _stored(url: str, padding: str, field: str = "frame") -> dict[str, dict[str, np.ndarray]]:
    with open_store(url, mode="r") as st:
        sampler = EpochSampler(st, 1_000_000, stack=K, stack_padding=padding, stack_field=field)
        b = {k: np.asarray(v) for k, v in gather(st.default, sampler.sample()).items()
             if not isinstance(v, list)}
        pos = {int(r): i for i, r in enumerate(b["indices"].tolist())}
        out = {}
        for key in sorted(st.streams()):
            rows, steps = st.rows(key)
            sel = [pos[int(r)] for r in rows[np.argsort(steps)] if int(r) in pos]
            out[str(key)] = {k: v[sel] for k, v in b.items()}
        return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.sampled_from(["step", "step", "step", "reset"]), min_size=1, max_size=30),
       padding=st.sampled_from(["reset", "zero"]), length=st.integers(1, 6), commit_every=st.integers(1, 8))
def test_single_env_stacks_equal_gymnasiums(tmp_path_factory: Any, plan: list[str], padding: str, length: int,
                                            commit_every: int) -> None:
    url = str(tmp_path_factory.mktemp("rec") / "s")
    env = RecordEpisodes(FrameStackObservation(Frames(length), K, padding_type=padding), url, frame_stack=K,
                         frame_padding=padding, commit_every=commit_every, info_keys={"n": np.int64})
    seen = []
    obs, _ = env.reset(seed=0)
    for i, what in enumerate(plan):
        if what == "reset":  # mid-episode (or right after an end): the episode is left unfinished
            obs, _ = env.reset()
            continue
        nxt, r, term, trunc, info = env.step(i % 3)
        seen.append((obs, nxt, i % 3, term, info["n"]))
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    if not seen:
        return
    (got,) = _stored(url, padding).values()
    np.testing.assert_array_equal(got["obs"], np.stack([s[0] for s in seen]))
    np.testing.assert_array_equal(got["next_obs"], np.stack([s[1] for s in seen]))
    np.testing.assert_array_equal(got["action"], [s[2] for s in seen])
    np.testing.assert_array_equal(got["terminated"], [s[3] for s in seen])
    np.testing.assert_array_equal(got["info_n"], [s[4] for s in seen])
    with open_store(url, mode="r") as st:
        assert sum(e["length"] for e in recorded_episodes(st)) == len(seen)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_stacks_equal_gymnasiums(tmp_path: Path, mode: AutoresetMode) -> None:
    n = 3
    venv = gym.vector.SyncVectorEnv([lambda i=i: FrameStackObservation(Frames(3 + i), K) for i in range(n)],
                                    autoreset_mode=mode)
    url = str(tmp_path / "s")
    venv = RecordVectorEpisodes(venv, url, frame_stack=K, commit_every=7)
    per: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    obs, _ = venv.reset(seed=0)
    skip = np.zeros(n, dtype=bool)
    for t in range(20):
        nxt, _, term, trunc, infos = venv.step(np.full(n, t % 3))
        done = term | trunc
        for i in range(n):
            if mode == AutoresetMode.NEXT_STEP:
                if not skip[i]:
                    per[i].append((obs[i], nxt[i]))
            else:
                per[i].append((obs[i], infos["final_obs"][i] if done[i] else nxt[i]))
        skip = done
        obs = nxt
    venv.close()
    got = _stored(url, "reset")
    for i, key in enumerate(sorted(got)):
        np.testing.assert_array_equal(got[key]["obs"], np.stack([p[0] for p in per[i]]))
        np.testing.assert_array_equal(got[key]["next_obs"], np.stack([p[1] for p in per[i]]))


class NotStacked(Frames):
    """Observations of the stacked shape that are not stacks."""

    def __init__(self) -> None:
        super().__init__(5)
        self.observation_space = gym.spaces.Box(0, 255, (K, 5, 6), np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        frame = self.np_random.integers(1, 255, (5, 6), dtype=np.uint8)
        return np.stack([frame] * K), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        _, r, term, trunc, info = super().step(action)
        return self.np_random.integers(1, 255, (K, 5, 6), dtype=np.uint8), r, term, trunc, info


def test_refuses_what_is_not_a_stack(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    env = RecordEpisodes(NotStacked(), url, frame_stack=K)
    env.reset(seed=0)  # (a reset-padded first stack: accepted)
    with pytest.raises(RecordingError, match="not one frame apart"):
        env.step(0)
    with pytest.raises(RecordingError, match="no episode in progress"):
        env.step(0)
    env.close()
    with open_store(url, mode="r") as st:
        assert len(st) == 0
    zero = RecordEpisodes(FrameStackObservation(Frames(), K, padding_type="zero"), str(tmp_path / "z"),
                          frame_stack=K)  # padded with zeros, recorded as "reset"
    with pytest.raises(RecordingError, match="frame_padding='reset'"):
        zero.reset(seed=0)
    zero.close()


def test_bad_arguments_and_mismatched_stores(tmp_path: Path) -> None:
    env = FrameStackObservation(Frames(), K)
    with pytest.raises(RecordingError, match="frame_stack"):
        RecordEpisodes(env, str(tmp_path / "a"), frame_stack=2)  # (3, 5, 6) does not split as 2 frames
    with pytest.raises(RecordingError, match="frame_padding"):
        RecordEpisodes(env, str(tmp_path / "b"), frame_stack=K, frame_padding="edge")
    with pytest.raises(RecordingError, match="needs Box observations"):
        RecordEpisodes(FrameStackObservation(WithScore(Frames(), discrete=True), K), str(tmp_path / "c"),
                       frame_stack=K)
    url = str(tmp_path / "d")
    rec = RecordEpisodes(env, url, frame_stack=K)
    rec.reset(seed=0)
    rec.step(0)
    rec.close()
    with pytest.raises(SchemaMismatchError, match="frame_padding"):
        RecordEpisodes(env, url, frame_stack=K, frame_padding="zero")
    with pytest.raises(SchemaMismatchError):
        RecordEpisodes(env, url)  # whole observations: not this store
    with open_store(url, mode="r") as st:
        assert st.schema.names == ("frame", "action", "reward", "terminated", "truncated")
        assert st.schema.field("frame").shape == (5, 6) and len(st) == 2


class WithScore(gym.ObservationWrapper):
    """A Dict observation: the frame (an image leaf) and a small vector (or a Discrete) leaf."""

    def __init__(self, env: gym.Env[Any, Any], discrete: bool = False) -> None:
        super().__init__(env)
        self.discrete = discrete
        score = gym.spaces.Discrete(9) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"image": env.observation_space, "score": score})

    def observation(self, observation: Any) -> Any:
        """The frame and a score derived from it."""
        v = float(observation[0, 0]) / 255
        return {"image": observation, "score": int(v * 8) if self.discrete else np.array([v, -v], np.float32)}


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_dict_observation_every_leaf_a_frame_field(tmp_path: Path, padding: str) -> None:
    url = str(tmp_path / "s")
    env = RecordEpisodes(FrameStackObservation(WithScore(Frames(4)), K, padding_type=padding), url,
                         frame_stack=K, frame_padding=padding, commit_every=5)
    seen = []
    obs, _ = env.reset(seed=0)
    for t in range(15):
        nxt, _, term, trunc, _ = env.step(t % 3)
        seen.append((obs, nxt))
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    with open_store(url, mode="r") as st:
        assert st.schema.names == ("frame_image", "frame_score", "action", "reward", "terminated", "truncated")
        assert st.schema.field("frame_image").shape == (5, 6) and st.schema.field("frame_score").shape == (2,)
    for leaf in ("image", "score"):
        (got,) = _stored(url, padding, f"frame_{leaf}").values()
        np.testing.assert_array_equal(got["obs"], np.stack([o[leaf] for o, _ in seen]))
        np.testing.assert_array_equal(got["next_obs"], np.stack([x[leaf] for _, x in seen]))
