"""Something other than a regular file in place of a data object (a FIFO, a directory, a symlink
to a FIFO): a fragment's chunk, a compressed field's shard, a segment's chunk. Every reader
(``Table.read``, ``scan``, a DataLoader worker, ``verify``, ``replaystore copy``, the chunk cache)
refuses it at once with a CorruptObjectError naming the object, and never waits on it: each case
runs under a thread or subprocess timeout, so a hang fails the test instead of hanging it
(docs/FORMAT.md, "What a reader must refuse")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError
from replaystore.schemas import Dense, Schema
from replaystore.store import ChunkCache, open_store
from replaystore.store.format import layout
from replaystore.store.format.zarrio import chunk_path
from replaystore.store.maintenance import verify_store
from replaystore.tools.cli import EXIT_CORRUPT, EXIT_DAMAGED
from support.bounded import bounded
from support.storecheck import Backend

RAW = Schema("records", [Dense("obs", np.float32, (4,)), Dense("reward", np.float32)])
ZIP = Schema("records", [Dense("obs", np.uint8, (6, 5), codec="zstd"), Dense("reward", np.float32)])
KINDS = ("fragment", "shard", "segment")
SPECIALS = ("fifo", "directory", "symlink-to-fifo")
TIMEOUT = 60.0


def _batch(rng: np.random.Generator, n: int, schema: Schema) -> dict[str, np.ndarray]:
    obs = schema.field("obs")
    return {"obs": rng.integers(0, 50, (n, *obs.shape)).astype(obs.dtype),
            "reward": rng.standard_normal(n).astype(np.float32)}


def _store(root: Path, kind: str) -> tuple[str, str]:
    """A closed local store of ``kind`` data (20 records, two commits) and the object path of its
    ``obs`` chunk (of the first fragment or segment)."""
    schema = ZIP if kind == "shard" else RAW
    backend = Backend(str(root))
    st = backend.open_fragments(schema) if kind == "fragment" else backend.open(schema, mode="w")
    rng = np.random.default_rng(7)
    with st.writer() as w:
        for _ in range(2):
            w.append(_batch(rng, 10, schema), stream=0)
            w.commit()
    # the data unit the live log names (close right-sizes a segment into a new one)
    unit = open_store(str(root), mode="r").table("records").reader.fragments[0].path
    assert unit.rsplit("/", 1)[-1].startswith("s" if kind == "segment" else "f"), unit
    return str(root), chunk_path(f"{unit}/obs", 1 + len(schema.field("obs").shape))


def _replace(root: str, path: str, special: str) -> None:
    full = Path(root, path)
    full.unlink()
    if special == "fifo":
        os.mkfifo(full)
    elif special == "directory":
        full.mkdir()
        (full / "x").write_bytes(b"not an object")
    else:  # a symbolic link (inside the store) to a FIFO inside the store
        os.mkfifo(Path(root, "fifo"))
        os.symlink(Path(root, "fifo"), full)


def _bounded(fn: Callable[[], Any], seconds: float = TIMEOUT) -> BaseException | None:
    return bounded(fn, seconds)


def _refused(err: BaseException | None, path: str) -> None:
    assert isinstance(err, CorruptObjectError), repr(err)
    assert err.path == path and "not a regular file" in str(err), err


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=TIMEOUT)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaystore.tools.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("special", SPECIALS)
def test_read_scan_and_verify_refuse_a_special_file_promptly(tmp_path: Path, kind: str, special: str) -> None:
    url, path = _store(tmp_path / "st", kind)
    _replace(url, path, special)
    st = open_store(url, mode="r")
    ids = st.row_ids()
    assert len(ids) == 20
    _refused(_bounded(lambda: st.read(ids)), path)
    _refused(_bounded(lambda: open_store(url, mode="r").default.read(ids[:3], columns=["obs"])), path)
    _refused(_bounded(lambda: list(open_store(url, mode="r").default.scan())), path)
    problems: list[Any] = []
    assert _bounded(lambda: problems.extend(verify_store(open_store(url, mode="r")))) is None
    assert any(p.path == path and "not a regular file" in p.problem for p in problems), problems


def test_a_dataloader_worker_refuses_a_fifo_in_a_process_of_its_own(tmp_path: Path, kind: str) -> None:
    url, path = _store(tmp_path / "st", kind)
    _replace(url, path, "fifo")
    code = """if True:
        import sys
        from replaystore.loaders import UniformSampler, make_loader
        from replaystore.store import open_store
        st = open_store(sys.argv[1], mode="r")
        loader = make_loader(st, UniformSampler(st, batch_size=8, seed=0), num_workers=1,
                             multiprocessing_context="fork", timeout=60)
        try:
            next(iter(loader))
        except Exception as exc:
            print("RAISED", type(exc).__name__, exc)
        else:
            print("READ")
        """
    result = _python(code, url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("RAISED") and path in out and "not a regular file (a FIFO)" in out, (out, result.stderr)


@pytest.mark.parametrize("special", ["fifo", "directory"])
def test_copy_refuses_a_special_file_with_one_line_and_the_corrupt_exit_code(tmp_path: Path, kind: str,
                                                                            special: str) -> None:
    url, path = _store(tmp_path / "st", kind)
    _replace(url, path, special)
    dst = tmp_path / "copy"
    started = time.monotonic()
    result = _cli("copy", url, str(dst))
    assert time.monotonic() - started < TIMEOUT
    assert result.returncode == EXIT_CORRUPT, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert path in result.stderr and ("not a regular file" in result.stderr or "missing" in result.stderr), \
        result.stderr
    assert not (dst / layout.MANIFEST).exists()  # no store was made there


def test_a_directory_in_place_of_a_shard_is_named_by_the_api_and_the_cli(tmp_path: Path) -> None:
    url, path = _store(tmp_path / "st", "shard")
    _replace(url, path, "directory")
    st = open_store(url, mode="r")
    with pytest.raises(CorruptObjectError, match="not a regular file \\(a directory\\)") as info:
        st.read(st.row_ids())
    assert info.value.path == path
    result = _cli("verify", url)
    assert result.returncode == EXIT_DAMAGED, result
    assert f"DAMAGED {path}: not a regular file (a directory)" in result.stdout, result.stdout
    assert "Is a directory" not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_the_verify_command_refuses_a_fifo_shard_in_a_process_of_its_own(tmp_path: Path) -> None:
    url, path = _store(tmp_path / "st", "shard")
    _replace(url, path, "fifo")
    result = _cli("verify", url)
    assert result.returncode == EXIT_DAMAGED and f"DAMAGED {path}: not a regular file (a FIFO)" in result.stdout, \
        result


def test_a_fifo_in_the_chunk_cache_is_refused_promptly(tmp_path: Path) -> None:
    url = f"memory://special-cache-{os.urandom(6).hex()}"
    st = open_store(url, ZIP, mode="w")
    rng = np.random.default_rng(1)
    with st.writer() as w:
        w.append(_batch(rng, 12, ZIP), stream=0)
        w.commit()
    want = st.read(st.row_ids())["obs"]
    cache = tmp_path / "cache"
    reader = open_store(url, mode="r", cache=ChunkCache(cache))
    assert np.array_equal(reader.read(reader.row_ids())["obs"], want)
    cached = [p for p in cache.rglob("*") if p.is_file() and "obs" in p.parts]
    assert len(cached) == 1
    cached[0].unlink()
    os.mkfifo(cached[0])
    fresh = open_store(url, mode="r", cache=ChunkCache(cache))
    err = _bounded(lambda: fresh.read(fresh.row_ids()))
    assert isinstance(err, CorruptObjectError) and "obs" in err.path and "not a regular file" in str(err), err
    os.unlink(cached[0])  # removed: fetched again
    assert np.array_equal(open_store(url, mode="r", cache=ChunkCache(cache)).read(reader.row_ids())["obs"], want)
    shutil.rmtree(cache)


@pytest.mark.parametrize("record", [layout.MANIFEST, layout.commit_record(0, 0)])
def test_a_directory_in_place_of_a_record_is_named_not_a_descriptor_number(tmp_path: Path, record: str) -> None:
    url, _ = _store(tmp_path / "st", "fragment")
    _replace(url, record, "directory")
    if record != layout.MANIFEST:  # (no manifest: no store to open)
        _refused(_bounded(lambda: open_store(url, mode="r")), record)
    result = _cli("verify", url)
    assert "Is a directory" not in result.stdout + result.stderr and "Traceback" not in result.stderr, result
    assert record in result.stdout + result.stderr, result
