"""The store handle and the writer stay small: their groups of methods live in parts of their own.

Modules are parsed for the sizes; the forwarding methods of ``Store`` carry the docstrings of
the parts that implement them, and keep their signatures.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replaystore.store import Store
from replaystore.store.read.follow import LogFollower
from replaystore.store.read.manifest import ReplaceWatch
from replaystore.store.state import StateSlots

STORE_DIR = Path(__file__).resolve().parents[2] / "store"
MAX_CLASS_LINES = 420
"""The style rule's "no class past ~400 lines", with a little slack."""


def _class_lines(path: Path, name: str) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            assert node.end_lineno is not None
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"{path}: no class {name}")


@pytest.mark.parametrize(("module", "name"), [("store.py", "Store"), ("write/writer.py", "Writer")])
def test_class_stays_small(module: str, name: str) -> None:
    assert _class_lines(STORE_DIR / module, name) <= MAX_CLASS_LINES


@pytest.mark.parametrize(("method", "impl"), [
    ("save_state", StateSlots.save), ("state_slots", StateSlots.slots), ("load_state", StateSlots.load),
    ("replaced", ReplaceWatch.replaced), ("check_current", ReplaceWatch.check_current),
    ("refresh", LogFollower.refresh), ("commits", LogFollower.commits),
])
def test_forwarders_carry_the_implementations_docstring_and_signature(method: str, impl: Callable[..., Any]) -> None:
    forwarder = getattr(Store, method)
    assert forwarder.__doc__ == impl.__doc__ and forwarder.__doc__
    assert list(inspect.signature(forwarder).parameters.items()) == list(inspect.signature(impl).parameters.items())
