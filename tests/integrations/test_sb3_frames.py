"""``ReplayStoreBuffer(frame_stack=k)``: stacked observations stored as frames, sampled as SB3's own buffer holds them.

A reference model: SB3's ``ReplayBuffer`` fed the same ``add`` calls. Observations are built as
``VecFrameStack`` builds them (zero padding at an episode's start, the terminal stack in
``next_obs``), on small synthetic images; commits, episode ends and mid-episode resets fall where
hypothesis puts them.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stable_baselines3.common.buffers import ReplayBuffer

from replaystore.errors import BufferArgumentError, SchemaMismatchError
from replaystore.integrations.sb3 import ReplayStoreBuffer
from replaystore.loaders import EpochSampler, gather
from replaystore.store import open_store

K = 4


def _space(channels_first: bool, c: int = 1) -> spaces.Box:
    shape = (K * c, 5, 6) if channels_first else (5, 6, K * c)
    return spaces.Box(0, 255, shape, np.uint8)


class Stacks:
    """``n`` envs' observations stacked as SB3's ``VecFrameStack`` does (``c`` channels per frame)."""

    def __init__(self, n: int, channels_first: bool, rng: np.random.Generator, c: int = 1) -> None:
        self.n, self.cf, self.rng, self.c = n, channels_first, rng, c
        self.obs = np.zeros((n, *_space(channels_first, c).shape), np.uint8)
        for i in range(n):
            self.start(i)

    def frame(self) -> np.ndarray:
        return self.rng.integers(1, 4, size=(self.c, 5, 6) if self.cf else (5, 6, self.c), dtype=np.uint8)

    def push(self, stack: np.ndarray, frame: np.ndarray) -> np.ndarray:
        if self.cf:
            return np.concatenate([stack[self.c:], frame], axis=0)
        return np.concatenate([stack[..., self.c:], frame], axis=-1)

    def start(self, i: int) -> None:
        self.obs[i] = self.push(np.zeros_like(self.obs[i]), self.frame())

    def step(self, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next_obs as the buffer gets it, the new obs)."""
        nxt = np.stack([self.push(self.obs[i], self.frame()) for i in range(self.n)])
        self.obs = nxt.copy()
        for i in np.flatnonzero(done):
            self.start(i)
        return nxt, self.obs.copy()


def _feed(buf: Any, peer: ReplayBuffer, plan: list[tuple[int, int]], n: int, cf: bool, seed: int) -> None:
    """Steps of the plan: (what happens, env): 0 a plain step, 1 env ends its episode, 2 env is reset
    mid-episode before the step, 3 a commit before the step."""
    rng = np.random.default_rng(seed)
    envs = Stacks(n, cf, rng)
    for what, env in plan:
        if what == 3:
            buf.flush()
        if what == 2:
            envs.start(env % n)
        obs = envs.obs.copy()
        done = np.zeros(n, bool)
        if what == 1:
            done[env % n] = True
        nxt, _ = envs.step(done)
        action = rng.integers(0, 3, size=(n, 1))
        reward = rng.normal(size=n).astype(np.float32)
        infos = [{"TimeLimit.truncated": bool(d and env % 2)} for d in done]
        for b in (buf, peer):
            b.add(obs, nxt, action, reward, done, infos)


def _stored(url: str, n: int) -> list[dict[str, np.ndarray]]:
    """Per env (stream order), every drawable transition in step order, read with ``EpochSampler(stack=)``."""
    with open_store(url, mode="r") as st:
        sampler = EpochSampler(st, 1_000_000, stack=K, stack_padding="zero")
        b = {k: np.asarray(v) for k, v in gather(st.default, sampler.sample()).items()}
        pos = {int(r): i for i, r in enumerate(b["indices"].tolist())}
        out = []
        for key in sorted(st.streams()):
            rows, steps = st.rows(key)
            sel = [pos[int(r)] for r in rows[np.argsort(steps)] if int(r) in pos]
            out.append({k: v[sel] for k, v in b.items()})
        assert len(out) == n
        return out


def _same_as_peer(url: str, peer: ReplayBuffer, n: int, space: spaces.Box, cf: bool) -> None:
    steps = peer.pos
    for env, got in enumerate(_stored(url, n)):
        assert len(got["indices"]) == steps
        obs, nxt = got["obs"], got["next_obs"]  # [T, k, *frame]
        if cf:
            obs, nxt = obs.reshape(steps, *space.shape), nxt.reshape(steps, *space.shape)
        else:
            obs = np.moveaxis(obs, 1, -2).reshape(steps, *space.shape)
            nxt = np.moveaxis(nxt, 1, -2).reshape(steps, *space.shape)
        np.testing.assert_array_equal(obs, peer.observations[:steps, env])
        np.testing.assert_array_equal(nxt, peer.next_observations[:steps, env])
        np.testing.assert_array_equal(got["action"], peer.actions[:steps, env, 0])
        np.testing.assert_array_equal(got["reward"], peer.rewards[:steps, env])
        np.testing.assert_array_equal(got["terminated"] | got["truncated"], peer.dones[:steps, env] > 0)
        np.testing.assert_array_equal(got["truncated"], peer.timeouts[:steps, env] > 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2, 3]), st.integers(0, 2)), min_size=1, max_size=40),
       n=st.integers(1, 3), cf=st.booleans(), seed=st.integers(0, 2**16))
def test_stored_transitions_equal_sb3s_buffer(tmp_path_factory: Any, plan: list[tuple[int, int]], n: int, cf: bool,
                                              seed: int) -> None:
    url = str(tmp_path_factory.mktemp("frames") / "s")
    space = _space(cf)
    peer = ReplayBuffer(100, space, spaces.Discrete(3), "cpu", n_envs=n)
    buf = ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", n_envs=n, url=url, frame_stack=K,
                            commit_every=7)
    _feed(buf, peer, plan, n, cf, seed)
    buf.close()
    _same_as_peer(url, peer, n, space, cf)


def test_samples_committed_and_pending_rows_as_sb3(tmp_path: Path) -> None:
    space = _space(True)
    n = 2
    peer = ReplayBuffer(1000, space, spaces.Discrete(3), "cpu", n_envs=n)
    buf = ReplayStoreBuffer(1000, space, spaces.Discrete(3), "cpu", n_envs=n, url=str(tmp_path / "s"),
                            frame_stack=K, commit_every=10)
    plan = [(1 if t % 9 == 8 else 0, t) for t in range(25)]  # 2 commits, 5 pending steps
    _feed(buf, peer, plan, n, True, 0)
    assert buf.pending == 5 * n
    assert buf.size() == peer.size() == 25  # (each env's last committed step counts while it waits for its next frame)
    every = {(peer.observations[t, e].tobytes(), peer.next_observations[t, e].tobytes(),
              float(peer.rewards[t, e])) for t in range(peer.pos) for e in range(n)}
    np.random.seed(0)
    s = buf.sample(200)
    assert s.observations.shape == (200, *space.shape) and s.observations.dtype.is_floating_point is False
    drawn = [(o.tobytes(), x.tobytes(), float(r)) for o, x, r in
             zip(s.observations.numpy(), s.next_observations.numpy(), s.rewards.numpy()[:, 0], strict=True)]
    assert set(drawn) <= every
    assert len(set(drawn)) > 30  # committed and pending ones
    buf.close()


def test_bytes_per_step_and_codec(tmp_path: Path) -> None:
    space = spaces.Box(0, 255, (K, 84, 84), np.uint8)
    url = str(tmp_path / "s")
    buf = ReplayStoreBuffer(1000, space, spaces.Discrete(3), "cpu", url=url, frame_stack=K)
    frames = np.zeros((K, 84, 84), np.uint8)
    for t in range(200):
        nxt = np.concatenate([frames[1:], np.full((1, 84, 84), t % 7, np.uint8)])
        buf.add(frames[None], nxt[None], np.array([[0]]), np.zeros(1), np.zeros(1), [{}])
        frames = nxt
    buf.close()
    with open_store(url, mode="r") as st:
        assert st.schema.names == ("frame", "action", "reward", "terminated", "truncated")
        assert st.schema.field("frame").shape == (84, 84) and st.schema.field("frame").codec is not None
        assert st.schema.metadata["frame_stack"] == K and st.schema.metadata["frame_padding"] == "zero"
        assert len(st) == 201  # 200 steps and the open episode's final frame
        stored = sum(c["stored"] for c in st.info()["tables"]["records"]["columns"].values())
        assert stored / 200 < 2 * K * 84 * 84 / 100


def test_refuses_observations_that_are_not_stacks(tmp_path: Path) -> None:
    space = _space(True)
    buf = ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=str(tmp_path / "s"), frame_stack=K)
    rng = np.random.default_rng(0)
    envs = Stacks(1, True, rng)
    obs = envs.obs.copy()
    nxt, _ = envs.step(np.zeros(1, bool))
    with pytest.raises(BufferArgumentError, match="not one frame apart"):
        buf.add(obs, rng.integers(0, 9, size=nxt.shape, dtype=np.uint8), np.array([[0]]), np.zeros(1),
                np.zeros(1), [{}])
    assert buf.size() == 0 and buf.pending == 0
    full = rng.integers(1, 9, size=obs.shape, dtype=np.uint8)  # an episode start without zero padding
    with pytest.raises(BufferArgumentError, match="without its padding"):
        buf.add(full, envs.push(full[0], envs.frame())[None], np.array([[0]]), np.zeros(1), np.zeros(1), [{}])
    assert buf.pending == 0
    buf.add(obs, nxt, np.array([[1]]), np.zeros(1), np.zeros(1), [{}])  # a right one is kept
    assert buf.pending == 1
    buf.close()


def test_bad_arguments_and_mismatched_stores(tmp_path: Path) -> None:
    space = _space(True)
    with pytest.raises(BufferArgumentError, match="frame_stack"):
        ReplayStoreBuffer(100, spaces.Box(0, 255, (3, 5, 6), np.uint8), spaces.Discrete(3), "cpu",
                          url=str(tmp_path / "a"), frame_stack=2)
    with pytest.raises(BufferArgumentError, match="frame_padding"):
        ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=str(tmp_path / "b"), frame_stack=K,
                          frame_padding="edge")
    with pytest.raises(BufferArgumentError, match="frame_stack"):
        ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=str(tmp_path / "c"), frame_stack=1)
    url = str(tmp_path / "d")
    ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=url, frame_stack=K).close()
    with pytest.raises(SchemaMismatchError, match="frame_stack"):
        ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=url, frame_stack=2)
    with pytest.raises(SchemaMismatchError):
        ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=url)  # whole observations: not this store


def test_pickled_buffer_reopens_its_frames_store(tmp_path: Path) -> None:
    space = _space(False)
    peer = ReplayBuffer(100, space, spaces.Discrete(3), "cpu", n_envs=1)
    url = str(tmp_path / "s")
    buf = ReplayStoreBuffer(100, space, spaces.Discrete(3), "cpu", url=url, frame_stack=K)
    _feed(buf, peer, [(0, 0)] * 6, 1, False, 3)
    buf.close()  # (closes the open episode with its final frame)
    again = pickle.loads(pickle.dumps(buf))
    assert again.size() == 6 and again.stored_at_open == 7  # 6 steps; 7 records with the final frame
    np.random.seed(1)
    s = again.sample(8)
    assert s.observations.shape == (8, *space.shape)
    again.close()


def test_a_recorded_frames_store_is_an_sb3_replay(tmp_path: Path) -> None:
    import gymnasium as gym
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordEpisodes

    class Frames(gym.Env[np.ndarray, int]):
        observation_space = gym.spaces.Box(0, 255, (5, 6), np.uint8)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.integers(1, 255, (5, 6), dtype=np.uint8), {}

        def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
            self.t += 1
            return self.np_random.integers(1, 255, (5, 6), dtype=np.uint8), 1.0, self.t >= 4, False, {}

    url = str(tmp_path / "rec")
    env = RecordEpisodes(FrameStackObservation(Frames(), K), url, frame_stack=K)
    seen = set()
    obs, _ = env.reset(seed=0)
    for _ in range(10):
        nxt, *_, term, trunc, _ = env.step(0)
        seen.add((obs.tobytes(), nxt.tobytes()))
        obs = env.reset()[0] if term or trunc else nxt
    env.close()
    space = gym.spaces.Box(0, 255, (K, 5, 6), np.uint8)
    buf = ReplayStoreBuffer(1000, space, spaces.Discrete(3), "cpu", url=url, frame_stack=K, frame_padding="reset")
    assert buf.size() == 10
    s = buf.sample(50)
    assert {(o.tobytes(), x.tobytes()) for o, x in zip(s.observations.numpy(), s.next_observations.numpy(),
                                                         strict=True)} <= seen
    buf.close()
