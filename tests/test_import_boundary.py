"""The store's public interface is the only way into it from the rest of the package.

Every module of a package folder other than ``store/`` (those pyproject's ``package-dir``
maps) is parsed, not imported, and checked for:

(a) imports from ``replaystore.store`` other than the names of its ``__all__`` and the
    modules it declares public (``storage``, ``sql``);
(b) attribute access ``.reader`` (the table's internal reader);
(c) attribute access to an underscore name (not a dunder) on anything but ``self``,
    ``cls`` or ``super()`` (namedtuple's public ``_fields``/``_asdict``/... excepted).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = "replaystore.store"
PUBLIC_MODULES = {"storage", "sql"}
"""Modules of ``replaystore.store`` importable by path (see the package docstring)."""
NAMEDTUPLE_API = {"_fields", "_asdict", "_replace", "_make", "_field_defaults"}


def store_exports(root: Path) -> set[str]:
    """``replaystore.store.__all__``, read from the source."""
    tree = ast.parse((root / "store" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def package_folders(root: Path) -> list[Path]:
    """The folders pyproject maps to packages, except the store's."""
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    dirs = doc["tool"]["setuptools"]["package-dir"]
    return [root / d for pkg, d in sorted(dirs.items()) if pkg != STORE and not pkg.startswith(STORE + ".")]


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def check_source(source: str, where: str, exports: set[str]) -> list[str]:
    """The boundary violations in one module's source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == STORE:
                out += [f"{where}:{node.lineno}: from {STORE} import {a.name} (not in __all__)"
                        for a in node.names if a.name not in exports and a.name not in PUBLIC_MODULES]
            elif node.module.startswith(STORE + ".") and node.module[len(STORE) + 1:] not in PUBLIC_MODULES:
                out.append(f"{where}:{node.lineno}: from {node.module} import ... (an internal module)")
        elif isinstance(node, ast.Import):
            out += [f"{where}:{node.lineno}: import {a.name} (an internal module)" for a in node.names
                    if a.name.startswith(STORE + ".") and a.name[len(STORE) + 1:] not in PUBLIC_MODULES]
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if name == "reader":
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)} (the table's internal reader)")
            elif (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
                  and name not in NAMEDTUPLE_API and not _is_own(node.value)):
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)} (an underscore name of another object)")
    return out


def violations(root: Path) -> list[str]:
    exports = store_exports(root)
    out = []
    for folder in package_folders(root):
        for path in sorted(folder.rglob("*.py")):
            out += check_source(path.read_text(), str(path.relative_to(root)), exports)
    return out


def test_outside_the_store_only_its_public_interface_is_used() -> None:
    found = violations(ROOT)
    assert not found, "the store's internals are used outside store/:\n" + "\n".join(found)


def test_the_scan_covers_every_package_folder_but_the_store() -> None:
    names = {p.name for p in package_folders(ROOT)}
    assert {"core", "schemas", "loaders", "tools"} <= names and "store" not in names


def test_each_rule_is_enforced() -> None:
    exports = {"Table", "open_store"}
    bad = """
from replaystore.store import Table, TableReader
from replaystore.store.read.table import TableReader
from replaystore.store.storage import open_storage
import replaystore.store.format.fragment
import replaystore.store.sql
rows = t.reader.fragments
x = t._data
y = self._data
z = super()._data
n = batch._fields
d = obj.__dict__
"""
    found = check_source(bad, "m.py", exports)
    assert sorted(int(f.split(":")[1]) for f in found) == [2, 3, 5, 7, 8], found
