"""Calls that must return: a test fails, instead of hanging, when one blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def bounded(fn: Callable[[], Any], seconds: float) -> BaseException | None:
    """Run ``fn`` on a daemon thread; what it raised (None: it returned).

    Fails the test if ``fn`` is still running after ``seconds`` (e.g. a blocking open of a
    FIFO that would never return); the thread is left behind as a daemon.
    """
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} still running after {seconds} s (blocked?)"
    return out[0]
