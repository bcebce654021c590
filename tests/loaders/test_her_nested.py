"""Hindsight relabelling over nested goal Dicts: a bit-flipping goal env with a gymnasium-robotics Dict observation,
recorded through ``replaystore.gym.RecordEpisodes``, relabelled by HER like the flat goal schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from replaystore.errors import StoreError
from replaystore.gym import RecordEpisodes
from replaystore.loaders import HER, GoalFields, PrioritizedSampler, UniformSampler, make_loader
from replaystore.loaders.dataset import gather_arrays
from replaystore.schemas import Dense, Schema, nested
from replaystore.store import Store, open_store
from support.goalenv import BitFlip, bit_reward

N_BITS = 6


class DictBitFlip(gym.Env):
    """:class:`BitFlip` with gymnasium-robotics' observation ``{"observation", "achieved_goal", "desired_goal"}``.

    Its info names the episode (``ep``, counted over resets) and the step within it (``t``), so a test can tell
    which episode and step a recorded row belongs to.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, n: int = N_BITS, seed: int = 0) -> None:
        box = spaces.Box(0.0, 1.0, (n,), np.float32)
        self.observation_space = spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = spaces.Discrete(n)
        self.flip = BitFlip(n, seed)
        self.ep = -1

    def _obs(self, state: np.ndarray) -> dict[str, np.ndarray]:
        return {"observation": state.copy(), "achieved_goal": state.copy(), "desired_goal": self.flip.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        state, _ = self.flip.reset()
        self.ep += 1
        return self._obs(state), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        state, reward, terminated, truncated = self.flip.step(int(action))
        return self._obs(state), reward, terminated, truncated, {"ep": self.ep, "t": self.flip.t - 1}

    def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        return bit_reward(achieved, desired, info)


def recorded_store(url: str, episodes: int = 40) -> Store:
    """``episodes`` episodes of random play (the last one left unfinished), recorded through RecordEpisodes."""
    env = RecordEpisodes(DictBitFlip(), url, info_keys={"ep": np.int64, "t": np.int64})
    rng = np.random.default_rng(3)
    env.reset(seed=0)
    done = 0
    while done < episodes:
        _, _, terminated, truncated, _ = env.step(int(rng.integers(N_BITS)))
        if terminated or truncated:
            done += 1
            env.reset()
    env.step(0)  # an open episode: never relabelled
    env.close()
    return open_store(url, mode="r")


def row_table(st: Store) -> dict[str, np.ndarray]:
    """Per row id: its episode, step in the episode, end flag and next achieved goal."""
    t = st.default
    rows = np.sort(t.stream_index().rows)
    d = t.read(rows, columns=["info_ep", "info_t", "terminated", "truncated", "next_obs__achieved_goal"])
    n = int(rows.max()) + 1
    out = {"ep": np.full(n, -1), "t": np.full(n, -1), "end": np.zeros(n, bool),
           "next_achieved": np.zeros((n, N_BITS), np.float32)}
    out["ep"][rows] = d["info_ep"]
    out["t"][rows] = d["info_t"]
    out["end"][rows] = d["terminated"] | d["truncated"]
    out["next_achieved"][rows] = d["next_obs__achieved_goal"]
    return out


def check_batch(b: dict[str, Any], ref: dict[str, np.ndarray], strategy: str, original: np.ndarray) -> int:
    """Assert HER's promises on one gathered minibatch (numpy); returns how many records were relabelled."""
    rows = np.asarray(b["indices"])
    goal_rows = np.asarray(b["her_goal_rows"])
    mask = goal_rows >= 0
    obs_goal, next_goal = np.asarray(b["obs"]["desired_goal"]), np.asarray(b["next_obs"]["desired_goal"])
    np.testing.assert_array_equal(obs_goal, next_goal)
    np.testing.assert_array_equal(obs_goal[~mask], original[rows[~mask]])
    np.testing.assert_array_equal(obs_goal[mask], ref["next_achieved"][goal_rows[mask]])
    last_ep = ref["ep"].max()
    for r, g in zip(rows[mask], goal_rows[mask], strict=True):
        assert ref["ep"][g] == ref["ep"][r] != last_ep
        if strategy == "future":
            assert ref["t"][g] >= ref["t"][r]
        elif strategy == "final":
            assert ref["end"][g]
    expected = bit_reward(np.asarray(b["next_obs"]["achieved_goal"]), next_goal, None)
    np.testing.assert_array_equal(np.asarray(b["reward"]), expected)
    np.testing.assert_array_equal(np.asarray(b["obs"]["achieved_goal"]), np.asarray(b["obs"]["observation"]))
    return int(mask.sum())


@pytest.fixture(scope="module")
def goal_dict_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return recorded_store(str(tmp_path_factory.mktemp("hernested") / "bitflip"))


def originals(st: Store) -> np.ndarray:
    ref_rows = np.sort(st.default.stream_index().rows)
    out = np.zeros((int(ref_rows.max()) + 1, N_BITS), np.float32)
    out[ref_rows] = st.default.read(ref_rows, columns=["obs"])["obs"]["desired_goal"]
    return out


def test_recorded_goal_env_is_stored_nested(goal_dict_store: Store) -> None:
    """The recorder stores the goal Dict as nested obs/next_obs, which GoalFields.detect picks."""
    schema = goal_dict_store.schema
    assert {"obs__achieved_goal", "obs__desired_goal", "next_obs__achieved_goal", "next_obs__desired_goal"} <= set(
        schema.names)
    assert GoalFields.detect(schema) == GoalFields.nested()
    assert GoalFields.nested().next_achieved == "next_obs__achieved_goal"


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_nested_goals_relabelled_from_the_right_steps(goal_dict_store: Store, strategy: str, kind: str) -> None:
    """future: an achieved goal at or after the step; final: the episode's last; episode: any of it. The goal goes
    into obs and next_obs desired_goal, the reward is compute_reward's, and about k/(k+1) are relabelled."""
    st = goal_dict_store
    ref, original = row_table(st), originals(st)
    env = DictBitFlip()
    fields = GoalFields.nested(obs="obs", next_obs="next_obs")
    her = HER(strategy, k=3, compute_reward=env.compute_reward, fields=fields, seed=4)
    cls = UniformSampler if kind == "uniform" else PrioritizedSampler
    sampler = cls(st, batch_size=64, seed=5, her=her)
    relabelled = total = 0
    changed = False
    for _ in range(8):
        b = her.relabel(sampler.table, gather_arrays(sampler.table, sampler.sample()))
        relabelled += check_batch(b, ref, strategy, original)
        total += len(b["indices"])
        changed |= bool((b["obs"]["desired_goal"] != original[b["indices"]]).any())
    assert changed  # relabelling replaced goals by other ones
    complete = (ref["ep"][np.sort(st.default.stream_index().rows)] != ref["ep"].max()).mean()
    assert abs(relabelled / total - 0.75 * complete) < 0.1


def test_default_fields_detect_a_nested_goal_store(goal_dict_store: Store) -> None:
    """HER without fields= relabels a nested goal store exactly as with GoalFields.nested()."""
    st = goal_dict_store
    batches = []
    for fields in (None, GoalFields.nested()):
        sampler = UniformSampler(st, batch_size=32, seed=7, her=HER("future", k=4, compute_reward=bit_reward,
                                                                      fields=fields, seed=8))
        batches.append(sampler.her.relabel(sampler.table, gather_arrays(sampler.table, sampler.sample())))
    a, b = batches
    np.testing.assert_array_equal(a["her_goal_rows"], b["her_goal_rows"])
    np.testing.assert_array_equal(a["obs"]["desired_goal"], b["obs"]["desired_goal"])
    np.testing.assert_array_equal(a["reward"], b["reward"])


def test_relabel_leaves_the_gathered_dicts_unmutated(goal_dict_store: Store) -> None:
    """The obs dict the gather produced keeps its goals: relabelling builds new dicts on the goal's path."""
    st = goal_dict_store
    sampler = UniformSampler(st, batch_size=64, seed=9, her=HER("final", k=4, compute_reward=bit_reward))
    raw = gather_arrays(sampler.table, sampler.sample())
    before = raw["obs"]["desired_goal"].copy()
    obs = raw["obs"]
    out = sampler.her.relabel(sampler.table, dict(raw))
    np.testing.assert_array_equal(obs["desired_goal"], before)
    assert (out["her_goal_rows"] >= 0).any()
    assert out["obs"]["observation"] is obs["observation"]


def test_nested_goals_through_a_dataloader_worker(goal_dict_store: Store) -> None:
    """In a DataLoader worker the relabelled goals and rewards arrive as nested tensors."""
    st = goal_dict_store
    ref, original = row_table(st), originals(st)
    sampler = PrioritizedSampler(st, batch_size=48, seed=11, num_batches=3,
                                 her=HER("future", k=4, compute_reward=bit_reward, fields=GoalFields.nested()))
    relabelled = 0
    batches = list(make_loader(st, sampler, num_workers=1))
    assert len(batches) == 3
    for b in batches:
        arrays = {"indices": b["indices"].numpy(), "her_goal_rows": b["her_goal_rows"].numpy(),
                  "reward": b["reward"].numpy(),
                  "obs": {k: v.numpy() for k, v in b["obs"].items()},
                  "next_obs": {k: v.numpy() for k, v in b["next_obs"].items()}}
        relabelled += check_batch(arrays, ref, "future", original)
    assert relabelled > 0


def test_nested_schema_without_goal_leaves_is_refused(new_url: Callable[[], str]) -> None:
    """A nested obs without the goal leaves is a StoreError naming the missing columns."""
    obs = {"observation": Dense("observation", np.float32, (3,))}
    schema = Schema("nogoal", [nested("obs", obs), Dense("reward", np.float32), nested("next_obs", obs),
                               Dense("terminated", np.bool_), Dense("truncated", np.bool_)])
    st = open_store(new_url(), schema)
    with pytest.raises(StoreError, match="next_obs__achieved_goal"):
        UniformSampler(st, batch_size=4, her=HER("future", compute_reward=bit_reward, fields=GoalFields.nested()))
