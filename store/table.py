"""A table's committed records: visibility under capacity, row ids, gathers, the stream index."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import RowError
from replaystore.schemas import Columns, Schema
from replaystore.schemas.csr import gather_csr
from replaystore.store.fragment import Fragment, FragmentData
from replaystore.store.index import StreamIndex
from replaystore.store.log import CommitLog
from replaystore.store.storage import Storage


class TableReader:
    """The visible records of one table, as of the log's last refresh.

    Rows are addressed by stable row ids (``writer << 40 | local row``); positions
    ``0 .. len-1`` enumerate visible rows in row-id order for uniform sampling.
    """

    def __init__(self, storage: Storage, log: CommitLog, name: str, schema: Schema, capacity: int | None) -> None:
        self.storage = storage
        self.log = log
        self.name = name
        self.schema = schema
        self.capacity = capacity
        self._version = -1
        self._data: dict[tuple[int, str], FragmentData] = {}
        self._index: StreamIndex | None = None
        self.sync()

    # -- visibility -----------------------------------------------------------------
    def sync(self) -> None:
        """Recompute the visible set after the log changed (cost: number of fragments)."""
        if self._version == self.log.version:
            return
        self._version = self.log.version
        frags = self.log.fragments(self.name)
        vis_from = np.zeros(len(frags), dtype=np.int64)
        if self.capacity is not None:
            vis_from = self._evict(frags)
        keep = vis_from < np.array([f.rows for f in frags], dtype=np.int64)
        self.all_fragments = frags
        self.fragments = [f for f, k in zip(frags, keep, strict=True) if k]
        self.vis_from = vis_from[keep]
        self.first_ids = np.array([f.first_id for f in self.fragments], dtype=np.int64)
        self.ends = np.array([f.first_id + f.rows for f in self.fragments], dtype=np.int64)
        counts = np.array([f.rows for f in self.fragments], dtype=np.int64) - self.vis_from
        self.cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        live = {(f.writer, f.name) for f in frags}
        self._data = {k: v for k, v in self._data.items() if k in live}
        self._index = None

    def _evict(self, frags: list[Fragment]) -> np.ndarray:
        """Per fragment, the local offset from which its rows are among the newest ``capacity``."""
        parts: list[tuple[int, int, int, int, int, int]] = []  # time, writer, seq, frag index, offset, rows
        for i, f in enumerate(frags):
            offset = 0
            for seq, time_ns, rows in f.parts:
                parts.append((time_ns, f.writer, seq, i, offset, rows))
                offset += rows
        parts.sort(reverse=True)
        vis_from = np.array([f.rows for f in frags], dtype=np.int64)
        budget = int(self.capacity or 0)
        for _, _, _, i, offset, rows in parts:
            if budget <= 0:
                break
            take = min(rows, budget)
            vis_from[i] = offset + rows - take
            budget -= take
        return vis_from

    def evicted_fragments(self, grace: int) -> list[Fragment]:
        """Fragments all of whose rows are older than the newest ``capacity + grace`` records."""
        if self.capacity is None:
            return []
        saved = self.capacity
        self.capacity = saved + grace
        try:
            vis_from = self._evict(self.all_fragments)
        finally:
            self.capacity = saved
        return [f for f, v in zip(self.all_fragments, vis_from, strict=True) if v >= f.rows]

    def retained_parts(self, grace: int) -> set[tuple[int, int]]:
        """``(writer, seq)`` of the append parts holding any of the newest ``capacity + grace`` records."""
        parts = sorted(((t, f.writer, seq, rows) for f in self.all_fragments for seq, t, rows in f.parts),
                       reverse=True)
        kept: set[tuple[int, int]] = set()
        budget = int(self.capacity or 0) + grace
        for _, writer, seq, rows in parts:
            if budget <= 0:
                break
            kept.add((writer, seq))
            budget -= rows
        return kept

    def __len__(self) -> int:
        return int(self.cum[-1])

    # -- row ids --------------------------------------------------------------------
    def row_ids(self) -> np.ndarray:
        """Every visible row id, ascending."""
        if not self.fragments:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s + v, e, dtype=np.int64)
                               for s, v, e in zip(self.first_ids, self.vis_from, self.ends, strict=True)])

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """Row ids of visible positions (``0 <= p < len``), vectorised."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise RowError(f"table {self.name!r}: positions must lie in [0, {len(self)})")
        i = np.searchsorted(self.cum, positions, side="right") - 1
        return self.first_ids[i] + self.vis_from[i] + (positions - self.cum[i])

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(fragment index, local offset)`` of visible row ids; RowError for any other id."""
        rows = np.asarray(rows, dtype=np.int64)
        i = np.searchsorted(self.first_ids, rows, side="right") - 1
        ok = i >= 0
        ic = np.where(ok, i, 0)
        local = rows - self.first_ids[ic] if len(self.first_ids) else rows
        ok &= (rows < self.ends[ic]) & (local >= self.vis_from[ic]) if len(self.first_ids) else False
        if not np.all(ok):
            bad = rows[~np.asarray(ok)][:5].tolist()
            raise RowError(f"table {self.name!r}: rows {bad} are not visible records (never written or evicted)")
        return ic, local

    # -- data -----------------------------------------------------------------------
    def data(self, frag: Fragment) -> FragmentData:
        key = (frag.writer, frag.name)
        d = self._data.get(key)
        if d is None:
            d = self._data[key] = FragmentData(self.storage, self.schema, frag)
        return d

    def read(self, rows: Any) -> dict[str, np.ndarray]:
        """The records at ``rows`` in that order: dense fields, ragged values and rebased offsets."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        frag_i, local = self.locate(rows)
        schema = self.schema
        out: dict[str, np.ndarray] = {}
        for f in schema.dense_fields:
            out[f.name] = np.empty((len(rows), *f.shape), dtype=f.dtype)
        groups = _group(frag_i)
        for fi, pos in groups:
            data = self.data(self.fragments[fi])
            loc = local[pos]
            for f in schema.dense_fields:
                out[f.name][pos] = data.array(f.name)[loc]
        for off_name, names in schema.offsets_groups.items():
            counts = np.empty(len(rows), dtype=np.int64)
            pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in names}
            for fi, pos in groups:
                data = self.data(self.fragments[fi])
                offsets = data.array(off_name)
                loc = local[pos]
                sub_offsets, value_index = gather_csr(offsets, loc)
                counts[pos] = np.diff(sub_offsets)
                for n in names:
                    pieces[n].append((pos, data.array(n)[value_index]))
            new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum(counts, out=new_offsets[1:])
            out[off_name] = new_offsets
            for n in names:
                values = np.empty(int(new_offsets[-1]), dtype=schema.field(n).dtype)  # type: ignore[union-attr]
                for pos, vals in pieces[n]:
                    dst = gather_csr(new_offsets, pos)[1]
                    values[dst] = vals
                out[n] = values
        return out

    def read_columns(self, rows: Any) -> Columns:
        out = self.read(rows)
        return Columns(self.schema, len(np.asarray(rows).reshape(-1)), out)

    def index_arrays(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream keys as object array, steps, resets)`` of visible rows."""
        frag_i, local = self.locate(rows)
        streams = np.empty(len(rows), dtype=object)
        steps = np.empty(len(rows), dtype=np.int64)
        resets = np.empty(len(rows), dtype=bool)
        for fi, pos in _group(frag_i):
            frag = self.fragments[fi]
            data = self.data(frag)
            loc = local[pos]
            keys = np.array(frag.streams + [None], dtype=object)[:-1]
            streams[pos] = keys[data.array("_stream")[loc]]
            steps[pos] = data.array("_step")[loc]
            resets[pos] = data.array("_reset")[loc]
        return streams, steps, resets

    # -- stream index -----------------------------------------------------------------
    @property
    def index(self) -> StreamIndex:
        """The (stream, step) index of visible rows, built on first use after a change."""
        if self._index is None:
            parts = []
            for frag, v in zip(self.fragments, self.vis_from, strict=True):
                data = self.data(frag)
                parts.append((frag.streams, frag.first_id + v, np.asarray(data.array("_stream")[v:]),
                              np.asarray(data.array("_step")[v:]), np.asarray(data.array("_reset")[v:])))
            self._index = StreamIndex.build(parts)
        return self._index


def _group(frag_i: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Positions grouped by fragment: ``[(fragment index, positions), ...]``."""
    if not len(frag_i):
        return []
    order = np.argsort(frag_i, kind="stable")
    sorted_i = frag_i[order]
    cuts = np.flatnonzero(np.diff(sorted_i)) + 1
    return [(int(sorted_i[s]), order[s:e]) for s, e in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True)]

