"""A table's (stream, step) index kept across views: :class:`IndexKeeper`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from replaystore.errors import StaleReadError
from replaystore.schemas import Schema
from replaystore.store.format.fragment import Fragment, FragmentData
from replaystore.store.format.streamkeys import StreamKey
from replaystore.store.read.index import Piece, StreamIndex
from replaystore.store.read.view import TableView
from replaystore.store.read.viewdiff import first_listings, grown_order, intervals, pair, subtract
from replaystore.store.storage import Storage

_REBUILD_MIN = 1 << 16
"""Rows changed below which the stream index always follows a change rather than rebuilding."""


class IndexKeeper:
    """The stream index of a table's current view, and which stream keys its fragments list.

    Built on first use, then followed across the views a sync replaced since, at the cost of
    the change, when next used (a writer that only appends never pays for it).

    Parameters
    ----------
    storage : Storage
        The store's storage.
    schema : Schema
        The table's schema.
    """

    def __init__(self, storage: Storage, schema: Schema) -> None:
        self.storage = storage
        self.schema = schema
        self._index: StreamIndex | None = None
        # per stream key of the index: (first_id, position in its stream list) of the first
        # visible fragment listing it, in the index's key order (see grown_order)
        self._key_at: dict[StreamKey, tuple[int, int]] = {}
        # stream keys listed by any fragment seen visible (see ``lists_stream``)
        self._listed: set[StreamKey] = set()
        self._listed_from: set[tuple[int, str]] = set()
        self._listed_version = -1
        # the view the index describes (and the fragment data it read), where the current one
        # differs: followed on next use
        self._index_view: tuple[TableView, dict[tuple[int, str], FragmentData]] | None = None

    def replaced(self, old: TableView, datas: dict[tuple[int, str], FragmentData]) -> None:
        """Note that a sync replaced the view ``old``, whose fragments' opened data is ``datas``.

        Parameters
        ----------
        old : TableView
            The view replaced.
        datas : dict
            ``(writer, name)`` to opened fragment data, as of ``old`` (not changed after).
        """
        if self._index is not None and self._index_view is None:
            self._index_view = (old, datas)

    def lists_stream(self, key: StreamKey, frags: Sequence[Fragment], version: int) -> bool:
        """False only when none of the visible fragments ``frags`` lists stream ``key``.

        Parameters
        ----------
        key : StreamKey
            The stream.
        frags : sequence of Fragment
            The current view's visible fragments.
        version : int
            The log version they show (fragments are looked at again when it changes).

        Returns
        -------
        bool
            False: the stream has no visible records. (True may still mean no visible
            records: keys of fragments evicted or compacted since stay listed.) Cost:
            fragments not seen before.
        """
        if self._listed_version != version:
            self._listed_version = version
            for f in frags:
                if (f.writer, f.name) not in self._listed_from:
                    self._listed_from.add((f.writer, f.name))
                    self._listed.update(f.streams)
        return key in self._listed

    def index(self, view: TableView, data: Callable[[Fragment], FragmentData]) -> StreamIndex:
        """The (stream, step) index of the visible rows of ``view``.

        Parameters
        ----------
        view : TableView
            The current view.
        data : callable
            Opens a fragment's data (the reader's cache).

        Returns
        -------
        StreamIndex
            Built on first use, else followed across the views replaced since
            (:meth:`_follow`).
        """
        if self._index_view is not None:
            (old, datas), self._index_view = self._index_view, None
            if not self._follow(list(old._frags), old.visible_from, old._live_ids[old._shown], datas, view, data):
                self._index = None
        if self._index is None:
            parts = []
            for frag, v in zip(view._frags, view.visible_from, strict=True):
                d = data(frag)
                parts.append((frag.streams, frag.first_id + v, np.asarray(d.array("_stream")[v:]),
                              np.asarray(d.array("_step")[v:]), np.asarray(d.array("_reset")[v:])))
            self._index = StreamIndex.build(parts)
            self._key_at = first_listings(list(view._frags))
        return self._index

    def _follow(self, frags: list[Fragment], vis_from: np.ndarray, ids: np.ndarray,
                datas: dict[tuple[int, str], FragmentData], view: TableView,
                data: Callable[[Fragment], FragmentData]) -> bool:
        """Apply the change from the view ``(frags, vis_from)`` to ``view`` to the stream index.

        The old view's objects are ``ids``. The change is the row-id intervals that appeared or left (appends,
        eviction; compaction replaces fragments without changing them), and the new stream
        order. Cost: array operations over both views (:func:`pair`) + the fragments and
        rows changed (see StreamIndex.apply for what a stream's update costs).

        False, and the index is rebuilt on next use, where that is cheaper or the only way:
        the change touches over a quarter of the rows (and more than ``_REBUILD_MIN``); the
        index arrays of rows that left the view can no longer be read (their fragment was
        reclaimed before this reader saw them go); the change contradicts the index.
        """
        assert self._index is not None
        # only fragments that are not the same objects, visible from the same row, in both views
        # changed (appends add fragments, compaction replaces a writer's newest ones, eviction
        # moves where the oldest start); a view's fragments are disjoint, so the others cancel out
        now, now_from = view._frags, view.visible_from
        head, tail, src, kept, stays = pair(ids, vis_from, view._live_ids[view._shown], now_from)
        gone, came = np.flatnonzero(~stays) + head, np.flatnonzero(~kept) + head
        old = intervals([frags[i] for i in gone], vis_from[gone])
        new = intervals([now[i] for i in came], now_from[came])
        appeared, left = subtract(new, old), subtract(old, new)
        changed = sum(hi - lo for _, lo, hi in appeared + left)
        if changed > max(_REBUILD_MIN, (self._index.seg.live + int(view.cum[-1])) // 4):
            return False
        try:
            added = [_piece(data(frag), frag, lo, hi, steps=True) for frag, lo, hi in appeared]
            removed = [_piece(datas.get((frag.writer, frag.name)) or FragmentData(self.storage, self.schema, frag),
                              frag, lo, hi, steps=False) for frag, lo, hi in left]
        except StaleReadError:
            return False
        grown = grown_order(self._key_at, self._index.keys, [frags[i] for i in gone], [now[i] for i in came])
        if grown is not None:
            known = self._index.slot_of
            return self._index.apply(added, removed, new_keys=[k for k in grown if k not in known])
        self._key_at = first_listings(list(now))
        return self._index.apply(added, removed, keys=list(self._key_at))


def _piece(data: FragmentData, frag: Fragment, lo: int, hi: int, steps: bool) -> Piece:
    """Index entries of ``frag``'s local rows ``[lo, hi)``."""
    rows = np.arange(frag.first_id + lo, frag.first_id + hi, dtype=np.int64)
    codes = np.asarray(data.array("_stream")[lo:hi])
    if not steps:
        return Piece(frag.streams, codes, rows)
    return Piece(frag.streams, codes, rows, np.asarray(data.array("_step")[lo:hi]),
                 np.asarray(data.array("_reset")[lo:hi]))
