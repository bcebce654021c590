"""iter_episodes over `episode` and `rollout` stores, and the ReplayBuffer front door."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import StoreError
from replaystore.loaders import EmptyStoreError, ReplayBuffer, iter_episodes
from replaystore.schemas import episode, rollout, transitions
from replaystore.store import open_store
from support.batches import episode_batch, rollout_batch
from support.loaderref import PROBE, RefEpisode, probe_arrays, split_episodes

OBS = 4


def check_episodes(got: list[dict[str, Any]], want: list[RefEpisode]) -> None:
    def key(e: Any) -> tuple[str, int]:
        return (str(e.stream if isinstance(e, RefEpisode) else e["stream"]),
                e.steps[0] if isinstance(e, RefEpisode) else int(e["steps"][0]))

    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [(e["stream"], e["steps"].tolist()) for e in got] == [(w.stream, w.steps) for w in want]
    for e, w in zip(got, want, strict=True):
        t = len(w.steps)
        assert isinstance(e["obs"], torch.Tensor) and tuple(e["obs"].shape) == (t, OBS)
        assert np.array_equal(e["obs"].numpy(), w.obs)
        assert np.array_equal(e["action"].numpy(), w.action) and np.array_equal(e["reward"].numpy(), w.reward)
        assert tuple(e["final_obs"].shape) == (OBS,) and np.array_equal(e["final_obs"].numpy(), w.final_obs)
        assert np.array_equal(e["next_obs"].numpy()[-1], w.final_obs)
        assert e["terminated"] is w.terminated and e["truncated"] is w.truncated
        assert not (w.terminated and w.truncated)


def test_episodes_of_an_episode_store(new_url: Any) -> None:
    st = open_store(new_url(), episode(OBS, actions=3))
    rng = np.random.default_rng(3)
    layout = [("run-a", 3, True), (4, 2, False), ("run-a", 5, False), ("run-a", 1, True), (4, 4, True)]
    per_stream: dict[Any, list[Any]] = {}
    with st.writer() as w:
        for i, (key, steps, term) in enumerate(layout):
            ep = episode_batch(rng, steps, obs_dim=OBS, terminated=term)
            w.append(ep, stream=key)
            per_stream.setdefault(key, []).append(ep)
            if i == 2:
                w.commit()
        # trailing steps of "run-a" that have not ended yet
        tail = episode_batch(rng, 2, obs_dim=OBS)
        w.append({"obs": tail.obs, "action": tail.action, "reward": tail.reward,
                  "next_obs": np.stack([tail.obs[1], tail.final_obs]), "terminated": np.zeros(2, bool),
                  "truncated": np.zeros(2, bool)}, stream="run-a")
    want: list[RefEpisode] = []
    want_all: list[RefEpisode] = []
    for key, eps in per_stream.items():
        step = 0
        for ep in eps:
            t = len(ep.obs)
            one = split_episodes(key, np.arange(step, step + t), ep.obs, ep.action, ep.reward,
                                 np.concatenate([ep.obs[1:], ep.final_obs[None]]),
                                 np.eye(t, dtype=bool)[-1] & ep.terminated,
                                 np.eye(t, dtype=bool)[-1] & (not ep.terminated))
            want += one
            want_all += one
            step += t
        if key == "run-a":
            want_all += split_episodes(key, np.arange(step, step + 2), tail.obs, tail.action, tail.reward,
                                       np.stack([tail.obs[1], tail.final_obs]), np.zeros(2, bool),
                                       np.zeros(2, bool), complete_only=False)
    assert len(want) == 5 and len(want_all) == 6
    got = list(iter_episodes(st.default))
    check_episodes(got, want)
    for e in got:  # an Episode's next_obs of step t is its obs of step t + 1
        assert torch.equal(e["next_obs"][:-1], e["obs"][1:])
    incomplete = list(iter_episodes(st.default, complete_only=False))
    check_episodes(incomplete, want_all)
    assert [e["truncated"] for e in incomplete if e["steps"][0] == 9] == [True]  # unfinished: reported truncated
    check_episodes(list(iter_episodes(st.default, streams=[4])), [w for w in want if w.stream == 4])


def test_episodes_of_a_rollout_store_span_rollouts(new_url: Any) -> None:
    st = open_store(new_url(), rollout(OBS, actions=3))
    rng = np.random.default_rng(11)
    rollouts = [rollout_batch(rng, 7, 3, obs_dim=OBS) for _ in range(3)]
    rollouts[0].terminated[-1, 1] = True  # slot 1 ends an episode exactly at a rollout boundary
    rollouts[0].truncated[-1, 1] = False
    with st.writer() as w:
        for r in rollouts:
            w.append(r)
            w.commit()
    want, want_all = [], []
    for b in range(3):
        cat = {name: np.concatenate([getattr(r, name)[:, b] for r in rollouts])
               for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
        args = (b, np.arange(21), cat["obs"], cat["action"], cat["reward"], cat["next_obs"], cat["terminated"],
                cat["truncated"])
        want += split_episodes(*args)
        want_all += split_episodes(*args, complete_only=False)
    assert any(w.terminated for w in want) and any(w.truncated for w in want)
    got = list(iter_episodes(st.default))
    check_episodes(got, want)
    assert any(e["steps"][0] < 7 <= e["steps"][-1] for e in got), "no episode spans two rollouts"
    check_episodes(list(iter_episodes(st.default, complete_only=False)), want_all)
    # the recurrent boundaries the store recorded are exactly the episode starts after the first
    for b in range(3):
        rows, steps = st.default.rows(b)
        _, _, resets = st.default.index_of(rows)
        starts = {w.steps[0] for w in want_all if w.stream == b}
        assert {int(s) for s, r in zip(steps, resets, strict=True) if r} == starts


def test_episode_split_at_a_step_gap_skips_the_unfinished_part(new_url: Any) -> None:
    st = open_store(new_url(), episode(OBS))
    rng = np.random.default_rng(0)
    a = episode_batch(rng, 4, obs_dim=OBS, terminated=True)
    with st.writer() as w:
        w.append({"obs": a.obs[:2], "action": a.action[:2], "reward": a.reward[:2], "next_obs": a.obs[1:3],
                  "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool)}, stream="s", step=0, reset=True)
        w.append(episode_batch(rng, 3, obs_dim=OBS, terminated=False), stream="s", step=5)
    got = list(iter_episodes(st.default))
    assert [e["steps"].tolist() for e in got] == [[5, 6, 7]] and got[0]["truncated"] is True


def test_iter_episodes_needs_episode_fields(new_url: Any) -> None:
    st = open_store(new_url(), PROBE)
    with st.writer() as w:
        w.append(probe_arrays([1]), stream=0)
    with pytest.raises(StoreError):
        list(iter_episodes(st.default))


# -- ReplayBuffer ----------------------------------------------------------------------------------

def steps(start: int, n: int) -> dict[str, np.ndarray]:
    """Transitions whose obs[:, 0] numbers them."""
    obs = np.zeros((n, OBS), np.float32)
    obs[:, 0] = np.arange(start, start + n)
    return {"obs": obs, "action": np.arange(n) % 3, "reward": np.ones(n, np.float32), "next_obs": obs + 1,
            "terminated": np.arange(n) % 5 == 4}


def test_replay_buffer_add_sample_len_and_capacity(new_url: Any) -> None:
    url = new_url()
    schema = transitions(OBS, actions=3)
    buf = ReplayBuffer(url, schema, capacity=50, seed=1)
    assert len(buf) == 0
    with pytest.raises(EmptyStoreError):
        buf.sample(4)
    buf.add(steps(0, 30))
    assert len(buf) == 30
    batch = buf.sample(64)
    assert set(batch) == {"obs", "action", "reward", "next_obs", "terminated", "indices"}
    assert batch["obs"].shape == (64, OBS) and batch["obs"].dtype == torch.float32
    assert batch["terminated"].dtype == torch.bool and batch["action"].dtype == torch.int64
    assert set(batch["obs"][:, 0].int().tolist()) <= set(range(30))
    for i in range(3):
        buf.add(steps(30 + 20 * i, 20))
    assert len(buf) == 50 == buf.capacity
    seen = set()
    for _ in range(20):
        seen |= set(buf.sample(64)["obs"][:, 0].int().tolist())
    assert seen == set(range(40, 90)), "samples come from the newest `capacity` records only"
    buf.close()


def test_replay_buffer_persists_and_resumes(new_url: Any) -> None:
    url = new_url()
    schema = transitions(OBS, actions=3)
    buf = ReplayBuffer(url, schema, capacity=40, seed=7)
    buf.add(steps(0, 25))
    buf.sample(5)
    buf.save()
    draws = [buf.sample(6) for _ in range(3)]
    buf.close()
    again = ReplayBuffer(url, schema)
    assert len(again) == 25 and again.capacity == 40
    for d in draws:
        got = again.sample(6)
        assert torch.equal(got["indices"], d["indices"]) and torch.equal(got["obs"], d["obs"])
    again.add(steps(25, 30))  # a new writer continues the same stream, within the capacity
    assert len(again) == 40
    again.flush()
    _, stp = again.store.rows(0)
    assert stp.tolist() == list(range(15, 55))
    with pytest.raises(StoreError):
        ReplayBuffer(url, schema, capacity=41)
    again.close()


def test_replay_buffer_commits_in_groups(new_url: Any) -> None:
    """Commits once ``commit_every`` records are pending, or when a sample would leave out at
    least as many pending records as it can draw from; pending records count in ``len`` and
    are lost if the process dies before a commit."""
    url = new_url()
    schema = transitions(OBS, actions=3)
    buf = ReplayBuffer(url, schema, commit_every=8, seed=3)

    def commits() -> int:
        return len(open_store(url, mode="r").commits())

    buf.add(steps(0, 1))
    assert commits() == 0 and len(buf) == 1
    assert buf.sample(4)["obs"][:, 0].int().tolist() == [0] * 4  # the first record at once
    buf.add(steps(1, 1))
    buf.sample(4)  # 1 pending >= 1 committed: committed first
    assert commits() == 2
    buf.add(steps(2, 1))
    assert len(buf) == 3
    drawn = set()
    for _ in range(10):
        drawn |= set(buf.sample(8)["obs"][:, 0].int().tolist())
    assert drawn == {0, 1} and commits() == 2  # 1 pending < 2 committed: not yet sampled
    for i in range(3, 10):  # one at a time: the 8th pending one commits them
        buf.add(steps(i, 1))
        assert commits() == (3 if i == 9 else 2)
    assert len(open_store(url, mode="r")) == 10
    buf.add(steps(10, 5))
    assert len(buf) == 15
    del buf  # dropped without close(): the pending records are lost, the committed ones kept
    again = ReplayBuffer(url, commit_every=8)
    assert len(again) == 10
    again.add(steps(10, 20))  # more than commit_every in one add: committed at once
    assert len(open_store(url, mode="r")) == 30
    again.close()
    with pytest.raises(StoreError, match="commit_every"):
        ReplayBuffer(new_url(), schema, commit_every=0)
