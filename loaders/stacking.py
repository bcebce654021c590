"""Frame stacking at read time: ``obs``/``next_obs`` stacks built from a stream's consecutive frames.

A table of the ``frames`` schema stores each frame once (record t: the frame seen at
step t). A sampler with ``stack=k`` turns a drawn record at stream-index position p
into the frame rows ``p-k+1 .. p+1`` (``obs``: the first k, ``next_obs``: the last k).
Stacks never cross an episode start (a reset, a new stream or a step gap): slots
before it repeat the episode's first frame (``"reset"`` padding, as gymnasium's
``FrameStackObservation`` and TorchRL's ``CatFrames`` do) or are zeros (``"zero"``).
Only records followed by a record of the same episode are drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import SamplerParameterError
from replaystore.loaders.base import Request
from replaystore.loaders.limits import MAX_WINDOW, check_size
from replaystore.store import StreamIndex, Table

PADDINGS = ("reset", "zero")
"""``stack_padding`` values: repeat the episode's first frame, or zeros (gymnasium's ``padding_type``)."""


class FrameIndex:
    """Per visible row: its stream-index position, its episode's first position, and whether it has a next frame.

    Built from a :class:`StreamIndex`'s dense views (cost: a stable sort of the visible
    row ids, linear when they are in stream order already; once per index change).

    Parameters
    ----------
    index : StreamIndex
        The table's stream index.
    """

    def __init__(self, index: StreamIndex) -> None:
        self.key = (id(index), index.version)
        rows, steps, resets, sids = index.rows, index.steps, index.resets, index.stream_ids
        m = len(rows)
        pos = np.arange(m, dtype=np.int64)
        brk = np.ones(m, dtype=bool)  # entry starts an episode: first, new stream, step gap, or reset
        if m > 1:
            brk[1:] = (sids[1:] != sids[:-1]) | (steps[1:] - steps[:-1] != 1) | resets[1:]
        start = np.where(brk, pos, 0)
        np.maximum.accumulate(start, out=start)
        self.rows = rows
        self.start = start
        self.has_next = np.zeros(m, dtype=bool)
        self.has_next[:-1] = ~brk[1:]
        self._sorted_order = np.argsort(rows, kind="stable")
        self._sorted_rows = rows[self._sorted_order]
        drawable = self.has_next[self._sorted_order]
        self.valid_rows = self._sorted_rows[drawable]
        """Ascending row ids that have a next frame in their episode (the drawable ones)."""
        self.invalid_rows = self._sorted_rows[~drawable]
        """Ascending visible row ids without one (episode ends, frame-only records)."""

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Stream-index positions of visible row ids (cost: a binary search per row).

        Parameters
        ----------
        rows : numpy.ndarray
            Visible row ids.

        Returns
        -------
        numpy.ndarray
            int64 positions.
        """
        at = np.searchsorted(self._sorted_rows, rows)
        return self._sorted_order[np.minimum(at, max(len(self._sorted_rows) - 1, 0))]

    def drawable(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row id is visible and has a next frame in its episode.

        Parameters
        ----------
        rows : numpy.ndarray
            Row ids.

        Returns
        -------
        numpy.ndarray
            bool per row.
        """
        if not len(self.valid_rows):
            return np.zeros(len(rows), dtype=bool)
        at = np.minimum(np.searchsorted(self.valid_rows, rows), len(self.valid_rows) - 1)
        return np.asarray(self.valid_rows[at] == rows)

    def windows(self, rows: np.ndarray, stack: int, padding: str) -> np.ndarray:
        """Frame rows of each row's ``obs`` + ``next_obs``: shape ``(*rows.shape, stack + 1)``, -1 for zero slots.

        Column j is frame ``t - stack + 1 + j`` of the row's step t, within its episode.
        A row without a next frame (:meth:`drawable` false) gets -1 in its last
        column; a row id -1 (a sequence's padding slot) gets -1 throughout. Cost:
        O(rows * stack), vectorised.

        Parameters
        ----------
        rows : numpy.ndarray
            Visible row ids, or -1.
        stack : int
            Frames per stack.
        padding : str
            ``"reset"`` or ``"zero"``.

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        flat = rows.reshape(-1)
        real = flat >= 0
        p = self.positions(np.where(real, flat, 0))
        w = p[:, None] + np.arange(1 - stack, 2, dtype=np.int64)[None, :]
        first = self.start[p][:, None]
        before = w < first
        np.maximum(w, first, out=w)
        w[:, -1] = np.where(self.has_next[p], w[:, -1], p)  # (overwritten with -1 below)
        out = self.rows[w]
        if padding == "zero":
            out[before] = -1
        out[~self.has_next[p], -1] = -1
        out[~real] = -1
        return out.reshape((*rows.shape, stack + 1))


class Stacker:
    """A sampler's frame-stacking settings and its :class:`FrameIndex`, followed across table changes.

    Parameters
    ----------
    table : Table
        The table sampled.
    stack : int
        Frames per stack; a positive int.
    padding : str
        ``"reset"`` (repeat the episode's first frame) or ``"zero"``.
    field : str
        The frame field (a dense field of the table).

    Raises
    ------
    SamplerParameterError
        ``stack`` not a positive int, ``padding`` not one of :data:`PADDINGS`, or
        ``field`` not a dense field of the table.
    """

    def __init__(self, table: Table, stack: int, padding: str, field: str) -> None:
        stack = check_size("stack", stack, MAX_WINDOW)
        if padding not in PADDINGS:
            raise SamplerParameterError("stack_padding", f"one of {PADDINGS}", repr(padding))
        if field not in {f.name for f in table.schema.dense_fields}:
            raise SamplerParameterError("stack_field", f"a dense field of table {table.name!r}", repr(field))
        self.table, self.stack, self.padding, self.field = table, stack, padding, field
        self._index: FrameIndex | None = None

    def index(self) -> FrameIndex:
        """The frame index of the table's current view (rebuilt when the stream index changed).

        Returns
        -------
        FrameIndex
            Cost: nothing when unchanged, else a sort of the visible rows.
        """
        si = self.table.view().stream_index()
        if self._index is None or self._index.key != (id(si), si.version):
            self._index = FrameIndex(si)
        return self._index


def gather_stacked(table: Table, request: Request) -> dict[str, Any]:
    """The minibatch of a stacked request: fields but the frame, ``obs``, ``next_obs``, ``indices``, outputs.

    Each distinct frame is read once (ascending rows); ``obs`` is ``(B, stack, *frame)``,
    ``next_obs`` the same one frame later; zero-padding slots are zeros. Cost: one read
    of the rows' other fields and one of their distinct frames.

    Parameters
    ----------
    table : Table
        The table to read.
    request : Request
        A request with ``frames``.

    Returns
    -------
    dict of str to Any
        Name to numpy array.
    """
    assert request.frames is not None and request.frame_field is not None
    rows = np.asarray(request.rows, dtype=np.int64)
    field = request.frame_field
    others = [n for n in table.schema.record_names if n != field]
    if request.sequence:  # padding slots (-1) read nothing and come out as zeros (dense fields)
        real = rows >= 0
        read = table.read(rows[real], columns=others) if others else {}
        data = {}
        for spec in table.schema.dense_fields:
            if spec.name != field:
                full = np.zeros((*rows.shape, *spec.shape), dtype=spec.dtype)
                full[real] = read[spec.name]
                data[spec.name] = full
    else:
        data = table.read(rows, columns=others) if others else {}
    w = request.frames
    if request.next_frames is not None:  # n-step: next_obs follows each window's last row
        w = np.concatenate([w, request.next_frames], axis=-1)
    got = w >= 0
    uniq, inv = np.unique(w[got], return_inverse=True)
    f = table.read(uniq, columns=[field])[field]
    if got.all():
        stacked = f[inv.reshape(w.shape)]
    else:
        stacked = np.zeros((*w.shape, *f.shape[1:]), dtype=f.dtype)
        stacked[got] = f[inv]
    lead = (slice(None),) * (w.ndim - 1)  # batch (and window) axes; the stack axis follows
    k = request.frames.shape[-1] - 1  # frames per stack
    if request.next_frames is None:
        obs, nxt = stacked[(*lead, slice(None, k))], stacked[(*lead, slice(1, k + 1))]
    else:
        obs, nxt = stacked[(*lead, slice(None, k))], stacked[(*lead, slice(k + 2, None))]
    batch: dict[str, Any] = {**data, "obs": obs, "next_obs": nxt, "indices": rows, **request.outputs}
    if request.stream_keys is not None:
        batch["stream_keys"] = request.stream_keys
    return batch
