"""What maintenance needs of an open store: a narrow face that :class:`~replaystore.store.Store` satisfies.

Verification and vacuum take any object with these attributes, never the ``Store`` class
itself: maintenance sits below ``store.py`` (which calls it), and imports nothing above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from replaystore.schemas import Schema
    from replaystore.store.read.log import CommitLog
    from replaystore.store.storage import Storage


class OpenStore(Protocol):
    """An open store as maintenance reads it (``Store`` is one).

    Attributes
    ----------
    storage : Storage
        The store's storage.
    log : CommitLog
        Its commit log, as last refreshed.
    schemas : dict of str to Schema
        Table name to schema, from the manifest.
    capacity : int or None
        The manifest's capacity.
    generation : str
        The store's generation (records of another generation are not its own).
    """

    storage: Storage
    log: CommitLog
    schemas: dict[str, Schema]
    capacity: int | None
    generation: str

    @property
    def url(self) -> str:
        """The store's URL."""

    @property
    def tables(self) -> list[str]:
        """The table names."""

    def refresh(self) -> bool:
        """Read the commit records created since the last refresh.

        Returns
        -------
        bool
            Whether anything changed.
        """
