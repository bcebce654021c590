"""Journey: an SB3 user trains with n-step returns and with HER on the store, saves, reloads, is killed, resumes.

DQN with ``ReplayStoreNStepBuffer`` on CartPole and SAC with ``ReplayStoreHerBuffer`` on SB3's
bit-flipping goal env: ``learn`` through the twin while SB3's own buffer receives the same ``add``
calls (the samples compared exactly), ``model.save``/``load`` reopening the store, then a training
process SIGKILLed mid-run and a new process that reloads the model, finds every committed transition
(the windows and seeded HER minibatches equal those of SB3's buffer fed the stored records) and
trains on.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from replaystore.integrations import ReplayStoreHerBuffer, ReplayStoreNStepBuffer
from replaystore.integrations.sb3 import resume_learning_starts
from replaystore.store import open_store
from replaystore.store.maintenance import verify_store
from support.sb3twins import make_env

TESTS_DIR = Path(__file__).resolve().parents[1]


class TeeNStep(ReplayStoreNStepBuffer):
    """The n-step twin, forwarding every ``add`` to SB3's own ``NStepReplayBuffer`` (``self.ref``)."""

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, device: Any = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False, **kw: Any) -> None:
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage, **kw)
        self.ref = NStepReplayBuffer(buffer_size, observation_space, action_space, device, n_envs,
                                     n_steps=self.n_steps, gamma=self.gamma)

    def add(self, *args: Any) -> None:
        super().add(*args)
        self.ref.add(*args)


class TeeHer(ReplayStoreHerBuffer):
    """The HER twin, forwarding every ``add`` to SB3's own ``HerReplayBuffer`` (``self.ref``)."""

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, env: Any = None,
                 device: Any = "auto", n_envs: int = 1, optimize_memory_usage: bool = False, **kw: Any) -> None:
        super().__init__(buffer_size, observation_space, action_space, env, device, n_envs, optimize_memory_usage,
                         **kw)
        self.ref = HerReplayBuffer(buffer_size, observation_space, action_space, env, device, n_envs,
                                   n_sampled_goal=self.n_sampled_goal,
                                   goal_selection_strategy=self.goal_selection_strategy)

    def add(self, *args: Any) -> None:
        super().add(*args)
        self.ref.add(*args)


def assert_samples_equal(a: Any, b: Any) -> None:
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
        elif isinstance(x, dict):
            for k in x:
                assert th.equal(x[k], y[k]), (name, k)
        else:
            assert x.dtype == y.dtype and th.equal(x, y), name


def same_samples(kind: str, ours: Any, ref: Any, n: int) -> None:
    """Every n-step window from the first ``n`` steps, or HER minibatches under three seeds, are SB3's."""
    if kind == "nstep":
        idx = np.arange(n)
        assert_samples_equal(ref._get_samples(idx), ours._samples_at(idx))
        return
    for seed in range(3):
        np.random.seed(seed)
        expected = ref.sample(64)
        np.random.seed(seed)
        assert_samples_equal(expected, ours.sample(64))


def read_back(url: str) -> dict[str, Any]:
    """Every stored record (one stream: a single writer with one env), in order; nested fields as dicts."""
    with open_store(url, mode="r") as s:
        view = s.default.view()
        cols = view.read(view.row_ids())
        keys, _, _ = view.index_of(view.row_ids())
    assert len(set(np.asarray(keys).astype(str).tolist())) == 1
    return dict(cols)


def sb3_buffer_of(kind: str, url: str, env: Any) -> tuple[Any, int]:
    """SB3's own buffer fed the store's records as its learner would have added them."""
    rec = read_back(url)
    n = len(rec["reward"])
    venv = DummyVecEnv([lambda: env])
    if kind == "nstep":
        ref: Any = NStepReplayBuffer(50_000, venv.observation_space, venv.action_space, "cpu", n_steps=3, gamma=0.99)
    else:
        ref = HerReplayBuffer(50_000, venv.observation_space, venv.action_space, venv, "cpu", n_sampled_goal=4)
    for i in range(n):
        def at(x: Any, i: int = i) -> Any:
            return {k: v[i:i + 1] for k, v in x.items()} if isinstance(x, dict) else x[i:i + 1]

        term, trunc = bool(rec["terminated"][i]), bool(rec["truncated"][i])
        ref.add(at(rec["obs"]), at(rec["next_obs"]), rec["action"][i:i + 1].reshape(1, -1),
                rec["reward"][i:i + 1], np.array([term or trunc]), [{"TimeLimit.truncated": trunc}])
    return ref, n


def read_line(proc: subprocess.Popen[bytes], buf: list[bytes], deadline: float) -> str | None:
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


def train_and_kill(kind: str, url: str, model_path: str, at_least: int) -> int:
    """A child trains ``kind`` on the store until ``at_least`` transitions are committed; SIGKILL; the count."""
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = json.dumps({"kind": kind, "url": url, "model": model_path, "commit_every": 50})
    proc = subprocess.Popen([sys.executable, "-m", "support.sb3twins", args], cwd=TESTS_DIR, env=env,
                            stdout=subprocess.PIPE)
    buf, committed = [b""], 0
    try:
        deadline = time.monotonic() + 300
        assert read_line(proc, buf, deadline) == "ready"
        while committed < at_least:
            line = read_line(proc, buf, deadline)
            assert line is not None and line.startswith("c "), line
            committed = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return committed


def journey(kind: str, tmp_path: Path, steps: int) -> None:
    algo: Any = DQN if kind == "nstep" else SAC
    tee = TeeNStep if kind == "nstep" else TeeHer
    # 1. learn through the twin; SB3's own buffer gets the same add calls: the same samples
    url, path = str(tmp_path / "replay"), str(tmp_path / "model.zip")
    extra = {"n_steps": 3, "gamma": 0.99} if kind == "nstep" else {"n_sampled_goal": 4,
                                                                   "goal_selection_strategy": "future"}
    model = algo("MlpPolicy" if kind == "nstep" else "MultiInputPolicy", make_env(kind), buffer_size=50_000,
                 learning_starts=100, train_freq=4, batch_size=32, policy_kwargs={"net_arch": [32]}, seed=0,
                 device="cpu", replay_buffer_class=tee, replay_buffer_kwargs={"url": url, "commit_every": 50, **extra})
    model.learn(steps)
    rb = model.replay_buffer
    assert model._n_updates > 0 and rb.size() == steps and rb.ref.size() == steps
    same_samples(kind, rb, rb.ref, steps)
    # 2. save, load: the same store reopened, the same samples
    model.save(path)
    before = rb._samples_at(np.arange(steps)) if kind == "nstep" else None
    rb.close()
    loaded = algo.load(path, env=make_env(kind), device="cpu")
    rb2 = loaded.replay_buffer
    assert isinstance(rb2, tee) and rb2.stored_at_open == steps
    if kind == "nstep":
        assert_samples_equal(before, rb2._samples_at(np.arange(steps)))
    loaded.learn(50, reset_num_timesteps=False)
    assert rb2.size() >= steps + 50  # (whole rounds of train_freq)
    rb2.close()
    # 3. a training process SIGKILLed mid-run; a new one reloads the model and continues on the replay
    url, path = str(tmp_path / "killed"), str(tmp_path / "killed.zip")
    committed = train_and_kill(kind, url, path, steps)
    with open_store(url, mode="r") as s:
        assert verify_store(s) == []
    ref, n = sb3_buffer_of(kind, url, make_env(kind))
    assert n >= committed and n % 50 == 0  # whole commits only
    resumed = algo.load(path, env=make_env(kind), device="cpu")
    rb3 = resumed.replay_buffer
    assert isinstance(rb3, ReplayStoreNStepBuffer if kind == "nstep" else ReplayStoreHerBuffer)
    assert rb3.stored_at_open == n
    same_samples(kind, rb3, ref, n)  # the killed run's replay samples as SB3's buffer of the same records
    assert resume_learning_starts(resumed) == 0
    resumed.learn(60)
    assert resumed._n_updates > 0 and rb3.size() >= n + 60
    if kind == "nstep":  # the killed writer's windows never run into the new writer's steps
        assert_samples_equal(ref._get_samples(np.arange(n)), rb3._samples_at(np.arange(n)))
    rb3.close()


@pytest.mark.parametrize("kind", ["nstep", "her"])
def test_sb3_twins_journey_small(tmp_path: Path, kind: str) -> None:
    """The journey with 120 steps per leg: n-step DQN on CartPole and SAC + HER on bit flipping."""
    journey(kind, tmp_path, 120)


@pytest.mark.slow
def test_dqn_nstep_on_cartpole_learn_save_load_kill_resume(tmp_path: Path) -> None:
    """The n-step journey with 600 steps per leg (about 45 s on a loaded 2-core machine)."""
    journey("nstep", tmp_path, 600)


@pytest.mark.slow
def test_sac_her_on_a_goal_env_learn_save_load_kill_resume(tmp_path: Path) -> None:
    """The HER journey with 600 steps per leg (about 60 s on a loaded 2-core machine)."""
    journey("her", tmp_path, 600)
