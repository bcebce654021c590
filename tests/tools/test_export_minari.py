"""Minari export (Arrow and HDF5 backends) checked with minari.load_dataset itself, and Minari import.

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
from minari.data_collector import EpisodeBuffer

from replaystore.errors import StoreError
from replaystore.loaders import iter_episodes
from replaystore.schemas import dqn, episode, ppo, rollout, transitions
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store
from support.batches import dqn_batch, episode_batch, rollout_batch, transitions_batch

pytestmark = pytest.mark.usefixtures("minari_root")  # a Minari root per test (tests/support/minariroot.py)

BACKENDS = [("minari", "arrow"), ("minari-hdf5", "hdf5")]
F32, I64 = np.float32, np.int64


def steps_batch(rng: np.random.Generator, n: int, obs_shape: tuple[int, ...], actions: int,
                end: str | None = None) -> dict[str, np.ndarray]:
    """Raw episode-schema step records with a proper observation chain, ending as asked."""
    all_obs = rng.standard_normal((n + 1, *obs_shape), dtype=F32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    if end == "terminated":
        term[-1] = True
    elif end == "truncated":
        trunc[-1] = True
    return {"obs": all_obs[:-1], "action": rng.integers(0, actions, n).astype(I64),
            "reward": rng.standard_normal(n, dtype=F32), "next_obs": all_obs[1:], "terminated": term,
            "truncated": trunc}


@pytest.fixture
def episode_store(tmp_path: Path):
    """Episodes (terminated and truncated) on int and str streams, a reset without an end flag,
    a step gap and an unfinished tail: every way an episode can stop."""
    rng = np.random.default_rng(10)
    st = open_store(str(tmp_path / "episodes"), episode((2, 3), actions=4, metadata={"env_id": "Grid-v1"}),
                    mode="w")
    with st.writer() as w:
        for s in (0, "env-b"):
            for k in range(3):
                ep = episode_batch(rng, 3 + 2 * k, obs_dim=6, actions=4, terminated=k != 1)
                ep.obs, ep.final_obs = ep.obs.reshape(-1, 2, 3), ep.final_obs.reshape(2, 3)
                w.append(ep, stream=s)
        w.append(steps_batch(rng, 5, (2, 3), 4), stream=7, reset=True)            # cut by the reset below
        w.append(steps_batch(rng, 4, (2, 3), 4, "terminated"), stream=7, reset=True)
        w.append(steps_batch(rng, 3, (2, 3), 4, "truncated"), stream=7, step=np.arange(20, 23))  # a gap
        w.append(steps_batch(rng, 6, (2, 3), 4), stream="env-b")                 # unfinished at the end
    return st


def chained_rollouts(rng: np.random.Generator, rollouts: int, steps: int, envs: int, obs_dim: int, actions: int):
    """[T, B] rollouts from B environments that auto-reset: next_obs[t] is obs[t + 1] inside an episode."""
    current = rng.standard_normal((envs, obs_dim), dtype=F32)
    out = []
    for _ in range(rollouts):
        obs = np.empty((steps, envs, obs_dim), F32)
        nxt = np.empty_like(obs)
        term = rng.random((steps, envs)) < 0.15
        trunc = ~term & (rng.random((steps, envs)) < 0.1)
        for t in range(steps):
            obs[t] = current
            nxt[t] = rng.standard_normal((envs, obs_dim), dtype=F32)
            done = term[t] | trunc[t]
            current = np.where(done[:, None], rng.standard_normal((envs, obs_dim), dtype=F32), nxt[t])
        out.append({"obs": obs, "action": rng.integers(0, actions, (steps, envs)).astype(I64),
                    "reward": rng.standard_normal((steps, envs), dtype=F32), "next_obs": nxt,
                    "terminated": term, "truncated": trunc})
    return out


@pytest.fixture
def rollout_store(tmp_path: Path):
    rng = np.random.default_rng(11)
    st = open_store(str(tmp_path / "rollouts"), rollout(5, actions=3), mode="w")
    with st.writer() as w:
        for ro in chained_rollouts(rng, 3, 8, 3, 5, 3):
            w.append(ro, stream=["a", "b", "c"])
    return st


@pytest.fixture
def dqn_store(tmp_path: Path):
    rng = np.random.default_rng(12)
    st = open_store(str(tmp_path / "dqn"), dqn(6, 2, actions=5), mode="w")
    with st.writer() as w:
        for s in ("p0", "p1", 2):
            w.append(dqn_batch(rng, 40, observation_size=6, actions=5, extra=0), stream=s, reset=True)
        w.commit()
        w.append(dqn_batch(rng, 25, observation_size=6, actions=5, extra=0), stream="p1")
    return st


def expected_episodes(table) -> list[dict[str, Any]]:
    """The store's episodes (replaystore's own iter_episodes), with the Minari flags they should get."""
    out = []
    for ep in iter_episodes(table, complete_only=False):
        ep = {k: v.numpy() if hasattr(v, "numpy") else v for k, v in ep.items()}
        if "dones" in ep:
            term = ep["dones"] & ~ep["can_bootstrap"]
            trunc = ep["dones"] & ep["can_bootstrap"]
        else:
            raw = table.read(ep["rows"])
            term, trunc = raw["terminated"], raw["truncated"]
        trunc = trunc.copy()
        trunc[-1] |= not (term[-1] or trunc[-1])  # an episode cut by a reset, a gap or the end of its stream
        ep["term"], ep["trunc"] = term, trunc
        out.append(ep)
    return out


def check_against_store(dataset, table, *, infos: set[str]) -> list[dict[str, Any]]:
    """Every Minari episode equals the store's episode record for record."""
    expected = expected_episodes(table)
    assert dataset.total_episodes == len(expected) > 0
    assert dataset.total_steps == len(table)
    action_name = "actions" if "actions" in table.schema else "action"
    reward_name = "rewards" if "rewards" in table.schema else "reward"
    for exp, got in zip(expected, dataset.iterate_episodes(), strict=True):
        t = len(exp["steps"])
        assert len(got) == t
        np.testing.assert_array_equal(got.observations, np.concatenate([exp["obs"], exp["final_obs"][None]]))
        np.testing.assert_array_equal(got.actions, exp[action_name])
        np.testing.assert_array_equal(got.rewards, exp[reward_name])
        assert got.rewards.dtype == exp[reward_name].dtype
        np.testing.assert_array_equal(got.terminations, exp["term"])
        np.testing.assert_array_equal(got.truncations, exp["trunc"])
        assert set(got.infos) == infos
        for key, values in got.infos.items():
            assert len(values) == t + 1, key
        if "next_obs" in infos:
            np.testing.assert_array_equal(got.infos["next_obs"][:t], exp["next_obs"])
        meta = next(iter(dataset.storage.get_episode_metadata([got.id])))
        assert meta["replaystore_stream"] == exp["stream"] and int(meta["replaystore_first_step"]) == exp["steps"][0]
    return expected


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_episode_store_loads_in_minari(episode_store, fmt: str, backend: str, minari_root: Path) -> None:
    summary = export_store(episode_store, str(minari_root), fmt, dataset_id="replaystore/grid-v1")
    assert summary["episodes"] == 10 and summary["records"] == len(episode_store)
    dataset = minari.load_dataset("replaystore/grid-v1")
    assert dataset.id == "replaystore/grid-v1"
    assert dataset.observation_space == gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32)
    assert dataset.action_space == gym.spaces.Discrete(4)
    assert dataset.storage.metadata["data_format"] == backend
    expected = check_against_store(dataset, episode_store.default, infos=set())
    kinds = [(bool(e["term"][-1]), bool(e["trunc"][-1])) for e in expected]
    assert (True, False) in kinds and (False, True) in kinds
    assert minari.list_local_datasets()["replaystore/grid-v1"]["total_episodes"] == 10


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_rollout_store_loads_in_minari(rollout_store, fmt: str, backend: str, minari_root: Path) -> None:
    export_store(rollout_store, str(minari_root), fmt, dataset_id="rollouts-v0")
    dataset = minari.load_dataset("rollouts-v0")
    expected = check_against_store(dataset, rollout_store.default, infos=set())
    assert any(len(e["steps"]) > 8 for e in expected)  # episodes span rollouts


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_dqn_store_loads_in_minari_with_legal_masks(dqn_store, fmt: str, backend: str, minari_root: Path) -> None:
    summary = export_store(dqn_store, str(minari_root), fmt)
    dataset_id = summary["dataset_id"]
    assert dataset_id == "replaystore/dqn-v0"  # from the store's directory name
    dataset = minari.load_dataset(dataset_id)
    assert dataset.action_space == gym.spaces.Discrete(5)
    infos = {"players", "dones", "can_bootstrap", "discounts", "masks", "legal_mask", "next_legal_mask", "next_obs"}
    expected = check_against_store(dataset, dqn_store.default, infos=infos)
    for exp, got in zip(expected, dataset.iterate_episodes(), strict=True):
        t = len(exp["steps"])
        raw = dqn_store.read(exp["rows"])
        for name, key in (("legal_ids", "legal_mask"), ("next_legal_ids", "next_legal_mask")):
            mask = got.infos[key]
            assert mask.dtype == np.bool_ and mask.shape == (t + 1, 5)
            offsets = raw[name.replace("ids", "offsets")]
            for i in range(t):
                assert set(np.flatnonzero(mask[i])) == set(raw[name][offsets[i]:offsets[i + 1]].tolist())
            assert not mask[t].any()  # the padding row
        for key in ("players", "dones", "can_bootstrap", "discounts", "masks"):
            np.testing.assert_array_equal(got.infos[key][:t], raw[key])
            assert not np.any(got.infos[key][t])
    meta = json.loads((Path(summary["path"]) / "data" / "metadata.json").read_text())
    assert meta["minari_version"] in minari.supported_dataset_versions
    assert meta["replaystore"]["infos"]["legal_mask"] == {"from": "legal_ids", "encoding": "bool mask", "width": 5}


def test_unknown_action_count_warns_and_leaves_masks_out(tmp_path: Path, minari_root: Path) -> None:
    rng = np.random.default_rng(13)
    st = open_store(str(tmp_path / "nocount"), dqn(4, 1), mode="w")
    with st.writer() as w:
        w.append(dqn_batch(rng, 30, observation_size=4, heads=1, actions=6, extra=0), stream=0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        export_store(st, str(minari_root), "minari", dataset_id="nocount-v0")
    messages = sorted(str(r.message) for r in record)
    assert len(messages) == 2
    assert messages[0].startswith("Minari export: ragged field 'legal_ids' left out")
    assert messages[1].startswith("Minari export: ragged field 'next_legal_ids' left out")
    assert "action count is unknown" in messages[0]
    dataset = minari.load_dataset("nocount-v0")
    top = int(st.read(st.row_ids())["actions"].max())
    assert dataset.action_space == gym.spaces.Discrete(top + 1)  # inferred from the data
    check_against_store(dataset, st.default,
                        infos={"players", "dones", "can_bootstrap", "discounts", "masks", "next_obs"})


def test_broken_observation_chain_keeps_next_obs(tmp_path: Path, minari_root: Path) -> None:
    rng = np.random.default_rng(14)
    st = open_store(str(tmp_path / "raw-rollouts"), rollout(4, actions=3), mode="w")
    with st.writer() as w:
        ro = rollout_batch(rng, 6, 2)  # next_obs unrelated to the following obs
        w.append(ro)
    with pytest.warns(UserWarning, match=r"'next_obs' is not the next step's 'obs'"):
        export_store(st, str(minari_root), "minari-hdf5", dataset_id="raw-v0")
    dataset = minari.load_dataset("raw-v0")
    for exp, got in zip(expected_episodes(st.default), dataset.iterate_episodes(), strict=True):
        if len(exp["steps"]) > 1:
            np.testing.assert_array_equal(got.infos["next_obs"][:-1], exp["next_obs"])


def test_minari_export_refusals(tmp_path: Path, minari_root: Path, episode_store) -> None:
    st = open_store(str(tmp_path / "ppo"), ppo(4, actions=3), mode="w")
    with pytest.raises(StoreError, match="schema 'ppo' lacks next_obs, reward/rewards, terminated/dones"):
        export_store(st, str(minari_root), "minari")
    with pytest.raises(StoreError, match="Minari dataset id 'no version'"):
        export_store(episode_store, str(minari_root), "minari", dataset_id="no version")
    export_store(episode_store, str(minari_root), "minari", dataset_id="twice-v0")
    with pytest.raises(StoreError, match="already exists"):
        export_store(episode_store, str(minari_root), "minari-hdf5", dataset_id="twice-v0")
    with pytest.raises(StoreError, match="dataset_id applies to Minari"):
        export_store(episode_store, str(tmp_path / "p"), "parquet", dataset_id="x-v0")


def test_ids_beyond_the_declared_count_are_refused_and_nothing_is_left(tmp_path: Path, minari_root: Path) -> None:
    rng = np.random.default_rng(16)
    st = open_store(str(tmp_path / "narrow"), dqn(4, 1, metadata={"actions": 3}), mode="w")
    with st.writer() as w:
        w.append(dqn_batch(rng, 40, observation_size=4, heads=1, actions=8, extra=0), stream=0)
    with pytest.raises(StoreError, match=r"field 'legal_ids': id [3-7] outside \[0, 3\) cannot go into a mask"):
        export_store(st, str(minari_root), "minari", dataset_id="narrow-v0")
    assert not (minari_root / "narrow-v0").exists()
    t = open_store(str(tmp_path / "t"), transitions(2, metadata={"actions": 2}), mode="w")  # no id_bound
    with t.writer() as w:
        w.append(transitions_batch(rng, 20, obs_dim=2, actions=5), stream=0)
    with pytest.raises(StoreError, match=r"field 'action': action [2-4] in stream 0 is outside .*Discrete\(2\)"):
        export_store(t, str(minari_root), "minari-hdf5", dataset_id="narrow-v1")
    assert not (minari_root / "narrow-v1").exists()


# -- import -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
def test_import_of_our_export_restores_streams_and_steps(episode_store, fmt: str, backend: str,
                                                         minari_root: Path, tmp_path: Path) -> None:
    export_store(episode_store, str(minari_root), fmt, dataset_id="grid-v3")
    back = import_store("grid-v3", str(tmp_path / "back"), "minari")  # an id under MINARI_DATASETS_PATH
    src = episode_store.default
    assert back.schema.name == "episode" and back.schema.field("obs").shape == (2, 3)
    assert back.schema.metadata["actions"] == 4 and back.schema.metadata["env_id"] == "Grid-v1"
    assert sorted(map(repr, back.streams())) == sorted(map(repr, src.streams()))
    for key in src.streams():
        rows_a, steps_a = src.rows(key)
        rows_b, steps_b = back.rows(key)
        np.testing.assert_array_equal(steps_a, steps_b)
        a, b = src.read(rows_a), back.read(rows_b)
        for name in ("obs", "action", "reward", "next_obs", "terminated"):
            assert a[name].tobytes() == b[name].tobytes(), name
        cut = ~(a["terminated"] | a["truncated"]) & (b["truncated"])
        np.testing.assert_array_equal(b["truncated"] & ~cut, a["truncated"])
    ends = [(e["stream"], int(e["steps"][-1])) for e in expected_episodes(src)]
    assert [(e["stream"], int(e["steps"][-1])) for e in expected_episodes(back.default)] == ends


@pytest.mark.parametrize("data_format", ["arrow", "hdf5"])
def test_import_of_a_dataset_minari_wrote(data_format: str, minari_root: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(15)
    buffers = []
    for i, t in enumerate((5, 1, 8)):
        buffers.append(EpisodeBuffer(
            observations=rng.standard_normal((t + 1, 3)).astype(F32),
            actions=rng.uniform(-1, 1, (t, 2)).astype(F32),
            rewards=rng.standard_normal(t),
            terminations=np.r_[np.zeros(t - 1, bool), i != 1], truncations=np.r_[np.zeros(t - 1, bool), i == 1],
            infos={"success": np.zeros(t + 1, bool)}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari asks for author, permalink, ...
        minari.create_dataset_from_buffers(
            "pendulum/mine-v2", buffers, observation_space=gym.spaces.Box(-5, 5, (3,), F32),
            action_space=gym.spaces.Box(-1, 1, (2,), F32), data_format=data_format)
    st = import_store(str(minari_root), str(tmp_path / "mine"), "minari", dataset_id="pendulum/mine-v2")
    assert st.schema.name == "episode"
    assert st.schema.field("action").dtype == np.float32 and st.schema.field("action").shape == (2,)
    assert st.schema.field("reward").dtype == np.float64
    assert st.streams() == [0, 1, 2]  # one stream per Minari episode
    for i, buf in enumerate(buffers):
        rows, steps = st.rows(i)
        data = st.read(rows)
        np.testing.assert_array_equal(steps, np.arange(len(buf.rewards)))
        np.testing.assert_array_equal(data["obs"], buf.observations[:-1])
        np.testing.assert_array_equal(data["next_obs"], buf.observations[1:])
        np.testing.assert_array_equal(data["action"], buf.actions)
        np.testing.assert_array_equal(data["reward"], buf.rewards)
        np.testing.assert_array_equal(data["terminated"], buf.terminations)
        np.testing.assert_array_equal(data["truncated"], buf.truncations)
        assert st.default.index_of(rows)[2].tolist() == [True] + [False] * (len(rows) - 1)
    episodes = list(iter_episodes(st.default))
    assert [len(e["steps"]) for e in episodes] == [5, 1, 8]


def test_import_errors(tmp_path: Path, minari_root: Path) -> None:
    with pytest.raises(StoreError, match="no Minari dataset there"):
        import_store("nothing/here-v0", str(tmp_path / "x"), "minari")
    data = minari_root / "weird-v0" / "data"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text(json.dumps({
        "dataset_id": "weird-v0", "data_format": "arrow", "total_episodes": 0, "total_steps": 0,
        "observation_space": json.dumps({"type": "Dict", "subspaces": {}}),
        "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 2})}))
    with pytest.raises(StoreError, match="type .Dict.: only Box, Discrete, MultiDiscrete, MultiBinary"):
        import_store(str(minari_root / "weird-v0"), str(tmp_path / "x"), "minari")
    assert not (tmp_path / "x").exists()
    with pytest.raises(StoreError, match="dataset_id applies to Minari imports only"):
        import_store("f.hdf5", str(tmp_path / "x"), "d4rl", dataset_id="a-v0")


def test_the_export_docs_home_root_is_the_home_directory(episode_store, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """EXPORT.md's ``export_store(st, "~/.minari/datasets", "minari", ...)``: ``~`` is $HOME, not a directory."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(home / ".minari" / "datasets"))
    monkeypatch.chdir(cwd)
    export_store(episode_store, "~/.minari/datasets", "minari", dataset_id="replaystore/grid-v1")
    assert list(cwd.iterdir()) == []  # no directory literally named "~"
    assert minari.load_dataset("replaystore/grid-v1").total_episodes == 10
    back = import_store("~/.minari/datasets", "~/back", "minari", dataset_id="replaystore/grid-v1")
    assert back.url == str(home / "back") and len(back.default) == len(episode_store)
    assert list(cwd.iterdir()) == []
