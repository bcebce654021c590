"""A table's committed records: visibility under capacity, row ids, gathers, the stream index."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from replaystore.compiled import kernels
from replaystore.errors import RowError
from replaystore.schemas import Columns, Schema
from replaystore.store.format.fragment import Fragment, FragmentData
from replaystore.store.format.streamkeys import StreamKey
from replaystore.store.read import retention
from replaystore.store.read.gather import empty, gather, gather_fragments, gather_index
from replaystore.store.read.index import StreamIndex
from replaystore.store.read.indexkeeper import IndexKeeper
from replaystore.store.read.log import CommitLog
from replaystore.store.read.plan import ReadPlans
from replaystore.store.read.rowids import fragment_of, locate
from replaystore.store.read.rows import row_array
from replaystore.store.read.sizecheck import SizeCheck
from replaystore.store.read.spans import Layout, map_touched
from replaystore.store.read.view import TableView
from replaystore.store.read.viewdiff import identities
from replaystore.store.read.viewstep import ViewStep
from replaystore.store.read.vmap import available as contiguous_views_available
from replaystore.store.storage import Storage
from replaystore.store.storage.cache import store_cache


class TableReader:
    """The visible records of one table, as of the log's last refresh.

    Rows are addressed by stable row ids (``writer << 40 | local row``); positions
    ``0 .. len-1`` enumerate visible rows in row-id order for uniform sampling.

    What is visible is one immutable :class:`~replaystore.store.read.view.TableView`,
    :attr:`view`: :meth:`sync` builds the next one and swaps the reference (a view handed
    out before stays as it was). The reader keeps only caches beside it: opened fragment
    data, the contiguous layouts and which fragments they mapped, the stream index.

    On local storage and on object storage read through a chunk cache (where the platform
    allows, and unless ``contiguous=False``) reads gather through
    :class:`~replaystore.store.read.spans.Layout` views in which all visible fragments of an
    array form one ndarray (on object storage a fragment is mapped when a read first
    touches it); elsewhere they gather per fragment.
    """

    def __init__(self, storage: Storage, log: CommitLog, name: str, schema: Schema, capacity: int | None,
                 contiguous: bool = True) -> None:
        self.storage = storage
        self.log = log
        self.name = name
        self.schema = schema
        self.capacity = capacity
        self._version = -1
        self._data: dict[tuple[int, str], FragmentData] = {}
        self._streams = IndexKeeper(storage, schema)  # the stream index, followed across syncs
        # read plans: (name, trailing shape, dtype) per dense field; (offsets, [(name, dtype)]) per CSR group
        self._plans = ReadPlans(name, schema)
        self._dense, self._ragged = self._plans.dense, self._plans.ragged
        self._sizes = SizeCheck(storage)  # which fragments' claimed rows were checked against their data
        # the compiled CSR index (store/read/csrkernels.py) or None: asked at the first ragged gather, so
        # that opening a store never loads numba
        self._csr: ModuleType | None | object = _UNASKED
        # contiguous views: the record arrays share one layout, each CSR group's values another
        self._layouts: dict[str, Layout] = {}
        # (compressed fields are not mappable: such tables gather per fragment, decoding blocks)
        if contiguous and not schema.compressed and contiguous_views_available() and storage.supports_memory_map:
            specs = schema.zarr_layout()
            self._layouts["records"] = Layout(storage, schema, [s for s in specs if s.role != "values"])
            for off, names in schema.offsets_groups.items():
                values = [s for s in specs if s.role == "values" and s.name in names]
                self._layouts[off] = Layout(storage, schema, values)
        self._layout_of = {name: lay for lay in self._layouts.values() for name in lay.specs}
        self._views: dict[str, np.ndarray] | None = None  # every array's view, taken at the first read
        # object storage (lazy layouts): the current view's fragments no read has mapped since the sync
        self._unmapped: np.ndarray | None = None
        self.view: TableView = self._fresh([], identities([]), np.zeros(0, dtype=np.int64), -1)
        """The visible records as of the last :meth:`sync` (replaced, never changed, by the next)."""
        self.sync()

    # -- the current view (read-only shortcuts) -------------------------------------------
    @property
    def fragments(self) -> tuple[Fragment, ...]:
        """The visible fragments (those with visible records), as of the last sync."""
        return self.view._frags

    @property
    def all_fragments(self) -> tuple[Fragment, ...]:
        """The live fragments (visible or not), as of the last sync."""
        return self.view._live

    @property
    def vis_from(self) -> np.ndarray:
        """Per visible fragment: its first visible local row (read-only)."""
        return self.view.visible_from

    @property
    def first_ids(self) -> np.ndarray:
        """Per visible fragment: its first row id (read-only)."""
        return self.view.first_ids

    @property
    def ends(self) -> np.ndarray:
        """Per visible fragment: its end row id (read-only)."""
        return self.view.ends

    @property
    def cum(self) -> np.ndarray:
        """Visible records before each visible fragment, then in all (read-only)."""
        return self.view.cum

    # -- visibility -----------------------------------------------------------------
    def sync(self) -> None:
        """Build the view of the log's current version and make it :attr:`view`, if the log changed.

        Cost: the fragments that changed (appended, compacted, closed with their writer, with
        rows evicted), the rest keeping their places; plus, in a store with a capacity, array
        operations over every fragment's parts (eviction).
        """
        if self._version == self.log.version:
            return
        version = self.log.version
        old = self.view
        frags = self.log.fragments(self.name)
        ids = identities(frags)
        vis_all = (retention.visible_from(frags, self.capacity) if self.capacity is not None
                   else np.zeros(len(frags), dtype=np.int64))
        # (checked before anything changes: a damaged fragment leaves the reader as it was, and the
        # next sync checks again)
        new = None if len(frags) <= _REDO_UP_TO else self._follow(old, frags, ids, vis_all, version)
        if new is None:
            self._sizes.check(frags)
        self._streams.replaced(old, self._data)
        self._version = version
        self.view = new if new is not None else self._fresh(frags, ids, vis_all, version)
        self._views = None

    def _fresh(self, frags: list[Fragment], ids: np.ndarray, vis_all: np.ndarray, version: int) -> TableView:
        """The view of the live fragments ``frags``, computed afresh; the caches moved to it.

        ``ids`` are their objects, each visible from local row ``vis_all``.
        """
        rows = np.array([f.rows for f in frags], dtype=np.int64)
        keep = vis_all < rows
        visible = [f for f, k in zip(frags, keep, strict=True) if k]
        if hasattr(self, "view"):
            self._forget({(f.writer, f.name): f for f in self.view._frags}, {(f.writer, f.name) for f in visible})
        first_ids = np.array([f.first_id for f in visible], dtype=np.int64)
        live = {(f.writer, f.name) for f in frags}
        self._data = {k: v for k, v in self._data.items() if k in live}
        self._sizes.keep(frags)
        # base row of each visible fragment per layout, and each fragment's value count per CSR group
        bases = {key: lay.place(visible) for key, lay in self._layouts.items()}
        self._unmapped = (np.ones(len(visible), dtype=bool)
                          if self._layouts and self._layouts["records"].lazy else None)
        # where each fragment's values end in its values arrays (a segment's are shared)
        nnz = {off: np.array([f.value_end(off) for f in visible], dtype=np.int64)
               for off in self.schema.offsets_groups}
        return TableView.build(self, version, visible, first_ids, vis_all[keep], first_ids + rows[keep], bases,
                               [off for off, _ in self._ragged], nnz, frags, ids, keep, vis_all)

    def _follow(self, o: TableView, frags: list[Fragment], ids: np.ndarray, vis_all: np.ndarray,
                version: int) -> TableView | None:
        """The view ``o`` moved to the live fragments ``frags``, or None.

        ``ids`` are their objects, each visible from local row ``vis_all``. A fragment that is
        the same object, visible from the same row, in both views keeps what was computed for
        it; the rest is computed for what changed (:class:`~replaystore.store.read.viewstep.ViewStep`).
        None, with nothing changed, where more than a quarter of the fragments changed.
        """
        step = ViewStep.between(o, frags, ids, vis_all, _FOLLOW_MIN)
        if step is None:
            return None
        self._sizes.check(step.added)  # (before anything changes)
        gone, came, visible, splice = step.gone, step.came, step.visible, step.splice
        self._forget({(f.writer, f.name): f for f in gone}, {(f.writer, f.name) for f in came})
        left = {(f.writer, f.name) for f in step.removed} - {(f.writer, f.name) for f in step.added}
        self._sizes.drop(left)
        if any(k in self._data for k in left):  # (a new dict: the index's previous view keeps the old one)
            self._data = {k: v for k, v in self._data.items() if k not in left}
        relaid = False
        bases = {}
        for key, lay in self._layouts.items():
            placed = lay.follow(gone, came)
            if placed is None:  # the reserved space ran out: laid out afresh
                relaid = True
                bases[key] = lay.place(visible)
            else:
                bases[key] = splice(o._bases[key], placed)
        if self._unmapped is not None:
            self._unmapped = (np.ones(len(visible), dtype=bool) if relaid
                              else splice(self._unmapped, np.ones(len(came), dtype=bool)))
        nnz = {off: splice(v, [f.value_end(off) for f in came]) for off, v in o._nnz.items()}
        return TableView.build(self, version, visible, step.first_ids, step.vis_from, step.ends, bases,
                               [off for off, _ in self._ragged], nnz, frags, ids, step.shown, vis_all)

    def _forget(self, before: dict[tuple[int, str], Fragment], now: set[tuple[int, str]]) -> None:
        """What no longer shows will not be read: a chunk cache drops it first."""
        cache = store_cache(self.storage)
        if cache is not None:
            cache.forget([f.path for k, f in before.items() if k not in now and f.segment is None])

    def widen(self, extra: int) -> None:
        """Show ``extra`` more records than the capacity.

        Those evicted most recently, still stored while within the grace margin (docs/FORMAT.md,
        "Capacity and reclamation"). For a handle that only gathers rows another handle's
        (possibly older) view chose, such as a DataLoader worker's. No effect without a capacity.
        Cost: one :meth:`sync`.
        """
        if self.capacity is None or extra <= 0:
            return
        self.capacity += int(extra)
        self._version = -1
        self.sync()

    def evicted_rows(self, grace: int) -> list[tuple[Fragment, int]]:
        """Each fragment with how many of its first rows are older than the newest ``capacity + grace``.

        None in a store without a capacity.
        """
        if self.capacity is None:
            return []
        vis_from = retention.visible_from(list(self.all_fragments), self.capacity + grace)
        return [(f, int(v)) for f, v in zip(self.all_fragments, vis_from, strict=True)]

    def evicted_fragments(self, grace: int) -> list[Fragment]:
        """Fragments all of whose rows are older than the newest ``capacity + grace`` records."""
        return [f for f, v in self.evicted_rows(grace) if v >= f.rows]

    def retained_parts(self, grace: int) -> set[tuple[int, int]]:
        """``(writer, seq)`` of the append parts holding any of the newest ``capacity + grace`` records."""
        return retention.retained_parts(list(self.all_fragments), int(self.capacity or 0) + grace)

    def __len__(self) -> int:
        return int(self.view.cum[-1])

    # -- row ids --------------------------------------------------------------------
    def row_ids(self) -> np.ndarray:
        """Every visible row id, ascending."""
        return self.view.row_ids()

    def rows_at(self, positions: np.ndarray, view: TableView | None = None) -> np.ndarray:
        """Row ids of visible positions of ``view`` (default: :attr:`view`), vectorised.

        Parameters
        ----------
        positions : array_like of int
            Positions ``0 <= p < len(view)``.
        view : TableView, optional

        Returns
        -------
        numpy.ndarray
            int64 row ids. Cost: one search per position, none where the visible rows are
            one run of row ids.

        Raises
        ------
        RowError
            A position out of range.
        """
        v = self.view if view is None else view
        positions = row_array(positions, "positions")
        # one reduction checks both bounds: a negative position is huge as unsigned
        n = int(v.cum[-1])
        if positions.size and _max(positions.view(np.uint64), axis=None) >= n:
            raise RowError(f"table {self.name!r}: positions must lie in [0, {n})")
        if v._run_start is not None:
            return positions + v._run_start
        return positions + v._base[v._cum_ends.searchsorted(positions, side="right")]

    def locate(self, rows: np.ndarray, view: TableView | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~replaystore.store.read.rowids.locate` in ``view`` (default: :attr:`view`)."""
        return locate(self.view if view is None else view, rows)

    # -- data -----------------------------------------------------------------------
    def data(self, frag: Fragment) -> FragmentData:
        """The cached data handle of ``frag``, opened (no read of data) on first use."""
        key = (frag.writer, frag.name)
        d = self._data.get(key)
        if d is None:
            d = self._data[key] = FragmentData(self.storage, self.schema, frag)
        return d

    def _data_of(self, v: TableView) -> Callable[[Fragment], FragmentData]:
        """How reads of view ``v`` open fragment data.

        Through the cache for the current view; for an older one, without adding to it (its
        fragments may no longer be live).
        """
        if v is self.view:
            return self.data
        return lambda frag: self._data.get((frag.writer, frag.name)) or FragmentData(self.storage, self.schema, frag)

    def read(self, rows: Any, columns: Sequence[str] | None = None, view: TableView | None = None,
             ) -> dict[str, np.ndarray]:
        """The records at ``rows`` in that order: dense fields, ragged values and rebased offsets.

        Parameters
        ----------
        rows : array_like of int
            Visible row ids of ``view``.
        columns : sequence of str, optional
            Field names to read (a ragged field brings its offsets); default every field.
        view : TableView, optional
            The view to read (default: :attr:`view`).

        Returns
        -------
        dict of str to numpy.ndarray

        Raises
        ------
        UnknownColumnError
            An unknown name in ``columns``.
        RowError
            A row id not visible in ``view``.
        CorruptObjectError
            CSR offsets that point outside their fragment's values.
        StaleReadError
            An older view whose fragments' objects were reclaimed since.

        Notes
        -----
        Hot path (docs/PERFORMANCE.md): with contiguous views, one ``take`` per array
        whatever the number of fragments. Otherwise rows are grouped by fragment once; each
        field costs one ``take`` per fragment touched, plus one permutation back to the
        requested order when more than one fragment is touched. Ragged values are gathered
        through CSR offsets computed for all rows at once. A view other than the current one
        reads per fragment.
        """
        v = self.view if view is None else view
        dense, ragged = self._dense, self._ragged
        if columns is not None:
            dense, ragged = self._plans.of(columns)
        rows = row_array(rows).reshape(-1)
        if not len(rows):
            return empty(dense, ragged)
        csr = self._csr
        if ragged and csr is _UNASKED:  # (asked at the first ragged gather: opening a store never loads numba)
            csr = self._csr = kernels("replaystore.store.read.csrkernels")
        # (a column subset on object storage reads per fragment: mapping a fragment maps every array)
        if self._layouts and v is self.view and (columns is None or self._unmapped is None):
            try:
                if self._views is None:
                    self._views = {name: lay.array(name) for name, lay in self._layout_of.items()}
                frag_i = fragment_of(v, rows)
                if self._unmapped is not None:
                    map_touched(self._layouts, self._unmapped, frag_i, v._frags)
            except OSError as exc:  # address space refused (e.g. ulimit -v), a cache that cannot keep
                # objects: gather per fragment from now on
                warnings.warn(f"table {self.name!r}: contiguous views unavailable ({exc}); reading per fragment",
                              RuntimeWarning, stacklevel=2)
                self._layouts, self._layout_of, self._views = {}, {}, None
                self._unmapped = None
            else:
                shift = v._view_shift.take(frag_i, axis=0)  # type: ignore[union-attr]
                return gather(self._views.__getitem__, rows + shift[:, 0],
                              {off: shift[:, g] for g, (off, _) in enumerate(self._ragged, 1)}, frag_i,
                              dense, ragged, v, csr)
        frag_i, local = locate(v, rows)
        data_of = self._data_of(v)
        if len(v._frags) == 1 or not np.any(frag_i != frag_i[0]):
            return gather(data_of(v._frags[int(frag_i[0])]).array, local, None, frag_i, dense, ragged, v, csr)
        return gather_fragments(data_of, v._frags, frag_i, local, dense, ragged)

    def read_columns(self, rows: Any) -> Columns:
        """Every column of the records at row ids ``rows`` as :class:`Columns` (see :meth:`read`)."""
        out = self.read(rows)
        return Columns(self.schema, len(np.asarray(rows).reshape(-1)), out)

    def index_arrays(self, rows: np.ndarray, view: TableView | None = None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream keys as object array, steps, resets)`` of visible rows.

        Parameters
        ----------
        rows : numpy.ndarray
            int64 row ids visible in ``view``.
        view : TableView, optional
            Default :attr:`view`.

        Returns
        -------
        tuple of numpy.ndarray
            Cost: one read of the index arrays per fragment touched.

        Raises
        ------
        RowError
            A row id that is not visible in ``view``.
        """
        v = self.view if view is None else view
        frag_i, local = locate(v, rows)
        return gather_index(self._data_of(v), v._frags, frag_i, local)

    # -- stream index -----------------------------------------------------------------
    def lists_stream(self, key: StreamKey) -> bool:
        """False only when no visible fragment lists stream ``key``.

        The stream then has no visible records, which a writer asking for a new stream's last step learns without the
        index. (True may still mean no visible records: keys of fragments evicted or
        compacted since stay listed.) Cost: fragments not seen before.
        """
        return self._streams.lists_stream(key, self.view._frags, self._version)

    @property
    def index(self) -> StreamIndex:
        """The (stream, step) index of visible rows.

        Built on first use, then followed across the changes :meth:`sync` saw since, at the cost
        of the change (:class:`~replaystore.store.read.indexkeeper.IndexKeeper`), when next used
        (a writer that only appends never pays for it).
        """
        return self._streams.index(self.view, self.data)


_FOLLOW_MIN = 8
"""Fragments changed up to which :meth:`TableReader.sync` always follows the change."""

_REDO_UP_TO = 64
"""Live fragments up to which :meth:`TableReader.sync` redoes its view: following has a fixed
cost in array operations, redoing grows with the fragments; they cross at 50-70 fragments
(``python bench/sync_threshold_bench.py``, docs/PERFORMANCE.md "Following a commit vs redoing the view")."""

_UNASKED = object()
_max = np.maximum.reduce

