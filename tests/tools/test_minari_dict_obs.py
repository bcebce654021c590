"""Dict observations and Minari: a recorded store exported with its Dict observation space and read
by ``minari.load_dataset``; a dataset Minari itself wrote with Dict observations imported into nested
fields, episode for episode."""

from __future__ import annotations

import minari
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from replaystore.gym import RecordVectorEpisodes
from replaystore.loaders import iter_episodes
from replaystore.store import open_store
from replaystore.tools.formats.minari import export_minari, import_minari
from support.dictenv import DictObsEnv


@pytest.fixture
def recorded(tmp_path):
    venv = RecordVectorEpisodes(SyncVectorEnv([DictObsEnv] * 2), tmp_path / "rec", commit_every=25)
    venv.reset(seed=11)
    rng = np.random.default_rng(1)
    for _ in range(40):
        venv.step(rng.integers(0, 3, 2))
    venv.close()
    return open_store(str(tmp_path / "rec"), mode="r")


@pytest.mark.parametrize("backend", ["arrow", "hdf5"])
def test_export_writes_a_dict_space_minari_loads(recorded, tmp_path, monkeypatch, backend):
    out = tmp_path / "datasets"
    export_minari(recorded, str(out), dataset_id="dictobs/rec-v0", backend=backend)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out))
    ds = minari.load_dataset("dictobs/rec-v0")
    assert ds.observation_space == DictObsEnv().observation_space
    ours = list(iter_episodes(recorded.default, complete_only=False))
    theirs = list(ds.iterate_episodes())
    assert len(theirs) == len(ours) > 2
    for mine, ep in zip(ours, theirs, strict=True):
        for leaf in ("image", "vec"):
            want = np.concatenate([mine["obs"][leaf].numpy(), mine["final_obs"][leaf].numpy()[None]])
            assert ep.observations[leaf].dtype == want.dtype
            np.testing.assert_array_equal(ep.observations[leaf], want, err_msg=leaf)
        np.testing.assert_array_equal(ep.actions, mine["action"].numpy())
        np.testing.assert_array_equal(ep.rewards, mine["reward"].numpy())
    back = import_minari(str(out / "dictobs" / "rec-v0"), str(tmp_path / "back"))
    assert back.schema.names == recorded.schema.names
    again = list(iter_episodes(back.default, complete_only=False))
    assert len(again) == len(ours)
    for mine, ep in zip(ours, again, strict=True):
        for name in ("obs", "next_obs", "final_obs"):
            for leaf in ("image", "vec"):
                np.testing.assert_array_equal(ep[name][leaf].numpy(), mine[name][leaf].numpy())


def _minari_made(tmp_path, monkeypatch):
    """Episodes of DictObsEnv written by Minari's own dataset writer (``create_dataset_from_buffers``).

    Minari's DataCollector needs jax, which is not a dependency here; the buffers hold what a
    collector would: T + 1 observations and T actions, rewards and flags per episode.
    """
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "made"))
    env = DictObsEnv()
    rng = np.random.default_rng(4)
    buffers, truth = [], []
    for e in range(4):
        obs, _ = env.reset(seed=30 + e)
        seen, acts, rews, terms, truncs = [obs], [], [], [], []
        while True:
            a = int(rng.integers(0, 3))
            obs, r, term, trunc, _ = env.step(a)
            seen.append(obs)
            acts.append(a)
            rews.append(r)
            terms.append(term)
            truncs.append(trunc)
            if term or trunc:
                break
        observations = {k: np.stack([o[k] for o in seen]) for k in ("image", "vec")}
        buffers.append(EpisodeBuffer(id=e, observations=observations, actions=np.array(acts),
                                     rewards=np.array(rews), terminations=np.array(terms),
                                     truncations=np.array(truncs), infos={}))
        truth.append((observations, np.array(acts), np.array(rews), np.array(terms), np.array(truncs)))
    minari.create_dataset_from_buffers("dictobs/made-v0", buffers, observation_space=env.observation_space,
                                       action_space=env.action_space, algorithm_name="random",
                                       jpeg_encoding=False)
    return tmp_path / "made" / "dictobs" / "made-v0", truth


def test_import_of_a_minari_made_dict_dataset_keeps_every_episode(tmp_path, monkeypatch):
    src, truth = _minari_made(tmp_path, monkeypatch)
    st = import_minari(str(src), str(tmp_path / "imported"))
    assert st.schema.to_dict()["nested"] == {"obs": "dict", "next_obs": "dict"}
    eps = list(iter_episodes(st.default))
    assert len(eps) == len(truth)
    for ep, (observations, acts, rews, terms, truncs) in zip(eps, truth, strict=True):
        for leaf in ("image", "vec"):
            np.testing.assert_array_equal(ep["obs"][leaf].numpy(), observations[leaf][:-1])
            np.testing.assert_array_equal(ep["next_obs"][leaf].numpy(), observations[leaf][1:])
            np.testing.assert_array_equal(ep["final_obs"][leaf].numpy(), observations[leaf][-1])
        np.testing.assert_array_equal(ep["action"].numpy(), acts)
        np.testing.assert_array_equal(ep["reward"].numpy(), rews)
        assert bool(ep["terminated"]) == bool(terms[-1]) and bool(ep["truncated"]) == bool(truncs[-1])
