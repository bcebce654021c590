"""Nested (Dict/Tuple) fields through every read path: ``read``, each sampler, ``iter_episodes``,
the DataLoader with workers, SQL (STRUCT columns) and the Parquet export, against the records written."""

from __future__ import annotations

import glob

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from replaystore.loaders import (
    EpochSampler,
    PrioritizedSampler,
    ReservoirSampler,
    SequenceSampler,
    UniformSampler,
    gather,
    iter_episodes,
    make_loader,
)
from replaystore.schemas import Dense, Schema, nested
from replaystore.store import open_store
from replaystore.tools.formats.parquet import export_parquet, import_parquet

N = 60
OBS = {"image": Dense("image", np.uint8, (8, 8, 3)), "vec": Dense("vec", np.float32, (3,)),
       "pair": (Dense("a", np.int64), Dense("b", np.float32, (2,)))}


def _obs(rng: np.random.Generator, n: int) -> dict:
    return {"image": rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
            "vec": rng.normal(size=(n, 3)).astype(np.float32),
            "pair": (rng.integers(0, 100, n), rng.normal(size=(n, 2)).astype(np.float32))}


@pytest.fixture(scope="module")
def nested_store(tmp_path_factory):
    """A store of 3 streams x 20 steps with nested obs/next_obs; and the flat truth, by row."""
    schema = Schema("nested", [nested("obs", OBS), Dense("action", np.int64), Dense("reward", np.float32),
                               nested("next_obs", OBS), Dense("terminated", np.bool_), Dense("truncated", np.bool_)])
    url = str(tmp_path_factory.mktemp("nested") / "s")
    st = open_store(url, schema)
    rng = np.random.default_rng(0)
    truth: dict[str, list] = {}
    with st.writer() as w:
        for stream in range(3):
            n = N // 3
            term = np.zeros(n, bool)
            term[[6, 13, n - 1]] = True
            batch = {"obs": _obs(rng, n), "action": np.arange(n) + 100 * stream,
                     "reward": rng.normal(size=n).astype(np.float32), "next_obs": _obs(rng, n),
                     "terminated": term, "truncated": np.zeros(n, bool)}
            w.append(batch, stream=stream)
            w.commit()
            for k, v in schema.nesting.unnest(batch).items():
                truth.setdefault(k, []).append(v)
    flat = {k: np.concatenate(v) for k, v in truth.items()}
    st.refresh()
    return st, flat


def _expect(flat: dict, rows: np.ndarray) -> dict:
    """The nested batch of ``rows`` (row ids are 0..N-1 here: one writer), built from the flat truth."""
    take = {k: v[rows] for k, v in flat.items()}
    return {"obs": {"image": take["obs__image"], "vec": take["obs__vec"],
                    "pair": (take["obs__pair__0"], take["obs__pair__1"])},
            "next_obs": {"image": take["next_obs__image"], "vec": take["next_obs__vec"],
                         "pair": (take["next_obs__pair__0"], take["next_obs__pair__1"])},
            "action": take["action"], "reward": take["reward"], "terminated": take["terminated"]}


def _assert_nested_equal(got, want, where=""):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            _assert_nested_equal(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_nested_equal(g, w, f"{where}[{i}]")
    else:
        g = got.numpy() if isinstance(got, torch.Tensor) else got
        np.testing.assert_array_equal(g, want, err_msg=where)


def test_read_returns_nested_dicts_and_selects_every_leaf(nested_store):
    st, flat = nested_store
    rows = np.array([5, 0, 59, 5, 31])
    got = st.default.read(rows)
    assert list(got) == ["obs", "action", "reward", "next_obs", "terminated", "truncated"]
    want = _expect(flat, rows)
    for k in want:
        _assert_nested_equal(got[k], want[k], k)
    only = st.default.read(rows, columns=["obs"])
    assert list(only) == ["obs"]
    _assert_nested_equal(only["obs"], want["obs"], "obs")
    view = st.default.view().read(rows, columns=["next_obs", "action"])
    _assert_nested_equal(view["next_obs"], want["next_obs"], "next_obs")
    leaf = st.default.read(rows, columns=["obs__vec"])  # a leaf by its column name stays flat
    np.testing.assert_array_equal(leaf["obs__vec"], flat["obs__vec"][rows])


@pytest.mark.parametrize("make", [
    lambda st: UniformSampler(st, 16, seed=1, num_batches=3),
    lambda st: PrioritizedSampler(st, 16, seed=2, num_batches=3),
    lambda st: EpochSampler(st, 16, seed=3, num_batches=3),
    lambda st: ReservoirSampler(st, 30, 16, seed=4, num_batches=3),
], ids=["uniform", "prioritized", "epoch", "reservoir"])
def test_every_sampler_returns_nested_batches(nested_store, make):
    st, flat = nested_store
    sampler = make(st)
    batches = 0
    for request in sampler:
        batch = gather(sampler.table, request)
        rows = batch["indices"].numpy()
        want = _expect(flat, rows)
        for k in want:
            _assert_nested_equal(batch[k], want[k], k)
        assert isinstance(batch["obs"]["pair"][0], torch.Tensor)
        batches += 1
    assert batches == 3


def test_sequence_sampler_returns_nested_windows(nested_store):
    st, flat = nested_store
    sampler = SequenceSampler(st, 4, batch_size=8, seed=5, num_batches=2)
    for request in sampler:
        batch = gather(sampler.table, request)
        rows = batch["indices"].numpy()
        assert rows.shape == (8, 4)
        real = rows >= 0
        got = batch["obs"]["image"].numpy()
        assert got.shape == (8, 4, 8, 8, 3)
        np.testing.assert_array_equal(got[real], flat["obs__image"][rows[real]])
        np.testing.assert_array_equal(batch["next_obs"]["pair"][1].numpy()[real], flat["next_obs__pair__1"][rows[real]])
        assert not got[~real].any()


def test_dataloader_with_two_workers_returns_nested_batches(nested_store):
    st, flat = nested_store
    sampler = UniformSampler(st, 8, seed=7, num_batches=6)
    seen = 0
    for batch in make_loader(st, sampler, num_workers=2):
        want = _expect(flat, batch["indices"].numpy())
        for k in want:
            _assert_nested_equal(batch[k], want[k], k)
        assert isinstance(batch["obs"]["image"], torch.Tensor)
        seen += 1
    assert seen == 6


def test_iter_episodes_nests_obs_and_final_obs(nested_store):
    st, flat = nested_store
    eps = list(iter_episodes(st.default))
    assert len(eps) == 9
    for ep in eps:
        rows = ep["rows"].numpy()
        want = _expect(flat, rows)
        _assert_nested_equal(ep["obs"], want["obs"], "obs")
        _assert_nested_equal(ep["next_obs"], want["next_obs"], "next_obs")
        last = rows[-1]
        np.testing.assert_array_equal(ep["final_obs"]["image"].numpy(), flat["next_obs__image"][last])
        assert int(ep["final_obs"]["pair"][0]) == flat["next_obs__pair__0"][last]


def test_sql_shows_a_nested_field_as_a_struct(nested_store):
    st, flat = nested_store
    got = st.sql("SELECT obs.vec AS vec, obs['pair']['0'] AS a, next_obs.image[2][3][1] AS px, action "
                 "FROM records WHERE obs.pair['0'] >= 50 ORDER BY action").to_pydict()
    order = np.argsort(flat["action"], kind="stable")
    keep = order[flat["obs__pair__0"][order] >= 50]
    assert got["a"] == flat["obs__pair__0"][keep].tolist()
    np.testing.assert_array_equal(np.array(got["vec"], np.float32), flat["obs__vec"][keep])
    assert got["px"] == flat["next_obs__image"][keep][:, 1, 2, 0].tolist()
    types = st.sql("SELECT obs FROM records LIMIT 1").schema.field("obs").type
    assert [types.field(i).name for i in range(types.num_fields)] == ["image", "vec", "pair"]


def test_parquet_export_writes_structs_and_imports_back(nested_store, tmp_path):
    st, flat = nested_store
    export_parquet(st, str(tmp_path / "pq"))
    files = sorted(glob.glob(str(tmp_path / "pq" / "**" / "*.parquet"), recursive=True))
    table = pq.read_table(files[0])
    assert "obs" in table.column_names and "obs__image" not in table.column_names
    assert table.column("obs").type.field("pair").type.field("1").name == "1"
    back = import_parquet(str(tmp_path / "pq"), str(tmp_path / "back"))
    assert back.schema == st.schema
    rows = np.arange(N)
    a, b = st.default.read(rows), back.default.read(rows)
    for k in a:
        _assert_nested_equal(b[k], a[k], k)
