"""Imports inside ``replaystore.store`` run one way.

Every module under ``store/`` is parsed, not imported; every import of another store module
counts, wherever it is written (module level, inside a function, under ``TYPE_CHECKING``).
Two rules (docs/LAYOUT.md, "The store's sub-packages"):

(a) the sub-packages are layered: a module imports only from its own layer or the layers
    below it, ``storage`` < ``format`` < ``read`` < ``maintenance`` < ``write`` < the faces
    (``store.py``, ``sql.py``, ``__init__.py``);
(b) the module graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "store"
STORE = "replaystore.store"
LAYERS = ["storage", "format", "read", "maintenance", "write", ""]
"""Sub-packages from the bottom up; ``""`` is the package's top-level modules."""


def store_modules(root: Path) -> dict[str, Path]:
    """Dotted names under ``replaystore.store`` (``""`` for the package itself) to their files."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(node: ast.ImportFrom | ast.Import, modules: set[str]) -> set[str]:
    """The store modules (dotted, relative to the package) one import statement names."""
    out = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == STORE or alias.name.startswith(STORE + "."):
                out.add(alias.name[len(STORE) + 1:])
        return out
    if node.level or not node.module or not (node.module == STORE or node.module.startswith(STORE + ".")):
        return out
    base = node.module[len(STORE) + 1:]
    for alias in node.names:
        child = f"{base}.{alias.name}" if base else alias.name
        out.add(child if child in modules else base)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    """Each store module's imports of other store modules."""
    modules = store_modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= imported(node, set(modules))
        deps.discard(name)
        edges[name] = {d for d in deps if d in modules}
    return edges


def layer(module: str) -> int:
    """The module's layer (its index in :data:`LAYERS`)."""
    head = module.split(".")[0]
    return LAYERS.index(head) if "." in module or head in LAYERS else LAYERS.index("")


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of ``edges`` (as a path that ends where it starts), or ``[]``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_layers_import_downwards_only() -> None:
    edges = graph(ROOT)
    upward = [f"{m} imports {d}" for m, deps in sorted(edges.items()) for d in sorted(deps)
              if layer(d) > layer(m) and m != ""]
    assert not upward, "store modules import a higher layer:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    found = cycle(graph(ROOT))
    assert not found, "store modules import each other: " + " -> ".join(found)


def test_every_module_is_in_a_layer() -> None:
    heads = {m.split(".")[0] for m in store_modules(ROOT) if "." in m}
    assert heads <= set(LAYERS), f"sub-packages outside the layering: {sorted(heads - set(LAYERS))}"


@pytest.mark.parametrize(("edges", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
])
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], expected: list[str]) -> None:
    assert cycle(edges) == expected


def test_the_checks_see_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "read").mkdir()
    (tmp_path / "write").mkdir()
    (tmp_path / "read" / "a.py").write_text("def f():\n    from replaystore.store.write import b\n")
    (tmp_path / "write" / "b.py").write_text("from replaystore.store.read.a import f\n")
    edges = graph(tmp_path)
    assert edges["read.a"] == {"write.b"} and edges["write.b"] == {"read.a"}
    assert layer("write.b") > layer("read.a")
    assert cycle(edges) == ["read.a", "write.b", "read.a"]
