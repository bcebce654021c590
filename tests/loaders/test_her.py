"""Hindsight relabelling: goals from the right part of the right episode, the k/(k+1) fraction, rewards,
resume, workers, and bit flipping learnt with HER and not without it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import ResumeMismatchError, SamplerParameterError, StoreError, TransformError
from replaystore.loaders import HER, GoalFields, PrioritizedSampler, UniformSampler, make_loader
from replaystore.loaders.dataset import gather_arrays
from replaystore.loaders.her import episode_bounds
from replaystore.schemas import goal_transitions, transitions
from replaystore.store import open_store
from support.goalenv import BitFlip, bit_reward, distance_reward, episode_records, goal_store

FIELDS = ("observation", "achieved_goal", "desired_goal", "action", "reward", "next_observation",
          "next_achieved_goal", "next_desired_goal", "terminated", "truncated")


def episode_of(episodes: list[dict[str, Any]], stream: int, step: int) -> dict[str, Any]:
    return next(e for e in episodes if e["stream"] == stream and e["first"] <= step <= e["last"])


def draw(sampler: Any, batches: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(batches):
        req = sampler.sample()
        out.append(sampler.her.relabel(sampler.table, gather_arrays(sampler.table, req)))
    return out


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_relabelled_goals_come_from_the_right_steps_of_the_same_episode(new_url: Callable[[], str], strategy: str,
                                                                        kind: str) -> None:
    """future: an achieved goal at or after the sampled step; final: the episode's last; episode: any of it.
    Goals land in desired_goal and next_desired_goal; open episodes are never relabelled."""
    st, episodes = goal_store(new_url())
    her = HER(strategy, k=4, compute_reward=distance_reward, seed=1)
    cls = UniformSampler if kind == "uniform" else PrioritizedSampler
    sampler = cls(st, batch_size=128, seed=2, her=her)
    relabelled = 0
    for b in draw(sampler, 10):
        stream = b["next_achieved_goal"][:, 0].astype(int)
        step = b["next_achieved_goal"][:, 1].astype(int)
        mask = b["her_goal_rows"] >= 0
        relabelled += int(mask.sum())
        assert (b["desired_goal"][~mask] == -1).all()
        np.testing.assert_array_equal(b["desired_goal"], b["next_desired_goal"])
        for i in np.flatnonzero(mask):
            ep = episode_of(episodes, stream[i], step[i])
            assert ep["complete"]
            g_stream, g_step = int(b["desired_goal"][i, 0]), int(b["desired_goal"][i, 1])
            assert g_stream == stream[i] and ep["first"] <= g_step <= ep["last"]
            if strategy == "future":
                assert g_step >= step[i]
            elif strategy == "final":
                assert g_step == ep["last"]
        # the goal row named is the row the goal was read from
        src = st.default.read(b["her_goal_rows"][mask], columns=["next_achieved_goal"])["next_achieved_goal"]
        np.testing.assert_array_equal(src, b["desired_goal"][mask])
    assert relabelled > 0


def test_future_goals_cover_every_later_step(new_url: Callable[[], str]) -> None:
    """future draws uniformly among [t, end]: from one episode's first step every later step shows up."""
    st = open_store(new_url(), goal_transitions(3, 2), mode="w+")
    with st.writer() as w:
        w.append(episode_records(0, 0, 5, "terminated"), reset=True)
        w.commit()
    sampler = UniformSampler(st, batch_size=512, seed=0, subset=[0], her=HER("future", 4, distance_reward))
    b = draw(sampler, 1)[0]
    steps = b["desired_goal"][b["her_goal_rows"] >= 0, 1].astype(int)
    counts = np.bincount(steps, minlength=5)
    assert (counts > 50).all(), counts  # ~82 each of 410 relabelled


@pytest.mark.parametrize("k", [1, 4])
def test_relabelled_fraction_is_k_over_k_plus_one(new_url: Callable[[], str], k: int) -> None:
    """Among records of complete episodes, each is relabelled with probability k/(k+1) (binomial bound)."""
    st, _ = goal_store(new_url(), seed=3)
    sampler = UniformSampler(st, batch_size=256, seed=5, her=HER("future", k, distance_reward, seed=9))
    eligible = hits = 0
    for b in draw(sampler, 20):
        stream = b["next_achieved_goal"][:, 0].astype(int)
        step = b["next_achieved_goal"][:, 1].astype(int)
        mask = b["her_goal_rows"] >= 0
        flags = b["terminated"] | b["truncated"]
        # the sampled record's episode is complete iff a flagged record ends it: read the flags of its stream
        rows_ok = []
        for s, t in zip(stream, step, strict=True):
            rows, steps = st.rows(int(s))
            later = st.default.read(rows[steps >= t], columns=["terminated", "truncated"])
            rows_ok.append(bool((later["terminated"] | later["truncated"]).any()))
        ok = np.array(rows_ok)
        assert not (mask & ~ok).any()
        eligible += int(ok.sum())
        hits += int(mask.sum())
        del flags
    p = k / (k + 1)
    sigma = math.sqrt(eligible * p * (1 - p))
    assert abs(hits - eligible * p) < 4.5 * sigma, (hits, eligible, p)


def test_rewards_are_compute_reward_of_the_relabelled_pairs_called_once(new_url: Callable[[], str]) -> None:
    """Relabelled rewards equal compute_reward(next_achieved_goal, new goal); the others keep the stored reward;
    compute_reward runs once per minibatch, over the relabelled records only."""
    st, _ = goal_store(new_url(), seed=4)
    calls: list[int] = []

    def reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        calls.append(len(achieved))
        assert info == {}
        return distance_reward(achieved, desired, info)

    sampler = UniformSampler(st, batch_size=256, seed=0, her=HER("episode", 4, reward))
    for b in draw(sampler, 5):
        mask = b["her_goal_rows"] >= 0
        np.testing.assert_array_equal(b["reward"][mask],
                                      distance_reward(b["next_achieved_goal"][mask], b["desired_goal"][mask], None))
        assert (b["reward"][~mask] == 7.0).all()
    assert calls and all(c > 0 for c in calls) and len(calls) == 5


def test_online_relabels_the_visible_part_of_open_episodes(new_url: Callable[[], str]) -> None:
    """online=True relabels records of unfinished episodes too, with goals of their visible part."""
    st, episodes = goal_store(new_url(), seed=6)
    sampler = UniformSampler(st, batch_size=256, seed=0, her=HER("final", 4, distance_reward, online=True))
    opened = 0
    for b in draw(sampler, 5):
        mask = b["her_goal_rows"] >= 0
        for i in np.flatnonzero(mask):
            ep = episode_of(episodes, int(b["next_achieved_goal"][i, 0]), int(b["next_achieved_goal"][i, 1]))
            assert int(b["desired_goal"][i, 1]) == ep["last"]
            opened += not ep["complete"]
    assert opened > 0


def test_episode_bounds_match_iter_episodes_rules() -> None:
    """Episodes start at resets, after end flags, after gaps and at new streams; complete needs a known start."""
    sid = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    steps = np.array([0, 1, 2, 5, 6, 3, 4, 5])
    resets = np.array([1, 0, 0, 0, 0, 0, 0, 0], bool)
    ends = np.array([0, 1, 0, 0, 1, 0, 1, 1], bool)
    lo, hi, complete = episode_bounds(sid, steps, resets, ends)
    np.testing.assert_array_equal(lo, [0, 0, 2, 3, 3, 5, 5, 7])
    np.testing.assert_array_equal(hi, [2, 2, 3, 5, 5, 7, 7, 8])
    # [2]: after an end, open; [3,4]: after a gap, no reset; [5,6]: stream 1 starts at step 3; [7]: after an end
    np.testing.assert_array_equal(complete, [1, 1, 0, 0, 0, 0, 0, 1])


def test_resume_continues_the_relabelling_exactly(new_url: Callable[[], str]) -> None:
    """HER's RNG is part of the sampler's state: a resumed sampler draws the same rows and goals."""
    st, _ = goal_store(new_url(), seed=7)
    a = UniformSampler(st, batch_size=64, seed=3, her=HER("future", 4, distance_reward, seed=11), name="h")
    draw(a, 3)
    a.save()
    expected = draw(a, 3)
    b = UniformSampler(st, batch_size=64, seed=3, her=HER("future", 4, distance_reward, seed=11), name="h",
                       resume=True)
    for x, y in zip(expected, draw(b, 3), strict=True):
        np.testing.assert_array_equal(x["indices"], y["indices"])
        np.testing.assert_array_equal(x["her_goal_rows"], y["her_goal_rows"])
    with pytest.raises(ResumeMismatchError, match="her"):
        UniformSampler(st, batch_size=64, seed=3, her=HER("final", 4, distance_reward, seed=11), name="h",
                       resume=True)


@pytest.mark.parametrize("context", ["fork"])
def test_workers_relabel_like_the_main_process(new_url: Callable[[], str], context: str) -> None:
    """make_loader relabels in the workers: same minibatches as in-process (spawn: tests/loaders/test_transform.py)."""
    st, _ = goal_store(new_url(), seed=8)

    def loader(workers: int) -> list[dict[str, Any]]:
        sampler = PrioritizedSampler(st, batch_size=32, seed=1, num_batches=4,
                                     her=HER("future", 4, distance_reward, seed=2))
        kw = {"multiprocessing_context": context} if workers else {}
        return list(make_loader(st, sampler, num_workers=workers, **kw))

    for x, y in zip(loader(0), loader(2), strict=True):
        assert set(x) == set(y)
        for key in x:
            torch.testing.assert_close(x[key], y[key])
        assert (x["her_goal_rows"] >= 0).any()


def test_bad_her_arguments_are_refused(new_url: Callable[[], str]) -> None:
    """Unknown strategy, bad k, no compute_reward, a non-HER, and a schema without the goal fields."""
    with pytest.raises(SamplerParameterError, match="strategy"):
        HER("later", 4, distance_reward)
    with pytest.raises(SamplerParameterError, match="her.k"):
        HER("future", -1, distance_reward)
    with pytest.raises(SamplerParameterError, match="compute_reward"):
        HER("future", 4)
    st = open_store(new_url(), transitions(3), mode="w+")
    with pytest.raises(SamplerParameterError, match="her"):
        UniformSampler(st, batch_size=4, her="future")  # type: ignore[arg-type]
    for make in (UniformSampler, PrioritizedSampler):  # stacked frames are not relabelled: refused, not ignored
        with pytest.raises(SamplerParameterError, match="stack"):
            make(st, batch_size=4, her=HER("future", 4, distance_reward), stack=4)
    with pytest.raises(StoreError, match="lacks"):
        UniformSampler(st, batch_size=4, her=HER("future", 4, distance_reward))
    # field names map: a transitions-like schema passes once the names are given
    with pytest.raises(StoreError, match="desired"):
        UniformSampler(st, batch_size=4, her=HER("future", 4, distance_reward,
                                                 fields=GoalFields(next_achieved="next_obs", truncated=None)))


def test_matches_sb3_her_replay_buffer_semantics(new_url: Callable[[], str]) -> None:
    """On the same complete episodes, SB3's HerReplayBuffer (future, k=4) and HER agree on the relabelled
    fraction, the goals' offsets (uniform over [t, T-1]: mean (T-1-t)/2), and the rewards."""
    her_buffer = pytest.importorskip("stable_baselines3.her.her_replay_buffer")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from support.goalenv import sb3_goal_env

    length, episodes_n = 10, 40
    env = DummyVecEnv([lambda: sb3_goal_env(2)])
    buf = her_buffer.HerReplayBuffer(length * episodes_n, env.observation_space, env.action_space, env,
                                     n_sampled_goal=4, goal_selection_strategy="future")
    st = open_store(new_url(), goal_transitions(2, 2), mode="w+")
    with st.writer() as w:
        for e in range(episodes_n):
            rec = episode_records(e, 0, length, "truncated")
            rec["observation"] = rec["next_observation"] = np.zeros((length, 2), np.float32)
            w.append(rec, stream=e, reset=True)
            for t in range(length):
                obs = {"observation": np.zeros((1, 2), np.float32), "achieved_goal": rec["achieved_goal"][t:t + 1],
                       "desired_goal": rec["desired_goal"][t:t + 1]}
                nxt = {"observation": np.zeros((1, 2), np.float32), "achieved_goal": rec["next_achieved_goal"][t:t + 1],
                       "desired_goal": rec["desired_goal"][t:t + 1]}
                buf.add(obs, nxt, np.zeros((1, 1)), rec["reward"][t:t + 1], np.array([t == length - 1]),
                        [{"TimeLimit.truncated": t == length - 1}])
        w.commit()
    np.random.seed(0)
    theirs = buf.sample(4000)
    sampler = UniformSampler(st, batch_size=4000, seed=0, her=HER("future", 4, distance_reward))
    ours = draw(sampler, 1)[0]

    def summary(stream_step: np.ndarray, goals: np.ndarray, reward: np.ndarray) -> tuple[float, float]:
        virtual = goals[:, 0] >= 0
        offsets = goals[virtual, 1] - stream_step[virtual, 1]
        assert (goals[virtual, 0] == stream_step[virtual, 0]).all() and (offsets >= 0).all()
        expected = (length - 1 - stream_step[virtual, 1]) / 2
        np.testing.assert_allclose(reward[virtual], distance_reward(stream_step[virtual], goals[virtual], None),
                                   atol=1e-5)
        return float(virtual.mean()), float((offsets - expected).mean())

    t_frac, t_bias = summary(theirs.next_observations["achieved_goal"].numpy(),
                             theirs.observations["desired_goal"].numpy(), theirs.rewards.numpy().ravel())
    o_frac, o_bias = summary(ours["next_achieved_goal"], ours["desired_goal"], ours["reward"])
    assert abs(t_frac - 0.8) < 0.01 and abs(o_frac - 0.8) < 0.03
    assert abs(t_bias) < 0.15 and abs(o_bias) < 0.15


def train_bitflip(n: int, use_her: bool, seed: int = 0, cycles: int = 30, episodes: int = 16,
                  updates: int = 32, batch: int = 128) -> float:
    """A short DQN run on bit flipping; returns the success rate of the last 80 training episodes."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = BitFlip(n, seed)
    schema = goal_transitions(n, n, actions=n)
    st = open_store(f"memory://bitflip/{n}-{use_her}-{seed}", schema, mode="w+")

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(2 * n, 128), torch.nn.ReLU(), torch.nn.Linear(128, n))

    q, target = net(), net()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    her = HER("future", 4, bit_reward, seed=seed) if use_her else None
    sampler = None
    gamma = 0.9
    successes: list[bool] = []
    for _ in range(cycles):
        with st.writer() as w:
            for _ in range(episodes):
                s, g = env.reset()
                recs: dict[str, list[Any]] = {k: [] for k in FIELDS}
                done = ok = False
                while not done:
                    if rng.random() < 0.2:
                        a = int(rng.integers(n))
                    else:
                        with torch.no_grad():
                            a = int(q(torch.from_numpy(np.r_[s, g])[None]).argmax())
                    s2, r, term, trunc = env.step(a)
                    for k, v in zip(FIELDS, [s, s, g, a, r, s2, s2, g, term, trunc], strict=True):
                        recs[k].append(v)
                    s, done, ok = s2, term or trunc, term
                successes.append(ok)
                w.append({k: np.asarray(v, dtype=schema.field(k).dtype) for k, v in recs.items()}, reset=True)
            w.commit()
        if sampler is None:
            sampler = UniformSampler(st, batch_size=batch, seed=seed, her=her)
        for _ in range(updates):
            b = gather_arrays(sampler.table, sampler.sample())
            if her is not None:
                b = her.relabel(sampler.table, b)
            x = torch.from_numpy(np.concatenate([b["observation"], b["desired_goal"]], 1))
            x2 = torch.from_numpy(np.concatenate([b["next_observation"], b["next_desired_goal"]], 1))
            r = torch.from_numpy(b["reward"])
            with torch.no_grad():
                y = (r + gamma * (r < 0).float() * target(x2).max(1).values).clamp(-1 / (1 - gamma), 0)
            loss = ((q(x).gather(1, torch.from_numpy(b["action"])[:, None]).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            for p, tp in zip(q.parameters(), target.parameters(), strict=True):
                tp.mul_(0.95).add_(0.05 * p)
    return float(np.mean(successes[-80:]))


@pytest.mark.slow
def test_bit_flipping_is_learnt_with_her_and_not_without() -> None:
    """The HER paper's bit flipping (10 bits, reward only at the goal): in 480 episodes DQN learns it with HER
    (future, k=4) and does not without it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with_her = train_bitflip(10, True)
        without = train_bitflip(10, False)
    finally:
        torch.set_num_threads(threads)
    assert with_her >= 0.3, with_her
    assert without <= 0.15, without


def _half(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return distance_reward(achieved, desired, info)[: len(achieved) // 2]


def _scalar(achieved: np.ndarray, desired: np.ndarray, info: Any) -> float:
    return 1.0


def _words(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return np.array(["near"] * len(achieved))


def _complex(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return distance_reward(achieved, desired, info).astype(np.complex128)


def _nan(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return np.full(len(achieved), np.nan)


def _column(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return distance_reward(achieved, desired, info).astype(np.float64)[:, None]


@pytest.mark.parametrize(("fn", "match"), [
    (_half, r"'_half'.*returned shape \(\d+,\), expected \(\d+,\)"),
    (_scalar, r"'_scalar'.*returned shape \(\), expected \(\d+,\)"),
    (_words, r"'_words'.*dtype <U4.*float32"),
    (_complex, r"'_complex'.*dtype complex128.*float32"),
    (_nan, r"'_nan'.*non-finite rewards \[nan"),
])
def test_compute_reward_returning_rewards_that_do_not_fit_is_a_typed_error(
        new_url: Callable[[], str], fn: Callable[..., Any], match: str) -> None:
    """Wrong shape, a dtype that does not cast within its kind, non-finite rewards for a finite reward field:
    TransformError naming the function and what it returned against what was expected (before: a raw
    ValueError, or rewards silently cast)."""
    st, _ = goal_store(new_url(), seed=4)
    sampler = UniformSampler(st, batch_size=64, seed=0, her=HER("episode", 4, fn))
    with pytest.raises(TransformError, match=match):
        draw(sampler, 1)
    # the same from a DataLoader worker, re-raised in the main process
    sampler = UniformSampler(st, batch_size=64, seed=0, num_batches=1, her=HER("episode", 4, fn))
    with pytest.raises(TransformError, match=match):
        list(make_loader(st, sampler, num_workers=1, multiprocessing_context="fork"))


def test_compute_reward_may_return_a_column_of_another_float_dtype(new_url: Callable[[], str]) -> None:
    """(m, 1) float64 for (m,) float32 rewards: one reward per record, cast within its kind."""
    st, _ = goal_store(new_url(), seed=4)
    sampler = UniformSampler(st, batch_size=64, seed=0, her=HER("episode", 4, _column))
    b = draw(sampler, 1)[0]
    mask = b["her_goal_rows"] >= 0
    assert mask.any() and b["reward"].dtype == np.float32
    np.testing.assert_array_equal(b["reward"][mask],
                                  distance_reward(b["next_achieved_goal"][mask], b["desired_goal"][mask], None))
