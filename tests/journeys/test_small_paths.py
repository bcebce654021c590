"""A user's short path across features: record FrozenLake with a custom map (a spec JSON cannot hold as it is)
through ``RecordEpisodes``, sample it, query it with SQL (a typo'd column names the columns there are),
export it to Minari under a namespaced id and read it back with Minari's own reader and as a store."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode
from minari.namespace import list_local_namespaces

from replaystore.errors import StoreExistsError
from replaystore.gym import RecordEpisodes, RecordVectorEpisodes
from replaystore.loaders import UniformSampler, make_loader
from replaystore.store import open_store
from replaystore.store.sql import QueryError
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store

pytestmark = pytest.mark.usefixtures("minari_root")  # a Minari root per test (tests/support/minariroot.py)

DESC = np.array([list(row) for row in ["SFFH", "FHFF", "FFFH", "HFFG"]])
DATASET_ID = "lab/frozenlake/custom-v0"


def _record(url: str, episodes: int) -> list[dict[str, list]]:
    """Record ``episodes`` random-policy episodes; what the environment gave, per episode."""
    env = gym.make("FrozenLake-v1", desc=DESC, is_slippery=True)
    with pytest.warns(UserWarning, match=r"kwargs\['desc'\] \(ndarray, kept as a list\)"):
        rec = RecordEpisodes(env, url)
    rng = np.random.default_rng(3)
    seen = []
    for i in range(episodes):
        obs, _ = rec.reset(seed=i)
        ep: dict[str, list] = {"obs": [obs], "action": [], "reward": [], "terminated": [], "truncated": []}
        while True:
            a = int(rng.integers(4))
            obs, r, term, trunc, _ = rec.step(a)
            for k, v in (("obs", obs), ("action", a), ("reward", r), ("terminated", term), ("truncated", trunc)):
                ep[k].append(v)
            if term or trunc:
                break
        seen.append(ep)
    rec.close()
    return seen


def test_frozenlake_custom_map_record_sample_query_export_to_a_namespace(tmp_path: Path,
                                                                         minari_root: Path) -> None:
    url = str(tmp_path / "frozen")
    seen = _record(url, episodes=12)
    steps = sum(len(ep["action"]) for ep in seen)
    st = open_store(url, mode="r")
    assert len(st) == steps

    # the kept spec remakes the custom map
    spec = EnvSpec.from_json(st.schema.metadata["env_spec"])
    np.testing.assert_array_equal(gym.make(spec).unwrapped.desc, np.asarray(DESC, dtype="c"))  # type: ignore[attr-defined]

    # sampling: every drawn transition is one the environment produced
    transitions = {(int(o), int(a), float(r), int(n)) for ep in seen
                   for o, a, r, n in zip(ep["obs"][:-1], ep["action"], ep["reward"], ep["obs"][1:], strict=True)}
    batches = list(make_loader(st, UniformSampler(st, batch_size=16, seed=0, num_batches=3)))
    assert len(batches) == 3
    for b in batches:
        for o, a, r, n in zip(b["obs"].tolist(), b["action"].tolist(), b["reward"].tolist(), b["next_obs"].tolist(),
                              strict=True):
            assert (int(o), int(a), float(r), int(n)) in transitions

    # SQL: the success rate, and a typo'd column that lists what there is
    got = st.sql("SELECT count(*) FILTER (WHERE terminated AND reward > 0) AS wins, "
                 "count(*) FILTER (WHERE terminated OR truncated) AS ends FROM records").to_pylist()[0]
    assert got == {"wins": sum(ep["reward"][-1] > 0 for ep in seen), "ends": len(seen)}
    with pytest.raises(QueryError, match=r'"rewrd" not found.*available columns: records: .*reward, next_obs'):
        st.sql("SELECT avg(rewrd) FROM records")

    # Minari under a namespace, read by Minari's own reader
    export_store(st, str(minari_root), "minari", dataset_id=DATASET_ID)
    ds = minari.load_dataset(DATASET_ID)
    assert ds.spec.namespace == "lab/frozenlake" and {"lab", "lab/frozenlake"} <= set(list_local_namespaces())
    assert ds.total_episodes == len(seen) and ds.total_steps == steps
    for ep, mine in zip(ds.iterate_episodes(), seen, strict=True):
        np.testing.assert_array_equal(ep.observations, mine["obs"])
        np.testing.assert_array_equal(ep.actions, mine["action"])
        np.testing.assert_array_equal(ep.rewards, mine["reward"])
        np.testing.assert_array_equal(ep.terminations, mine["terminated"])
        np.testing.assert_array_equal(ep.truncations, mine["truncated"])
    remade = ds.recover_environment()  # Minari rebuilds the custom map from the kept spec
    np.testing.assert_array_equal(remade.unwrapped.desc, np.asarray(DESC, dtype="c"))

    # and back into a new store by its id; a second import onto it says a store is there
    back = import_store(DATASET_ID, str(tmp_path / "back"), "minari")
    rows = np.arange(steps)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_array_equal(back.read(rows)[name], st.read(rows)[name])
    with pytest.raises(StoreExistsError, match="a replaystore store is already there") as err:
        import_store(DATASET_ID, str(tmp_path / "back"), "minari")
    assert "mode" not in str(err.value)


def test_episode_statistics_over_a_same_step_vector_env_match_the_recorded_returns(tmp_path: Path) -> None:
    """RecordEpisodeStatistics around a SAME_STEP CartPole vector env: recorded, and the store's per-episode
    returns (SQL window over each stream) are the wrapper's own ``return_queue``."""
    venv = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    stats = gym.wrappers.vector.RecordEpisodeStatistics(venv, buffer_length=1000)
    with pytest.warns(UserWarning, match=r"autoreset_mode'\] \(AutoresetMode, kept as its value 'SameStep'\)"):
        rec = RecordVectorEpisodes(stats, str(tmp_path / "cp"))
    rec.reset(seed=5)
    rng = np.random.default_rng(5)
    for _ in range(120):
        rec.step(rng.integers(2, size=3))
    rec.close()
    st = open_store(str(tmp_path / "cp"), mode="r")
    assert len(st) == 360
    assert EnvSpec.from_json(st.schema.metadata["env_spec"]).kwargs["vector_kwargs"] == {"autoreset_mode": "SameStep"}
    ends = st.sql("""
        WITH marked AS (
            SELECT stream, step, reward, terminated OR truncated AS done,
                   sum(CASE WHEN terminated OR truncated THEN 1 ELSE 0 END)
                       OVER (PARTITION BY stream ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ep
            FROM records)
        SELECT stream, coalesce(ep, 0) AS ep, sum(reward) AS ret, bool_or(done) AS finished
        FROM marked GROUP BY stream, coalesce(ep, 0) HAVING bool_or(done)""").to_pylist()
    assert sorted(e["ret"] for e in ends) == sorted(float(r) for r in stats.return_queue)
    assert len(ends) == len(stats.return_queue) > 0
