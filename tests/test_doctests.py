"""The examples in docstrings run, over ``memory://`` stores, and show what they claim."""

from __future__ import annotations

import doctest
import importlib
from collections.abc import Iterator

import fsspec
import pytest

MODULES = (
    "replaystore",
    "replaystore.store.store",
    "replaystore.schemas.schema",
    "replaystore.schemas.csr",
    "replaystore.loaders.buffer",
    "replaystore.loaders.uniform",
    "replaystore.loaders.masks",
    "replaystore.report.html",
)
"""Modules whose docstrings hold examples."""
ROOTS = ("/quickstart", "/doc-open-store", "/doc-sql", "/doc-report", "/examples")
"""The ``memory://`` stores the examples create."""


def _clear_roots() -> None:
    fs = fsspec.filesystem("memory")
    for root in ROOTS:
        if fs.exists(root):
            fs.rm(root, recursive=True)


@pytest.fixture
def fresh_memory_roots() -> Iterator[None]:
    """The examples create their stores with mode "x": none may exist before, none is left after."""
    _clear_roots()
    yield
    _clear_roots()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, fresh_memory_roots: None) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS, report=True)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (output above)"
