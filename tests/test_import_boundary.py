"""The store's public interface is the only way into it from the rest of the package.

Every module of a package folder other than ``store/`` (those pyproject's ``package-dir``
maps) is parsed, not imported, and checked for:

(a) imports from ``replaystore.store`` other than the names of its ``__all__`` and the
    modules it declares public (``storage``, ``sql``, ``maintenance``); from a public module
    that declares an ``__all__`` (``storage``, ``maintenance``), only those names; every other
    module of the store (``format``, ``read``, ``write``, ``maintenance.verify``, ...) is internal;
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
PUBLIC_MODULES = {"storage": "storage/__init__.py", "sql": "sql.py", "maintenance": "maintenance/__init__.py"}
"""Modules of ``replaystore.store`` importable by path (see the package docstring), and their files."""
NAMEDTUPLE_API = {"_fields", "_asdict", "_replace", "_make", "_field_defaults"}


def module_exports(path: Path) -> set[str] | None:
    """The ``__all__`` of the module at ``path``, read from the source; None if it declares none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def store_exports(root: Path) -> set[str]:
    """``replaystore.store.__all__``, read from the source."""
    return module_exports(root / "store" / "__init__.py") or set()


def public_module_exports(root: Path) -> dict[str, set[str] | None]:
    """Each public module of the store -> its ``__all__`` (None: it declares none)."""
    return {name: module_exports(root / "store" / file) for name, file in PUBLIC_MODULES.items()}


def package_folders(root: Path) -> list[Path]:
    """The folders pyproject maps to packages, except the store's."""
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    dirs = doc["tool"]["setuptools"]["package-dir"]
    return [root / d for pkg, d in sorted(dirs.items()) if pkg != STORE and not pkg.startswith(STORE + ".")]


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def check_source(source: str, where: str, exports: set[str],
                 public: dict[str, set[str] | None] | None = None) -> list[str]:
    """The boundary violations in one module's source.

    ``exports`` is the store's ``__all__``; ``public`` maps each public module to its
    ``__all__`` (None, or a module left out: any name not starting with ``_``).
    """
    public = public or {}
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            sub = node.module[len(STORE) + 1:]
            if node.module == STORE:
                out += [f"{where}:{node.lineno}: from {STORE} import {a.name} (not in __all__)"
                        for a in node.names if a.name not in exports and a.name not in PUBLIC_MODULES]
            elif node.module.startswith(STORE + ".") and sub not in PUBLIC_MODULES:
                out.append(f"{where}:{node.lineno}: from {node.module} import ... (an internal module)")
            elif node.module.startswith(STORE + "."):
                names = public.get(sub)
                out += [f"{where}:{node.lineno}: from {node.module} import {a.name} (not in its __all__)"
                        for a in node.names
                        if (a.name not in names if names is not None else a.name.startswith("_"))]
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
    exports, public = store_exports(root), public_module_exports(root)
    out = []
    for folder in package_folders(root):
        for path in sorted(folder.rglob("*.py")):
            out += check_source(path.read_text(), str(path.relative_to(root)), exports, public)
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


def test_public_modules_admit_only_their_exports() -> None:
    public = {"maintenance": {"verify_store", "live_objects"}, "storage": None, "sql": None}
    bad = """
from replaystore.store.maintenance import verify_store, live_objects
from replaystore.store.maintenance import find_garbage
from replaystore.store.maintenance.verify import verify
from replaystore.store.maintenance.live import live_objects
import replaystore.store.maintenance.vacuum
from replaystore.store.sql import connect, _connect
from replaystore.store.storage import open_storage
from replaystore.store import maintenance
from replaystore.store.format import layout
from replaystore.store.read.segments import Segments
"""
    found = check_source(bad, "m.py", {"Store"}, public)
    assert sorted(int(f.split(":")[1]) for f in found) == [3, 4, 5, 6, 7, 10, 11], found


def test_the_removed_internals_are_not_exported_again() -> None:
    exports = store_exports(ROOT)
    internals = {"layout", "records", "bodies", "Segments", "grown", "verify_store", "Problem",
                 "read_state_record", "TableReader", "CommitLog"}
    assert not exports & internals, sorted(exports & internals)
    maintenance = public_module_exports(ROOT)["maintenance"] or set()
    assert {"verify_store", "Problem", "live_objects", "read_state_record"} <= maintenance


def _imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports from, at any level (functions, ``TYPE_CHECKING`` blocks)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_maintenance_and_the_sql_face_sit_on_one_side_of_store_py() -> None:
    """Nothing under store/maintenance imports store.py or sql.py; store.py never imports sql.py."""
    found = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / "store" / "maintenance").rglob("*.py"))
             for m in _imports_of(p) if m in (f"{STORE}.store", f"{STORE}.sql")]
    found += [f"store/store.py: {m}" for m in _imports_of(ROOT / "store" / "store.py")
              if m == f"{STORE}.sql" or m.startswith(f"{STORE}.sql.")]
    assert not found, found
