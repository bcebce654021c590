"""Stable-Baselines3 buffers backed by a store: real SB3, real Gymnasium envs, real processes.

Reference: SB3's own ``ReplayBuffer`` / ``DictReplayBuffer`` fed the same ``add`` calls (a
``Tee`` buffer forwards every call SB3 makes to one), compared transition by transition.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import VecNormalize

from replaystore.errors import BufferArgumentError, SchemaMismatchError, StoreNotFoundError
from replaystore.gym import recorded_episodes
from replaystore.integrations.sb3 import ReplayStoreBuffer, ReplayStoreDictBuffer, resume_learning_starts
from replaystore.loaders import iter_episodes
from replaystore.store import open_store
from replaystore.store.maintenance import verify_store
from support.dictenv import DictObsEnv

TESTS_DIR = Path(__file__).resolve().parents[1]


class Tee(ReplayStoreBuffer):
    """Our buffer, also forwarding every ``add`` SB3 makes to SB3's own ``ReplayBuffer`` (``self.ref``)."""

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, device: Any = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                 **kw: Any) -> None:
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
                         handle_timeout_termination, **kw)
        self.ref = ReplayBuffer(buffer_size, observation_space, action_space, device, n_envs,
                                handle_timeout_termination=handle_timeout_termination)

    def add(self, *args: Any) -> None:
        super().add(*args)
        self.ref.add(*args)


class DictTee(ReplayStoreDictBuffer):
    """:class:`Tee` for Dict observations (``self.ref`` is SB3's ``DictReplayBuffer``)."""

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, device: Any = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False, **kw: Any) -> None:
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, **kw)
        self.ref = DictReplayBuffer(buffer_size, observation_space, action_space, device, n_envs)

    def add(self, obs: Any, next_obs: Any, *args: Any) -> None:
        super().add(obs, next_obs, *args)
        self.ref.add({k: v.copy() for k, v in obs.items()}, {k: v.copy() for k, v in next_obs.items()}, *args)


def stored(url: str) -> tuple[np.ndarray, dict[str, Any], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every visible record of the store at ``url``: row ids, columns, (streams, steps, resets)."""
    with open_store(url, mode="r") as s:
        ids = s.default.row_ids()
        return ids, s.default.read(ids), s.default.index_of(ids)


def _key(obs: Any, *index: Any) -> bytes:
    """The bytes of one observation (every leaf of a Dict observation, in key order)."""
    if isinstance(obs, dict):
        return b"".join(_key(obs[k], *index) for k in sorted(obs))
    value = obs[index]
    return np.asarray(value.numpy() if isinstance(value, th.Tensor) else value).tobytes()


def ref_transitions(ref: ReplayBuffer) -> dict[bytes, tuple[Any, ...]]:
    """SB3's valid transitions keyed by observation bytes: (action, reward, next_obs bytes, sampled done)."""
    rows = ref.buffer_size if ref.full else ref.pos
    done = ref.dones * (1 - ref.timeouts)
    out = {}
    for r in range(rows):
        for j in range(ref.n_envs):
            out[_key(ref.observations, r, j)] = (ref.actions[r, j].tolist(), float(ref.rewards[r, j]),
                                                 _key(ref.next_observations, r, j), float(done[r, j]))
    assert len(out) == rows * ref.n_envs  # (the observations tell the transitions apart)
    return out


def check_samples(buf: Any, want: dict[bytes, tuple[Any, ...]], n: int = 512) -> None:
    """Every sampled transition is one of SB3's, with SB3's ``dones``; dtypes and shapes as SB3's."""
    s = buf.sample(n)
    r = buf.ref.sample(4)
    pairs = [(s.actions, r.actions), (s.dones, r.dones), (s.rewards, r.rewards)]
    if isinstance(s.observations, dict):
        assert s.observations.keys() == r.observations.keys() == s.next_observations.keys()
        pairs += [(s.observations[k], r.observations[k]) for k in r.observations]
        pairs += [(s.next_observations[k], r.next_observations[k]) for k in r.observations]
    else:
        pairs += [(s.observations, r.observations), (s.next_observations, r.next_observations)]
    for ours, theirs in pairs:
        assert ours.dtype == theirs.dtype and ours.shape[1:] == theirs.shape[1:] and ours.shape[0] == n
    for i in range(n):
        o = _key(s.observations, i)
        assert o in want, "a sampled transition that SB3's buffer does not hold"
        act, rew, nb, done = want[o]
        assert s.actions[i].tolist() == act and float(s.rewards[i, 0]) == rew
        assert _key(s.next_observations, i) == nb and float(s.dones[i, 0]) == done


# -- learning (the training to a return threshold is slow-marked; the default run trains with the buffer in
# test_sac_and_td3_on_pendulum and test_dqn_save_del_collect_load_keeps_the_pending_steps) --------------------
@pytest.mark.slow
def test_dqn_cartpole_learns_with_the_store_buffer(tmp_path: Path) -> None:
    """Seeded DQN (rl-zoo CartPole settings, a smaller net, 3k steps) with our buffer: a return far above random
    (~22). ~1k gradient steps: ~6 s on 2 quiet cores."""
    env = gym.make("CartPole-v1")
    model = DQN("MlpPolicy", env, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs={"net_arch": [64, 64]}, seed=0, device="cpu",
                replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"url": str(tmp_path / "r")})
    model.learn(3072)
    mean, _ = evaluate_policy(model, Monitor(gym.make("CartPole-v1")), n_eval_episodes=10, deterministic=True)
    assert mean > 100, mean
    buf = model.replay_buffer
    assert isinstance(buf, ReplayStoreBuffer) and buf.size() == 3072
    buf.close()
    ids, cols, (_, _, resets) = stored(str(tmp_path / "r"))
    assert len(ids) == 3072 and resets[0]
    # episodes: CartPole-v1 ends by termination here; the per-episode metadata is the recorders'
    with open_store(str(tmp_path / "r"), mode="r") as s:
        eps = recorded_episodes(s)
    assert sum(e["length"] for e in eps) <= 3072 and all(e["terminated"] or e["truncated"] for e in eps)
    assert resets.sum() == len(eps) + (0 if eps[-1]["first_step"] + eps[-1]["length"] == 3072 else 1)


@pytest.mark.parametrize("algo", [SAC, TD3])
def test_sac_and_td3_on_pendulum(tmp_path: Path, algo: Any) -> None:
    """SAC and TD3 (Box actions) train a few hundred steps on Pendulum with our buffer, as with SB3's."""
    url = str(tmp_path / "r")
    model = algo("MlpPolicy", "Pendulum-v1", learning_starts=100, buffer_size=10_000, batch_size=32, seed=0,
                 policy_kwargs={"net_arch": [16]}, device="cpu", replay_buffer_class=Tee,
                 replay_buffer_kwargs={"url": url, "commit_every": 64})
    model.learn(300)
    buf = model.replay_buffer
    assert model._n_updates > 0 and buf.size() == buf.ref.size() == 300
    assert buf.pending == 300 - 256
    check_samples(buf, ref_transitions(buf.ref))
    buf.close()
    ids, cols, _ = stored(url)
    assert len(ids) == 300
    np.testing.assert_array_equal(cols["action"], buf.ref.actions[:300, 0])
    np.testing.assert_array_equal(cols["obs"], buf.ref.observations[:300, 0])
    assert cols["truncated"].sum() == 1 and not cols["terminated"].any()  # Pendulum's time limit, at step 200
    assert cols["truncated"][199]


# -- vector envs and time limits ---------------------------------------------------------------
def test_n_envs_streams_and_time_limit_truncations(tmp_path: Path) -> None:
    """4 CartPoles with a 12-step limit: one stream per env index, each equal to SB3's column for that env;
    truncations stored as truncated (not terminated); sampled dones as SB3's ``dones * (1 - timeouts)``."""
    url = str(tmp_path / "r")
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0, env_kwargs={"max_episode_steps": 12})
    model = DQN("MlpPolicy", env, learning_starts=10**6, buffer_size=4000, seed=0, device="cpu",
                replay_buffer_class=Tee, replay_buffer_kwargs={"url": url, "commit_every": 25})
    model.learn(400)  # 100 vector steps: 4 commits of 25 steps
    buf = model.replay_buffer
    ref = buf.ref
    assert buf.size() == ref.size() == 100 and buf.pending == 0
    check_samples(buf, ref_transitions(ref))
    ids, cols, (streams, steps, resets) = stored(url)
    assert len(ids) == 400 and len(set(streams)) == 4
    for j in range(4):
        key = f"w{streams[0][1:].split('-')[0]}-{j}"
        mine = streams == key
        order = np.argsort(steps[mine])
        np.testing.assert_array_equal(steps[mine][order], np.arange(100))
        np.testing.assert_array_equal(cols["obs"][mine][order], ref.observations[:100, j])
        np.testing.assert_array_equal(cols["next_obs"][mine][order], ref.next_observations[:100, j])
        np.testing.assert_array_equal(cols["truncated"][mine][order], ref.dones[:100, j] * ref.timeouts[:100, j])
        np.testing.assert_array_equal(cols["terminated"][mine][order],
                                      ref.dones[:100, j] * (1 - ref.timeouts[:100, j]))
        # an episode starts at the stream's first record and after each end
        ends = ref.dones[:100, j].astype(bool)
        np.testing.assert_array_equal(resets[mine][order], np.concatenate([[True], ends[:-1]]))
    assert cols["truncated"].sum() > 0 and cols["terminated"].sum() > 0
    assert not (cols["truncated"] & cols["terminated"]).any()
    buf.close()
    # the loaders' episode reader sees SB3's episodes: one per done, truncated where SB3 saw a timeout
    with open_store(url, mode="r") as s:
        eps = list(iter_episodes(s.default))
    assert len(eps) == int(ref.dones[:100].sum())
    assert sum(bool(e["truncated"]) for e in eps) == int((ref.dones[:100] * ref.timeouts[:100]).sum())


def test_without_handle_timeout_termination_truncations_are_dones(tmp_path: Path) -> None:
    """``handle_timeout_termination=False``: sampled dones count truncations too, as SB3's do; stored flags
    still tell them apart."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=1, env_kwargs={"max_episode_steps": 8})
    model = DQN("MlpPolicy", env, learning_starts=10**6, seed=0, device="cpu", replay_buffer_class=Tee,
                replay_buffer_kwargs={"url": str(tmp_path / "r"), "handle_timeout_termination": False})
    model.learn(200)
    buf = model.replay_buffer
    assert buf.ref.timeouts.sum() == 0  # (SB3 keeps no timeouts then)
    check_samples(buf, ref_transitions(buf.ref))
    buf.close()
    _, cols, _ = stored(str(tmp_path / "r"))
    assert cols["truncated"].sum() > 0


# -- reference model --------------------------------------------------------------------------
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_envs=st.integers(1, 3), buffer_size=st.integers(3, 30), commit_every=st.integers(1, 6),
       handle=st.booleans(), steps=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 2)), min_size=1,
                                            max_size=40), seed=st.integers(0, 2**16))
def test_same_add_calls_as_sb3_hold_the_same_transitions(n_envs: int, buffer_size: int, commit_every: int,
                                                         handle: bool, steps: list[tuple[int, int]],
                                                         seed: int) -> None:
    """The same ``add`` calls to SB3's ``ReplayBuffer`` and to ours: the same ``size``/``full``/``pos``, every
    sample one of SB3's valid transitions with SB3's dones (through commits and capacity eviction), and after
    a commit the store holds exactly SB3's valid transitions."""
    rng = np.random.default_rng(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    act_space = gym.spaces.Discrete(3)
    url = f"memory://sb3-prop-{uuid.uuid4().hex}"
    ours = ReplayStoreBuffer(buffer_size, obs_space, act_space, "cpu", n_envs, handle_timeout_termination=handle,
                             url=url, commit_every=commit_every)
    ref = ReplayBuffer(buffer_size, obs_space, act_space, "cpu", n_envs, handle_timeout_termination=handle)
    for t, (flags, action) in enumerate(steps):
        obs = np.stack([[t, j, rng.normal()] for j in range(n_envs)]).astype(np.float32)
        nxt = obs + np.float32(0.5)
        done = np.array([(flags >> j) & 1 for j in range(n_envs)], bool)
        infos = [{"TimeLimit.truncated": bool((flags >> 2) & 1 and done[j])} for j in range(n_envs)]
        act = np.full(n_envs, action)
        rew = rng.normal(size=n_envs).astype(np.float32)
        ours.add(obs, nxt, act, rew, done, infos)
        ref.add(obs, nxt, act, rew, done, infos)
        assert (ours.size(), ours.full, ours.pos) == (ref.size(), ref.full, ref.pos)
    ours.ref = ref  # type: ignore[attr-defined]
    want = ref_transitions(ref)
    check_samples(ours, want, n=64)
    ours.flush()
    with open_store(url, mode="r") as s:
        cols = s.default.read(s.default.row_ids())
    got = {}
    for i in range(len(cols["obs"])):
        done = cols["terminated"][i] if handle else cols["terminated"][i] | cols["truncated"][i]
        got[cols["obs"][i].tobytes()] = ([int(cols["action"][i])], float(cols["reward"][i]),
                                         cols["next_obs"][i].tobytes(), float(done))
    assert got == want
    ours.close()


# -- Dict observations ------------------------------------------------------------------------
class FlatDict(BaseFeaturesExtractor):
    """Every leaf flattened and concatenated (DictObsEnv's 8x8 image is too small for SB3's CNN)."""

    def __init__(self, observation_space: gym.spaces.Dict) -> None:
        super().__init__(observation_space, sum(int(np.prod(s.shape)) for s in observation_space.spaces.values()))

    def forward(self, observations: dict[str, th.Tensor]) -> th.Tensor:
        return th.cat([observations[k].flatten(1).float() for k in sorted(observations)], 1)


def test_dict_observations_with_the_dict_buffer(tmp_path: Path) -> None:
    """DQN with MultiInputPolicy on a Dict-obs env: nested columns, samples as SB3's DictReplayBuffer's."""
    url = str(tmp_path / "r")
    env = make_vec_env(DictObsEnv, n_envs=2, seed=0)
    model = DQN("MultiInputPolicy", env, learning_starts=50, buffer_size=1000, batch_size=16, seed=0,
                policy_kwargs={"net_arch": [16], "features_extractor_class": FlatDict}, device="cpu",
                replay_buffer_class=DictTee,
                replay_buffer_kwargs={"url": url, "commit_every": 30})
    model.learn(200)
    buf = model.replay_buffer
    assert model._n_updates > 0 and buf.size() == buf.ref.size() == 100
    check_samples(buf, ref_transitions(buf.ref), n=128)
    buf.close()
    with open_store(url, mode="r") as s:
        assert {"obs__image", "obs__vec", "next_obs__image", "next_obs__vec"} <= set(s.schema.names)
        cols = s.default.read(s.default.row_ids())
    assert cols["obs"]["image"].shape == (200, 3, 8, 8)  # (SB3 transposes images to channels first)
    assert cols["next_obs"]["vec"].dtype == np.float32
    assert cols["truncated"].any()  # DictObsEnv's 9-step limit


def test_dict_buffer_refuses_a_flat_space_and_the_flat_buffer_a_dict(tmp_path: Path) -> None:
    """Each buffer names the observation space it needs."""
    box, disc = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2)
    with pytest.raises(BufferArgumentError, match="observation_space"):
        ReplayStoreDictBuffer(10, box, disc, url=str(tmp_path / "a"))
    with pytest.raises(BufferArgumentError, match="observation_space.*ReplayStoreDictBuffer"):
        ReplayStoreBuffer(10, gym.spaces.Dict({"a": box}), disc, url=str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- crash and restart ------------------------------------------------------------------------
def _read_line(proc: subprocess.Popen[bytes], buf: list[bytes], deadline: float) -> str | None:
    """The child's next stdout line, or None at EOF; fails the test at ``deadline``."""
    fd = proc.stdout.fileno()  # type: ignore[union-attr]
    while b"\n" not in buf[0]:
        left = deadline - time.monotonic()
        assert left > 0, "the training child did not report in time"
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            if not sel.select(left):
                continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf[0] += chunk
    line, buf[0] = buf[0].split(b"\n", 1)
    return line.decode()


def test_sigkill_mid_training_then_dqn_load_continues_with_the_replay(tmp_path: Path) -> None:
    """A child trains DQN with our buffer and is SIGKILLed once 600+ transitions are committed. DQN.load with the
    saved kwargs reopens the store: every committed transition is there, bit for bit; the restarted learner
    trains from its first step (resume_learning_starts) and appends; save_replay_buffer pickles no replay."""
    from support.sb3train import MAX_STEPS

    url, path = str(tmp_path / "replay"), str(tmp_path / "model.zip")
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "support.sb3train",
                             json.dumps({"url": url, "model": path, "commit_every": 100})],
                            cwd=TESTS_DIR, env=env, stdout=subprocess.PIPE)
    buf = [b""]
    committed = 0
    try:
        deadline = time.monotonic() + 120
        assert _read_line(proc, buf, deadline) == "ready"
        while committed < 600:
            line = _read_line(proc, buf, deadline)
            assert line is not None and line.startswith("c "), line
            committed = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    ids, before, (streams, steps, resets) = stored(url)
    assert len(ids) >= committed and len(ids) % 100 == 0  # whole commits only
    # the transitions chain: next_obs is the following obs within an episode
    order = np.lexsort((steps, streams.astype(str)))
    nxt, cur, new = before["next_obs"][order][:-1], before["obs"][order][1:], resets[order][1:]
    np.testing.assert_array_equal(nxt[~new], cur[~new])
    assert before["truncated"].any() and before["terminated"].any()

    model = DQN.load(path, env=gym.make("CartPole-v1", max_episode_steps=MAX_STEPS), device="cpu")
    rb = model.replay_buffer
    assert isinstance(rb, ReplayStoreBuffer) and rb.stored_at_open == len(ids) and rb.size() == len(ids)
    assert resume_learning_starts(model) == 0
    model.learn(150)
    added = model.num_timesteps  # (152: whole rounds of train_freq 4)
    assert added >= 150 and model._n_updates > 0  # trained from the first steps: the store already held learning_starts
    pkl = tmp_path / "buffer.pkl"
    model.save_replay_buffer(pkl)  # commits, pickles the url and arguments only
    assert pkl.stat().st_size < 20_000 < len(ids) * 40
    model.load_replay_buffer(pkl)
    assert model.replay_buffer.size() == len(ids) + added
    model.replay_buffer.close()
    rb.close()
    ids2, after, _ = stored(url)
    assert len(ids2) == len(ids) + added
    with open_store(url, mode="r") as s:
        assert verify_store(s) == []  # the killed writer left nothing damaged
    kept = np.isin(ids2, ids)
    assert kept.sum() == len(ids)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_array_equal(after[name][kept], before[name])


def test_restart_learn_marks_a_new_episode(tmp_path: Path) -> None:
    """A second ``learn()`` resets the env mid-episode: the next record starts an episode (reset) and the
    abandoned one is listed unfinished in the commit metadata."""
    url = str(tmp_path / "r")
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=10**6, train_freq=1, seed=3, device="cpu",
                replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"url": url})
    model.learn(7)
    model.learn(5)  # reset_num_timesteps=True: a fresh env.reset()
    model.replay_buffer.close()
    _, cols, (_, _, resets) = stored(url)
    assert resets.tolist()[7] and not cols["terminated"][:7].any() and not cols["truncated"][:7].any()
    with open_store(url, mode="r") as s:
        eps = recorded_episodes(s)
    assert eps[0]["length"] == 7 and not eps[0]["terminated"] and not eps[0]["truncated"]


# -- bad arguments ----------------------------------------------------------------------------
def test_bad_arguments_get_typed_errors_and_leave_the_store(tmp_path: Path) -> None:
    """No url, optimize_memory_usage, other spaces or another buffer_size on reopen: typed errors naming the
    field; the store is left as it was."""
    env = gym.make("CartPole-v1")
    with pytest.raises(BufferArgumentError, match="url"):
        DQN("MlpPolicy", env, replay_buffer_class=ReplayStoreBuffer, device="cpu")
    url = str(tmp_path / "r")
    with pytest.raises(BufferArgumentError, match="optimize_memory_usage"):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, optimize_memory_usage=True,
                          handle_timeout_termination=False, url=url)
    with pytest.raises(BufferArgumentError, match="commit_every"):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, url=url, commit_every=0)
    with pytest.raises(BufferArgumentError, match="n_envs"):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, n_envs=0, url=url)
    with pytest.raises(BufferArgumentError, match="buffer_size"):
        ReplayStoreBuffer(0, env.observation_space, env.action_space, url=url)
    assert not os.path.exists(url)
    buf = ReplayStoreBuffer(100, env.observation_space, env.action_space, url=url, commit_every=2)
    for _ in range(3):
        buf.add(np.zeros((1, 4), np.float32), np.ones((1, 4), np.float32), np.array([1]), np.array([1.0]),
                np.array([False]), [{}])
    with pytest.raises(BufferArgumentError, match="action"):
        buf.add(np.zeros((1, 4), np.float32), np.ones((1, 4), np.float32), np.array([5]), np.array([1.0]),
                np.array([False]), [{}])
    with pytest.raises(BufferArgumentError, match="obs"):
        buf.add(np.full((1, 4), np.nan, np.float32), np.ones((1, 4), np.float32), np.array([1]), np.array([1.0]),
                np.array([False]), [{}])
    buf.close()
    ids, before, _ = stored(url)
    assert len(ids) == 3
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(SchemaMismatchError, match="'obs'"):
        ReplayStoreBuffer(100, pendulum.observation_space, env.action_space, url=url)
    with pytest.raises(SchemaMismatchError, match="'action'"):
        ReplayStoreBuffer(100, env.observation_space, pendulum.action_space, url=url)
    with pytest.raises(BufferArgumentError, match="buffer_size"):
        ReplayStoreBuffer(200, env.observation_space, env.action_space, url=url)
    ids2, after, _ = stored(url)
    np.testing.assert_array_equal(ids, ids2)
    with open_store(url, mode="r") as s:
        assert len(s.writers) == 1  # no writer registered by the refused opens


def test_pending_transitions_are_committed_when_the_process_exits(tmp_path: Path) -> None:
    """A process that returns normally without close(): its pending transitions (fewer than commit_every)
    are committed at interpreter exit; the same for a buffer that is garbage-collected."""
    url = str(tmp_path / "r")
    code = (
        "import gc, sys, numpy as np, gymnasium as gym\n"
        "from replaystore.integrations.sb3 import ReplayStoreBuffer\n"
        "env = gym.make('CartPole-v1')\n"
        "def fill(url, n):\n"
        "    b = ReplayStoreBuffer(1000, env.observation_space, env.action_space, url=url)\n"
        "    for t in range(n):\n"
        "        b.add(np.full((1, 4), t, np.float32), np.full((1, 4), t + 1, np.float32), np.array([1]),\n"
        "              np.array([1.0]), np.array([False]), [{}])\n"
        "    return b\n"
        "fill(sys.argv[1] + '-gc', 5)\n"
        "gc.collect()\n"
        "keep = fill(sys.argv[1], 7)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for path, n in ((url + "-gc", 5), (url, 7)):
        ids, cols, _ = stored(path)
        assert len(ids) == n
        np.testing.assert_array_equal(cols["obs"][:, 0], np.arange(n))


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_failed_commit_is_retried_without_losing_or_repeating_transitions(tmp_path: Path) -> None:
    """A commit that fails (writes past the file size limit fail with EFBIG, as on a full disk) raises from
    ``add``; once writes work again, the next ``add`` and ``flush`` commit every transition exactly once."""
    code = (
        "import errno, resource, signal, sys, numpy as np, gymnasium as gym\n"
        "from replaystore.integrations.sb3 import ReplayStoreBuffer\n"
        "env = gym.make('CartPole-v1')\n"
        "b = ReplayStoreBuffer(1000, env.observation_space, env.action_space, url=sys.argv[1], commit_every=5)\n"
        "def add(t):\n"
        "    b.add(np.full((1, 4), t, np.float32), np.full((1, 4), t + 1, np.float32), np.array([1]),\n"
        "          np.array([1.0]), np.array([False]), [{}])\n"
        "for t in range(5):\n"
        "    add(t)\n"  # (the fifth add commits)
        "add(5); add(6); add(7); add(8)\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))\n"
        "try:\n"
        "    add(9)\n"  # (the tail is full: its commit fails)
        "    print('no error')\n"
        "except OSError as exc:\n"
        "    print('failed', errno.errorcode.get(exc.errno))\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))\n"
        "add(10)\n"
        "b.flush()\n"
        "b.close()\n"
    )
    url = str(tmp_path / "r")
    r = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["failed", "EFBIG"]
    _, cols, (_, steps, _) = stored(url)
    assert sorted(cols["obs"][:, 0].tolist()) == list(range(11))
    assert sorted(steps.tolist()) == list(range(11))


def test_default_commit_every_bounds_the_ram_of_pending_steps(tmp_path: Path) -> None:
    """Default cadence: 1000 steps, fewer where they would exceed ~64 MiB (8 envs of 84x84x4 frames: 148)."""
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    b = ReplayStoreBuffer(10_000, frames, gym.spaces.Discrete(4), n_envs=8, url=str(tmp_path / "atari"))
    small = ReplayStoreBuffer(10_000, gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2),
                              url=str(tmp_path / "small"))
    assert (b.commit_every, small.commit_every) == (148, 1000)
    for _ in range(148):
        b.add(np.zeros((8, 4, 84, 84), np.uint8), np.zeros((8, 4, 84, 84), np.uint8), np.zeros(8, np.int64),
              np.zeros(8, np.float32), np.zeros(8, bool), [{}] * 8)
    assert b.pending == 0 and b.size() == 148  # committed at the 148th step
    b.close()
    small.close()


def test_sample_normalises_through_vec_normalize_as_sb3(tmp_path: Path) -> None:
    """DQN on a VecNormalize env: the store keeps the original observations and rewards (as SB3's buffer
    does), and ``sample(n, env)`` returns them normalised by ``env``."""
    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0))
    model = DQN("MlpPolicy", venv, learning_starts=50, seed=0, device="cpu", policy_kwargs={"net_arch": [16]},
                replay_buffer_class=Tee, replay_buffer_kwargs={"url": str(tmp_path / "r"), "commit_every": 40})
    model.learn(200)
    buf = model.replay_buffer
    check_samples(buf, ref_transitions(buf.ref))  # (raw values, as SB3's buffer stores them)
    np.random.seed(5)
    raw = buf.sample(64)
    np.random.seed(5)
    normed = buf.sample(64, env=venv)
    np.testing.assert_allclose(normed.observations.numpy(), venv.normalize_obs(raw.observations.numpy()))
    np.testing.assert_allclose(normed.next_observations.numpy(), venv.normalize_obs(raw.next_observations.numpy()))
    np.testing.assert_allclose(normed.rewards.numpy(), venv.normalize_reward(raw.rewards.numpy()))
    assert not np.allclose(normed.observations.numpy(), raw.observations.numpy())
    buf.close()


# -- garbage collection, exit and SIGTERM ----------------------------------------------------------
_FILL = (
    "import concurrent.futures.thread as cft, gc, os, signal, sys, time, numpy as np, gymnasium as gym\n"
    "from replaystore.integrations import sb3\n"
    "from replaystore.store import open_store\n"
    "env = gym.make('CartPole-v1')\n"
    "def fill(url, n):\n"
    "    b = sb3.ReplayStoreBuffer(1000, env.observation_space, env.action_space, url=url)\n"
    "    for t in range(n):\n"
    "        b.add(np.full((1, 4), t, np.float32), np.full((1, 4), t + 1, np.float32), np.array([1]),\n"
    "              np.array([1.0]), np.array([False]), [{}])\n"
    "    return b\n"
)


def _run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python; a child that does not finish in ``timeout`` s (a hang) fails the test."""
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child hung (killed after {timeout} s): {exc.stdout!r} {exc.stderr!r}")


def test_a_buffer_collected_inside_the_executors_lock_does_not_hang(tmp_path: Path) -> None:
    """The cyclic GC may free a buffer at any allocation, e.g. while this thread is inside
    ``ThreadPoolExecutor.submit`` holding its (non-reentrant) locks. Collecting a buffer with pending steps there
    returns at once; its steps are committed by the flusher thread as soon as the lock is free."""
    url = str(tmp_path / "r")
    code = _FILL + (
        "b = fill(sys.argv[1], 5)\n"
        "b.cycle = b\n"  # (a reference cycle, as an SB3 model is: only the cyclic GC frees it)
        "del b\n"
        "with cft._global_shutdown_lock:\n"  # (what ThreadPoolExecutor.submit holds, the writer's commit takes)
        "    gc.collect()\n"
        "    print('collected', flush=True)\n"
        "assert sb3.commit_collected(timeout=60)\n"
        "with open_store(sys.argv[1], mode='r') as s:\n"
        "    print(len(s.default), flush=True)\n"
        "os._exit(0)\n"  # (no exit hooks: the rows were committed before)
    )
    r = _run_child(code, url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["collected", "5"]
    ids, cols, _ = stored(url)
    np.testing.assert_array_equal(cols["obs"][:, 0], np.arange(5))


def test_dqn_save_del_collect_load_keeps_the_pending_steps(tmp_path: Path) -> None:
    """SB3's save/load cycle (its own ``test_save_load``) with our buffer and pending steps: ``del model``, a garbage
    collection while the executor's lock is held, ``DQN.load``. Nothing hangs; the reloaded buffer holds the first
    model's steps; the second model's pending steps reach the store at exit."""
    url, path = str(tmp_path / "replay"), str(tmp_path / "model.zip")
    code = (
        "import concurrent.futures.thread as cft, gc, sys, gymnasium as gym\n"
        "from stable_baselines3 import DQN\n"
        "from replaystore.integrations.sb3 import ReplayStoreBuffer\n"
        "url, path = sys.argv[1:]\n"
        "model = DQN('MlpPolicy', gym.make('CartPole-v1'), learning_starts=50, policy_kwargs={'net_arch': [16]},\n"
        "            seed=0, device='cpu', replay_buffer_class=ReplayStoreBuffer,\n"
        "            replay_buffer_kwargs={'url': url, 'commit_every': 10_000})\n"
        "model.learn(120)\n"
        "print(model.replay_buffer.pending, flush=True)\n"
        "model.save(path)\n"
        "del model\n"
        "with cft._global_shutdown_lock:\n"
        "    gc.collect()\n"
        "model = DQN.load(path, env=gym.make('CartPole-v1'), device='cpu')\n"
        "print(model.replay_buffer.stored_at_open, flush=True)\n"
        "model.learn(80)\n"
        "print(model.replay_buffer.pending, flush=True)\n"
    )
    r = _run_child(code, url, path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["120", "120", "80"]
    ids, cols, (streams, _, _) = stored(url)
    assert len(ids) == 200 and len(set(streams.tolist())) == 2  # two writers, every step once


def test_sigterm_with_the_documented_handler_commits_the_pending_steps(tmp_path: Path) -> None:
    """Python's default SIGTERM kills the process without exit hooks (the pending steps are lost, as in a crash);
    with the handler docs/GUIDE.md gives (``sys.exit`` from a SIGTERM handler) they are committed."""
    for handler, kept in ((False, 0), (True, 7)):
        url = str(tmp_path / f"r{int(handler)}")
        code = _FILL + (
            "if sys.argv[2] == '1':\n"
            "    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))\n"
            "b = fill(sys.argv[1], 7)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code, url, str(int(handler))], stdout=subprocess.PIPE)
        try:
            assert _read_line(proc, [b""], time.monotonic() + 120) == "ready"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait(timeout=60)
        assert proc.returncode == (128 + signal.SIGTERM if handler else -signal.SIGTERM)
        ids, cols, _ = stored(url)
        assert len(ids) == kept
        np.testing.assert_array_equal(cols["obs"][:, 0], np.arange(kept))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_commits_only_its_own_buffers(tmp_path: Path) -> None:
    """A child forked with pending steps in the parent's buffer, exiting normally, commits its own buffer's steps
    and never the parent's copy of the parent's (which the parent commits once at its own exit)."""
    url = str(tmp_path / "r")
    code = _FILL + (
        "keep = fill(sys.argv[1], 3)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    child = fill(sys.argv[1] + '-child', 2)\n"
        "    sys.exit(0)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
    )
    r = _run_child(code, url)
    assert r.returncode == 0, r.stderr
    for path, n in ((url, 3), (url + "-child", 2)):
        ids, cols, _ = stored(path)
        np.testing.assert_array_equal(np.sort(cols["obs"][:, 0]), np.arange(n))


def test_an_unbounded_store_opens_for_any_buffer_size_and_samples_its_newest_records(tmp_path: Path) -> None:
    env = gym.make("CartPole-v1")
    url = str(tmp_path / "replay")
    first = ReplayStoreBuffer(10_000, env.observation_space, env.action_space, url=url)
    first.close()
    with open_store(url, mode="r") as st:  # (a store this buffer created is bounded: refused for another size)
        assert st.default.capacity == 10_000
    unbounded = str(tmp_path / "unbounded")
    with open_store(url, mode="r") as src, open_store(unbounded, src.schema, mode="x") as st, st.writer() as w:
        obs = np.arange(50 * 4, dtype=np.float32).reshape(50, 4)
        w.append({"obs": obs, "action": np.zeros(50, np.int64), "reward": np.arange(50, dtype=np.float32),
                  "next_obs": obs + 1, "terminated": np.zeros(50, bool), "truncated": np.zeros(50, bool)},
                 stream="s", reset=True)
    for size, low in ((8, 42), (50, 0), (1000, 0)):
        buf = ReplayStoreBuffer(size, env.observation_space, env.action_space, url=unbounded)
        assert buf.size() == min(size, 50) and buf.full == (size <= 50)
        drawn = buf.sample(2000).rewards.numpy().ravel()
        assert set(drawn.astype(int).tolist()) == set(range(low, 50))
        buf.close()
    with open_store(unbounded, mode="r") as st:
        assert st.default.capacity is None and len(st.default) == 50


def test_a_missing_store_is_created_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = gym.make("CartPole-v1")
    url = tmp_path / "replay"
    with pytest.raises(StoreNotFoundError, match=str(url)):
        ReplayStoreBuffer(100, env.observation_space, env.action_space, url=url, create=False)
    assert not url.exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    buf = ReplayStoreBuffer(100, env.observation_space, env.action_space, url="~/replay")  # ~ is $HOME
    buf.close()
    assert url.is_dir() and list((tmp_path / "cwd").iterdir()) == []
    with open_store(str(url), mode="r") as st:
        assert len(st.default) == 0


def test_dqn_load_of_a_moved_run_never_creates_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An absolute url of a moved run is a StoreNotFoundError (nothing created); a relative one follows the run."""
    for url in ("replay", str(tmp_path / "run" / "replay")):
        run = tmp_path / "run"
        run.mkdir()
        monkeypatch.chdir(run)
        model = DQN("MlpPolicy", "CartPole-v1", learning_starts=10, buffer_size=500, seed=0, device="cpu",
                    replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"url": url})
        model.learn(40)
        model.save(run / "model")
        model.replay_buffer.close()
        moved = tmp_path / "moved"
        run.rename(moved)
        monkeypatch.chdir(tmp_path)
        if url == "replay":  # relative: looked up next to the model file
            loaded = DQN.load(moved / "model", device="cpu")
            assert loaded.replay_buffer.size() == 40
            loaded.replay_buffer.close()
        else:
            with pytest.raises(StoreNotFoundError, match="replay_buffer_kwargs") as err:
                DQN.load(moved / "model", device="cpu")
            assert url in str(err.value)
        assert not run.exists() and not (tmp_path / "replay").exists()
        shutil.rmtree(moved)
