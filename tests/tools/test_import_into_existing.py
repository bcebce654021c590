"""Importing where something already is: the error says what is there, that an import makes a new store, and
what to do; it never mentions an open mode the user did not pass, and what is there is left as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import StoreExistsError
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.formats.common import ImportDestination
from replaystore.tools.importer import import_store

SCHEMA = transitions(obs_shape=2)


def _store(url: str) -> None:
    st = open_store(url, SCHEMA, mode="w")
    with st.writer() as w:
        w.append({"obs": np.zeros((3, 2), np.float32), "action": np.arange(3), "reward": np.ones(3, np.float32),
                  "next_obs": np.zeros((3, 2), np.float32), "terminated": np.array([False, False, True])})


@pytest.fixture
def parquet_export(tmp_path: Path) -> str:
    _store(str(tmp_path / "src"))
    export_store(open_store(str(tmp_path / "src")), str(tmp_path / "pq"), "parquet")
    return str(tmp_path / "pq")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_importing_onto_a_store_says_so_and_what_to_do(tmp_path: Path, parquet_export: str, where: str) -> None:
    url = str(tmp_path / "dst") if where == "local" else f"memory://import-existing-{tmp_path.name}/dst"
    _store(url)
    with pytest.raises(StoreExistsError) as err:
        import_store(parquet_export, url, "parquet")
    msg = str(err.value)
    assert msg.startswith(f"{url}: a replaystore store is already there; an import creates a new store")
    assert "give a URL where nothing is" in msg and "mode" not in msg
    assert len(open_store(url, mode="r")) == 3  # left as it was


def test_importing_into_a_non_empty_directory_says_it_is_not_empty(tmp_path: Path, parquet_export: str) -> None:
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "notes.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match=r"dst: it is not empty; an import creates a new store"):
        import_store(parquet_export, str(tmp_path / "dst"), "parquet")
    assert (tmp_path / "dst" / "notes.txt").read_text() == "mine"


def test_a_store_made_there_while_the_import_ran_is_named_and_kept(tmp_path: Path) -> None:
    url = str(tmp_path / "dst")
    with pytest.raises(StoreExistsError) as err, ImportDestination(url) as dest:
        _store(url)  # another writer creates a store at the destination after the check
        dest.opened(open_store(url, SCHEMA, mode="w"))
    msg = str(err.value)
    assert "a store was created there while this import ran" in msg and "mode" not in msg
    assert len(open_store(url, mode="r")) == 3  # the other writer's store is not removed
