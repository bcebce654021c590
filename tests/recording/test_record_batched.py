"""The vector recorder's batched bookkeeping (one buffered block per vector step, steps and resets
worked out at each flush) stores exactly what a plain reference stores: each sub-env's transition
appended one record at a time, its step and reset flag given by hand."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from replaystore.gym import RecordVectorEpisodes, recorded_episodes
from replaystore.store import open_store

N = 8


def _plain_reference(path: str, schema, keys: list[str], seed: int, plan: list) -> list[dict]:
    """Replay ``plan`` on a fresh vector env, appending each transition alone; return the episodes."""
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=AutoresetMode.NEXT_STEP)
    st = open_store(path, schema, mode="w")
    episodes: list[dict] = []
    step = [0] * N
    first = [0] * N  # the step each slot's episode started at
    length = [0] * N
    ret = [0.0] * N
    seeds: list[int | None] = [None] * N
    autoreset = [False] * N
    obs, _ = venv.reset(seed=seed)
    cur = [np.array(o) for o in obs]

    def start(i: int, o: np.ndarray, s: int | None) -> None:
        end(i, False, False)
        cur[i], first[i], length[i], ret[i], seeds[i] = np.array(o), step[i], 0, 0.0, s

    def end(i: int, term: bool, trunc: bool) -> None:
        if length[i]:
            episodes.append({"stream": keys[i], "first_step": first[i], "length": length[i], "return": ret[i],
                             "seed": seeds[i], "terminated": term, "truncated": trunc})
        length[i] = 0

    for i in range(N):
        seeds[i] = seed + i
    with st.writer() as w:
        for kind, arg in plan:
            if kind == "reset":
                obs, _ = venv.reset(options={"reset_mask": arg})
                for i in np.flatnonzero(arg):
                    start(i, obs[i], None)
                    autoreset[i] = False
                continue
            obs, rew, term, trunc, _ = venv.step(arg)
            for i in range(N):
                if autoreset[i]:  # this step reset sub-env i: not a transition
                    start(i, obs[i], None)
                    autoreset[i] = False
                    continue
                f = schema.field
                w.append({"obs": cur[i][None].astype(f("obs").dtype), "action": np.array([arg[i]], f("action").dtype),
                          "reward": np.array([rew[i]], f("reward").dtype),
                          "next_obs": obs[i][None].astype(f("next_obs").dtype), "terminated": np.array([term[i]]),
                          "truncated": np.array([trunc[i]])},
                         stream=np.array([keys[i]]), step=np.array([step[i]]), reset=np.array([length[i] == 0]))
                step[i] += 1
                length[i] += 1
                ret[i] += float(np.array(rew[i], schema.field("reward").dtype))
                cur[i] = np.array(obs[i])
                if term[i] or trunc[i]:
                    end(i, bool(term[i]), bool(trunc[i]))
                    autoreset[i] = True
        for i in range(N):  # close() leaves the open episodes unfinished
            end(i, False, False)
        w.commit()
    venv.close()
    return episodes


@pytest.mark.parametrize("commit_every", [1, 13, 10_000])
def test_batched_recording_equals_a_plain_record_by_record_reference(tmp_path, commit_every: int) -> None:
    rng = np.random.default_rng(commit_every)
    plan: list = []
    for t in range(240):
        if t in (57, 150):  # sub-envs reset mid-episode: their open episodes are left unfinished
            plan.append(("reset", rng.random(N) < 0.5))
        plan.append(("step", rng.integers(0, 2, N)))
    keys = [f"env{i}" for i in range(N)]
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=AutoresetMode.NEXT_STEP)
    env = RecordVectorEpisodes(venv, tmp_path / "rec", commit_every=commit_every, streams=keys)
    env.reset(seed=3)
    for kind, arg in plan:
        if kind == "reset":
            env.reset(options={"reset_mask": arg})
        else:
            env.step(arg)
    env.close()
    got = open_store(tmp_path / "rec", mode="r")
    ref_episodes = _plain_reference(str(tmp_path / "ref"), got.schema, keys, 3, plan)
    ref = open_store(tmp_path / "ref", mode="r")
    assert len(got) == len(ref) > 1_500
    for key in keys:
        rows_g, steps_g = got.rows(key)
        rows_r, steps_r = ref.rows(key)
        np.testing.assert_array_equal(steps_g, steps_r, err_msg=key)
        a, b = got.read(rows_g), ref.read(rows_r)
        for name in got.schema.record_names:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{key} {name}")
        np.testing.assert_array_equal(got.default.index_of(rows_g)[2], ref.default.index_of(rows_r)[2],
                                      err_msg=f"{key} resets")
    want = sorted(ref_episodes, key=lambda e: (e["stream"], e["first_step"]))
    have = sorted(({k: e[k] for k in want[0]} for e in recorded_episodes(got)),
                  key=lambda e: (e["stream"], e["first_step"]))
    assert have == want
