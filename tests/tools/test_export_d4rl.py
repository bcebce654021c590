"""D4RL-style HDF5 export: D4RL's own qlearning_dataset derivation yields the store's transitions; import."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import dqn, episode, transitions
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store
from support.batches import dqn_batch

F32, I64 = np.float32, np.int64


def qlearning_dataset(dataset: dict[str, np.ndarray], use_next_observations: bool = False) -> dict[str, np.ndarray]:
    """D4RL's ``d4rl.qlearning_dataset`` (terminate_on_end=False), re-implemented.

    Rows are steps in order; the next observation is ``observations[i + 1]``, so the last row
    is never used and a timeout step (its successor is the next episode's first observation)
    is skipped. Many D4RL users read ``next_observations`` instead when the file has them
    (``use_next_observations``): then every row is a transition and nothing is skipped.
    """
    n = dataset["rewards"].shape[0]
    obs_, next_obs_, action_, reward_, done_ = [], [], [], [], []
    use_timeouts = "timeouts" in dataset
    for i in range(n if use_next_observations else n - 1):
        obs = dataset["observations"][i].astype(np.float32)
        new_obs = (dataset["next_observations"][i] if use_next_observations
                   else dataset["observations"][i + 1]).astype(np.float32)
        action = dataset["actions"][i].astype(np.float32)
        reward = dataset["rewards"][i].astype(np.float32)
        done_bool = bool(dataset["terminals"][i])
        final_timestep = dataset["timeouts"][i] if use_timeouts else False
        if final_timestep and not use_next_observations:
            continue  # skip this transition and don't apply terminals on the last step of an episode
        obs_.append(obs)
        next_obs_.append(new_obs)
        action_.append(action)
        reward_.append(reward)
        done_.append(done_bool)
    return {"observations": np.array(obs_), "actions": np.array(action_), "next_observations": np.array(next_obs_),
            "rewards": np.array(reward_), "terminals": np.array(done_)}


def load(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def chain(rng: np.random.Generator, n: int, obs_dim: int, end: str | None) -> dict[str, np.ndarray]:
    all_obs = rng.standard_normal((n + 1, obs_dim), dtype=F32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    if end:
        (term if end == "terminated" else trunc)[-1] = True
    return {"obs": all_obs[:-1], "action": rng.integers(0, 4, n).astype(I64),
            "reward": rng.standard_normal(n, dtype=F32), "next_obs": all_obs[1:], "terminated": term,
            "truncated": trunc}


@pytest.fixture
def episode_store(tmp_path: Path):
    """Terminated, truncated, reset-cut, gap-cut and unfinished episodes on three streams."""
    rng = np.random.default_rng(20)
    st = open_store(str(tmp_path / "episodes"), episode(3, actions=4), mode="w")
    with st.writer() as w:
        for s in ("b", 0, 5):
            for k, end in enumerate(("terminated", "truncated", "terminated")):
                w.append(chain(rng, 3 + k + (s == 5), 3, end), stream=s, reset=True)
        w.append(chain(rng, 4, 3, None), stream=0, reset=True)                    # cut by the next reset
        w.append(chain(rng, 2, 3, "terminated"), stream=0, reset=True)
        w.append(chain(rng, 3, 3, None), stream="b", reset=True)                  # cut by a step gap
        w.append(chain(rng, 3, 3, "truncated"), stream="b", step=np.arange(40, 43), reset=True)
        w.append(chain(rng, 5, 3, None), stream=5, reset=True)                    # unfinished
    return st


def store_rows(table) -> list[dict]:
    """The store's records in stream order, then step order: what the D4RL file holds row by row."""
    out = []
    for key in table.streams():
        rows, steps = table.rows(key)
        data = table.read(rows)
        for i in range(len(rows)):
            out.append({k: data[k][i] for k in data if len(data[k]) == len(rows)} | {"stream": key, "step": steps[i]})
    return out


def test_qlearning_dataset_yields_the_store_transitions(episode_store, tmp_path: Path) -> None:
    out = tmp_path / "ep.hdf5"
    summary = export_store(episode_store, str(out), "d4rl")
    assert summary["records"] == len(episode_store) and summary["episodes"] == 14
    data = load(out)
    recs = store_rows(episode_store.default)
    n = len(recs)
    for key in ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations"):
        assert len(data[key]) == n
    assert data["observations"].dtype == np.float32 and data["terminals"].dtype == np.bool_
    # timeouts: truncations and every episode end that is not terminal (cut by reset, gap or stream end)
    is_end = np.array([r["terminated"] or r["truncated"] for r in recs])
    nxt_start = np.r_[[(recs[i + 1]["stream"] != recs[i]["stream"]) or (recs[i + 1]["step"] != recs[i]["step"] + 1)
                       for i in range(n - 1)], True]
    resets = data["infos/reset"]
    nxt_start[:-1] |= resets[1:]
    np.testing.assert_array_equal(data["terminals"], [r["terminated"] for r in recs])
    np.testing.assert_array_equal(data["timeouts"], [r["truncated"] for r in recs] | (nxt_start & ~is_end))
    assert data["timeouts"].sum() > sum(r["truncated"] for r in recs)  # the cut episodes

    q = qlearning_dataset(data)  # D4RL exactly: observations[i + 1], timeout steps skipped
    kept = [r for i, r in enumerate(recs[:-1]) if not data["timeouts"][i]]
    assert len(q["rewards"]) == len(kept)
    np.testing.assert_array_equal(q["observations"], [r["obs"] for r in kept])
    np.testing.assert_array_equal(q["actions"], np.array([r["action"] for r in kept], F32))
    np.testing.assert_array_equal(q["rewards"], [r["reward"] for r in kept])
    np.testing.assert_array_equal(q["terminals"], [r["terminated"] for r in kept])
    live = ~q["terminals"]  # D4RL pairs a terminal step with the next episode's start: never bootstrapped
    np.testing.assert_array_equal(q["next_observations"][live], np.array([r["next_obs"] for r in kept])[live])

    q = qlearning_dataset(data, use_next_observations=True)
    assert len(q["rewards"]) == n
    np.testing.assert_array_equal(q["next_observations"], [r["next_obs"] for r in recs])
    np.testing.assert_array_equal(q["terminals"], [r["terminated"] for r in recs])


def test_dqn_mapping_and_infos(tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    st = open_store(str(tmp_path / "dqn"), dqn(5, 2, actions=6), mode="w")
    with st.writer() as w:
        for s in range(3):
            w.append(dqn_batch(rng, 30, observation_size=5, actions=6, extra=0), stream=s, reset=True)
    out = tmp_path / "dqn.hdf5"
    export_store(st, str(out), "d4rl")
    data = load(out)
    recs = store_rows(st.default)
    q = qlearning_dataset(data, use_next_observations=True)
    np.testing.assert_array_equal(q["observations"], [r["obs"] for r in recs])
    np.testing.assert_array_equal(q["next_observations"], [r["next_obs"] for r in recs])
    np.testing.assert_array_equal(q["actions"], np.array([r["actions"] for r in recs], F32))
    np.testing.assert_array_equal(q["rewards"], np.array([r["rewards"] for r in recs], F32))
    dones = np.array([r["dones"] for r in recs])
    boot = np.array([r["can_bootstrap"] for r in recs])
    np.testing.assert_array_equal(data["terminals"], dones & ~boot)
    last_of_stream = np.r_[[recs[i]["stream"] != recs[i + 1]["stream"] for i in range(len(recs) - 1)], True]
    np.testing.assert_array_equal(data["timeouts"], (dones & boot) | (last_of_stream & ~dones))
    assert data["actions"].dtype == np.int64 and data["rewards"].dtype == np.float64
    for key in ("players", "dones", "can_bootstrap", "discounts", "masks"):
        np.testing.assert_array_equal(data[f"infos/{key}"], [r[key] for r in recs])
    mask = data["infos/legal_mask"]
    assert mask.shape == (len(recs), 6) and mask.dtype == np.bool_
    row = 0
    for key in st.streams():
        raw = st.read(st.rows(key)[0])
        for i in range(len(raw["obs"])):
            ids = raw["legal_ids"][raw["legal_offsets"][i]:raw["legal_offsets"][i + 1]]
            assert set(np.flatnonzero(mask[row])) == set(ids.tolist())
            row += 1
    np.testing.assert_array_equal(data["infos/stream"], [r["stream"] for r in recs])
    np.testing.assert_array_equal(data["infos/step"], [r["step"] for r in recs])
    with h5py.File(out, "r") as f:
        assert json.loads(f.attrs["replaystore.mapping"])["terminals"] == "dones & ~can_bootstrap"


def test_import_restores_streams_from_our_export(episode_store, tmp_path: Path) -> None:
    export_store(episode_store, str(tmp_path / "ep.hdf5"), "d4rl")
    back = import_store(str(tmp_path / "ep.hdf5"), str(tmp_path / "back"), "d4rl")
    assert back.schema == episode(3, actions=4, metadata={"source": "d4rl"})
    src = episode_store.default
    assert sorted(map(repr, back.streams())) == sorted(map(repr, src.streams()))
    for key in src.streams():
        rows_a, steps_a = src.rows(key)
        rows_b, steps_b = back.rows(key)
        np.testing.assert_array_equal(steps_a, steps_b)
        np.testing.assert_array_equal(src.index_of(rows_a)[2], back.default.index_of(rows_b)[2])
        a, b = src.read(rows_a), back.read(rows_b)
        for name in ("obs", "action", "reward", "next_obs", "terminated"):
            assert a[name].tobytes() == b[name].tobytes(), name
        assert np.all(b["truncated"][a["truncated"]])  # plus the cut episode ends, as timeouts


def test_import_of_a_plain_d4rl_file(tmp_path: Path) -> None:
    """An old-style D4RL file: no next_observations, no infos, float terminals."""
    rng = np.random.default_rng(22)
    n = 12
    obs = rng.standard_normal((n, 2)).astype(F32)
    terminals = np.zeros(n, F32)
    timeouts = np.zeros(n, bool)
    terminals[3] = 1.0   # episode 0: rows 0..3, terminal
    timeouts[7] = True   # episode 1: rows 4..7, time limit: row 7 has no successor in the file
    terminals[11] = 1.0  # episode 2: rows 8..11, terminal
    path = tmp_path / "old.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = obs
        f["actions"] = rng.uniform(-1, 1, (n, 3)).astype(F32)
        f["rewards"] = rng.standard_normal(n).astype(F32)
        f["terminals"] = terminals
        f["timeouts"] = timeouts
    with pytest.warns(UserWarning, match="1 timeout step"):
        st = import_store(str(path), str(tmp_path / "old"), "d4rl")
    assert st.schema.name == "episode" and st.schema.field("action").shape == (3,)
    assert st.streams() == [0]
    rows, steps = st.rows(0)
    np.testing.assert_array_equal(steps, [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11])
    data = st.read(rows)
    keep = np.arange(n) != 7
    np.testing.assert_array_equal(data["obs"], obs[keep])
    np.testing.assert_array_equal(data["terminated"], terminals[keep].astype(bool))
    # inside episodes the next row's observation; at a terminal the step's own (never bootstrapped)
    np.testing.assert_array_equal(data["next_obs"][[0, 1, 2, 4, 5, 6, 7, 8, 9]], obs[[1, 2, 3, 5, 6, 7, 9, 10, 11]])
    np.testing.assert_array_equal(data["next_obs"][[3, 10]], obs[[3, 11]])
    np.testing.assert_array_equal(st.default.index_of(rows)[2], np.isin(steps, [0, 4, 8]))

    path2 = tmp_path / "no-timeouts.hdf5"
    with h5py.File(path2, "w") as f:
        for key in ("observations", "actions", "rewards", "terminals"):
            f[key] = load(path)[key]
        f["next_observations"] = obs[::-1]
    st2 = import_store(str(path2), str(tmp_path / "t"), "d4rl")
    assert st2.schema == transitions(2, (3,), np.float32, metadata={"source": "d4rl"})
    np.testing.assert_array_equal(st2.read(st2.rows(0)[0])["next_obs"], obs[::-1])


def test_d4rl_errors(tmp_path: Path, episode_store) -> None:
    export_store(episode_store, str(tmp_path / "x.hdf5"), "d4rl")
    with pytest.raises(StoreError, match="already exists"):
        export_store(episode_store, str(tmp_path / "x.hdf5"), "d4rl")
    with pytest.raises(StoreError, match="no such file"):
        import_store(str(tmp_path / "missing.hdf5"), str(tmp_path / "s"), "d4rl")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(StoreError, match="expected an HDF5 file"):
        import_store(str(tmp_path / "text.hdf5"), str(tmp_path / "s"), "d4rl")
    with h5py.File(tmp_path / "partial.hdf5", "w") as f:
        f["observations"] = np.zeros((2, 2), F32)
    with pytest.raises(StoreError, match="'actions': expected a dataset, found none"):
        import_store(str(tmp_path / "partial.hdf5"), str(tmp_path / "s"), "d4rl")
    assert not (tmp_path / "s").exists()
