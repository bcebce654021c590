"""The store-backed twins of SB3's ``NStepReplayBuffer`` and ``HerReplayBuffer``, checked against SB3's own.

Reference: SB3's buffers fed the same ``add`` calls from a real vector env. n-step windows are
deterministic given the start index, so they are compared exactly for every index; HER
minibatches are compared exactly under the same ``np.random`` seed (records are numbered as SB3
numbers its slots), and the relabelled goals' distribution is tested against the distribution
SB3's sampling defines (a chi-square goodness-of-fit over (step, goal step) cells).
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from replaystore.errors import BufferArgumentError
from replaystore.integrations import ReplayStoreHerBuffer, ReplayStoreNStepBuffer
from replaystore.integrations.sb3 import ReplayStoreBuffer, ReplayStoreDictBuffer
from support.sb3twins import CounterGoalEnv


def feed(venv: Any, bufs: list[Any], steps: int, seed: int = 0) -> None:
    """``steps`` vector-env steps of random actions, each added to every buffer as SB3's learner adds it."""
    venv.seed(seed)
    venv.action_space.seed(seed)
    n = venv.num_envs
    obs = venv.reset()
    for _ in range(steps):
        action = np.array([venv.action_space.sample() for _ in range(n)])
        new_obs, reward, done, infos = venv.step(action)
        nxt = {k: v.copy() for k, v in new_obs.items()} if isinstance(new_obs, dict) else new_obs.copy()
        for i in np.flatnonzero(done):
            term = infos[i]["terminal_observation"]
            if isinstance(nxt, dict):
                for k in nxt:
                    nxt[k][i] = term[k]
            else:
                nxt[i] = term
        for b in bufs:
            b.add(obs, nxt, action.reshape(n, -1), reward, done, infos)
        obs = new_obs


def cartpole(n_envs: int, limit: int = 18) -> DummyVecEnv:
    return DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=limit) for _ in range(n_envs)])


def counters(n_envs: int) -> DummyVecEnv:
    return DummyVecEnv([CounterGoalEnv for _ in range(n_envs)])


def assert_samples_equal(a: Any, b: Any) -> None:
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
        elif isinstance(x, dict):
            assert list(x) == list(y), name
            for k in x:
                assert x[k].dtype == y[k].dtype and th.equal(x[k], y[k]), (name, k)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, y.dtype, x.shape, y.shape)
            assert th.equal(x, y), name


# -- n-step ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("handle_timeout_termination", [True, False])
@pytest.mark.parametrize("n_steps", [1, 3, 6])
def test_nstep_windows_equal_sb3_for_every_index(tmp_path: Path, n_envs: int, handle_timeout_termination: bool,
                                                 n_steps: int) -> None:
    """Every start index: reward sum, discount, next_obs, done, obs and action exactly SB3's, terminations and
    time-limit truncations within the window included, the newest (in-progress) step included."""
    venv = cartpole(n_envs)
    kw: dict[str, Any] = {"n_envs": n_envs, "handle_timeout_termination": handle_timeout_termination,
                          "n_steps": n_steps, "gamma": 0.9}
    ref = NStepReplayBuffer(2000, venv.observation_space, venv.action_space, "cpu", **kw)
    ours = ReplayStoreNStepBuffer(2000, venv.observation_space, venv.action_space, "cpu", **kw,
                                  url=str(tmp_path / "s"), commit_every=7)
    feed(venv, [ref, ours], 130)
    assert 0 < ours.pending < 7 * n_envs  # committed and pending records alike
    assert ours._ledger.truncated.any() and ours._ledger.terminated.any()  # both ends occur
    idx = np.arange(ref.pos)
    np.random.seed(5)
    expected = ref._get_samples(idx)
    np.random.seed(5)
    env_idx = np.random.randint(0, n_envs, size=idx.shape)  # (SB3 draws the env of each index so)
    assert_samples_equal(expected, ours._samples_at(idx * n_envs + env_idx))


def test_nstep_samples_draw_every_held_transition_uniformly(tmp_path: Path) -> None:
    """sample() starts windows at held transitions uniformly (chi-square against uniform), as SB3's sample."""
    venv = cartpole(2)
    ours = ReplayStoreNStepBuffer(500, venv.observation_space, venv.action_space, "cpu", n_envs=2,
                                  url=str(tmp_path / "s"), commit_every=10)
    feed(venv, [ours], 50)
    held = {ours._gather(np.array([g]), ["obs"])["obs"].tobytes(): g for g in range(100)}
    np.random.seed(1)
    counts = np.zeros(100)
    for _ in range(50):
        batch = ours.sample(400)
        assert batch.discounts is not None
        for row in batch.observations.numpy():
            counts[held[row.tobytes()]] += 1
    assert chi_square(counts, np.full(100, counts.sum() / 100)) < chi2_critical(99)


def test_nstep_windows_survive_close_and_reopen(tmp_path: Path) -> None:
    """A reopened store gives the same windows (its ledger is rebuilt from the stream index); the episode
    the closed writer left unfinished ends its windows as a truncation; new steps never extend them."""
    venv = cartpole(2)
    url = str(tmp_path / "s")
    a = ReplayStoreNStepBuffer(1000, venv.observation_space, venv.action_space, "cpu", n_envs=2, n_steps=4,
                               url=url, commit_every=9)
    feed(venv, [a], 61)
    every = np.arange(122)
    before = a._samples_at(every)
    a.close()
    b = ReplayStoreNStepBuffer(1000, venv.observation_space, venv.action_space, "cpu", n_envs=2, n_steps=4,
                               url=url, commit_every=9)
    assert b.stored_at_open == 122
    assert_samples_equal(before, b._samples_at(every))
    feed(venv, [b], 20, seed=1)
    assert_samples_equal(before, b._samples_at(every))
    last = b._samples_at(np.array([120, 121]))  # the closed writer's newest steps: windows of one, bootstrapped
    if not (b._ledger.terminated[120:122] | b._ledger.truncated[120:122]).any():
        np.testing.assert_allclose(last.discounts.numpy(), 0.99)
        assert not last.dones.any()


# -- HER ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("n_envs", [1, 2])
@pytest.mark.parametrize("copy_info_dict", [False, True])
def test_her_minibatches_equal_sb3_with_the_same_seed(tmp_path: Path, strategy: str, n_envs: int,
                                                      copy_info_dict: bool) -> None:
    """Same add calls, same np.random seed: SB3's HerReplayBuffer and the twin give the same minibatches,
    relabelled goals, compute_reward rewards (infos passed when copy_info_dict) and dones."""
    venv = counters(n_envs)
    kw: dict[str, Any] = {"n_envs": n_envs, "n_sampled_goal": 4, "goal_selection_strategy": strategy,
                          "copy_info_dict": copy_info_dict}
    ref = HerReplayBuffer(2000, venv.observation_space, venv.action_space, venv, "cpu", **kw)
    ours = ReplayStoreHerBuffer(2000, venv.observation_space, venv.action_space, venv, "cpu", **kw,
                                url=str(tmp_path / "s"), commit_every=6)
    feed(venv, [ref, ours], 90)
    assert ours._ledger.truncated.any() and ours._ledger.terminated.any()  # both ends occur
    for seed in range(4):
        np.random.seed(seed)
        expected = ref.sample(100)
        np.random.seed(seed)
        got = ours.sample(100)
        assert_samples_equal(expected, got)
    bonus = got.rewards.numpy()[20:] % 1  # the relabelled rows' rewards carry the infos' bonus, or none
    assert (np.abs(bonus) > 1e-6).any() == copy_info_dict


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a count where the reference gives probability 0"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """The chi-square quantile for ``dof`` degrees of freedom at p = 1e-4 (Wilson-Hilferty)."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


def her_cells(batch: Any, nb_virtual: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, goal step) of the relabelled rows: the counter env's observation is the step, its goal the count."""
    t = batch.observations["observation"].numpy()[-nb_virtual:, 0].astype(int)
    j = batch.observations["desired_goal"].numpy()[-nb_virtual:, 0].astype(int) - 1
    return t, j


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_her_goals_follow_sb3s_sampling_distribution(tmp_path: Path, strategy: str) -> None:
    """With an independent seed, the twin's (sampled step, goal step) frequencies fit the distribution SB3's
    sampling defines over its own episode arrays (chi-square, p = 1e-4); so do SB3's own draws. Goals come from
    the sampled transition's episode: at or after it (future), its last step (final); the share relabelled is
    SB3's, and real rows keep their reward."""
    venv = counters(1)
    kw: dict[str, Any] = {"n_sampled_goal": 4, "goal_selection_strategy": strategy}
    ref = HerReplayBuffer(2000, venv.observation_space, venv.action_space, venv, "cpu", **kw)
    ours = ReplayStoreHerBuffer(2000, venv.observation_space, venv.action_space, venv, "cpu", **kw,
                                url=str(tmp_path / "s"), commit_every=13)
    feed(venv, [ref, ours], 150)
    # SB3's distribution: a valid slot uniformly, then the goal step uniformly in its range
    valid = np.flatnonzero(ref.ep_length[:, 0] > 0)
    expected = np.zeros((16, 16))
    for i in valid:
        t, length = i - ref.ep_start[i, 0], ref.ep_length[i, 0]
        lo, hi = {"future": (t, length), "final": (length - 1, length), "episode": (0, length)}[strategy]
        expected[t, lo:hi] += 1.0 / (len(valid) * (hi - lo))
    batch, rounds = 250, 40
    nb_virtual = int(ours.her_ratio * batch)
    assert nb_virtual == 200
    for buf, seed in ((ours, 1234), (ref, 99)):
        np.random.seed(seed)
        counts = np.zeros((16, 16))
        for _ in range(rounds):
            b = buf.sample(batch)
            t, j = her_cells(b, nb_virtual)
            np.add.at(counts, (t, j), 1)
            if strategy == "future":
                assert (j >= t).all()
            real = b.observations["desired_goal"].numpy()[:batch - nb_virtual, 0]
            assert (real >= 2).all()  # the env's own goals, not relabelled
            ach = b.next_observations["achieved_goal"].numpy()[:batch - nb_virtual, 0]
            np.testing.assert_allclose(b.rewards.numpy()[:batch - nb_virtual, 0],
                                       -(np.abs(ach - real) > 0.5).astype(float) + 0.01 * ach, rtol=1e-5)
        cells = expected.reshape(-1) > 0
        stat = chi_square(counts.reshape(-1), expected.reshape(-1) * counts.sum())
        assert stat < chi2_critical(max(int(cells.sum()) - 1, 1)), (type(buf).__name__, stat)


def test_her_reopen_samples_the_same_and_truncate_last_trajectory(tmp_path: Path) -> None:
    """A reopened store samples what the closed buffer sampled (episodes in progress stay unsampled);
    truncate_last_trajectory ends them as truncations, as SB3's does (with its warning)."""
    venv = counters(2)
    url = str(tmp_path / "s")
    a = ReplayStoreHerBuffer(1000, venv.observation_space, venv.action_space, venv, "cpu", n_envs=2, url=url,
                             commit_every=5)
    feed(venv, [a], 41)
    np.random.seed(7)
    before = a.sample(64)
    open_eps = sum(1 for ep in a._episodes_open if ep)
    a.close()
    b = ReplayStoreHerBuffer(1000, venv.observation_space, venv.action_space, venv, "cpu", n_envs=2, url=url,
                             commit_every=5)
    np.random.seed(7)
    assert_samples_equal(before, b.sample(64))
    valid_before = int((b._ledger.length[:b._ledger.n] > 0).sum())
    assert open_eps > 0
    with pytest.warns(UserWarning, match="truncated"):
        b.truncate_last_trajectory()
    assert int((b._ledger.length[:b._ledger.n] > 0).sum()) > valid_before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.truncate_last_trajectory()  # nothing left to end: no warning
    b.close()


def test_her_dqn_save_load_and_replay_buffer_pickle(tmp_path: Path) -> None:
    """DQN + HER on a goal env: model.save/load reopens the same store with the HER arguments (the env comes
    from load); save_replay_buffer pickles the URL and arguments only; load_replay_buffer sets the env."""
    url, path = str(tmp_path / "replay"), str(tmp_path / "model.zip")
    env = CounterGoalEnv()
    model = DQN("MultiInputPolicy", env, buffer_size=10_000, learning_starts=40, train_freq=4, batch_size=16,
                policy_kwargs={"net_arch": [16]}, seed=0, device="cpu", replay_buffer_class=ReplayStoreHerBuffer,
                replay_buffer_kwargs={"url": url, "n_sampled_goal": 2, "goal_selection_strategy": "final",
                                      "commit_every": 10})
    model.learn(80)
    assert model._n_updates > 0
    model.save(path)
    model.replay_buffer.close()
    del model
    loaded = DQN.load(path, env=CounterGoalEnv(), device="cpu")
    rb = loaded.replay_buffer
    assert isinstance(rb, ReplayStoreHerBuffer) and isinstance(rb, HerReplayBuffer)
    assert rb.stored_at_open == 80 and rb.n_sampled_goal == 2 and rb.goal_selection_strategy.name == "FINAL"
    assert rb.env is loaded.env
    loaded.learn(40, reset_num_timesteps=False)
    pkl = tmp_path / "buffer.pkl"
    loaded.save_replay_buffer(pkl)
    assert pkl.stat().st_size < 20_000
    with pytest.warns(UserWarning, match="truncated"):
        loaded.load_replay_buffer(pkl)  # (the episode in progress is ended, SB3's default truncate_last_traj)
    rb2 = loaded.replay_buffer
    assert isinstance(rb2, ReplayStoreHerBuffer) and rb2.env is loaded.env and rb2.size() == 120
    assert rb2.sample(8).rewards.shape == (8, 1)
    rb2.close()
    rb.close()


def test_nstep_dqn_learns_with_the_twin_and_save_load(tmp_path: Path) -> None:
    """DQN with n-step returns through the twin trains; load reopens it with n_steps and gamma."""
    url, path = str(tmp_path / "replay"), str(tmp_path / "model.zip")
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), buffer_size=10_000, learning_starts=50, train_freq=4,
                batch_size=16, policy_kwargs={"net_arch": [16]}, seed=0, device="cpu",
                replay_buffer_class=ReplayStoreNStepBuffer,
                replay_buffer_kwargs={"url": url, "n_steps": 5, "gamma": 0.95, "commit_every": 25})
    model.learn(120)
    assert model._n_updates > 0 and isinstance(model.replay_buffer, ReplayStoreBuffer)
    model.save(path)
    model.replay_buffer.close()
    loaded = DQN.load(path, env=gym.make("CartPole-v1"), device="cpu")
    rb = loaded.replay_buffer
    assert isinstance(rb, ReplayStoreNStepBuffer) and isinstance(rb, NStepReplayBuffer)
    assert (rb.n_steps, rb.gamma, rb.stored_at_open) == (5, 0.95, 120)
    batch = rb.sample(64)
    assert batch.discounts is not None
    got = batch.discounts.numpy().ravel()
    assert np.isclose(got[:, None], 0.95 ** np.arange(1, 6)[None, :]).any(axis=1).all()
    rb.close()


def test_bad_arguments_get_typed_errors_and_create_nothing(tmp_path: Path) -> None:
    box, disc = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2)
    goal = CounterGoalEnv().observation_space
    url = str(tmp_path / "s")
    for kw, field in (({"n_steps": 0}, "n_steps"), ({"gamma": 1.5}, "gamma"), ({"n_steps": True}, "n_steps")):
        with pytest.raises(BufferArgumentError, match=field):
            ReplayStoreNStepBuffer(10, box, disc, url=url, **kw)
    with pytest.raises(BufferArgumentError, match="observation_space"):
        ReplayStoreNStepBuffer(10, goal, disc, url=url)
    with pytest.raises(BufferArgumentError, match="goal_selection_strategy"):
        ReplayStoreHerBuffer(10, goal, disc, goal_selection_strategy="later", url=url)
    with pytest.raises(BufferArgumentError, match="n_sampled_goal"):
        ReplayStoreHerBuffer(10, goal, disc, n_sampled_goal=-1, url=url)
    with pytest.raises(BufferArgumentError, match="desired_goal"):
        ReplayStoreHerBuffer(10, gym.spaces.Dict({"observation": box}), disc, url=url)
    with pytest.raises(BufferArgumentError, match="url"):
        ReplayStoreHerBuffer(10, goal, disc)
    with pytest.raises(BufferArgumentError, match="frame_stack"):
        ReplayStoreNStepBuffer(10, box, disc, url=url, frame_stack=4)
    with pytest.raises(BufferArgumentError, match="frame_stack"):
        ReplayStoreHerBuffer(10, goal, disc, url=url, frame_stack=4)
    assert not (tmp_path / "s").exists()
    buf = ReplayStoreHerBuffer(100, goal, disc, url=url)  # no env: refused at sampling, with what to do
    feed(counters(1), [buf], 12)
    with pytest.raises(BufferArgumentError, match="set_env"):
        buf.sample(4)
    assert isinstance(buf, ReplayStoreDictBuffer)
    buf.close()


def test_the_package_exports_the_twins_lazily() -> None:
    """``replaystore.integrations`` imports stable-baselines3 only when a twin is asked for."""
    code = ("import sys, replaystore.integrations as i; assert 'stable_baselines3' not in sys.modules; "
            "i.ReplayStoreNStepBuffer, i.ReplayStoreHerBuffer; assert 'stable_baselines3' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_past_capacity_both_twins_sample_only_what_sb3_still_holds(tmp_path: Path) -> None:
    """Past the capacity, HER draws only episodes whose first step is still held (SB3 voids an episode as
    soon as its first step is overwritten): the (step, goal step) frequencies fit SB3's distribution over its
    wrapped arrays; n-step windows from the held steps are SB3's, matched by observation."""
    venv = counters(1)
    kw: dict[str, Any] = {"n_sampled_goal": 4, "goal_selection_strategy": "future"}
    ref = HerReplayBuffer(60, venv.observation_space, venv.action_space, venv, "cpu", **kw)
    ours = ReplayStoreHerBuffer(60, venv.observation_space, venv.action_space, venv, "cpu", **kw,
                                url=str(tmp_path / "her"), commit_every=7)
    feed(venv, [ref, ours], 203)
    assert ref.full
    valid = np.flatnonzero(ref.ep_length[:, 0] > 0)
    expected = np.zeros((16, 16))
    for i in valid:
        t, length = (i - ref.ep_start[i, 0]) % 60, ref.ep_length[i, 0]
        expected[t, t:length] += 1.0 / (len(valid) * (length - t))
    np.random.seed(11)
    counts = np.zeros((16, 16))
    for _ in range(40):
        t, j = her_cells(ours.sample(250), 200)
        np.add.at(counts, (t, j), 1)
    stat = chi_square(counts.reshape(-1), expected.reshape(-1) * counts.sum())
    assert stat < chi2_critical(max(int((expected > 0).sum()) - 1, 1)), stat
    ours.close()

    cp = cartpole(1)
    nref = NStepReplayBuffer(50, cp.observation_space, cp.action_space, "cpu", n_steps=4, gamma=0.9)
    nours = ReplayStoreNStepBuffer(50, cp.observation_space, cp.action_space, "cpu", n_steps=4, gamma=0.9,
                                   url=str(tmp_path / "nstep"), commit_every=7)
    feed(cp, [nref, nours], 133)
    held = np.array([i for i in range(50) if i != nref.pos])  # SB3 never starts at pos (its oldest, when full)
    np.random.seed(0)
    exp = nref._get_samples(held)
    by_obs = {nours._gather(np.array([g]), ["obs"])["obs"].tobytes(): g for g in range(83, 133)}
    got = nours._samples_at(np.array([by_obs[o.tobytes()] for o in exp.observations.numpy()]))
    assert_samples_equal(exp, got)
    nours.close()


def test_recorded_vector_env_stores_feed_both_twins(tmp_path: Path) -> None:
    """A store recorded from a 3-env vector env (streams interleaved unevenly: autoreset steps are not
    records) opens in both twins: every n-step window equals the one computed from ``iter_episodes``'
    episodes, and every relabelled HER goal comes from the sampled transition's own episode, at or after it."""
    from replaystore.gym import RecordVectorEpisodes
    from replaystore.loaders import iter_episodes
    from replaystore.store import open_store

    url = str(tmp_path / "rec")
    rec = RecordVectorEpisodes(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                                            max_episode_steps=18), url)
    rec.reset(seed=0)
    for _ in range(60):
        rec.step(rec.action_space.sample())
    rec.close()
    space = gym.make("CartPole-v1")
    buf = ReplayStoreNStepBuffer(1000, space.observation_space, space.action_space, "cpu", n_steps=4, gamma=0.9,
                                 url=url)
    n = buf.stored_at_open
    got = buf._samples_at(np.arange(n))
    by_obs = {o.tobytes(): i for i, o in enumerate(got.observations.numpy())}
    seen = 0
    with open_store(url, mode="r") as s:
        for ep in iter_episodes(s.default, complete_only=False):
            obs, nxt, r = np.asarray(ep["obs"]), np.asarray(ep["next_obs"]), np.asarray(ep["reward"], np.float32)
            length = len(r)
            for t in range(length):
                k = min(4, length - t)
                i = by_obs[obs[t].tobytes()]
                expected = (r[t:t + k] * 0.9 ** np.arange(k, dtype=np.float32)).sum()
                np.testing.assert_allclose(got.rewards.numpy()[i, 0], expected, rtol=1e-6)
                np.testing.assert_array_equal(got.next_observations.numpy()[i], nxt[t + k - 1])
                np.testing.assert_allclose(got.discounts.numpy()[i, 0], 0.9 ** k, rtol=1e-6)
                seen += 1
    assert seen == n
    buf.close()

    url = str(tmp_path / "goals")
    rec = RecordVectorEpisodes(gym.vector.SyncVectorEnv([CounterGoalEnv for _ in range(3)]), url)
    rec.reset(seed=0)
    for _ in range(60):
        rec.step(rec.action_space.sample())
    rec.close()
    env = CounterGoalEnv()
    her = ReplayStoreHerBuffer(1000, env.observation_space, env.action_space, DummyVecEnv([CounterGoalEnv]), "cpu",
                               url=url)
    np.random.seed(0)
    for _ in range(10):
        b = her.sample(100)
        t, j = her_cells(b, 80)
        assert (j >= t).all() and (j <= 7).all()  # the counter's own episode: step t .. at most 8 steps
        np.testing.assert_array_equal(b.observations["desired_goal"].numpy(),
                                      b.next_observations["desired_goal"].numpy())
    her.close()
