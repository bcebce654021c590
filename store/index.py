"""The (stream, step) index: rows of a stream in step order, contiguous runs, lookups."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

StreamKey = int | str


@dataclass
class StreamIndex:
    """Visible rows sorted by (stream, step).

    ``keys[g]`` is the stream key of dense stream id ``g``; ``bounds[g]:bounds[g+1]``
    delimits its rows in ``rows``/``steps``/``resets`` (sorted by step).
    """

    keys: list[StreamKey]
    bounds: np.ndarray
    rows: np.ndarray
    steps: np.ndarray
    resets: np.ndarray
    stream_ids: np.ndarray  # dense stream id of each sorted entry

    @classmethod
    def build(cls, parts: list[tuple[list[StreamKey], int, np.ndarray, np.ndarray, np.ndarray]]) -> StreamIndex:
        """From per-fragment ``(stream keys, first row id, codes, steps, resets)``."""
        gid: dict[StreamKey, int] = {}
        sids, rows, steps, resets = [], [], [], []
        for keys, first, codes, st, rs in parts:
            mapping = np.array([gid.setdefault(k, len(gid)) for k in keys] or [0], dtype=np.int64)
            sids.append(mapping[codes])
            rows.append(np.arange(first, first + len(codes), dtype=np.int64))
            steps.append(st)
            resets.append(rs)
        if not sids:
            empty = np.zeros(0, dtype=np.int64)
            return cls([], np.zeros(1, dtype=np.int64), empty, empty, np.zeros(0, bool), empty)
        sid = np.concatenate(sids)
        step = np.concatenate(steps)
        order = np.lexsort((step, sid))
        sid = sid[order]
        bounds = np.searchsorted(sid, np.arange(len(gid) + 1), side="left").astype(np.int64)
        return cls(list(gid), bounds, np.concatenate(rows)[order], step[order],
                   np.concatenate(resets)[order], sid)

    def _gid(self, stream: StreamKey) -> int:
        try:
            return self._lookup[stream]
        except AttributeError:
            self._lookup = {k: i for i, k in enumerate(self.keys)}
            return self._gid(stream)
        except KeyError:
            raise KeyError(f"no visible records of stream {stream!r}") from None

    def streams(self) -> list[StreamKey]:
        return [k for g, k in enumerate(self.keys) if self.bounds[g + 1] > self.bounds[g]]

    def span(self, stream: StreamKey) -> tuple[int, int]:
        """``[lo, hi)`` of a stream's sorted entries; empty for a stream with no visible records
        (never written, or wholly evicted: the same answer whether or not a live fragment still
        lists its key)."""
        try:
            g = self._gid(stream)
        except KeyError:
            return 0, 0
        return int(self.bounds[g]), int(self.bounds[g + 1])

    def stream_rows(self, stream: StreamKey) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, steps)`` of one stream in step order."""
        lo, hi = self.span(stream)
        return self.rows[lo:hi], self.steps[lo:hi]

    def runs(self, stream: StreamKey) -> np.ndarray:
        """Contiguous step runs of a stream as an ``(n, 2)`` array of ``[first_step, last_step]``.

        A run breaks at every step gap (missing or evicted steps). Resets do not
        break runs; they are recurrent boundaries, reported by :meth:`resets`.
        """
        _, steps = self.stream_rows(stream)
        if not len(steps):
            return np.zeros((0, 2), dtype=np.int64)
        cuts = np.flatnonzero(np.diff(steps) != 1) + 1
        starts = np.r_[0, cuts]
        ends = np.r_[cuts, len(steps)] - 1
        return np.stack([steps[starts], steps[ends]], axis=1)

    def lookup(self, stream: StreamKey, steps: np.ndarray | int) -> np.ndarray:
        """Row ids of ``(stream, step)`` pairs; -1 where the step is not visible."""
        lo, hi = self.span(stream)
        s = self.steps[lo:hi]
        want = np.asarray(steps, dtype=np.int64)
        pos = np.searchsorted(s, want)
        posc = np.minimum(pos, max(hi - lo - 1, 0))
        found = (pos < hi - lo) & (s[posc] == want) if hi > lo else np.zeros(want.shape, bool)
        return np.where(found, self.rows[lo:hi][posc] if hi > lo else -1, -1)

    def last_step(self, stream: StreamKey) -> int | None:
        lo, hi = self.span(stream)
        return int(self.steps[hi - 1]) if hi > lo else None
