"""Minari fidelity: recorded stores export with their spaces, env spec and infos (checked with
minari.load_dataset and recover_environment), and a dataset Minari's DataCollector made imports with
them and exports back bit-identical per episode.

MINARI_DATASETS_PATH points at a temp dir; nothing touches the network.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import pytest

from replaystore.gym import RecordEpisodes
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store

pytestmark = pytest.mark.usefixtures("minari_root")  # a Minari root per test (tests/support/minariroot.py)

BACKENDS = [("minari", "arrow"), ("minari-hdf5", "hdf5")]


class CartX(gym.Wrapper):
    """CartPole whose step and reset infos carry the cart position (a float32) and, on steps, a vector."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "x_pos": np.float32(obs[0])}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, r, term, trunc, info = self.env.step(action)
        return obs, r, term, trunc, {**info, "x_pos": np.float32(obs[0])}


def _record(env: gym.Env, url: str, episodes: int, seed: int, **kwargs: Any) -> None:
    rec = RecordEpisodes(env, url, **kwargs)
    rng = np.random.default_rng(seed)
    for k in range(episodes):
        rec.reset(seed=seed + k)
        done = False
        while not done:
            a = rec.action_space.sample() if not isinstance(rec.action_space, gym.spaces.Discrete) \
                else int(rng.integers(rec.action_space.n))
            _, _, term, trunc, _ = rec.step(a)
            done = term or trunc
    rec.close()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
@pytest.mark.parametrize(("env_id", "kwargs"), [("CartPole-v1", {"max_episode_steps": 40}),
                                                 ("MountainCarContinuous-v0", {"max_episode_steps": 30})])
def test_recorded_store_exports_a_recoverable_environment(env_id: str, kwargs: dict[str, Any], fmt: str,
                                                          backend: str, minari_root: Path, tmp_path: Path) -> None:
    env = gym.make(env_id, **kwargs)
    _record(env, str(tmp_path / "rec"), 4, seed=3)
    st = open_store(str(tmp_path / "rec"), mode="r")
    export_store(st, str(minari_root), fmt, dataset_id="rec/run-v0")
    ds = minari.load_dataset("rec/run-v0")
    assert ds.env_spec is not None and ds.env_spec.id == env_id
    assert ds.env_spec.max_episode_steps == kwargs["max_episode_steps"]
    assert ds.observation_space == env.observation_space and ds.action_space == env.action_space
    made = ds.recover_environment()
    assert made.spec is not None and made.spec.id == env_id and made.observation_space == env.observation_space
    made.reset(seed=0)
    made.step(made.action_space.sample())
    made.close()
    table = st.default
    rows, _ = table.rows(table.streams()[0])
    data = table.read(rows)
    eps = list(ds.iterate_episodes())
    assert len(eps) == 4 and sum(len(e.rewards) for e in eps) == len(rows)
    cut = 0
    for e in eps:
        t = len(e.rewards)
        assert _same(e.observations[:-1], data["obs"][cut:cut + t])
        assert _same(e.observations[-1], data["next_obs"][cut + t - 1])
        assert _same(e.actions, data["action"][cut:cut + t])
        assert _same(e.rewards, data["reward"][cut:cut + t])
        assert e.terminations[-1] or e.truncations[-1]
        cut += t
    st.close()


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_recorded_infos_are_exported_with_their_presence(fmt: str, backend: str, minari_root: Path,
                                                         tmp_path: Path) -> None:
    _record(CartX(gym.make("CartPole-v1", max_episode_steps=25)), str(tmp_path / "rec"), 3, seed=5,
            info_keys=["x_pos"])
    st = open_store(str(tmp_path / "rec"), mode="r")
    assert "info_x_pos" in st.schema and "info_x_pos_valid" in st.schema
    export_store(st, str(minari_root), fmt, dataset_id="rec/infos-v0")
    ds = minari.load_dataset("rec/infos-v0")
    table = st.default
    data = table.read(table.rows(table.streams()[0])[0])
    cut = 0
    for e in ds.iterate_episodes():
        t = len(e.rewards)
        assert sorted(e.infos) == ["_x_pos", "x_pos"]
        assert len(e.infos["x_pos"]) == t + 1
        # row 0 is the reset info, which the recorder does not keep: zero and marked absent
        assert e.infos["x_pos"][0] == 0 and e.infos["_x_pos"].tolist() == [False] + [True] * t
        assert _same(e.infos["x_pos"][1:], data["info_x_pos"][cut:cut + t])
        np.testing.assert_array_equal(e.infos["x_pos"][1:], e.observations[1:, 0])
        cut += t
    st.close()


def _collect(data_format: str, dataset_id: str) -> minari.MinariDataset:
    """A CartPole dataset made by Minari's own DataCollector (needs jax: minari[create]), with an info key."""
    class XPos(minari.StepDataCallback):
        def __call__(self, env: gym.Env, **kwargs: Any) -> Any:
            step = super().__call__(env, **kwargs)
            step["info"]["x_pos"] = np.float32(kwargs["obs"][0])
            return step

    env = minari.DataCollector(gym.make("CartPole-v1", max_episode_steps=30), step_data_callback=XPos,
                               record_infos=True, data_format=data_format)
    env.reset(seed=1)  # DataCollector: the first reset's info carries x_pos too (see reset below)
    env.action_space.seed(2)
    for k in range(4):
        env.reset(seed=10 + k)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari asks for author, permalink, ...
        ds = env.create_dataset(dataset_id=dataset_id, algorithm_name="random")
    env.close()
    return ds


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_import_of_a_data_collector_dataset_round_trips_bit_identically(fmt: str, backend: str, minari_root: Path,
                                                                        tmp_path: Path) -> None:
    src = _collect(backend, "cartpole/collected-v0")
    meta = json.loads((minari_root / "cartpole/collected-v0/data/metadata.json").read_text())
    st = import_store("cartpole/collected-v0", str(tmp_path / "imported"), "minari")
    md = st.schema.metadata
    assert md["env_spec"] == meta["env_spec"] and md["env_id"] == "CartPole-v1"
    assert md["observation_space"] == meta["observation_space"] and md["action_space"] == meta["action_space"]
    for name in ("info_x_pos", "info_x_pos_valid", "info_x_pos_reset"):
        assert name in st.schema
    originals = list(src.iterate_episodes())
    assert len(originals) == 4 and all(len(e.infos["x_pos"]) == len(e.rewards) + 1 for e in originals)
    table = st.default
    for i, e in enumerate(originals):  # the info columns in the store, recorder style
        data = table.read(table.rows(i)[0])
        assert _same(data["info_x_pos"], e.infos["x_pos"][1:]) and data["info_x_pos_valid"].all()
        assert data["info_x_pos_reset"][0] == e.infos["x_pos"][0]

    export_store(st, str(minari_root), fmt, dataset_id="cartpole/back-v0")
    back = minari.load_dataset("cartpole/back-v0")
    assert back.env_spec == src.env_spec
    assert back.observation_space == src.observation_space and back.action_space == src.action_space
    assert back.recover_environment().spec.id == "CartPole-v1"
    again = list(back.iterate_episodes())
    assert len(again) == len(originals)
    for a, b in zip(originals, again, strict=True):
        for field in ("observations", "actions", "rewards", "terminations", "truncations"):
            assert _same(getattr(a, field), getattr(b, field)), field
        assert sorted(a.infos) == sorted(b.infos) == ["x_pos"]
        assert _same(a.infos["x_pos"], b.infos["x_pos"])
    st.close()


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_recorded_infos_survive_export_import_export(fmt: str, backend: str, minari_root: Path,
                                                    tmp_path: Path) -> None:
    _record(CartX(gym.make("CartPole-v1", max_episode_steps=25)), str(tmp_path / "rec"), 3, seed=7,
            info_keys=["x_pos"])
    st = open_store(str(tmp_path / "rec"), mode="r")
    export_store(st, str(minari_root), fmt, dataset_id="rec/first-v0")
    back = import_store("rec/first-v0", str(tmp_path / "back"), "minari")
    assert "info_x_pos" in back.schema and "info_x_pos_reset" not in back.schema  # no reset infos were recorded
    src, dst = st.default, back.default
    for key in src.streams():
        a, b = src.read(src.rows(key)[0]), back.read(dst.rows(key)[0])
        assert _same(a["info_x_pos"], b["info_x_pos"]) and _same(a["info_x_pos_valid"], b["info_x_pos_valid"])
    export_store(back, str(minari_root), fmt, dataset_id="rec/second-v0")
    first, second = minari.load_dataset("rec/first-v0"), minari.load_dataset("rec/second-v0")
    assert second.env_spec == first.env_spec
    for e1, e2 in zip(first.iterate_episodes(), second.iterate_episodes(), strict=True):
        assert sorted(e1.infos) == sorted(e2.infos) == ["_x_pos", "x_pos"]
        assert _same(e1.infos["x_pos"], e2.infos["x_pos"]) and _same(e1.infos["_x_pos"], e2.infos["_x_pos"])
        assert _same(e1.observations, e2.observations) and _same(e1.actions, e2.actions)
    st.close()
    back.close()
