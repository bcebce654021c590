"""pytest plugin: tests marked ``slow`` (soak and fault runs) are deselected by default.

They run when ``CI`` is set to a true value (``.ci/run`` runs with ``CI=true``), with
``--run-slow``, or when the command line gives ``-m`` (the marker expression then decides).
Deselected tests are reported as deselected (never as passed or skipped), and the terminal
summary says how many slow tests were left out and how to run them (under pytest-xdist too: the
workers send their count to the controller).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

MARKER = "slow"
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
_deselected = pytest.StashKey[int]()


def ci_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CI`` holds a true value (``1``, ``true``, ``yes``, ``on``; any case)."""
    return environ.get("CI", "").strip().lower() in TRUE_VALUES


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help=f"also run tests marked {MARKER!r} (deselected by default unless CI is true or -m is given)")


def runs_slow(config: pytest.Config) -> bool:
    """Whether this run keeps the slow tests: ``--run-slow``, an explicit ``-m``, or CI."""
    return bool(config.getoption("--run-slow") or config.getoption("markexpr") or ci_enabled())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if runs_slow(config):
        return
    slow = [item for item in items if item.get_closest_marker(MARKER) is not None]
    if not slow:
        return
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if item.get_closest_marker(MARKER) is None]
    config.stash[_deselected] = len(slow)
    workeroutput = getattr(config, "workeroutput", None)  # a pytest-xdist worker: tell the controller
    if workeroutput is not None:
        workeroutput[f"{MARKER}_deselected"] = len(slow)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """Under pytest-xdist, the controller (which collects nothing) takes the count its workers saw."""
    n = getattr(node, "workeroutput", {}).get(f"{MARKER}_deselected")
    config = getattr(node, "config", None)
    if isinstance(n, int) and config is not None:
        config.stash[_deselected] = max(n, config.stash.get(_deselected, 0))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = config.stash.get(_deselected, 0)
    if n:
        terminalreporter.write_line(
            f"{n} slow test{'s' if n != 1 else ''} deselected (soak/fault runs); "
            "run them with --run-slow, -m slow, or CI=true (as .ci/run does)")
