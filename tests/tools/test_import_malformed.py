"""Imports never reinterpret: malformed Parquet, D4RL (HDF5) and Minari sources give typed errors naming the
column, the source is checked before the destination is created, and a failed import leaves no store behind
(a new destination does not exist afterwards; an existing one is unchanged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replaystore.errors import (
    DTypeError,
    ImportSourceError,
    ReplayStoreError,
    StoreError,
    StoreExistsError,
)
from replaystore.schemas import episode
from replaystore.store import open_store
from replaystore.tools.cli import EXIT_USAGE
from replaystore.tools.export import export_store
from replaystore.tools.importer import import_store

F32 = np.float32


def _episodes_store(path: Path, streams: int = 2, steps: int = 6):
    rng = np.random.default_rng(0)
    st = open_store(str(path), episode(4, actions=3), mode="w")
    with st.writer() as w:
        for s in range(streams):
            term = np.zeros(steps, bool)
            term[-1] = True
            obs = rng.standard_normal((steps + 1, 4)).astype(F32)
            w.append({"obs": obs[:-1], "action": rng.integers(0, 3, steps), "reward": rng.random(steps, F32),
                      "next_obs": obs[1:], "terminated": term, "truncated": np.zeros(steps, bool)},
                     stream=s, reset=np.arange(steps) == 0)
    return st


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    base = tmp_path_factory.mktemp("import-src")
    st = _episodes_store(base / "store")
    return st


def _refused(src: str, fmt: str, dst: Path, error: type[BaseException] = ImportSourceError, match: str | None = None,
             **kwargs) -> BaseException:
    with pytest.raises(error, match=match) as info:
        import_store(src, str(dst), fmt, **kwargs)
    assert isinstance(info.value, ReplayStoreError)
    assert not dst.exists(), "a failed import left something at the destination"
    return info.value


# -- Parquet ---------------------------------------------------------------------------------------


@pytest.fixture
def parquet_src(source, tmp_path):
    out = tmp_path / "pq"
    export_store(source, str(out), "parquet")
    return out


def _rewrite(path: Path, change) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def _replace(name: str, array_of):
    def change(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index(name)
        return table.set_column(i, name, array_of(table))
    return change


PARQUET_DAMAGE = {
    "string-reward": (_replace("reward", lambda t: pa.array([str(v) for v in t["reward"].to_pylist()])), "reward",
                      "string"),
    "list-reward": (_replace("reward", lambda t: pa.array([[v] for v in t["reward"].to_pylist()])), "reward", "list"),
    "struct-reward": (_replace("reward", lambda t: pa.array([{"r": v} for v in t["reward"].to_pylist()])), "reward",
                      "struct"),
    "double-reward": (_replace("reward", lambda t: t["reward"].cast(pa.float64())), "reward", "double"),
    "variable-list-obs": (_replace("obs", lambda t: pa.array(t["obs"].to_pylist(), pa.list_(pa.float32()))), "obs",
                          "list<"),
    "narrow-obs": (_replace("obs", lambda t: pa.array([v[:3] for v in t["obs"].to_pylist()],
                                                      pa.list_(pa.float32(), 3))), "obs", "[3]"),
    "int-obs": (_replace("obs", lambda t: pa.array([[int(x) for x in v] for v in t["obs"].to_pylist()],
                                                   pa.list_(pa.int32(), 4))), "obs", "int32"),
    "missing-reward": (lambda t: t.drop_columns(["reward"]), "reward", "none"),
    "string-step": (_replace("step", lambda t: pa.array([str(v) for v in t["step"].to_pylist()])), "step", "string"),
}


@pytest.mark.parametrize("damage", list(PARQUET_DAMAGE))
def test_parquet_column_of_another_type_is_refused(parquet_src, tmp_path, damage):
    change, column, found = PARQUET_DAMAGE[damage]
    files = sorted(parquet_src.glob("stream=*/*.parquet"))
    _rewrite(files[-1], change)  # the last stream's file: the check runs before anything is created
    err = _refused(str(parquet_src), "parquet", tmp_path / "dst")
    assert err.column == column and found in str(err.found), err
    assert column in str(err) and str(files[-1]) in str(err)


def test_parquet_string_reward_is_not_reinterpreted_as_floats(parquet_src, tmp_path):
    """The reported case: a string reward column imported as float32 0, 1e-45, 3e-45, ..."""
    for f in parquet_src.glob("stream=*/*.parquet"):
        _rewrite(f, PARQUET_DAMAGE["string-reward"][0])
    _refused(str(parquet_src), "parquet", tmp_path / "dst", match="'reward': expected float")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_parquet_unreadable_file_is_refused(parquet_src, tmp_path, damage):
    f = sorted(parquet_src.glob("stream=*/*.parquet"))[-1]
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(500), "empty": b""}[damage])
    err = _refused(str(parquet_src), "parquet", tmp_path / "dst")
    assert str(f) in str(err)


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "not a replaystore Parquet export manifest"),
    (None, "schema document"),
    ("path", "path"),
])
def test_parquet_malformed_manifest_is_refused(parquet_src, tmp_path, text, match):
    manifest = parquet_src / "_replaystore.json"
    if text is None:  # a schema document without its fields
        doc = json.loads(manifest.read_text())
        del doc["tables"]["records"]["schema"]["fields"]
        text = json.dumps(doc)
    elif text == "path":  # a table path that leaves the export
        doc = json.loads(manifest.read_text())
        doc["tables"]["records"]["path"] = "../elsewhere"
        text = json.dumps(doc)
    manifest.write_text(text)
    _refused(str(parquet_src), "parquet", tmp_path / "dst", ReplayStoreError, match=match)


def test_parquet_without_manifest_checks_every_file_against_the_first(parquet_src, tmp_path):
    (parquet_src / "_replaystore.json").unlink()
    files = sorted(parquet_src.glob("stream=*/*.parquet"))
    _rewrite(files[-1], PARQUET_DAMAGE["narrow-obs"][0])
    err = _refused(str(parquet_src), "parquet", tmp_path / "dst")
    assert err.column == "obs"


def test_a_failed_import_leaves_an_existing_destination_as_it_was(parquet_src, source, tmp_path):
    _rewrite(sorted(parquet_src.glob("stream=*/*.parquet"))[-1], PARQUET_DAMAGE["string-reward"][0])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ImportSourceError):
        import_store(str(parquet_src), str(empty), "parquet")
    assert empty.is_dir() and not list(empty.iterdir())
    existing = tmp_path / "existing"
    st = _episodes_store(existing, streams=1)
    before = {p: p.read_bytes() for p in existing.rglob("*") if p.is_file()}
    st.close()
    with pytest.raises(StoreExistsError):
        import_store(str(parquet_src), str(existing), "parquet")
    assert {p: p.read_bytes() for p in existing.rglob("*") if p.is_file()} == before
    assert len(open_store(str(existing), mode="r")) == 6


def test_a_good_export_still_imports(parquet_src, source, tmp_path):
    back = import_store(str(parquet_src), str(tmp_path / "dst"), "parquet")
    assert len(back) == len(source)


# -- D4RL (HDF5) -------------------------------------------------------------------------------------


def _d4rl(path: Path, n: int = 8, **override) -> Path:
    data = {"observations": np.zeros((n, 3), F32), "actions": np.zeros((n, 2), F32),
            "rewards": np.ones(n, F32), "terminals": np.zeros(n, bool), "timeouts": np.r_[np.zeros(n - 1), 1] > 0,
            "next_observations": np.zeros((n, 3), F32)}
    data.update(override)
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            if v is not None:
                f[k] = v
    return path


D4RL_DAMAGE = {
    "missing-rewards": ({"rewards": None}, "rewards", "none"),
    "2d-rewards": ({"rewards": np.ones((8, 2), F32)}, "rewards", "shape"),
    "short-actions": ({"actions": np.zeros((7, 2), F32)}, "actions", "(7, 2)"),
    "short-timeouts": ({"timeouts": np.zeros(5, bool)}, "timeouts", "(5,)"),
    "2d-terminals": ({"terminals": np.zeros((8, 1), bool)}, "terminals", "(8, 1)"),
    "next-obs-shape": ({"next_observations": np.zeros((8, 4), F32)}, "next_observations", "(8, 4)"),
    "next-obs-dtype": ({"next_observations": np.zeros((8, 3), np.float64)}, "next_observations", "float64"),
    "complex-obs": ({"observations": np.zeros((8, 3), np.complex64),
                     "next_observations": np.zeros((8, 3), np.complex64)}, "observations", "complex64"),
    "string-rewards": ({"rewards": np.array([b"1.0"] * 8)}, "rewards", "S3"),
    "terminal-two": ({"terminals": np.r_[np.zeros(7), 2].astype(np.int8)}, "terminals", "2"),
}


@pytest.mark.parametrize("damage", list(D4RL_DAMAGE))
def test_d4rl_malformed_dataset_is_refused(tmp_path, damage):
    override, column, found = D4RL_DAMAGE[damage]
    src = _d4rl(tmp_path / "src.hdf5", **override)
    err = _refused(str(src), "d4rl", tmp_path / "dst")
    assert err.column == column and found in str(err.found), err


@pytest.mark.parametrize("chunked", [True, False])
def test_d4rl_huge_declared_shape_is_refused_without_allocating(tmp_path, chunked):
    n = 1 << 40  # a terabyte of rows, declared and never written
    with h5py.File(tmp_path / "huge.hdf5", "w") as f:
        for key, shape, dtype in (("observations", (n, 64), F32), ("actions", (n,), np.int64),
                                  ("rewards", (n,), F32), ("terminals", (n,), bool)):
            f.create_dataset(key, shape=shape, dtype=dtype, chunks=(1024, *shape[1:]) if chunked else None)
    assert (tmp_path / "huge.hdf5").stat().st_size < 1 << 20
    # in a subprocess with a timeout: an importer that trusted the declared size would read zeros for ever
    _cli_refuses(str(tmp_path / "huge.hdf5"), "d4rl", tmp_path / "dst", "'observations': expected data for")


def test_d4rl_truncated_file_and_bad_stream_index_are_refused(tmp_path, source):
    export_store(source, str(tmp_path / "good.hdf5"), "d4rl")
    data = (tmp_path / "good.hdf5").read_bytes()
    (tmp_path / "cut.hdf5").write_bytes(data[: len(data) // 2])
    _refused(str(tmp_path / "cut.hdf5"), "d4rl", tmp_path / "dst", StoreError)
    with h5py.File(tmp_path / "good.hdf5", "a") as f:
        f.attrs["replaystore.int_streams"] = "{garbage"
    err = _refused(str(tmp_path / "good.hdf5"), "d4rl", tmp_path / "dst")
    assert err.column == "replaystore.int_streams"
    with h5py.File(tmp_path / "good.hdf5", "a") as f:
        f.attrs["replaystore.int_streams"] = "[]"
        del f["infos/stream"]
        f["infos/stream"] = np.array([b"x"] * len(f["rewards"]), dtype=h5py.string_dtype())
    err = _refused(str(tmp_path / "good.hdf5"), "d4rl", tmp_path / "dst")
    assert err.column == "infos/stream"


# -- Minari --------------------------------------------------------------------------------------------


@pytest.fixture(params=["arrow", "hdf5"])
def minari_src(request, source, tmp_path):
    fmt = "minari" if request.param == "arrow" else "minari-hdf5"
    export_store(source, str(tmp_path / "datasets"), fmt, dataset_id="toy/src-v0")
    return request.param, tmp_path / "datasets" / "toy" / "src-v0" / "data"


def _meta(data: Path, change) -> None:
    doc = json.loads((data / "metadata.json").read_text())
    change(doc)
    (data / "metadata.json").write_text(json.dumps(doc))


def test_minari_good_dataset_imports(minari_src, source, tmp_path):
    _, data = minari_src
    assert len(import_store(str(data), str(tmp_path / "dst"), "minari")) == len(source)


@pytest.mark.parametrize("damage", ["garbage-json", "json-list", "huge-total", "string-total", "no-spaces",
                                    "complex-space", "bad-box"])
def test_minari_malformed_metadata_is_refused(minari_src, tmp_path, damage):
    _, data = minari_src
    meta = data / "metadata.json"
    if damage == "garbage-json":
        meta.write_text('{"dataset_id": ')
    elif damage == "json-list":
        meta.write_text("[]")
    elif damage == "huge-total":
        _meta(data, lambda d: d.update(total_episodes=10**12))
    elif damage == "string-total":
        _meta(data, lambda d: d.update(total_episodes="2"))
    elif damage == "no-spaces":
        _meta(data, lambda d: d.pop("observation_space"))
    elif damage == "complex-space":
        _meta(data, lambda d: d.update(observation_space=json.dumps(
            {"type": "Box", "dtype": "complex64", "shape": [4], "low": [0] * 4, "high": [1] * 4})))
    else:
        _meta(data, lambda d: d.update(observation_space=json.dumps({"type": "Box", "dtype": "float32"})))
    _refused(str(data), "minari", tmp_path / "dst", StoreError)


def test_minari_truncated_or_missing_data_is_refused(minari_src, tmp_path):
    backend, data = minari_src
    if backend == "hdf5":
        main = data / "main_data.hdf5"
        raw = main.read_bytes()
        main.write_bytes(raw[: len(raw) // 2])
    else:
        part = data / "1" / "part-0.arrow"
        raw = part.read_bytes()
        part.write_bytes(raw[: len(raw) // 2])
    err = _refused(str(data), "minari", tmp_path / "dst")
    assert "main_data.hdf5" in str(err) or str(data / "1") in str(err)


def test_minari_missing_column_in_a_later_episode_is_refused_before_creating(minari_src, tmp_path):
    backend, data = minari_src
    if backend == "hdf5":
        with h5py.File(data / "main_data.hdf5", "a") as f:
            del f["episode_1/actions"]
    else:
        part = data / "1" / "part-0.arrow"
        with pa.ipc.open_file(str(part)) as r:
            table = r.read_all().drop_columns(["rewards"])
        with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    err = _refused(str(data), "minari", tmp_path / "dst")
    assert err.column == ("actions" if backend == "hdf5" else "rewards")


def test_minari_episode_metadata_garbage_is_refused(source, tmp_path):
    export_store(source, str(tmp_path / "datasets"), "minari", dataset_id="toy/src-v0")  # (HDF5: attributes)
    data = tmp_path / "datasets" / "toy" / "src-v0" / "data"
    (data / "0" / "metadata.json").write_text("{")
    err = _refused(str(data), "minari", tmp_path / "dst")
    assert "metadata.json" in str(err)


def test_minari_wrong_typed_observations_are_refused(minari_src, tmp_path):
    backend, data = minari_src
    if backend == "hdf5":
        with h5py.File(data / "main_data.hdf5", "a") as f:
            obs = f["episode_0/observations"][()]
            del f["episode_0/observations"]
            f["episode_0/observations"] = obs.astype(np.complex64)  # complex: never cast to real
        err = _refused(str(data), "minari", tmp_path / "dst", DTypeError)
        assert err.field == "obs"
    else:
        part = data / "0" / "part-0.arrow"
        with pa.ipc.open_file(str(part)) as r:
            table = r.read_all()
        strings = pa.array([str(v) for v in table["observations"].to_pylist()])
        table = table.set_column(table.schema.get_field_index("observations"), "observations", strings)
        with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        err = _refused(str(data), "minari", tmp_path / "dst")
        assert err.column == "observations" and err.found == "string"


def test_minari_huge_declared_hdf5_dataset_is_refused(tmp_path, source):
    export_store(source, str(tmp_path / "datasets"), "minari-hdf5", dataset_id="toy/src-v0")
    data = tmp_path / "datasets" / "toy" / "src-v0" / "data"
    with h5py.File(data / "main_data.hdf5", "a") as f:
        del f["episode_1/observations"]
        f.create_dataset("episode_1/observations", shape=(1 << 40, 4), dtype=F32, chunks=(1024, 4))
    _cli_refuses(str(data), "minari", tmp_path / "dst", "'observations': expected data for")


# -- the command line -------------------------------------------------------------------------------


def _cli_refuses(src: str, fmt: str, dst: Path, needle: str) -> None:
    """``replaystore import`` of ``src`` exits 2 with one error line holding ``needle``, within two minutes."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "import", src, str(dst), "--from", fmt],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == EXIT_USAGE == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("replaystore import: error:") and needle in r.stderr, r.stderr
    assert not dst.exists()


def test_cli_import_of_a_malformed_source_is_one_line_and_exit_2(parquet_src, tmp_path):
    for f in parquet_src.glob("stream=*/*.parquet"):
        _rewrite(f, PARQUET_DAMAGE["string-reward"][0])
    _cli_refuses(str(parquet_src), "parquet", tmp_path / "dst", "'reward': expected float")
    _d4rl(tmp_path / "complex.hdf5", observations=np.zeros((8, 3), np.complex64),
          next_observations=np.zeros((8, 3), np.complex64))
    _cli_refuses(str(tmp_path / "complex.hdf5"), "d4rl", tmp_path / "dst", "'observations': expected")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_failure_after_the_store_is_created_removes_it(tmp_path, source, where):
    """Steps that go backwards inside a stream are found while appending: the half-made store goes."""
    from replaystore.store.storage import open_storage
    from replaystore.tools.formats.d4rl import import_d4rl

    export_store(source, str(tmp_path / "good.hdf5"), "d4rl")
    with h5py.File(tmp_path / "good.hdf5", "a") as f:
        steps = f["infos/step"][()]
        steps[-1] = 0  # the last record of the last stream repeats its first step
        f["infos/step"][...] = steps
    dst = str(tmp_path / "dst") if where == "local" else f"memory://{tmp_path.name}-dst"
    with pytest.raises(ReplayStoreError):
        import_d4rl(str(tmp_path / "good.hdf5"), dst, batch_rows=4)  # (several appends before the bad one)
    if where == "local":
        assert not (tmp_path / "dst").exists()
    else:
        assert open_storage(dst).list("") == []
