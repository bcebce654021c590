"""Fixtures for the loader tests: fresh local-disk store URLs, usable inside hypothesis examples."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

_counter = itertools.count()


@pytest.fixture(scope="session")
def new_url(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], str]:
    """A factory of fresh local store directories (session-scoped, so hypothesis may call it per example)."""
    base = tmp_path_factory.mktemp("loaders")

    def make() -> str:
        return str(base / f"st{next(_counter)}")

    return make
