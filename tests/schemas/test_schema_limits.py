"""Schema limits (docs/FORMAT.md, "Schema limits"): field-name bytes, nesting depth, nested nodes and
field counts are checked when a schema is built and when a store's manifest is read; a forged
manifest of any size is refused (or opened) in time linear in its size, with a typed error that
names the field and the limit, never a RecursionError or a raw OSError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError, SchemaError
from replaystore.schemas import (
    FIELD_NAME_BYTES,
    FIELDS_LIMIT,
    NESTED_NODES_LIMIT,
    NESTING_DEPTH_LIMIT,
    Dense,
    Ragged,
    Schema,
    nested,
)
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.tools.cli import main as cli_main

BOUND_S = 20  # a generous wall-clock bound for work that takes well under a second when linear

SMALL = Schema("s", [nested("obs", {"a": Dense("x", np.float32)}), Dense("action", np.int64)])


def _store(tmp_path: Path) -> str:
    """A store of SMALL with one commit (its manifest is what the tests forge)."""
    url = str(tmp_path / "st")
    st = open_store(url, SMALL, mode="w")
    with st.writer() as w:
        w.append({"obs": {"a": np.zeros(3, np.float32)}, "action": np.zeros(3, np.int64)})
        w.commit()
    return url


def _forge(url: str, schema_doc: dict[str, Any]) -> bytes:
    """Replace the store's table schema with ``schema_doc`` in a checksum-valid manifest."""
    path = Path(url) / layout.MANIFEST
    body = records.decode(layout.MANIFEST, path.read_bytes())
    body["tables"]["records"] = schema_doc
    raw = records.encode(body)
    path.write_bytes(raw)
    return raw


def _deep_doc(levels: int) -> dict[str, Any]:
    """SMALL's document with its leaf ``levels`` dict nodes deep (``obs__a__a...``)."""
    doc = SMALL.to_dict()
    path = ["obs"] + ["a"] * levels
    doc["nested"] = {"__".join(path[:i]): "dict" for i in range(1, len(path))}
    doc["fields"][0]["name"] = "__".join(path)
    return doc


def _wide_doc(nodes: int) -> dict[str, Any]:
    """SMALL's document with ``nodes`` dict nodes under ``obs``, each holding one leaf."""
    doc = SMALL.to_dict()
    leaf, action = doc["fields"]
    doc["fields"] = [dict(leaf, name=f"obs__n{i}__x") for i in range(nodes)] + [action]
    doc["nested"] = {"obs": "dict", **{f"obs__n{i}": "dict" for i in range(nodes)}}
    return doc


OPEN_SCRIPT = """
import sys
from replaystore.errors import ReplayStoreError
from replaystore.store import open_store

try:
    st = open_store(sys.argv[1], mode="r")
except ReplayStoreError as exc:
    print(type(exc).__name__, exc)
else:
    print("opened", len(st.schema.fields))
"""


def _open_in_subprocess(url: str) -> str:
    """What opening ``url`` gives, in a process of its own that must finish within ``BOUND_S``."""
    r = subprocess.run([sys.executable, "-c", OPEN_SCRIPT, url], capture_output=True, text=True, timeout=BOUND_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def _cli(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(args))
    return code, out.getvalue() + err.getvalue()


# -- building a schema -------------------------------------------------------------------------------
def test_a_field_name_over_the_limit_is_refused_naming_it() -> None:
    name = "a" * 300
    for build in (lambda: Dense(name, np.float32), lambda: Ragged(name, np.int64, "offs"),
                  lambda: Ragged("ids", np.int64, name), lambda: Schema("s", [Dense(name, np.float32)])):
        with pytest.raises(SchemaError, match=rf"field name '{name}': 300 bytes in UTF-8, over the limit of "
                                              rf"{FIELD_NAME_BYTES} bytes"):
            build()
    wide = "é" * (FIELD_NAME_BYTES // 2 + 1)  # few characters, too many bytes
    with pytest.raises(SchemaError, match=f"{len(wide.encode())} bytes"):
        Dense(wide, np.float32)


def test_a_nested_leaf_path_over_the_name_limit_is_refused_naming_it() -> None:
    key = "k" * 60
    with pytest.raises(SchemaError, match=rf"field name 'obs__{key}__{key}__{key}__{key}': 251 bytes in UTF-8, "
                                          rf"over the limit of {FIELD_NAME_BYTES}"):
        nested("obs", {key: {key: {key: {key: Dense("x", np.float32)}}}})


def test_a_name_at_the_limit_is_stored_and_read_back(tmp_path: Path) -> None:
    """200 bytes is one path component of a fragment on every local file system (255 at most)."""
    name = "f" * FIELD_NAME_BYTES
    leaf = "l" * (FIELD_NAME_BYTES - len("obs__"))
    schema = Schema("s", [Dense(name, np.float32, (2,)), nested("obs", {leaf: Dense("x", np.int64)}),
                          Ragged("r" * FIELD_NAME_BYTES, np.int64, "o" * FIELD_NAME_BYTES)])
    url = str(tmp_path / "st")
    st = open_store(url, schema, mode="w")
    with st.writer() as w:
        w.append({name: np.ones((2, 2), np.float32), "obs": {leaf: np.arange(2)},
                  "r" * FIELD_NAME_BYTES: np.arange(3), "o" * FIELD_NAME_BYTES: np.array([0, 1, 3])})
        w.commit()
    got = open_store(url, mode="r").read(np.arange(2))
    assert np.array_equal(got[name], np.ones((2, 2), np.float32))
    assert np.array_equal(got["obs"][leaf], np.arange(2))


def test_nesting_deeper_than_the_limit_is_a_schema_error_not_a_recursion_error() -> None:
    def chain(levels: int) -> Any:
        node: Any = Dense("x", np.float32)
        for _ in range(levels):
            node = {"a": node}
        return node

    assert nested("obs", chain(NESTING_DEPTH_LIMIT)).leaves[0].name.count("__") == NESTING_DEPTH_LIMIT
    for levels in (NESTING_DEPTH_LIMIT + 1, 3000):
        with pytest.raises(SchemaError, match=rf"nested node 'obs__a__a.*: its keys are {NESTING_DEPTH_LIMIT + 1} "
                                              rf"levels deep, over the limit of {NESTING_DEPTH_LIMIT}"):
            nested("obs", chain(levels))
    deep = _deep_doc(3000)  # the same as a document: refused before any recursion
    with pytest.raises(SchemaError, match="over the limit"):
        Schema.from_dict(deep)
    doc = _deep_doc(NESTING_DEPTH_LIMIT + 1)
    with pytest.raises(SchemaError, match=f"{NESTING_DEPTH_LIMIT + 1} levels deep"):
        Schema.from_dict(doc)
    assert Schema.from_dict(_deep_doc(NESTING_DEPTH_LIMIT)).nesting is not None


def test_field_and_node_counts_over_the_limits_are_refused() -> None:
    many = [Dense(f"f{i}", np.uint8) for i in range(FIELDS_LIMIT + 1)]
    with pytest.raises(SchemaError, match=rf"{FIELDS_LIMIT + 1} fields, over the limit of {FIELDS_LIMIT}"):
        Schema("s", many)
    assert len(Schema("s", many[:FIELDS_LIMIT]).fields) == FIELDS_LIMIT
    with pytest.raises(SchemaError, match=f"more than {NESTED_NODES_LIMIT} inner nodes"):
        nested("obs", {f"k{i}": {"x": Dense("x", np.uint8)} for i in range(NESTED_NODES_LIMIT)})
    doc = _wide_doc(NESTED_NODES_LIMIT)  # fields within the limit, nodes one over
    doc["fields"] = doc["fields"][-2:]
    with pytest.raises(SchemaError, match=f"{NESTED_NODES_LIMIT + 1} nested nodes, over the limit"):
        Schema.from_dict(doc)


def test_building_the_largest_allowed_nested_schema_is_linear() -> None:
    """A membership test against the field tuple per node made this quadratic (minutes at 60k nodes)."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from test_schema_limits import _wide_doc; "
              "from replaystore.schemas import Schema; "
              f"s = Schema.from_dict(_wide_doc({FIELDS_LIMIT - 1})); print(len(s.fields), len(s.nesting.nodes))")
    r = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True,
                       timeout=BOUND_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(FIELDS_LIMIT), str(FIELDS_LIMIT)]


# -- a forged manifest ----------------------------------------------------------------------------------
def test_a_forged_manifest_of_60k_nested_nodes_is_refused_promptly(tmp_path: Path) -> None:
    url = _store(tmp_path)
    raw = _forge(url, _wide_doc(60_000))
    got = _open_in_subprocess(url)
    assert got.startswith("CorruptObjectError") and layout.MANIFEST in got, got
    assert f"over the limit of {FIELDS_LIMIT}" in got
    assert (Path(url) / layout.MANIFEST).read_bytes() == raw  # left as it was


def test_a_forged_manifest_of_60k_nodes_and_few_fields_is_refused_promptly(tmp_path: Path) -> None:
    url = _store(tmp_path)
    doc = _wide_doc(60_000)
    doc["fields"] = doc["fields"][:1] + doc["fields"][-1:]
    _forge(url, doc)
    got = _open_in_subprocess(url)
    assert got.startswith("CorruptObjectError") and f"over the limit of {NESTED_NODES_LIMIT}" in got, got


def test_a_forged_manifest_at_the_limits_opens_promptly(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    open_store(url, SMALL, mode="w")  # no records: the forged fields need no data to open
    _forge(url, _wide_doc(FIELDS_LIMIT - 1))
    assert _open_in_subprocess(url) == f"opened {FIELDS_LIMIT}"


def test_a_forged_manifest_3000_levels_deep_is_a_typed_error(tmp_path: Path) -> None:
    url = _store(tmp_path)
    _forge(url, _deep_doc(3000))
    got = _open_in_subprocess(url)
    assert got.startswith("CorruptObjectError") and "over the limit" in got and "Recursion" not in got, got
    for levels in (NESTING_DEPTH_LIMIT + 1, 3000):  # nodes that deep, the leaf's name kept short
        doc = _deep_doc(levels)
        doc["fields"][0]["name"] = "obs__b"
        _forge(url, doc)
        with pytest.raises(CorruptObjectError, match=f"levels deep, over the limit of {NESTING_DEPTH_LIMIT}") as exc:
            open_store(url, mode="r")
        assert exc.value.path == layout.MANIFEST


def test_a_forged_manifest_with_a_300_byte_field_name_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    url = _store(tmp_path)
    doc = SMALL.to_dict()
    doc["fields"][1]["name"] = "b" * 300
    raw = _forge(url, doc)
    for mode in ("r", "a"):
        with pytest.raises(CorruptObjectError, match=rf"field name '{'b' * 300}': 300 bytes in UTF-8, over the "
                                                     rf"limit of {FIELD_NAME_BYTES}") as exc:
            open_store(url, mode=mode)
        assert exc.value.path == layout.MANIFEST
    for command in ("info", "verify"):
        code, text = _cli(command, url)
        assert code != 0 and "over the limit" in text and "Traceback" not in text and "ENAMETOOLONG" not in text
        assert len(text.strip().splitlines()) == 1, text
    assert (Path(url) / layout.MANIFEST).read_bytes() == raw


def test_a_forged_node_name_over_the_limit_is_a_typed_error(tmp_path: Path) -> None:
    url = _store(tmp_path)
    doc = SMALL.to_dict()
    doc["nested"]["obs__" + "z" * 300] = "dict"
    _forge(url, doc)
    with pytest.raises(CorruptObjectError, match=f"over the limit of {FIELD_NAME_BYTES} bytes"):
        open_store(url, mode="r")
    doc["nested"] = ["obs"]
    _forge(url, doc)
    with pytest.raises(CorruptObjectError, match="'nested' must be a mapping"):
        open_store(url, mode="r")
