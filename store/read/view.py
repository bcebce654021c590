"""Immutable snapshots of a table's visible records: :class:`TableView` and :class:`FragmentInfo`.

A view is what one refresh of the store showed of a table: its visible fragments, where
each one's visible records start, the row ids and positions they enumerate, and the log
version it was built from. Nothing in a view changes after it is built; a refresh that
changes the table builds a new one (``Table.view()`` then returns the new object, while
code that kept the old one still sees the old set).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import RowIdTypeError, StaleReadError
from replaystore.schemas import Columns, Schema
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.streamkeys import StreamKey

if TYPE_CHECKING:
    import pyarrow as pa

    from replaystore.store.read.index import StreamIndex
    from replaystore.store.read.table import TableReader

_INT64 = np.dtype(np.int64)
_INT64_MAX = np.iinfo(np.int64).max


def row_array(values: Any, argument: str = "rows") -> np.ndarray:
    """``values`` as an int64 array of row ids (or positions), refusing anything but integers.

    Cost: none for an int64 array; one conversion for other integer dtypes.

    Parameters
    ----------
    values : array_like of int
        An int, a sequence of ints, or an array of any integer dtype.
    argument : str, optional
        What ``values`` are, named in the error.

    Returns
    -------
    numpy.ndarray
        int64 (the input itself where it already is an int64 array).

    Raises
    ------
    RowIdTypeError
        Floats (``1.5`` is no row id), booleans (a mask is no list of ids), strings, objects,
        or unsigned values past the int64 range. An empty sequence is accepted.
    """
    a = values if isinstance(values, np.ndarray) else np.asarray(values)
    dtype = a.dtype
    if dtype == _INT64:
        return a
    if dtype.kind in "iu":
        if dtype.kind == "u" and dtype.itemsize == 8 and a.size and int(a.max()) > _INT64_MAX:
            raise RowIdTypeError(argument, f"unsigned values past the int64 range (up to {int(a.max())})")
        return a.astype(np.int64)
    if a.size == 0:  # (``[]`` becomes float64: no id, nothing to refuse)
        return np.zeros(a.shape, dtype=np.int64)
    what = "booleans (a mask: pass np.flatnonzero(mask) for the ids it selects)" if dtype.kind == "b" else \
        f"values of dtype {dtype}"
    raise RowIdTypeError(argument, what)


_NONE = np.zeros((0, 2), dtype=np.int64)
_ZERO = np.zeros(1, dtype=np.int64)


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only (no copy): a view's arrays are never written."""
    a.flags.writeable = False
    return a


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


@dataclass(frozen=True, eq=False)
class TableView:
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
    Gathers (:meth:`read`, :meth:`scan`) from the table's current view take the fast path
    (contiguous views over all fragments where available); from an older view they read
    fragment by fragment and raise :class:`~replaystore.errors.StaleReadError` for records
    whose objects were reclaimed since (evicted past the grace margin, or compacted 30 s ago).
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
    _reader: TableReader = field(repr=False)

    @classmethod
    def build(cls, reader: TableReader, version: int, frags: Sequence[Fragment], first_ids: np.ndarray,
              visible_from: np.ndarray, ends: np.ndarray, bases: dict[str, np.ndarray], ragged: Sequence[str],
              nnz: dict[str, np.ndarray], live: Sequence[Fragment], live_ids: np.ndarray, shown: np.ndarray,
              live_from: np.ndarray) -> TableView:
        """The view of visible fragments ``frags`` and the lookup tables derived from them.

        Used by the table's reader at each refresh that changes the table; users take views
        from ``Table.view()``.

        Parameters
        ----------
        reader : TableReader
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
    def __len__(self) -> int:
        """Visible records. Cost: O(1)."""
        return int(self.cum[-1])

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

    def row_ids(self) -> np.ndarray:
        """Every visible row id, ascending.

        Returns
        -------
        numpy.ndarray
            int64, a new array. Cost: O(records).
        """
        if not self._frags:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s + v, e, dtype=np.int64)
                               for s, v, e in zip(self.first_ids, self.visible_from, self.ends, strict=True)])

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

    def rows_at(self, positions: Any) -> np.ndarray:
        """Row ids of visible positions.

        Parameters
        ----------
        positions : array_like of int
            Positions ``0 <= p < len(view)``.

        Returns
        -------
        numpy.ndarray
            int64 row ids, the shape of ``positions``. Cost: one search per position (none
            where the visible rows are one run of row ids).

        Raises
        ------
        RowError
            A position outside ``[0, len)``.
        """
        return self._reader.rows_at(positions, self)

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

    # -- reading --------------------------------------------------------------------
    def read(self, rows: Any, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The records at row ids ``rows``, in that order.

        Parameters
        ----------
        rows : array_like of int
            Visible row ids (any order, repeats allowed).
        columns : sequence of str, optional
            Field names to read (default: every dense and ragged field). A ragged field brings
            its CSR offsets array; batch metadata fields are not per record and are not read; a
            nested field (``obs``) brings all its leaves.

        Returns
        -------
        dict of str to numpy.ndarray
            Dense fields; ragged values with their offsets (rebased to 0), new arrays; a nested
            field's leaves as a nested dict (tuples for Tuple nodes) under its name.

        Raises
        ------
        UnknownFieldError
            A name in ``columns`` that is not a dense or ragged field of the schema.
        RowError
            A row id that is not visible in this view.
        StaleReadError
            An older view whose records' objects were reclaimed since.

        Notes
        -----
        Cost: one gather per array read (current view, contiguous views) or per array and
        fragment touched; arrays of unnamed columns are not read.
        """
        nesting = self.schema.nesting
        if nesting is None:
            return self._reader.read(rows, columns, self)
        return nesting.nest(self._reader.read(rows, nesting.columns(columns), self))

    def read_columns(self, rows: Any, columns: Sequence[str] | None = None) -> Columns:
        """:meth:`read` as :class:`~replaystore.schemas.Columns` (same errors and cost).

        Parameters
        ----------
        rows : array_like of int
            Visible row ids (any order, repeats allowed).
        columns : sequence of str, optional
            Field names to read (default: every dense and ragged field).

        Returns
        -------
        Columns
            The records, field by field.
        """
        nesting = self.schema.nesting
        out = self._reader.read(rows, columns if nesting is None else nesting.columns(columns), self)
        return Columns(self.schema, len(np.asarray(rows).reshape(-1)), out)

    def index_of(self, rows: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream keys, steps, resets)`` of visible row ids.

        Parameters
        ----------
        rows : array_like of int
            Visible row ids.

        Returns
        -------
        tuple of numpy.ndarray
            Stream keys (object array), steps (int64), resets (bool). Cost: one read of the
            index arrays per fragment touched.

        Raises
        ------
        RowError
            A row id that is not visible in this view.
        """
        return self._reader.index_arrays(row_array(rows).reshape(-1), self)

    def stream_index(self) -> StreamIndex:
        """The (stream, step) index of the visible rows.

        The index is kept up to date incrementally and shared by every user of the table, so
        only the table's current view has it; take ``Table.view()`` again after a refresh.

        Returns
        -------
        StreamIndex
            Built on first use, then followed across changes at the cost of the change.

        Raises
        ------
        StaleReadError
            This view is no longer the table's current one.
        """
        if not self.current:
            raise StaleReadError(f"table {self.name!r}: this view (version {self.version}) is older than the "
                                 "table's; take table.view() again for its stream index")
        return self._reader.index

    def scan_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        """The Arrow schema of :meth:`scan`'s batches.

        Parameters
        ----------
        columns : sequence of str, optional
            Columns in that order (default: ``row, stream, step, reset``, every field except
            batch metadata, ``writer, commit, commit_time``).

        Returns
        -------
        pyarrow.Schema
            ``stream`` is int64 where every stream key is an int, else string. Cost: O(fragments).

        Raises
        ------
        StoreError
            A column the table does not have (named in the message).
        """
        from replaystore.store.read.scan import scan_projection, scan_schema

        return scan_projection(scan_schema(self), columns, self.name)

    def scan(self, columns: Sequence[str] | None = None, batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The visible records in row-id order as Arrow record batches.

        Parameters
        ----------
        columns : sequence of str, optional
            As for :meth:`scan_schema`; only the arrays behind them are read.
        batch_rows : int, optional
            Records per batch at most (default ``replaystore.store.SCAN_ROWS``); memory stays
            bounded by it, whatever the table's size.

        Returns
        -------
        iterator of pyarrow.RecordBatch
            Lazily read, a fragment at a time. Cost: the requested columns' objects, once.

        Raises
        ------
        StoreError
            An unknown column or a ``batch_rows`` that is not a positive int (at the call).
        StaleReadError
            While iterating, records whose objects were reclaimed since the view was taken.
        """
        from replaystore.store.read.scan import scan

        return scan(self, columns, batch_rows)
