"""``replaystore vacuum`` through the real console script, on a local store and on S3 (loopback moto)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from replaystore.schemas import dqn
from replaystore.store.format import layout
from replaystore.store.maintenance.compaction import COMPACT_FANIN
from support.batches import dqn_batch
from support.s3 import moto_s3
from support.storecheck import Backend, snapshot


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["replaystore", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(params=("local", "s3"))
def backend(request: pytest.FixtureRequest, tmp_path) -> Iterator[Backend]:
    if request.param == "local":
        yield Backend(str(tmp_path / "store"))
        return
    with moto_s3("replaystore-vacuum") as server:
        yield Backend(server.url("store"), server.storage_options)


def _garbage_store(b: Backend) -> set[str]:
    """A store whose only writer exited right after compacting, plus a crashed commit's fragment."""
    st = b.open_fragments(dqn(16, 2, actions=9))  # compaction rewrites fragments (a segment's merge moves nothing)
    rng = np.random.default_rng(1)
    with st.writer() as w:
        for i in range(COMPACT_FANIN):
            w.append(dqn_batch(rng, 4, extra=0), stream=i % 2)
            w.commit()
    storage = b.storage()
    src = layout.fragment_dir(0, "records", layout.fragment_name(0))
    orphan = layout.fragment_dir(0, "records", layout.fragment_name(50))
    for o in storage.walk(src):
        storage.write(orphan + o.path[len(src):], storage.read(o.path))
    removed = {layout.fragment_dir(0, t, n) for c in st.commits() if c["kind"] == "compact"
               for t, change in c["tables"].items() for n in change["remove"]}
    return removed | {orphan}


def test_vacuum_command(backend: Backend) -> None:
    garbage = _garbage_store(backend)
    opts = ["--storage-options", json.dumps(backend.storage_options)] if backend.storage_options else []
    objects = {o.path for o in backend.storage().walk("")}
    before = snapshot(backend.open(mode="r"))

    r = run("vacuum", backend.url, "--older-than", "0", "--dry-run", *opts)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[3] for line in r.stdout.splitlines() if line.startswith("would delete fragment ")}
    assert listed == garbage
    assert f"would delete {len(garbage)} unreferenced units" in r.stdout
    assert {o.path for o in backend.storage().walk("")} == objects  # nothing deleted

    r = run("vacuum", backend.url, *opts)  # the default threshold (an hour): all of it is too recent
    assert r.returncode == 0, r.stderr
    assert "deleted 0 unreferenced units" in r.stdout and f"kept {len(garbage)}" in r.stdout

    r = run("vacuum", backend.url, "--older-than", "0", *opts)
    assert r.returncode == 0, r.stderr
    assert {line.split()[2] for line in r.stdout.splitlines() if line.startswith("deleted fragment ")} == garbage
    gone = {o.path for o in backend.storage().walk("")}
    assert gone < objects and all(not p.startswith(tuple(f"{g}/" for g in garbage)) for p in gone)
    assert snapshot(backend.open(mode="r")) == before
    r = run("verify", backend.url, *opts)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stdout + r.stderr


def test_vacuum_command_mistakes_are_one_line(tmp_path) -> None:
    r = run("vacuum", str(tmp_path / "nothing"))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "no replaystore store" in r.stderr
    b = Backend(str(tmp_path / "store"))
    b.open(dqn(16, 2, actions=9), mode="w")
    r = run("vacuum", b.url, "--older-than", "-5")
    assert r.returncode == 2 and "older_than_s" in r.stderr and r.stderr.count("\n") == 1
