"""Immutable snapshots of a table's visible records: :class:`TableView` and :class:`FragmentInfo`.

A view is what one refresh of the store showed of a table: its visible fragments, where
each one's visible records start, the row ids and positions they enumerate, and the log
version it was built from. Nothing in a view changes after it is built; a refresh that
changes the table builds a new one (``Table.view()`` then returns the new object, while
code that kept the old one still sees the old set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.schemas import Schema
from replaystore.store.format.fragment import Fragment
from replaystore.store.read.face import Reader, ReadFace
from replaystore.store.read.fraginfo import FragmentInfo
from replaystore.store.read.rows import frozen

_NONE = np.zeros((0, 2), dtype=np.int64)
_ZERO = np.zeros(1, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class TableView(ReadFace):
    """The visible records of one table as of one refresh: an immutable snapshot.

    Obtained from ``Table.view()``; a refresh that changes the table makes a new view and
    never changes this one. Rows are addressed by row id; positions ``0 .. len-1`` enumerate
    the visible rows in row-id order (for uniform sampling).

    Attributes
    ----------
    name : str
        The table's name.
    schema : Schema
        The table's schema.
    version : int
        The commit-log version the view was built from: two views of a table with the same
        version show the same records.
    first_ids, visible_from, ends : numpy.ndarray
        Per visible fragment (row-id order), read-only int64: its first row id, its first
        visible local row, its end row id; its visible row ids are
        ``[first_ids + visible_from, ends)``.
    cum : numpy.ndarray
        Read-only int64, one more than the fragments: visible records before each fragment
        (``cum[-1]`` is ``len(view)``).

    Notes
    -----
    The read methods (:meth:`read`, :meth:`scan`, :meth:`index_of`, ...) are the shared
    :class:`~replaystore.store.read.face.ReadFace`'s, reading this snapshot. Gathers from the
    table's current view take the fast path (contiguous views over all fragments where
    available); from an older view they read fragment by fragment and raise
    :class:`~replaystore.errors.StaleReadError` for records whose objects were reclaimed since
    (evicted past the grace margin, or compacted 30 s ago).
    """

    name: str
    schema: Schema
    version: int
    _frags: tuple[Fragment, ...] = field(repr=False)
    first_ids: np.ndarray = field(repr=False)
    visible_from: np.ndarray = field(repr=False)
    ends: np.ndarray = field(repr=False)
    cum: np.ndarray = field(repr=False)
    # row-id lookups (store/read/table.py): visible row ids of fragment i are [edges[2i], edges[2i+1]);
    # position p of fragment i is row id p + base[i]; run_start: the first row id where the visible
    # rows are one run of row ids, else None
    _edges: np.ndarray = field(repr=False)
    _base: np.ndarray = field(repr=False)
    _cum_ends: np.ndarray = field(repr=False)
    _run_start: int | None = field(repr=False)
    # per layout: base row of each visible fragment; per CSR group: each one's values end
    _bases: dict[str, np.ndarray] = field(repr=False)
    _view_shift: np.ndarray | None = field(repr=False)
    _nnz: dict[str, np.ndarray] = field(repr=False)
    _max_nnz: dict[str, int] = field(repr=False)
    # every live fragment (visible or not), which of them show, each one's first visible row
    _live: tuple[Fragment, ...] = field(repr=False)
    _live_ids: np.ndarray = field(repr=False)
    _shown: np.ndarray = field(repr=False)
    _live_from: np.ndarray = field(repr=False)
    _reader: Reader = field(repr=False)  # the table's TableReader

    @classmethod
    def build(cls, reader: Reader, version: int, frags: Sequence[Fragment], first_ids: np.ndarray,
              visible_from: np.ndarray, ends: np.ndarray, bases: dict[str, np.ndarray], ragged: Sequence[str],
              nnz: dict[str, np.ndarray], live: Sequence[Fragment], live_ids: np.ndarray, shown: np.ndarray,
              live_from: np.ndarray) -> TableView:
        """The view of visible fragments ``frags`` and the lookup tables derived from them.

        Used by the table's reader at each refresh that changes the table; users take views
        from ``Table.view()``.

        Parameters
        ----------
        reader : Reader
            The table's reader, which reads the view's records.
        version : int
            The commit-log version the view shows.
        frags : sequence of Fragment
            The visible fragments, in row-id order.
        first_ids, visible_from, ends : numpy.ndarray
            Per visible fragment: first row id, first visible local row, end row id (int64).
        bases : dict of str to numpy.ndarray
            Per layout, the base row of each visible fragment in the contiguous views (empty
            where there are none).
        ragged : sequence of str
            The CSR offsets arrays, in schema order.
        nnz : dict of str to numpy.ndarray
            Per CSR offsets array, the values each visible fragment holds.
        live : sequence of Fragment
            Every live fragment, visible or not.
        live_ids : numpy.ndarray
            First row id of each live fragment.
        shown : numpy.ndarray
            Bool per live fragment: whether it is visible.
        live_from : numpy.ndarray
            First visible local row of each live fragment.

        Returns
        -------
        TableView
            The new view. Cost: array operations over the fragments.
        """
        firsts = first_ids + visible_from
        cum = np.concatenate([_ZERO, np.cumsum(ends - firsts)])
        edges = np.stack((firsts, ends), axis=1).reshape(-1)
        run_start: int | None = int(firsts[0]) if len(firsts) else 0
        if not np.array_equal(firsts[1:], ends[:-1]):
            run_start = None
        # what a row id plus it is in the record arrays' views, and the base row of its values in
        # each CSR group's views (one gather per read fetches them all)
        shift = (np.stack([bases["records"] - first_ids, *(bases[off] for off in ragged)], axis=1)
                 if bases else None)
        return cls(reader.name, reader.schema, version, tuple(frags), frozen(first_ids), frozen(visible_from),
                   frozen(ends), frozen(cum), frozen(edges), frozen(firsts - cum[:-1]), frozen(cum[1:]), run_start,
                   {k: frozen(v) for k, v in bases.items()}, None if shift is None else frozen(shift),
                   {k: frozen(v) for k, v in nnz.items()}, {k: int(v.max(initial=0)) for k, v in nnz.items()},
                   tuple(live), frozen(live_ids), frozen(shown), frozen(live_from), reader)

    # -- what it shows --------------------------------------------------------------
    def _snapshot(self) -> TableView:
        # docstring inherited (a view's reads see the view itself)
        return self

    @property
    def current(self) -> bool:
        """Whether this is still the table's view as of its last sync (reads take the fast path). Cost: O(1)."""
        return self._reader.view is self

    @property
    def fragments(self) -> tuple[FragmentInfo, ...]:
        """The visible fragments (those with visible records), in row-id order.

        Returns
        -------
        tuple of FragmentInfo
            Read-only descriptions. Cost: O(fragments), on each call.
        """
        return tuple(FragmentInfo.of(f, v) for f, v in zip(self._frags, self.visible_from.tolist(), strict=True))

    @property
    def live_fragments(self) -> tuple[FragmentInfo, ...]:
        """Every live fragment, visible or not, in row-id order per writer.

        Capacity may have evicted all of a fragment's records before its objects are reclaimed.

        Returns
        -------
        tuple of FragmentInfo
            ``visible_from == rows`` for those with no visible record. Cost: O(fragments).
        """
        return tuple(FragmentInfo.of(f, min(int(v), f.rows))
                     for f, v in zip(self._live, self._live_from.tolist(), strict=True))

    def intervals(self) -> np.ndarray:
        """The visible row ids as sorted disjoint ``[lo, hi)`` intervals (touching ones joined).

        Returns
        -------
        numpy.ndarray
            ``(k, 2)`` int64, a new array. Cost: O(fragments).
        """
        if not self._frags:
            return _NONE.copy()
        iv = np.stack((self.first_ids + self.visible_from, self.ends), axis=1).astype(np.int64)
        iv = iv[np.argsort(iv[:, 0], kind="stable")]
        iv = iv[iv[:, 1] > iv[:, 0]]
        if len(iv) < 2:
            return iv
        start = np.r_[True, iv[1:, 0] > iv[:-1, 1]]
        end = np.r_[start[1:], True]
        return np.stack((iv[start, 0], iv[end, 1]), axis=1)

    def locate(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(visible fragment index, local row)`` of each visible row id.

        Parameters
        ----------
        rows : array_like of int
            Visible row ids.

        Returns
        -------
        tuple of numpy.ndarray
            Indices into :attr:`fragments` and local rows, int64. Cost: one search per row.

        Raises
        ------
        RowError
            A row id that is not visible in this view.
        """
        return self._reader.locate(rows, self)
