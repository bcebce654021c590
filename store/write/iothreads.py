"""A writer's I/O threads: spare segments created ahead and reclaimed storage deleted."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class IOThreads:
    """Two background threads, ``replaystore-io-<writer>``, started on first use.

    Two, so that a spare segment the append path is about to need is not queued behind
    deletions. The segment pool and the reclaimer submit to them; the writer shuts them down
    at close.

    Parameters
    ----------
    writer : int
        The writer's number (it names the threads).
    """

    def __init__(self, writer: int) -> None:
        self.writer = writer
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on an I/O thread.

        Parameters
        ----------
        fn : callable
            The work; its result or error is the future's.
        *args
            Its arguments.

        Returns
        -------
        Future
            Done once ``fn`` returned or raised.

        Cost: O(1) here; the threads start on the first call.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2, thread_name_prefix=f"replaystore-io-{self.writer}")
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        """Wait for every submitted task and stop the threads (a later submit starts new ones).

        Cost: as long as the queued work takes.
        """
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
