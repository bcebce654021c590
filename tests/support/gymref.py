"""Ground truth for the Gymnasium recorders: the transitions each sub-environment makes, recorded by
hand from single environments driven with the same seeds and actions, and the store read back per
stream for comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from replaystore.gym import recorded_episodes


@dataclass
class Truth:
    """One slot's transitions (as lists of values) and its episodes."""

    obs: list[Any] = field(default_factory=list)
    action: list[Any] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    next_obs: list[Any] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    reset: list[bool] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # vector steps that were an autoreset, not a transition (NEXT_STEP)
    _open: dict[str, Any] | None = None

    def start(self, seed: int | None) -> None:
        self.close_episode(False, False)
        self._open = {"first_step": len(self.obs), "length": 0, "return": 0.0, "seed": seed}

    def add(self, obs: Any, action: Any, reward: float, next_obs: Any, term: bool, trunc: bool,
            info: dict[str, Any]) -> None:
        assert self._open is not None
        self.reset.append(self._open["length"] == 0)
        self.obs.append(np.array(obs, copy=True))
        self.action.append(np.array(action, copy=True))
        self.reward.append(float(reward))
        self.next_obs.append(np.array(next_obs, copy=True))
        self.terminated.append(bool(term))
        self.truncated.append(bool(trunc))
        self.infos.append(dict(info))
        self._open["length"] += 1
        self._open["return"] += float(reward)
        if term or trunc:
            self.close_episode(bool(term), bool(trunc))

    def close_episode(self, term: bool, trunc: bool) -> None:
        if self._open is not None and self._open["length"] > 0:
            self.episodes.append({**self._open, "terminated": term, "truncated": trunc})
        self._open = None


def single_truth(make: Callable[[], gym.Env], plan: Sequence[tuple[str, Any]]) -> Truth:
    """Run one env through ``plan``: ``("reset", seed)`` or ``("step", action)``."""
    env = make()
    truth = Truth()
    obs = None
    for kind, arg in plan:
        if kind == "reset":
            obs, _ = env.reset(seed=arg)
            truth.start(arg)
        else:
            nxt, reward, term, trunc, info = env.step(arg)
            truth.add(obs, arg, reward, nxt, term, trunc, info)
            obs = nxt
    truth.close_episode(False, False)
    env.close()
    return truth


def vector_truth(make: Callable[[], gym.Env], n: int, mode: AutoresetMode, seed: int,
                 actions: Sequence[Any]) -> list[Truth]:
    """What each of ``n`` sub-envs does under ``mode`` after ``reset(seed=seed)`` and the steps
    ``actions[t][i]`` (DISABLED: ended sub-envs are reset, without a seed, right after the step),
    recorded slot by slot from single envs."""
    out = []
    for i in range(n):
        env = make()
        truth = Truth()
        obs, _ = env.reset(seed=seed + i)
        truth.start(seed + i)
        autoreset = False
        for step_actions in actions:
            a = step_actions[i]
            if mode == AutoresetMode.NEXT_STEP and autoreset:
                obs, _ = env.reset()
                truth.start(None)
                truth.skipped += 1
                autoreset = False
                continue
            nxt, reward, term, trunc, info = env.step(a)
            truth.add(obs, a, reward, nxt, term, trunc, info)
            obs = nxt
            if term or trunc:
                if mode == AutoresetMode.NEXT_STEP:
                    autoreset = True
                else:
                    obs, _ = env.reset()
                    truth.start(None)
        truth.close_episode(False, False)
        env.close()
        out.append(truth)
    return out


def drive_vector(venv: Any, mode: AutoresetMode, seed: int, actions: Sequence[Any]) -> None:
    """The user's loop the truth above describes (DISABLED: reset ended sub-envs with a mask)."""
    venv.reset(seed=seed)
    for a in actions:
        _, _, term, trunc, _ = venv.step(a)
        done = np.asarray(term) | np.asarray(trunc)
        if mode == AutoresetMode.DISABLED and done.any():
            venv.reset(options={"reset_mask": done})


def assert_stream_equals(st: Any, key: Any, truth: Truth, info_keys: Sequence[str] = ()) -> None:
    """The stored records of stream ``key`` equal ``truth``, record for record (steps 0, 1, ...)."""
    rows, steps = st.rows(key) if truth.obs else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(rows) == len(truth.obs), f"stream {key!r}: {len(rows)} records, truth {len(truth.obs)}"
    if not len(rows):
        return
    order = np.argsort(steps)
    rows, steps = rows[order], steps[order]
    np.testing.assert_array_equal(steps, np.arange(len(rows)))
    data = st.read(rows)
    _, _, resets = st.default.index_of(rows)
    np.testing.assert_array_equal(resets, truth.reset)
    f = st.schema
    for name in ("obs", "action", "next_obs"):
        want = np.stack(getattr(truth, name)).astype(f.field(name).dtype).reshape(data[name].shape)
        np.testing.assert_array_equal(data[name], want, err_msg=name)
    np.testing.assert_array_equal(data["reward"], np.asarray(truth.reward, dtype=f.field("reward").dtype))
    np.testing.assert_array_equal(data["terminated"], truth.terminated)
    np.testing.assert_array_equal(data["truncated"], truth.truncated)
    for key_ in info_keys:
        present = [key_ in i for i in truth.infos]
        np.testing.assert_array_equal(data[f"info_{key_}_valid"], present, err_msg=key_)
        values = [i.get(key_, 0) for i in truth.infos]
        np.testing.assert_array_equal(data[f"info_{key_}"], np.asarray(values, dtype=data[f"info_{key_}"].dtype))


def assert_episodes_equal(st: Any, keys: Sequence[Any], truths: Sequence[Truth]) -> None:
    """``recorded_episodes`` lists exactly the truth's episodes, per stream in order."""
    eps = recorded_episodes(st)
    for key, truth in zip(keys, truths, strict=True):
        got = [{k: e[k] for k in ("first_step", "length", "return", "seed", "terminated", "truncated")}
               for e in eps if e["stream"] == key]
        assert got == truth.episodes, key
    assert len(eps) == sum(len(t.episodes) for t in truths)
