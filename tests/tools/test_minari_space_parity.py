"""Minari export matches Minari: for every gymnasium space the recorder supports, flat and nested, the same
episodes recorded with Minari's own DataCollector and with RecordEpisodes (then exported) give datasets with
the same spaces, the same Arrow column types / HDF5 dtypes and shapes, and equal episodes when
``minari.load_dataset`` reads them back. MINARI_DATASETS_PATH points at a temp dir."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import h5py
import minari
import numpy as np
import pyarrow as pa
import pytest
from gymnasium import spaces

from replaystore.gym import RecordEpisodes
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store

pytestmark = pytest.mark.usefixtures("minari_root")  # a Minari root per test (tests/support/minariroot.py)

BACKENDS = [("minari", "arrow"), ("minari-hdf5", "hdf5")]

BOX3 = spaces.Box(-1.0, 1.0, (3,), np.float32)
LEAVES: dict[str, spaces.Space] = {
    "box-f32": BOX3,
    "box-f64-scalar": spaces.Box(-2.0, 2.0, (), np.float64),
    "box-i16-2d": spaces.Box(-5, 5, (2, 3), np.int16),
    "box-u8-3d": spaces.Box(0, 255, (2, 2, 3), np.uint8),
    "discrete": spaces.Discrete(5),
    "discrete-start": spaces.Discrete(3, start=-1),
    "multidiscrete": spaces.MultiDiscrete([3, 4, 2]),
    "multidiscrete-2d": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "multibinary": spaces.MultiBinary(4),
    "multibinary-2d": spaces.MultiBinary([2, 2]),
}
NESTED: dict[str, spaces.Space] = {
    "dict": spaces.Dict({"pos": spaces.Discrete(4), "vec": BOX3}),
    "tuple": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
    "dict-deep": spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 3]))),
                              "b": spaces.Dict({"c": spaces.Box(0, 1, (2,), np.float64)})}),
    "tuple-deep": spaces.Tuple((spaces.Dict({"d": spaces.Discrete(6, start=2)}), BOX3)),
}
ACTIONS: dict[str, spaces.Space] = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
}
CASES = ([(f"obs-{k}", v, ACTIONS["discrete"]) for k, v in {**LEAVES, **NESTED}.items()]
         + [(f"act-{k}", BOX3, v) for k, v in ACTIONS.items() if k != "discrete"]
         + [("dict-obs-multidiscrete-act", NESTED["dict"], ACTIONS["multidiscrete"])])


class SpaceEnv(gym.Env):
    """Observations drawn from ``observation_space`` (seeded at reset), episodes of 2 to 4 steps."""

    metadata: dict = {}

    def __init__(self, observation_space, action_space):
        self.observation_space = observation_space
        self.action_space = action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        self.t, self.length = 0, int(self.np_random.integers(2, 5))
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(self.t) / 4, self.t >= self.length, False, {}


def _play(env: gym.Env, action_space: spaces.Space, episodes: int = 3) -> None:
    action_space.seed(5)
    for k in range(episodes):
        env.reset(seed=100 + k)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(action_space.sample())
            done = term or trunc


def _theirs(obs_space, act_space, backend: str) -> None:
    env = minari.DataCollector(SpaceEnv(obs_space, act_space), data_format=backend, jpeg_encoding=False)
    _play(env, act_space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari asks for author, permalink, ...
        env.create_dataset(dataset_id="ref/theirs-v0", algorithm_name="random", ref_min_score=0.0,
                           ref_max_score=1.0)
    env.close()


def _ours(obs_space, act_space, fmt: str, root: Path, tmp_path: Path) -> None:
    env = RecordEpisodes(SpaceEnv(obs_space, act_space), tmp_path / "rec")
    _play(env, act_space)
    env.close()
    export_store(open_store(str(tmp_path / "rec"), mode="r"), str(root), fmt, dataset_id="ref/ours-v0")


def _arrow_types(data: Path) -> dict[str, Any]:
    with pa.ipc.open_file(str(data / "0" / "part-0.arrow")) as f:
        schema = f.schema
    return {f.name: f.type for f in schema if f.name != "infos"}


def _hdf5_layout(data: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with h5py.File(data / "main_data.hdf5", "r") as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and "/infos" not in "/" + name:
                out[name] = (obj.dtype, obj.shape)
        f["episode_0"].visititems(visit)
    return out


def _tree_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            _tree_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _tree_equal(x, y, f"{where}[{i}]")
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
@pytest.mark.parametrize(("case", "obs_space", "act_space"), CASES, ids=[c[0] for c in CASES])
def test_export_has_the_layout_minari_writes(case, obs_space, act_space, fmt, backend, minari_root, tmp_path):
    _theirs(obs_space, act_space, backend)
    _ours(obs_space, act_space, fmt, minari_root, tmp_path)
    theirs_dir, ours_dir = minari_root / "ref/theirs-v0/data", minari_root / "ref/ours-v0/data"
    meta_t = json.loads((theirs_dir / "metadata.json").read_text())
    meta_o = json.loads((ours_dir / "metadata.json").read_text())
    assert meta_o["data_format"] == meta_t["data_format"] == backend
    for key in ("observation_space", "action_space"):
        assert json.loads(meta_o[key]) == json.loads(meta_t[key]), key
    if backend == "arrow":
        assert _arrow_types(ours_dir) == _arrow_types(theirs_dir)
    else:
        assert _hdf5_layout(ours_dir) == _hdf5_layout(theirs_dir)
    ref, mine = minari.load_dataset("ref/theirs-v0"), minari.load_dataset("ref/ours-v0")
    assert mine.observation_space == ref.observation_space == obs_space
    assert mine.action_space == ref.action_space == act_space
    a_eps, b_eps = list(ref.iterate_episodes()), list(mine.iterate_episodes())
    assert len(a_eps) == len(b_eps) == 3
    for i, (a, b) in enumerate(zip(a_eps, b_eps, strict=True)):
        _tree_equal(a.observations, b.observations, f"episode {i} observations")
        for name in ("actions", "rewards", "terminations", "truncations"):
            _tree_equal(getattr(a, name), getattr(b, name), f"episode {i} {name}")


@pytest.mark.parametrize(("fmt", "backend"), BACKENDS)
@pytest.mark.parametrize(("case", "obs_space", "act_space"), CASES, ids=[c[0] for c in CASES])
def test_a_data_collector_dataset_imports_and_exports_back_equal(case, obs_space, act_space, fmt, backend,
                                                                  minari_root, tmp_path):
    _theirs(obs_space, act_space, backend)
    st = import_store("ref/theirs-v0", str(tmp_path / "imported"), "minari")
    export_store(st, str(minari_root), fmt, dataset_id="ref/back-v0")
    ref, back = minari.load_dataset("ref/theirs-v0"), minari.load_dataset("ref/back-v0")
    assert back.observation_space == obs_space and back.action_space == act_space
    for i, (a, b) in enumerate(zip(ref.iterate_episodes(), back.iterate_episodes(), strict=True)):
        _tree_equal(a.observations, b.observations, f"episode {i} observations")
        for name in ("actions", "rewards", "terminations", "truncations"):
            _tree_equal(getattr(a, name), getattr(b, name), f"episode {i} {name}")
