"""The read face: the one implementation of the read methods of ``Store``, ``Table`` and ``TableView``.

Every read goes through a snapshot (a :class:`~replaystore.store.read.view.TableView`):
:class:`ReadFace` writes each read method once against the snapshot its face names in
``_snapshot`` (a ``Table`` or ``Store``: the table's current view after following new
commits; a ``TableView``: itself), the way a pyarrow ``Dataset`` and its ``Fragment`` share
``take(indices, columns=)`` and ``scanner(columns=)``. The faces add only what is theirs
(a ``Table`` its ``view()`` and ``widen``, a ``TableView`` its fragments and row-id
intervals, a ``Store`` its tables, log and state slots).

This module sits below the view (``view.py`` subclasses :class:`ReadFace`) and the table's
reader (``table.py``): it names the view and the reader only by the :class:`Snapshot` and
:class:`Reader` protocols, so the modules of ``store/read/`` import one way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from replaystore.errors import StaleReadError
from replaystore.schemas import Columns, Schema
from replaystore.store.format.fragment import Fragment, FragmentData
from replaystore.store.format.streamkeys import StreamKey
from replaystore.store.read.rows import row_array
from replaystore.store.read.scan import check_batch_rows, scan_fragments, scan_projection, scan_schema

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from replaystore.store.read.index import StreamIndex


class _Named(Protocol):
    """A table's name and schema (what both a reader and a view carry)."""

    @property
    def name(self) -> str:
        """The table's name."""

    @property
    def schema(self) -> Schema:
        """The table's schema."""


class Reader(_Named, Protocol):
    """What a snapshot's reads need of its table's reader (``TableReader``, store/read/table.py)."""

    @property
    def view(self) -> Any:
        """The table's current view."""

    @property
    def index(self) -> StreamIndex:
        """The stream index of the table's current view."""

    def locate(self, rows: Any, view: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(visible fragment index, local row)`` of row ids of ``view``."""

    def read(self, rows: Any, columns: Sequence[str] | None, view: Any) -> dict[str, np.ndarray]:
        """The records at ``rows`` of ``view``, flat (see ``TableReader.read``)."""

    def index_arrays(self, rows: np.ndarray, view: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream keys, steps, resets)`` of rows of ``view``."""

    def rows_at(self, positions: Any, view: Any) -> np.ndarray:
        """Row ids of positions of ``view``."""

    def _data_of(self, view: Any) -> Callable[[Fragment], FragmentData]:
        """How reads of ``view`` open fragment data."""


class Snapshot(_Named, Protocol):
    """What the read face needs of a view (``TableView``, store/read/view.py)."""

    @property
    def first_ids(self) -> np.ndarray:
        """First row id per visible fragment."""

    @property
    def visible_from(self) -> np.ndarray:
        """First visible local row per visible fragment."""

    @property
    def ends(self) -> np.ndarray:
        """End row id per visible fragment."""

    @property
    def cum(self) -> np.ndarray:
        """Visible records before each visible fragment (and in all, last)."""

    @property
    def version(self) -> int:
        """The commit-log version the view shows."""

    @property
    def current(self) -> bool:
        """Whether this is the table's current view."""

    @property
    def _frags(self) -> tuple[Fragment, ...]:
        """The visible fragments."""

    @property
    def _reader(self) -> Reader:
        """The table's reader."""


class ReadFace:
    """The read methods of a table's visible records, written once for every face that reads them.

    ``Store`` (its only table), ``Table`` (its current view) and ``TableView`` (the snapshot
    itself) inherit these methods, so they take the same arguments (``columns=`` wherever
    columns are read), return the same results and raise the same errors. On a ``Store``
    with several tables every method raises :class:`~replaystore.errors.StoreError` (use
    ``Store.table``). On a ``Table`` or ``Store`` each call first follows the commits the
    handle has seen (``Store.refresh``, or its own writer committing); a ``TableView`` never
    changes.

    The stream methods take a ``stream`` key (an int or a str, as appended); a key with no
    visible records is no error: it reads as an empty stream.
    """

    __slots__ = ()

    def _snapshot(self) -> Snapshot:
        """The view the face's reads see."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Visible records. Cost: O(1) once the view is current."""
        return int(self._snapshot().cum[-1])

    # -- row ids --------------------------------------------------------------------
    def row_ids(self) -> np.ndarray:
        """Every visible row id, ascending (single-writer stores: ``0 .. n-1`` until eviction).

        Returns
        -------
        numpy.ndarray
            int64, a new array. Cost: O(records).
        """
        v = self._snapshot()
        if not v._frags:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s + f, e, dtype=np.int64)
                               for s, f, e in zip(v.first_ids, v.visible_from, v.ends, strict=True)])

    def rows_at(self, positions: Any) -> np.ndarray:
        """Row ids of visible positions ``0 <= p < len`` (for uniform sampling).

        Parameters
        ----------
        positions : array_like of int
            Positions ``0 <= p < len``.

        Returns
        -------
        numpy.ndarray
            int64 row ids, the shape of ``positions``. Cost: one search per position, none
            where the visible rows are one run of row ids.

        Raises
        ------
        RowError
            A position outside ``[0, len)``.
        RowIdTypeError
            Positions that are not integers.
        """
        v = self._snapshot()
        return v._reader.rows_at(positions, v)

    # -- reading --------------------------------------------------------------------
    def read(self, rows: Any, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The records at row ids ``rows``, in that order.

        Parameters
        ----------
        rows : array_like of int
            Visible row ids (any order, repeats allowed): :meth:`row_ids`, :meth:`rows_at`,
            :meth:`lookup`.
        columns : sequence of str, optional
            Field names to read (default: every dense and ragged field). A ragged field brings
            its CSR offsets array; batch metadata fields are not per record and are not read; a
            nested field (``obs``) brings all its leaves.

        Returns
        -------
        dict of str to numpy.ndarray
            Dense fields ``(len(rows), *shape)``; ragged values with their offsets (rebased to
            0), new arrays; a nested field's leaves as a nested dict (tuples for Tuple nodes)
            under its name.

        Raises
        ------
        UnknownColumnError
            A name in ``columns`` that is not a dense or ragged field of the schema (also an
            ``UnknownFieldError``).
        RowError
            A row id that is not visible (never written, or evicted).
        RowIdTypeError
            Row ids that are not integers.
        StaleReadError
            Records whose objects were reclaimed since the view was taken (an older view,
            or rows a handle still showed that were evicted past the grace margin).
        CorruptObjectError
            A stored object fails its checks.

        Notes
        -----
        Cost: one gather per array read (current view, contiguous views) or per array and
        fragment touched; arrays of unnamed columns are not read.
        """
        v = self._snapshot()
        nesting = v.schema.nesting
        if nesting is None:
            return v._reader.read(rows, columns, v)
        return nesting.nest(v._reader.read(rows, nesting.columns(columns), v))

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
            The records, field by field (nested fields as their flat leaves).
        """
        v = self._snapshot()
        nesting = v.schema.nesting
        out = v._reader.read(rows, columns if nesting is None else nesting.columns(columns), v)
        return Columns(v.schema, len(np.asarray(rows).reshape(-1)), out)

    def index_of(self, rows: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream keys, steps, resets)`` of visible row ids.

        Parameters
        ----------
        rows : array_like of int
            The records to index, by visible row id.

        Returns
        -------
        tuple of numpy.ndarray
            Stream keys (object array), steps (int64), resets (bool). Cost: one read of the
            index arrays per fragment touched.

        Raises
        ------
        RowError
            A row id that is not visible.
        """
        v = self._snapshot()
        return v._reader.index_arrays(row_array(rows).reshape(-1), v)

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
        UnknownColumnError
            A column the table does not have (named; also a ``StoreError``).
        """
        v = self._snapshot()
        return scan_projection(scan_schema(v.schema, v._frags), columns, v.name)

    def scan(self, columns: Sequence[str] | None = None, batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The visible records in row-id order as Arrow record batches.

        What ``st.sql`` and the exporters read. The records are those of the view at the call:
        a refresh while iterating does not change them.

        Parameters
        ----------
        columns : sequence of str, optional
            As for :meth:`scan_schema`; only the arrays behind them are read.
        batch_rows : int, optional
            Records per batch at most (default ``replaystore.store.SCAN_ROWS``, 65536); memory
            stays bounded by it, whatever the table's size.

        Returns
        -------
        iterator of pyarrow.RecordBatch
            Lazily read, a fragment at a time. Cost: the requested columns' objects, once.

        Raises
        ------
        UnknownColumnError
            An unknown column (at the call; also a ``StoreError``).
        StoreError
            A ``batch_rows`` that is not a positive int (at the call).
        StaleReadError
            While iterating, records whose objects were reclaimed since the view was taken.
        """
        v = self._snapshot()
        rows = check_batch_rows(batch_rows)
        schema = scan_projection(scan_schema(v.schema, v._frags), columns, v.name)
        return scan_fragments(v._reader._data_of(v), v._frags, v.visible_from.tolist(), schema, rows)

    # -- streams --------------------------------------------------------------------
    def stream_index(self) -> StreamIndex:
        """The (stream, step) index of the visible records.

        Kept up to date incrementally and shared by every user of the table (the same object
        while it can be followed): read it, never change it. Only the table's current view has
        it; take ``Table.view()`` again after a refresh.

        Returns
        -------
        StreamIndex
            Cost: built on first use (reads every visible fragment's index arrays), then the
            rows that changed per refresh.

        Raises
        ------
        StaleReadError
            A view that is no longer the table's current one.
        """
        v = self._snapshot()
        if not v.current:
            raise StaleReadError(f"table {v.name!r}: this view (version {v.version}) is older than the "
                                 "table's; take table.view() again for its stream index")
        return v._reader.index

    def streams(self) -> list[StreamKey]:
        """Keys of the streams with visible records.

        Returns
        -------
        list of int or str
            Stream keys. Cost: the stream index (see :meth:`stream_index`).
        """
        return self.stream_index().streams()

    def rows(self, stream: StreamKey) -> tuple[np.ndarray, np.ndarray]:
        """One stream's visible records, in step order.

        Parameters
        ----------
        stream : int or str
            The stream to list.

        Returns
        -------
        tuple of numpy.ndarray
            ``(row ids, steps)``, both int64 copies (empty for an unknown stream). Cost: a copy
            of the stream's slice of the index.
        """
        rows, steps = self.stream_index().stream_rows(stream)
        return rows.copy(), steps.copy()

    def runs(self, stream: StreamKey) -> np.ndarray:
        """Contiguous step runs of a stream; gaps lie between runs.

        Parameters
        ----------
        stream : int or str
            The stream whose steps are split where one is missing.

        Returns
        -------
        numpy.ndarray
            int64 ``[[first step, last step], ...]``, shape ``(runs, 2)``. Cost: one pass over
            the stream's steps.
        """
        return self.stream_index().runs(stream)

    def lookup(self, stream: StreamKey, steps: Any) -> np.ndarray:
        """Row ids of ``(stream, step)`` pairs.

        Parameters
        ----------
        stream : int or str
            The stream searched.
        steps : int or array_like of int
            Steps of that stream.

        Returns
        -------
        numpy.ndarray
            int64 row ids shaped like ``steps``; -1 where the step is not visible. Cost: a
            binary search per step.
        """
        return self.stream_index().lookup(stream, steps)
