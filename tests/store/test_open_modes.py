"""The modes of ``open_store`` (the table in its docstring): what each does with an absent and a
present store, whether it can write, and that every refused open leaves the location exactly
as it was. Runs on local disk, ``memory://`` and S3."""

from __future__ import annotations

import os
import threading
from typing import get_args

import numpy as np
import pytest

from replaystore.errors import (
    ModeError,
    ReadOnlyError,
    SchemaMismatchError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from replaystore.schemas import dqn, ppo
from replaystore.store import Mode, Store, open_store
from replaystore.store.store import MODES
from support.batches import dqn_batch
from support.storecheck import Backend, snapshot

SCHEMA = dqn(16, 2, actions=9)
EXCLUSIVE = ("w", "w-", "x")


def _location(backend: Backend) -> dict[str, tuple[bytes, int]]:
    """Every object at the location with its bytes and modification time; local: also whether
    the root directory exists at all."""
    storage = backend.storage()
    objects = {o.path: (storage.read(o.path), o.mtime_ns) for o in storage.walk("")}
    if backend.kind == "local":
        objects["<root exists>"] = (str(os.path.isdir(backend.url)).encode(), 0)
    return objects


def _append(st: Store, n: int, seed: int) -> None:
    with st.writer() as w:
        w.append(dqn_batch(np.random.default_rng(seed), n, extra=0), stream=f"s{seed}")


def _filled(backend: Backend) -> Store:
    st = backend.open(SCHEMA, mode="w")
    _append(st, 6, 0)
    st.save_state("sampler", {"cursor": 2})
    return st


def test_mode_is_a_literal_of_the_accepted_spellings() -> None:
    assert set(get_args(Mode)) == {"r", "r+", "a", "w", "w-", "x", "w+"}
    assert MODES == get_args(Mode)


def test_r_plus_opens_an_existing_store_for_writing(backend: Backend) -> None:
    before = _location(backend)
    for schema in (None, SCHEMA):
        with pytest.raises(StoreNotFoundError, match="r\\+"):
            backend.open(schema, mode="r+")
    assert _location(backend) == before  # "r+" never creates (local: not even the directory)
    _filled(backend)
    st = backend.open(mode="r+")
    assert st.mode == "r+" and len(st) == 6
    _append(st, 4, 1)  # unlike "r", it writes
    assert st.save_state("sampler", {"cursor": 5}) >= 1
    st.vacuum(older_than_s=3600.0)
    reopened = backend.open(SCHEMA, mode="r+")
    assert len(reopened) == 10 and reopened.load_state("sampler")[0] == {"cursor": 5}
    ro = backend.open(mode="r")
    with pytest.raises(ReadOnlyError):
        ro.writer()


@pytest.mark.parametrize("mode", EXCLUSIVE)
def test_exclusive_modes_create_and_refuse_an_existing_store(backend: Backend, mode: Mode) -> None:
    with pytest.raises(StoreError, match="schema"):  # nothing to create it from
        backend.open(mode=mode)
    st = backend.open(SCHEMA, mode=mode, capacity=50)
    assert st.mode == mode and len(st) == 0 and st.capacity == 50
    _append(st, 5, 0)
    before = _location(backend)
    for other in EXCLUSIVE:
        with pytest.raises(StoreExistsError, match=f"mode '{other}'"):
            backend.open(SCHEMA, mode=other)
        with pytest.raises(FileExistsError):  # the builtin family too
            backend.open(ppo(16, actions=9), mode=other)
    assert _location(backend) == before
    assert len(backend.open(mode="r")) == 5


def test_a_and_w_plus_still_open_create_and_replace(backend: Backend) -> None:
    st = backend.open(SCHEMA, mode="a")
    _append(st, 3, 0)
    assert len(backend.open(mode="a")) == 3
    fresh = backend.open(ppo(16, actions=9), mode="w+")
    assert len(fresh) == 0 and fresh.schema == ppo(16, actions=9)
    assert len(backend.sibling().open(SCHEMA, mode="w+")) == 0  # on nothing it creates


def test_refused_opens_leave_the_location_exactly_as_it_was(backend: Backend) -> None:
    _filled(backend)
    before = _location(backend)
    want = snapshot(backend.open(mode="r"))
    refused: list[tuple[dict, type[Exception]]] = [
        *[({"schema": SCHEMA, "mode": m}, StoreExistsError) for m in EXCLUSIVE],
        *[({"schema": ppo(16, actions=9), "mode": m}, SchemaMismatchError) for m in ("r", "r+", "a")],
        *[({"schema": SCHEMA, "mode": m, "capacity": 9}, StoreError) for m in ("r+", "a")],
        ({"schema": SCHEMA, "mode": "rw"}, ModeError),
        ({"mode": "w+"}, StoreError),  # nothing to create the new store from: the old one stays
    ]
    for kwargs, error in refused:
        with pytest.raises(error):
            backend.open(**kwargs)
        assert _location(backend) == before, kwargs
    assert snapshot(backend.open(mode="r")) == want


@pytest.mark.parametrize("mode", ["rw", "", "W", "R+", "a+", "wx", "x-", None, 1])
def test_an_unknown_mode_names_mode_and_the_accepted_ones(backend: Backend, mode: object) -> None:
    before = _location(backend)
    with pytest.raises(ModeError) as info:
        backend.open(SCHEMA, mode=mode)
    err = info.value
    assert issubclass(ModeError, ValueError) and issubclass(ModeError, StoreError)
    assert err.field == "mode" and err.actual == mode and err.expected == MODES
    assert str(err).startswith("mode: expected one of")
    assert all(repr(m) in str(err) for m in MODES)
    assert _location(backend) == before


@pytest.mark.parametrize("mode", EXCLUSIVE)
def test_racing_exclusive_creators_one_wins(tmp_path: os.PathLike[str], mode: Mode) -> None:
    """Of several openers creating one store at once, exactly one gets it; the others see
    StoreExistsError, also those that found the location empty before the winner created it."""
    racers = 8
    for attempt in range(5):
        url = os.path.join(tmp_path, f"st-{attempt}")
        gate = threading.Barrier(racers)
        outcome: list[object] = [None] * racers

        def race(i: int, url: str = url, gate: threading.Barrier = gate, outcome: list[object] = outcome) -> None:
            gate.wait()
            try:
                outcome[i] = open_store(url, SCHEMA, mode=mode)
            except StoreExistsError as exc:
                outcome[i] = exc

        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcome if isinstance(o, Store)]
        assert len(winners) == 1, outcome
        assert all(isinstance(o, StoreExistsError) for o in outcome if o is not winners[0]), outcome


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_a_leading_tilde_is_the_home_directory(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch,
                                               prefix: str) -> None:
    home, cwd = os.path.join(tmp_path, "home"), os.path.join(tmp_path, "cwd")
    os.makedirs(home)
    os.makedirs(cwd)
    monkeypatch.setenv("HOME", home)
    monkeypatch.chdir(cwd)
    with open_store(f"{prefix}~/replay", SCHEMA, mode="x") as st:
        _append(st, 3, seed=0)
        assert st.url == os.path.join(home, "replay")
    assert os.listdir(cwd) == []  # no directory literally named "~"
    with open_store(os.path.join(home, "replay"), mode="r") as st:
        assert len(st.default) == 3


def test_a_tilde_inside_a_non_local_url_is_left_alone() -> None:
    with open_store("memory://~/replay-tilde", SCHEMA, mode="x") as st:
        assert "~" in st.url
