"""``open_store(mode="w+")`` replaces a store and nothing else: a location that is not a store is
refused with nothing deleted, symbolic links are never followed out of a store, and of several
openers replacing one store at once, the store that is left is whole (its manifest's schema is
its data's) and every opener that lost got a typed error."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import NotAStoreError, SchemaMismatchError, StoreReplacedError
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.maintenance.verify import verify
from replaystore.store.storage import open_storage
from support.procs import Child, crash_batch, racer_batch, racer_schema, same_records, schema, take_rows
from support.s3 import S3Server
from support.s3proxy import conflicting_s3, options_via
from support.storecheck import Backend

TIMEOUT_S = 120.0


def _commit(st: Any, tag: str = "a") -> None:
    w = st.writer()
    w.append(crash_batch(1, tag, 0, 4), stream=tag)
    w.commit()
    w.close()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_w_plus_refuses_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / ".bashrc").write_text("export X=1\n")
    (home / "projects" / "notes.txt").write_text("keep me")
    before = _tree(home)
    with pytest.raises(NotAStoreError, match="nothing was deleted"):
        open_store(str(home), schema(), mode="w+")
    assert _tree(home) == before
    (home / layout.MANIFEST).write_text('{"not": "ours"}')  # a file of that name that is not a manifest
    with pytest.raises(NotAStoreError):
        open_store(str(home), schema(), mode="w+")
    assert (home / "projects" / "notes.txt").read_text() == "keep me"


def test_w_plus_refuses_objects_that_are_not_a_store(backend: Backend) -> None:
    storage = open_storage(backend.url, backend.storage_options)
    storage.write("data/part-0.parquet", b"someone else's")
    with pytest.raises(NotAStoreError):
        open_store(backend.url, schema(), mode="w+", storage_options=backend.storage_options)
    assert storage.read("data/part-0.parquet") == b"someone else's"


def test_w_plus_replaces_a_store_and_a_stale_handle_cannot_write(backend: Backend) -> None:
    url, opts = backend
    old = open_store(url, schema(), mode="w", storage_options=opts)
    _commit(old)
    other = racer_schema(3)
    new = open_store(url, other, mode="w+", storage_options=opts)
    assert new.schema == other and len(new) == 0 and new.writers == []
    with pytest.raises(StoreReplacedError):
        old.writer()  # its store is gone: writing now would mix two schemas
    again = open_store(url, schema(), mode="w+", storage_options=opts)  # a replaced store is replaced again
    _commit(again)
    assert verify(open_store(url, mode="r", storage_options=opts)) == []


def test_w_plus_through_a_symlink_replaces_the_target_store_in_place(tmp_path: Path) -> None:
    target = tmp_path / "real"
    link = tmp_path / "link"
    _commit(open_store(str(target), schema(), mode="w"))
    link.symlink_to(target, target_is_directory=True)
    st = open_store(str(link), racer_schema(2), mode="w+")
    assert link.is_symlink() and target.is_dir()  # both stay: the store inside is replaced
    assert open_store(str(target), mode="r").schema == racer_schema(2)
    assert len(st) == 0 and not (target / layout.WRITERS).exists()


def test_w_plus_never_follows_a_symlink_out_of_the_store(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    store = tmp_path / "st"
    _commit(open_store(str(store), schema(), mode="w"))
    (store / "escape").symlink_to(outside, target_is_directory=True)
    (store / layout.WRITERS / "000000" / "data" / "escape").symlink_to(outside, target_is_directory=True)
    open_store(str(store), schema(), mode="w+")
    assert (outside / "precious.txt").read_text() == "keep"
    assert not (store / "escape").exists() and not os.path.lexists(store / "escape")
    # a link to a directory that is not a store: refused, the target untouched
    link = tmp_path / "link-out"
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(NotAStoreError):
        open_store(str(link), schema(), mode="w+")
    assert (outside / "precious.txt").read_text() == "keep" and link.is_symlink()


RACERS = 4
SEED = 9


def _race_replace(url: str, options: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Start RACERS replace-racers on ``url``, release them at once; per racer (open, write) reports."""
    children = [Child("replace-racer", stdin=True, url=url, storage_options=options, seed=SEED, i=i)
                for i in range(RACERS)]
    try:
        for c in children:
            assert c.readline(TIMEOUT_S) == "ready", c.stderr()
        assert all(c.proc.stdin is not None for c in children)
        for c in children:
            c.proc.stdin.write(b"go\n")  # type: ignore[union-attr]
            c.proc.stdin.flush()  # type: ignore[union-attr]
        opened = [json.loads(c.readline(TIMEOUT_S) or "null") for c in children]
        for c in children:
            c.close_stdin()  # every open has returned: now the ones that opened write
        wrote = [json.loads(c.finish(TIMEOUT_S)[-1]) for c in children]
        return [{**o, "wrote": w["wrote"], "write_error": w["error"]} for o, w in zip(opened, wrote, strict=True)]
    finally:
        for c in children:
            c.close()


def _check_whole(url: str, options: dict[str, Any] | None, results: list[dict[str, Any]]) -> None:
    typed = {None, StoreReplacedError.__name__, SchemaMismatchError.__name__}
    assert {r["error"] for r in results} <= typed, results
    assert {r["write_error"] for r in results} <= {None, StoreReplacedError.__name__}, results
    writers = [r["i"] for r in results if r["wrote"]]
    assert len(writers) == 1, results  # different schemas: only the store left can be written
    k = writers[0]
    st = open_store(url, mode="r", storage_options=options)
    assert st.schema == racer_schema(k)  # the manifest's schema is the data's
    assert verify(st) == []
    rows, _ = st.rows(f"r{k}")
    assert st.streams() == [f"r{k}"]
    want = racer_batch(SEED, k)
    assert same_records(st.read(rows), take_rows(st.schema, want, np.arange(len(want["obs"])))) == []


def test_racing_w_plus_openers_leave_one_whole_store_local(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _commit(open_store(url, schema(), mode="w"))
    _check_whole(url, None, _race_replace(url, None))


def test_racing_w_plus_openers_leave_one_whole_store_s3(s3_server: S3Server) -> None:
    url = s3_server.url(f"wplus-{uuid.uuid4().hex}")
    _commit(open_store(url, schema(), mode="w", storage_options=s3_server.storage_options))
    # moto's conditional PUT is not atomic under races: the proxy answers 409 as S3 does (test_s3_conflicts.py)
    with conflicting_s3(s3_server.endpoint_url, hold_s=0.05) as (endpoint, _):
        options = options_via(s3_server.storage_options, endpoint)
        results = _race_replace(url, options)
    _check_whole(url, s3_server.storage_options, results)
