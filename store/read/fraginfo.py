"""Read-only descriptions of a table's fragments: :class:`FragmentInfo`."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from replaystore.store.format.fragment import Fragment
from replaystore.store.format.streamkeys import StreamKey


@dataclass(frozen=True, eq=False)
class FragmentInfo:
    """A read-only description of one fragment of a table: a run of one writer's records.

    Attributes
    ----------
    writer : int
        The writer that committed the records.
    table : str
        The table the fragment belongs to.
    name : str
        The fragment's name (unique per writer and table).
    first_id : int
        The row id of its first record (``writer << 40 | local row``).
    rows : int
        Records it holds, visible or not.
    visible_from : int
        Its first visible local row: records ``[visible_from, rows)`` are visible (0 without a
        capacity; ``rows`` where capacity evicted them all).
    streams : tuple
        The stream keys its records belong to.
    parts : tuple
        ``(seq, time_ns, rows)`` of the commits whose records it holds, in row order.
    nnz : Mapping[str, int]
        Values it holds per CSR offsets array.
    """

    writer: int
    table: str
    name: str
    first_id: int
    rows: int
    visible_from: int
    streams: tuple[StreamKey, ...]
    parts: tuple[tuple[int, int, int], ...]
    nnz: MappingProxyType[str, int]
    _fragment: Fragment = field(repr=False)
    """The store's own description (used inside ``replaystore.store``)."""

    @classmethod
    def of(cls, frag: Fragment, visible_from: int) -> FragmentInfo:
        """The description of ``frag``, visible from local row ``visible_from`` (used inside the store).

        Parameters
        ----------
        frag : Fragment
            The store's own description of the fragment.
        visible_from : int
            Its first visible local row.

        Returns
        -------
        FragmentInfo
            A new description. Cost: O(streams + parts).
        """
        return cls(frag.writer, frag.table, frag.name, frag.first_id, frag.rows, int(visible_from),
                   tuple(frag.streams), tuple(tuple(p) for p in frag.parts),  # type: ignore[misc]
                   MappingProxyType(dict(frag.nnz)), frag)

    @classmethod
    def from_descriptor(cls, writer: int, table: str, descriptor: dict[str, Any],
                        visible_from: int = 0) -> FragmentInfo:
        """A description rebuilt from :meth:`descriptor` (e.g. in another process).

        Parameters
        ----------
        writer, table : int, str
            The fragment's writer and table.
        descriptor : dict
            What :meth:`descriptor` returned.
        visible_from : int
            Its first visible local row.

        Returns
        -------
        FragmentInfo

        Raises
        ------
        KeyError, TypeError
            ``descriptor`` is not one :meth:`descriptor` made.
        """
        return cls.of(Fragment.from_dict(writer, table, descriptor), visible_from)

    @property
    def visible(self) -> int:
        """Visible records: ``rows - visible_from``."""
        return self.rows - self.visible_from

    def descriptor(self) -> dict[str, Any]:
        """The fragment's commit-record descriptor (JSON-compatible, a fresh dict).

        Enough for another process to read the fragment without reading the commit log
        (:meth:`from_descriptor`, ``replaystore.store.scan_fragment``).

        Returns
        -------
        dict
            The descriptor. Cost: O(parts).
        """
        return self._fragment.to_dict()
