"""Journey: Atari pixels stored once, compressed, from where they are made — and given back frame for frame.

One user's path per test, on real ALE Pong (84x84 grayscale, frame skip 4):

- record gymnasium's ``FrameStackObservation(4)`` with ``RecordEpisodes``/``RecordVectorEpisodes``
  (``frame_stack=4``), then sample the recording with ``stack=4``: every stacked ``obs``/``next_obs``
  equals the one gymnasium returned, episode starts (padding) included, and the frames are zstd;
- train SB3's DQN on ``VecFrameStack(4)`` with ``ReplayStoreBuffer(frame_stack=4)``, teeing every
  ``add`` into SB3's own ``ReplayBuffer``: >= 100x fewer bytes per step, and the stored transitions
  (and the buffer's own samples) equal SB3's, index for index;
- the same with a Dict observation whose image leaf is stacked (``ReplayStoreDictBuffer``, and the
  recorder, which stores every leaf of ``FrameStackObservation``'s Dict as a frame field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecTransposeImage

from replaystore.gym import RecordEpisodes, RecordVectorEpisodes, recorded_episodes
from replaystore.integrations.sb3 import ReplayStoreBuffer, ReplayStoreDictBuffer
from replaystore.loaders import UniformSampler, make_loader
from replaystore.store import open_store
from support.pixels import live_bytes, pong, stored_transitions

SB3_STEP_BYTES = 2 * 4 * 84 * 84  # SB3's ReplayBuffer: stacked uint8 obs + next_obs per transition


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_recorded_pong_stacks_equal_gymnasium_frame_for_frame(tmp_path: Path, padding: str) -> None:
    url = str(tmp_path / "pong")
    env = RecordEpisodes(FrameStackObservation(pong(60), 4, padding_type=padding), url, frame_stack=4,
                         frame_padding=padding, commit_every=100)
    seen: list[tuple[np.ndarray, np.ndarray, int, float, bool, bool]] = []
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = int(rng.integers(6))
        nxt, r, term, trunc, _ = env.step(a)
        seen.append((obs, nxt, a, float(r), bool(term), bool(trunc)))
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    env.close()  # the open episode's last transition stays drawable (close stores its final frame)
    with open_store(url, mode="r") as st:
        assert st.schema.field("frame").codec is not None  # zstd
        assert st.schema.metadata["frame_stack"] == 4 and st.schema.metadata["frame_padding"] == padding
        (got,) = stored_transitions(st, 4, padding).values()
        assert len(got["obs"]) == len(seen) == 200
        np.testing.assert_array_equal(got["obs"], np.stack([w[0] for w in seen]))
        np.testing.assert_array_equal(got["next_obs"], np.stack([w[1] for w in seen]))
        np.testing.assert_array_equal(got["action"], [w[2] for w in seen])
        np.testing.assert_array_equal(got["reward"], [w[3] for w in seen])
        np.testing.assert_array_equal(got["terminated"], [w[4] for w in seen])
        np.testing.assert_array_equal(got["truncated"], [w[5] for w in seen])
        assert [e["length"] for e in recorded_episodes(st)][:3] == [60, 60, 60]
        # each stored frame once: bytes per step far below the stacked obs + next_obs
        assert live_bytes(st) * 100 <= SB3_STEP_BYTES * len(seen)


def test_recorded_vector_pong_and_its_loader(tmp_path: Path) -> None:
    url = str(tmp_path / "pong-vec")
    n = 3
    venv = gym.vector.SyncVectorEnv([lambda: FrameStackObservation(pong(50), 4)] * n)
    venv = RecordVectorEpisodes(venv, url, frame_stack=4)
    per: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
    obs, _ = venv.reset(seed=0)
    rng = np.random.default_rng(1)
    autoreset = np.zeros(n, dtype=bool)  # NEXT_STEP: the step after an episode's end only resets
    for _ in range(120):
        nxt, _, term, trunc, _ = venv.step(rng.integers(6, size=n))
        for i in np.flatnonzero(~autoreset):
            per[i].append((obs[i], nxt[i]))
        autoreset = term | trunc
        obs = nxt
    venv.close()
    with open_store(url, mode="r") as st:
        got = stored_transitions(st, 4, "reset")
        for i, key in enumerate(sorted(got)):
            np.testing.assert_array_equal(got[key]["obs"], np.stack([p[0] for p in per[i]]))
            np.testing.assert_array_equal(got[key]["next_obs"], np.stack([p[1] for p in per[i]]))
        assert live_bytes(st) * 100 <= SB3_STEP_BYTES * sum(map(len, per))
        every = {(o.tobytes(), x.tobytes()) for p in per for o, x in p}
        for workers in (0, 2):  # in-process, and through workers (large arrays come back in shared slots)
            batches = list(make_loader(st, UniformSampler(st, 32, stack=4, num_batches=3), num_workers=workers))
            assert len(batches) == 3
            for batch in batches:
                assert tuple(batch["obs"].shape) == (32, 4, 84, 84)
                for o, x in zip(batch["obs"].numpy(), batch["next_obs"].numpy(), strict=True):
                    assert (o.tobytes(), x.tobytes()) in every


def _atari_vec(n_envs: int, dict_obs: bool = False) -> Any:
    def make() -> gym.Env[Any, Any]:
        env = pong(70, channel=True)
        if dict_obs:
            env = ImageAndScore(env)
        return env

    venv = VecTransposeImage(VecFrameStack(DummyVecEnv([make] * n_envs), 4))
    venv.seed(0)
    return venv


class ImageAndScore(gym.ObservationWrapper):
    """A Dict observation: the screen (an image leaf) and a small vector (the step in the episode)."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({"screen": env.observation_space,
                                                  "clock": gym.spaces.Box(0, 1e6, (1,), np.float32)})
        self.t = 0

    def reset(self, **kwargs: Any) -> Any:
        """Reset the clock too."""
        self.t = 0
        return super().reset(**kwargs)

    def observation(self, observation: Any) -> Any:
        """The screen and the clock."""
        self.t += 1
        return {"screen": observation, "clock": np.array([self.t], np.float32)}


def _tee(base: type, peer_class: type) -> type:
    """``base`` whose every ``add`` also goes to SB3's own buffer ``peer_class`` (kept as ``.peer``)."""

    class Tee(base):  # type: ignore[misc, valid-type]
        def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, *args: Any,
                     **kwargs: Any) -> None:
            super().__init__(buffer_size, observation_space, action_space, *args, **kwargs)
            self.peer = peer_class(buffer_size, observation_space, action_space, "cpu", n_envs=self.n_envs)

        def add(self, *args: Any) -> None:
            super().add(*args)
            self.peer.add(*args)

    return Tee


def _check_against_peer(st: Any, peer: Any, n_envs: int, leaf: str | None = None) -> int:
    """Every stored transition equals SB3's at the same (step, env) index; returns the transitions."""
    got = stored_transitions(st, 4, "zero", field="frame" if leaf is None else f"frame_{leaf}")
    steps = peer.pos if not peer.full else peer.buffer_size
    obs = peer.observations if leaf is None else peer.observations[leaf]
    nxt = peer.next_observations if leaf is None else peer.next_observations[leaf]
    for env, key in enumerate(sorted(got)):
        g = got[key]
        assert len(g["obs"]) == steps
        np.testing.assert_array_equal(g["obs"].reshape(obs[:steps, env].shape), obs[:steps, env])
        np.testing.assert_array_equal(g["next_obs"].reshape(nxt[:steps, env].shape), nxt[:steps, env])
        np.testing.assert_array_equal(g["action"], peer.actions[:steps, env, 0])
        np.testing.assert_array_equal(g["reward"], peer.rewards[:steps, env])
        np.testing.assert_array_equal(g["terminated"] | g["truncated"], peer.dones[:steps, env].astype(bool))
    return steps * n_envs


def test_dqn_on_vecframestack_pong_stores_frames_once(tmp_path: Path) -> None:
    n_envs = 2
    url = str(tmp_path / "dqn-pong")
    model = DQN("CnnPolicy", _atari_vec(n_envs), buffer_size=2_000, learning_starts=100, batch_size=16,
                train_freq=8, seed=0, device="cpu",
                replay_buffer_class=_tee(ReplayStoreBuffer, ReplayBuffer),
                replay_buffer_kwargs={"url": url, "frame_stack": 4, "commit_every": 50},
                policy_kwargs={"net_arch": [32], "features_extractor_kwargs": {"features_dim": 32}})
    model.learn(240)  # trains on minibatches the store buffer samples (committed and pending rows)
    buf, peer = model.replay_buffer, model.replay_buffer.peer
    assert buf.size() >= peer.size()
    # the buffer's own samples, with everything committed: each one of SB3's transitions
    buf.flush()
    sb3 = {(peer.observations[t, e].tobytes(), peer.next_observations[t, e].tobytes(), int(peer.actions[t, e, 0]))
           for t in range(peer.pos) for e in range(n_envs)}
    s = buf.sample(64)
    assert tuple(s.observations.shape) == (64, 4, 84, 84) and tuple(s.next_observations.shape) == (64, 4, 84, 84)
    for o, x, a in zip(s.observations.numpy(), s.next_observations.numpy(), s.actions.numpy(), strict=True):
        assert (o.tobytes(), x.tobytes(), int(a[0])) in sb3
    buf.close()
    with open_store(url, mode="r") as st:
        transitions = _check_against_peer(st, peer, n_envs)
        per_step = live_bytes(st) / transitions
        sb3_per_step = sum(a.nbytes for a in (peer.observations, peer.next_observations, peer.actions,
                                              peer.rewards, peer.dones, peer.timeouts)) / (peer.buffer_size * n_envs)
        assert per_step * 100 <= sb3_per_step, (per_step, sb3_per_step)


def test_dict_observation_image_leaf_stored_as_frames(tmp_path: Path) -> None:
    n_envs = 2
    url = str(tmp_path / "dict-pong")
    venv = _atari_vec(n_envs, dict_obs=True)
    tee = _tee(ReplayStoreDictBuffer, DictReplayBuffer)
    buf = tee(1_000, venv.observation_space, venv.action_space, "cpu", n_envs=n_envs, url=url, frame_stack=4,
              commit_every=40)
    obs = venv.reset()
    rng = np.random.default_rng(2)
    for _ in range(150):
        action = rng.integers(6, size=n_envs)
        new, reward, done, infos = venv.step(action)
        nxt = {k: v.copy() for k, v in new.items()}
        for i in np.flatnonzero(done):
            for k in nxt:
                nxt[k][i] = infos[i]["terminal_observation"][k]
        buf.add(obs, nxt, action.reshape(n_envs, 1), reward, done, infos)
        obs = new
    s = buf.sample(16)
    assert tuple(s.observations["screen"].shape) == (16, 4, 84, 84)
    assert tuple(s.observations["clock"].shape) == (16, 4)
    peer = buf.peer
    buf.close()
    with open_store(url, mode="r") as st:
        assert {"frame_screen", "obs__clock", "next_obs__clock"} <= set(st.schema.names)
        assert st.schema.field("frame_screen").codec is not None
        _check_against_peer(st, peer, n_envs, leaf="screen")
        assert live_bytes(st) * 100 <= SB3_STEP_BYTES * 150 * n_envs


def test_recorded_dict_observation_with_an_image_leaf(tmp_path: Path) -> None:
    url = str(tmp_path / "dict-rec")
    env = RecordEpisodes(FrameStackObservation(ImageAndScore(pong(60)), 4), url, frame_stack=4)
    seen = []
    obs, _ = env.reset(seed=0)
    for t in range(150):
        nxt, _, term, trunc, _ = env.step(t % 6)
        seen.append((obs, nxt))
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    with open_store(url, mode="r") as st:
        assert st.schema.field("frame_screen").codec is not None and st.schema.field("frame_screen").shape == (84, 84)
        for leaf in ("screen", "clock"):
            (got,) = stored_transitions(st, 4, "reset", field=f"frame_{leaf}").values()
            np.testing.assert_array_equal(got["obs"], np.stack([o[leaf] for o, _ in seen]))
            np.testing.assert_array_equal(got["next_obs"], np.stack([x[leaf] for _, x in seen]))
        assert live_bytes(st) * 100 <= SB3_STEP_BYTES * len(seen)
