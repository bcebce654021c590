"""The writer's parts receive narrow collaborators, not the store handle.

Modules are parsed, not imported: no module of ``store/write/`` imports the store handle's
module (``replaystore.store.store``), and no module of ``store/`` but that one reaches a private
name that ``Store`` or ``Table`` defines. ``Writer(store)`` stays a public way to write.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from replaystore.schemas import transitions
from replaystore.store import Writer, open_store
from support.batches import transitions_batch

STORE_DIR = Path(__file__).resolve().parents[2] / "store"
HANDLE = "replaystore.store.store"


def _imports(tree: ast.AST) -> set[str]:
    """Every module a parsed module imports (``from X import Y`` also counts ``X.Y``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _private_names(tree: ast.Module, classes: set[str]) -> set[str]:
    """The underscore (not dunder) methods and ``self`` attributes the named classes define."""
    names: set[str] = set()
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in classes):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
                name = node.attr
            else:
                continue
            if name.startswith("_") and not name.endswith("__"):
                names.add(name)
    return names


def test_no_write_module_imports_the_store_handle() -> None:
    offenders = {}
    for path in sorted((STORE_DIR / "write").glob("*.py")):
        found = {m for m in _imports(ast.parse(path.read_text())) if m == HANDLE or m.startswith(HANDLE + ".")}
        if found:
            offenders[path.name] = sorted(found)
    assert offenders == {}


def test_only_the_store_module_reaches_private_store_names() -> None:
    private = _private_names(ast.parse((STORE_DIR / "store.py").read_text()), {"Store", "Table"})
    assert {"_apply_created", "_may_delete", "_as_replaced"} <= private  # (the parser sees them)
    offenders = []
    for path in sorted(STORE_DIR.rglob("*.py")):
        if path == STORE_DIR / "store.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})):
                offenders.append(f"{path.relative_to(STORE_DIR)}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_writer_constructed_from_a_store_handle(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    st = open_store(url, transitions(4), mode="w")
    batch = transitions_batch(np.random.default_rng(0), 3)
    with Writer(st) as w:
        w.append(batch)
        result = w.commit()
    assert result is not None and result.rows == {"records": (0, 3)}
    assert len(st) == 3  # (the handle shows the writer's records without a refresh)
    np.testing.assert_array_equal(st.read(np.arange(3))["obs"], batch["obs"])
    assert len(open_store(url, mode="r")) == 3
