"""RecordEpisodes and RecordVectorEpisodes on real Gymnasium environments (CartPole-v1,
MountainCarContinuous-v0), in every autoreset mode, against a ground truth recorded by hand from
single environments with the same seeds and actions."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from replaystore.gym import RecordEpisodes, RecordVectorEpisodes, recorded_episodes
from replaystore.store import open_store
from support.gymref import assert_episodes_equal, assert_stream_equals, drive_vector, single_truth, vector_truth

ENVS = {
    # (id, kwargs): a short time limit, so that truncations happen next to terminations
    "cartpole": ("CartPole-v1", {"max_episode_steps": 30}),
    "mountaincar": ("MountainCarContinuous-v0", {"max_episode_steps": 40}),
}
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _make(which: str) -> gym.Env:
    env_id, kwargs = ENVS[which]
    return gym.make(env_id, **kwargs)


def _actions(space: gym.Space, count: int, seed: int, n: int | None = None) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        shape = () if n is None else (n,)
        if isinstance(space, gym.spaces.Discrete):
            out.append(rng.integers(0, space.n, shape) if n is not None else int(rng.integers(0, space.n)))
        else:
            out.append(rng.uniform(-1, 1, (*shape, *space.shape)).astype(space.dtype))
    return out


@pytest.mark.parametrize("which", sorted(ENVS))
def test_single_env_records_what_the_env_did(tmp_path, which):
    env = _make(which)
    acts = _actions(env.action_space, 200, seed=1)
    plan: list[tuple[str, object]] = [("reset", 7)]
    for t, a in enumerate(acts):
        plan.append(("step", a))
        if t == 150:  # a reset in mid-episode, with a new seed: the old episode stays unfinished
            plan.append(("reset", 11))
    truth = single_truth(partial(_make, which), _resolve(plan, partial(_make, which)))
    rec = RecordEpisodes(env, tmp_path / "s", commit_every=37)
    _play(rec, _resolve(plan, partial(_make, which)))
    key = rec.recorder.stream_keys[0]
    rec.close()
    st = open_store(str(tmp_path / "s"), mode="r")
    assert st.schema.name == ENVS[which][0]
    assert_stream_equals(st, key, truth)
    assert_episodes_equal(st, [key], [truth])
    assert any(truth.terminated) or which == "mountaincar"
    assert any(truth.truncated)  # the time limit was reached and stored as a truncation
    assert len(st.commits()) >= len(truth.obs) // 37


def _resolve(plan, make):
    """Insert the resets a user makes after each episode end (what the env reports decides them)."""
    env = make()
    out = []
    obs_done = True
    for kind, arg in plan:
        if kind == "reset":
            env.reset(seed=arg)
            out.append((kind, arg))
            obs_done = False
            continue
        if obs_done:
            env.reset()
            out.append(("reset", None))
        _, _, term, trunc, _ = env.step(arg)
        out.append((kind, arg))
        obs_done = term or trunc
    return out


def _play(env, plan):
    for kind, arg in plan:
        if kind == "reset":
            env.reset(seed=arg)
        else:
            env.step(arg)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("which", sorted(ENVS))
def test_vector_env_records_every_autoreset_mode(tmp_path, which, mode):
    n, steps = 3, 120
    make = partial(_make, which)
    venv = SyncVectorEnv([make] * n, autoreset_mode=mode)
    acts = _actions(venv.single_action_space, steps, seed=5, n=n)
    rec = RecordVectorEpisodes(venv, tmp_path / "v", commit_every=50)
    drive_vector(rec, mode, 100, acts)
    keys = rec.recorder.stream_keys
    rec.close()
    truths = vector_truth(make, n, mode, 100, acts)
    st = open_store(str(tmp_path / "v"), mode="r")
    for key, truth in zip(keys, truths, strict=True):
        assert_stream_equals(st, key, truth)
    assert_episodes_equal(st, keys, truths)
    stored = sum(len(t.obs) for t in truths)
    assert len(st) == stored
    episodes = sum(len(t.episodes) for t in truths)
    skipped = sum(t.skipped for t in truths)
    assert stored == n * steps - skipped
    assert (skipped > 0) == (mode == AutoresetMode.NEXT_STEP)
    assert episodes > n  # autoresets happened
    assert sorted(e["seed"] for e in recorded_episodes(st) if e["first_step"] == 0) == [100, 101, 102]


def test_next_step_never_stores_the_reset_step(tmp_path):
    """A naive loop stores (terminal obs -> reset obs, reward 0) at each autoreset; this does not."""
    venv = SyncVectorEnv([partial(_make, "cartpole")] * 4)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    rec = RecordVectorEpisodes(venv, tmp_path / "n")
    acts = _actions(venv.single_action_space, 150, seed=2, n=4)
    drive_vector(rec, AutoresetMode.NEXT_STEP, 0, acts)
    rec.close()
    st = open_store(str(tmp_path / "n"), mode="r")
    truths = vector_truth(partial(_make, "cartpole"), 4, AutoresetMode.NEXT_STEP, 0, acts)
    assert sum(t.skipped for t in truths) > 4
    assert len(st) == 4 * 150 - sum(t.skipped for t in truths)
    data = st.read(st.row_ids())
    _, _, resets = st.default.index_of(st.row_ids())
    assert not ((data["reward"] == 0) & ~data["terminated"]).any()  # CartPole pays 1 per real step
    # every record's obs follows the previous record's next_obs inside an episode, and resets follow ends
    for key in st.streams():
        rows, steps = st.rows(key)
        order = np.argsort(steps)
        d = st.read(rows[order])
        _, _, r = st.default.index_of(rows[order])
        done = d["terminated"] | d["truncated"]
        np.testing.assert_array_equal(r[1:], done[:-1])
        inside = ~done[:-1]
        np.testing.assert_array_equal(d["obs"][1:][inside], d["next_obs"][:-1][inside])
    assert resets.sum() == len(recorded_episodes(st))


def test_same_step_keeps_the_terminal_observation(tmp_path):
    venv = SyncVectorEnv([partial(_make, "cartpole")] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    rec = RecordVectorEpisodes(venv, tmp_path / "s")
    rec.reset(seed=3)
    finals = []
    for a in _actions(venv.single_action_space, 80, seed=9, n=2):
        obs, _, term, trunc, infos = rec.step(a)
        for i in np.flatnonzero(term | trunc):
            finals.append((i, infos["final_obs"][i], obs[i]))
    keys = rec.recorder.stream_keys
    rec.close()
    st = open_store(str(tmp_path / "s"), mode="r")
    assert finals
    for i, final, first in finals:
        rows, steps = st.rows(keys[i])
        d = st.read(rows[np.argsort(steps)])
        end = np.flatnonzero(d["terminated"] | d["truncated"])
        # the terminal observation is some episode's last next_obs; the reset observation starts the next one
        assert any(np.array_equal(d["next_obs"][e], final) for e in end)
        assert any(np.array_equal(d["obs"][e + 1], first) for e in end if e + 1 < len(d["obs"]))


def test_reopened_in_a_new_process(tmp_path):
    rec = RecordEpisodes(_make("cartpole"), tmp_path / "p")
    rec.reset(seed=0)
    total = 0.0
    for a in _actions(rec.action_space, 25, seed=0):
        _, r, term, trunc, _ = rec.step(a)
        total += r
        if term or trunc:
            rec.reset()
    rec.close()
    code = ("import json, sys; from replaystore.store import open_store; from replaystore.gym import "
            "recorded_episodes; st = open_store(sys.argv[1], mode='r'); d = st.read(st.row_ids()); "
            "print(json.dumps([len(st), float(d['reward'].sum()), st.schema.metadata['env_id'], "
            "len(recorded_episodes(st))]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p")], capture_output=True, text=True,
                         check=True, timeout=120)
    n, rsum, env_id, eps = json.loads(out.stdout)
    assert (n, rsum, env_id) == (25, total, "CartPole-v1") and eps >= 1
