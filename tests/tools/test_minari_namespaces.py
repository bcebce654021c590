"""Namespaced Minari ids: the ids Minari's own parser accepts are accepted for export and import, Minari's
reader and namespace listing see the export, and an id is data, never a path out of the datasets root."""

from __future__ import annotations

import json
from pathlib import Path

import minari
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from minari.dataset.minari_dataset import parse_dataset_id
from minari.namespace import list_local_namespaces

from replaystore.errors import StoreError
from replaystore.schemas import episode
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.formats.minari import DATASET_ID_RE
from replaystore.tools.importer import import_store

pytestmark = pytest.mark.usefixtures("minari_root")  # a Minari root per test (tests/support/minariroot.py)


@pytest.fixture
def store(tmp_path: Path):
    st = open_store(str(tmp_path / "st"), episode((2,), actions=3), mode="w")
    n = 5
    with st.writer() as w:
        w.append({"obs": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "action": np.arange(n) % 3,
                  "reward": np.ones(n, np.float32), "next_obs": np.arange(2, 2 * n + 2, dtype=np.float32).reshape(n, 2),
                  "terminated": np.arange(n) == n - 1, "truncated": np.zeros(n, bool)})
    return st


@pytest.mark.parametrize("dataset_id", ["xx/y-v0", "team/sub/cartpole-expert-v3", "_x/y-v1"])
def test_a_namespaced_export_loads_in_minari_and_imports_back(store, minari_root: Path, tmp_path: Path,
                                                              dataset_id: str) -> None:
    out = export_store(store, str(minari_root), "minari", dataset_id=dataset_id)
    assert out["path"] == str(minari_root / dataset_id)
    ds = minari.load_dataset(dataset_id)
    namespace = dataset_id.rpartition("/")[0]
    assert ds.spec.dataset_id == dataset_id and ds.spec.namespace == namespace and ds.total_steps == 5
    assert namespace in list_local_namespaces()  # Minari's own listing sees the namespace
    by_id = import_store(dataset_id, str(tmp_path / "back1"), "minari")
    by_root = import_store(str(minari_root), str(tmp_path / "back2"), "minari", dataset_id=dataset_id)
    for back in (by_id, by_root):
        assert len(back) == 5
        np.testing.assert_array_equal(back.read(np.arange(5))["obs"], store.read(np.arange(5))["obs"])


def test_existing_namespace_metadata_is_kept(store, minari_root: Path) -> None:
    (minari_root / "team").mkdir()
    (minari_root / "team" / "namespace_metadata.json").write_text(json.dumps({"description": "ours"}))
    export_store(store, str(minari_root), "minari", dataset_id="team/a-v0")
    assert json.loads((minari_root / "team" / "namespace_metadata.json").read_text()) == {"description": "ours"}


@pytest.mark.parametrize("dataset_id", ["x/y-v0", "/abs/y-v0", "../y-v0", "ns/../../y-v0", "a/./b-v0", "a\\b/y-v0",
                                        "ns/y", "ns/-v0"])
def test_ids_minari_refuses_are_refused_and_nothing_is_written(store, minari_root: Path, tmp_path: Path,
                                                               dataset_id: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        parse_dataset_id(dataset_id)  # Minari's own rule refuses it too
    with pytest.raises(StoreError, match="Minari dataset id"):
        export_store(store, str(minari_root), "minari", dataset_id=dataset_id)
    with pytest.raises(StoreError, match="Minari dataset id"):
        import_store(str(minari_root), str(tmp_path / "back"), "minari", dataset_id=dataset_id)
    assert list(minari_root.iterdir()) == [] and not (tmp_path / "back").exists()


def test_a_one_character_namespace_names_minaris_rule(store, minari_root: Path) -> None:
    with pytest.raises(StoreError, match=r"namespace 'x' must be at least two characters.*Minari's own rule"):
        export_store(store, str(minari_root), "minari", dataset_id="x/y-v0")


def test_an_import_source_that_is_not_an_id_is_not_looked_up_under_the_root(minari_root: Path,
                                                                             tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "data"
    outside.mkdir(parents=True)
    (outside / "metadata.json").write_text("{}")
    with pytest.raises(StoreError, match="no Minari dataset there") as err:
        import_store("../outside", str(tmp_path / "back"), "minari")
    assert str(minari_root) not in str(err.value)


ID_CHARS = hs.sampled_from(list("ab_-/.9\\ ") + ["é", "v0", "-v1", "//"])


@settings(max_examples=300, deadline=None)
@given(hs.lists(ID_CHARS, min_size=1, max_size=10).map("".join))
def test_the_id_rule_is_minaris(dataset_id: str) -> None:
    try:
        parse_dataset_id(dataset_id)
        minari_ok = True
    except (ValueError, TypeError):
        minari_ok = False
    assert bool(DATASET_ID_RE.fullmatch(dataset_id)) == minari_ok
