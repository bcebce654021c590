"""Names read from a store are data, never paths: a store whose records or directories name
places outside its root (``..``, absolute paths, separators, symbolic links) gives typed
errors, ``verify`` reports it, and nothing outside the root is read, written or deleted."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import InvalidNameError, ReplayStoreError, UnsafeNameError
from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.storage import LocalStorage
from replaystore.tools.info import run_verify
from support.batches import dqn_batch

SCHEMA = dqn(16, 2, actions=9)
ESCAPE = "../../../../../victim"  # from writers/<W>/data/<table>/<name> up to the store's parent


def snapshot(top: Path) -> dict[str, str]:
    """Every file under ``top`` with a hash of its bytes (and every directory)."""
    out = {}
    for directory, dirs, files in os.walk(top):
        for d in dirs:
            out[os.path.relpath(os.path.join(directory, d), top)] = "dir"
        for f in files:
            p = os.path.join(directory, f)
            out[os.path.relpath(p, top)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A capped store with two commits and a saved state slot, beside a victim directory."""
    victim = tmp_path / "victim"
    (victim / "records" / "s0000000000").mkdir(parents=True)
    (victim / "precious.txt").write_text("do not touch")
    np.save(victim / "x.npy", np.full(3, 666))
    root = tmp_path / "store"
    st = open_store(str(root), SCHEMA, capacity=300)
    with st.writer() as w:
        for i in range(2):
            w.append(dqn_batch(np.random.default_rng(i), 100, extra=0), stream=i)
            w.commit()
    st.save_state("slot", {"a": 1}, {"x": np.arange(3)})
    return root, victim, snapshot(victim)


def edit_record(root: Path, path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite record ``path`` with ``edit`` applied to its body: checksum-valid, as a forger would."""
    body = records.decode(path, (root / path).read_bytes())
    edit(body)
    (root / path).write_bytes(records.encode(body))


def first_add(body: dict[str, Any]) -> dict[str, Any]:
    return body["tables"]["records"]["add"][0]


FORGERIES: dict[str, Callable[[Path], None]] = {
    "fragment name": lambda root: edit_record(root, layout.commit_record(0, 0),
                                              lambda b: first_add(b).__setitem__("name", ESCAPE)),
    "segment name": lambda root: edit_record(root, layout.commit_record(0, 0),
                                             lambda b: first_add(b)["segment"].__setitem__("name", ESCAPE)),
    "absolute segment name": lambda root: edit_record(
        root, layout.commit_record(0, 0),
        lambda b: first_add(b)["segment"].__setitem__("name", str(root.parent / "victim"))),
    "removed name": lambda root: edit_record(root, layout.commit_record(0, 1),
                                             lambda b: b["tables"]["records"].__setitem__("remove", [ESCAPE])),
    "table name": lambda root: edit_record(
        root, layout.MANIFEST, lambda b: b.__setitem__("tables", {"../../victim": b["tables"]["records"]})),
}


def exercise(root: Path) -> list[BaseException]:
    """Everything an honest user does with a store: open and read it, append to it (a capped
    store: eviction and reclaim run), vacuum it, load its state; the typed errors met."""
    errors: list[BaseException] = []
    steps: list[Callable[[], Any]] = [
        lambda: open_store(str(root), mode="r").default.read(np.arange(10)),
        lambda: _append(root),
        lambda: open_store(str(root), mode="a").vacuum(older_than_s=0.0),
        lambda: open_store(str(root), mode="r").load_state("slot"),
    ]
    for step in steps:
        try:
            step()
        except ReplayStoreError as exc:
            errors.append(exc)
    return errors


def _append(root: Path) -> None:
    st = open_store(str(root), mode="a")
    with st.writer() as w:
        for i in range(4):  # 400 records into a capacity of 300: the oldest are evicted and reclaimed
            w.append(dqn_batch(np.random.default_rng(10 + i), 100, extra=0), stream=0)
            w.commit()


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_forged_names_are_refused_and_touch_nothing_outside(world, kind) -> None:
    root, victim, before = world
    FORGERIES[kind](root)
    errors = exercise(root)
    assert snapshot(victim) == before
    assert errors and all(isinstance(e, ReplayStoreError) for e in errors)
    assert any(isinstance(e, UnsafeNameError) or "name" in str(e) for e in errors), errors
    assert run_verify(str(root), None) == 1


def test_a_forged_state_payload_path_is_never_read(world) -> None:
    root, victim, before = world
    path = layout.state_record("slot", 0)
    edit_record(root, path, lambda b: b.__setitem__("arrays", {"x": "../../victim/x.npy"}))
    st = open_store(str(root), mode="r")
    with pytest.warns(UserWarning, match="not a payload of slot"):
        assert st.load_state("slot") is None  # the only version is skipped; the outside array is not read
    assert snapshot(victim) == before


@pytest.mark.parametrize("link", ["writers/000000/data/records/s0000000000", "writers/000000/data", "state/slot"])
def test_symlinks_out_of_the_store_are_not_followed(world, link) -> None:
    """A directory of the store replaced by a symbolic link to the victim: no read, write or delete
    goes through it (a capped store's writer reclaims evicted segments; vacuum deletes garbage)."""
    root, victim, before = world
    target = root / link
    import shutil

    shutil.rmtree(target)
    os.symlink(victim / "records" if link.endswith("data") else victim, target)
    before = snapshot(victim)
    errors = exercise(root)
    assert snapshot(victim) == before
    assert all(isinstance(e, ReplayStoreError) for e in errors)
    if "state" not in link:
        assert any(isinstance(e, UnsafeNameError) for e in errors), errors


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "a//b", "./a", "a\x00b"])
def test_local_storage_refuses_paths_that_leave_the_root(tmp_path, path) -> None:
    storage = LocalStorage(str(tmp_path / "root"))
    for op in (lambda: storage.read(path), lambda: storage.write(path, b"x"), lambda: storage.delete(path),
               lambda: storage.create(path, b"x"), lambda: storage.local_path(path)):
        with pytest.raises(UnsafeNameError):
            op()
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("slot", ["", ".", "..", "../up", "a/b", "a\\b", ".hidden", "x" * 201, "tab\tname", 7])
def test_save_state_refuses_slot_names_outside_the_grammar(tmp_path, slot) -> None:
    st = open_store(str(tmp_path / "s"), SCHEMA)
    with pytest.raises(InvalidNameError, match="slot"):
        st.save_state(slot, {})  # type: ignore[arg-type]
    assert not (tmp_path / "s" / "state").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", ".npy", ""])
def test_save_state_refuses_array_names_outside_the_grammar(tmp_path, name) -> None:
    st = open_store(str(tmp_path / "s"), SCHEMA)
    with pytest.raises(InvalidNameError, match="arrays"):
        st.save_state("ok", {}, {name: np.zeros(2)})
    assert not (tmp_path / "s" / "state").exists()
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("table", ["../x", "a/b", "", "a b", "x" * 201])
def test_table_names_outside_the_grammar_are_refused(tmp_path, table) -> None:
    with pytest.raises(InvalidNameError, match="table"):
        open_store(str(tmp_path / "s"), {table: SCHEMA})
    assert not (tmp_path / "s").exists()


def test_valid_names_pass(tmp_path) -> None:
    st = open_store(str(tmp_path / "s"), {"advantage": SCHEMA, "strategy": SCHEMA})
    st.save_state("demo-per.v2_final", {"ok": True}, {"priorities": np.ones(4), "rng-state": np.zeros(2)})
    doc, arrays = st.load_state("demo-per.v2_final")  # type: ignore[misc]
    assert doc == {"ok": True} and sorted(arrays) == ["priorities", "rng-state"]
