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

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import SamplerParameterError
from replaystore.loaders.follow import EntryFollower, SortedRows
from replaystore.loaders.limits import MAX_WINDOW, check_size
from replaystore.store import StreamIndex, Table

PADDINGS = ("reset", "zero")
"""``stack_padding`` values: repeat the episode's first frame, or zeros (gymnasium's ``padding_type``)."""


class FrameIndex(EntryFollower):
    """Per visible row: its stream position, its episode's first position, and whether it has a next frame.

    Kept per row as the row's stream slot and relative position in the :class:`StreamIndex`'s
    segments, the relative position of its episode's first entry, and its next-frame flag,
    with the ascending drawable rows (:attr:`valid_rows`) and the others (:attr:`invalid_rows`).
    With ``table`` the index follows the table (:meth:`sync`): after a commit or eviction
    of k records the update costs O(k) (an append recomputes the entries appended and the
    one before each, a head eviction only drops rows; a stream the stream index rewrote is
    recomputed whole), and the results are those of an index built afresh.

    Parameters
    ----------
    index : StreamIndex
        The table's stream index (the one built from).
    table : Table, optional
        The table whose view ``index`` describes: :meth:`sync` then follows its changes.
        Without it the index describes ``index`` as it is.
    """

    columns = {"start": (np.int64, 0), "next": (np.int8, -1)}  # next: -1 for a row not yet computed

    def __init__(self, index: StreamIndex, table: Table | None = None) -> None:
        super().__init__(table)  # type: ignore[arg-type]
        self.key = (id(self), self.changes)
        if table is None:
            self._build(index, np.sort(index.rows))
        else:
            self.sync()

    def _cleared(self) -> None:
        self._valid = SortedRows()
        self._invalid = SortedRows()

    def sync(self) -> bool:
        """Bring the index up to the table's current view, and :attr:`key` with it.

        Returns
        -------
        bool
            Whether anything changed. Cost: see :meth:`EntryFollower.sync`.
        """
        changed = super().sync()
        self.key = (id(self), self.changes)
        return changed

    @property
    def valid_rows(self) -> np.ndarray:
        """Ascending row ids that have a next frame in their episode (the drawable ones; valid until a change)."""
        return self._valid.values

    @property
    def invalid_rows(self) -> np.ndarray:
        """Ascending visible row ids without one (episode ends, frame-only records; valid until a change)."""
        return self._invalid.values

    def _removed(self, iv: np.ndarray) -> None:
        self._valid.remove_in(iv)
        self._invalid.remove_in(iv)

    def _first(self, index: StreamIndex, s: np.ndarray, lo: np.ndarray, old_hi: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray]:
        first = np.maximum(old_hi - 1, lo)  # the entry before the appended ones gains a next frame
        return np.maximum(first - 1, lo), first  # and the one before it carries the episode's start

    def _compute(self, jid: np.ndarray, bounds: np.ndarray, has_ctx: np.ndarray, rows: np.ndarray,
                 steps: np.ndarray, resets: np.ndarray, slots: np.ndarray, rel: np.ndarray,
                 write: np.ndarray) -> None:
        m = len(rows)
        i = np.arange(m, dtype=np.int64)
        brk = np.ones(m, dtype=bool)  # entry starts an episode: first, new stream, step gap, or reset
        if m > 1:
            brk[1:] = (jid[1:] != jid[:-1]) | (steps[1:] - steps[:-1] != 1) | resets[1:]
        at = np.where(brk, i, 0)
        np.maximum.accumulate(at, out=at)
        start = rel[at]
        carry = has_ctx[jid] & (at == bounds[:-1][jid])  # the episode began before the context entry
        start[carry] = self.cols["start"][slots[at[carry]]]
        nxt = np.zeros(m, dtype=np.int8)
        nxt[:-1] = ~brk[1:]
        w = slots[write]
        old, new = self.cols["next"][w], nxt[write]
        self.cols["start"][w] = start[write]
        self.cols["next"][w] = new
        r = rows[write]
        self._valid.remove(np.sort(r[(old == 1) & (new == 0)]))
        self._invalid.remove(np.sort(r[(old == 0) & (new == 1)]))
        self._valid.add(np.sort(r[(old != 1) & (new == 1)]))
        self._invalid.add(np.sort(r[(old != 0) & (new == 0)]))

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Positions of visible row ids in the stream index's column buffers (``index.seg.cols``).

        Cost: a binary search per row (none when the rows are one run of slots).

        Parameters
        ----------
        rows : numpy.ndarray
            Visible row ids.

        Returns
        -------
        numpy.ndarray
            int64 positions.
        """
        return self.locate(np.asarray(rows, dtype=np.int64))[2]

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
        slots, found = self.slots.lookup(np.asarray(rows, dtype=np.int64))
        return found & (self.cols["next"][slots] == 1)

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
        assert self.index is not None
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        buf = self.index.seg.cols["rows"]
        if not len(self.slots):
            return np.full((*np.shape(rows), stack + 1), -1, dtype=np.int64)
        slots, real, p, origin, lo = self.locate(flat)
        first = np.maximum(origin + self.cols["start"][slots], origin + lo)
        has = real & (self.cols["next"][slots] == 1)
        p = np.where(real, p, 0)
        first = np.where(real, first, 0)
        w = p[:, None] + np.arange(1 - stack, 2, dtype=np.int64)[None, :]
        before = w < first[:, None]
        np.maximum(w, first[:, None], out=w)
        w[:, -1] = np.where(has, w[:, -1], p)  # (overwritten with -1 below)
        out = buf[w]
        if padding == "zero":
            out[before] = -1
        out[~has, -1] = -1
        out[~real] = -1
        return out.reshape((*np.shape(rows), stack + 1))


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
        """The frame index of the table's current view (followed across the table's changes).

        Returns
        -------
        FrameIndex
            Cost: nothing when unchanged; else, after commits and evictions of k records,
            O(k) (:meth:`FrameIndex.sync`); the first call builds it (a sort of the visible rows).
        """
        if self._index is None:
            self._index = FrameIndex(self.table.stream_index(), self.table)
        else:
            self._index.sync()
        return self._index


@dataclass
class FrameWindows:
    """Stacking's payload in a request: the frame rows of each drawn row's stacks, gathered where it is gathered.

    Attributes
    ----------
    frames : numpy.ndarray
        int64 ``[*rows.shape, stack + 1]`` frame row ids (:meth:`FrameIndex.windows`), -1 for
        zero slots; ``obs`` is the first ``stack``, ``next_obs`` the last ``stack``.
    field : str
        The frame field.
    next_frames : numpy.ndarray, optional
        With n-step windows: the frame windows of each window's last row (same shape);
        ``next_obs`` is their last ``stack`` frames instead.
    """

    frames: np.ndarray
    field: str
    next_frames: np.ndarray | None = None

    def reads(self) -> tuple[str, ...]:
        """The record field the plain gather leaves to :meth:`apply`: the frame field.

        Returns
        -------
        tuple of str
            ``(field,)``.
        """
        return (self.field,)

    def apply(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        """Add ``obs`` and ``next_obs`` (``(*rows.shape, stack, *frame)``) to a minibatch gathered without frames.

        Each distinct frame is read once (ascending rows, ``next_frames`` included);
        zero-padding slots are zeros. ``obs`` and ``next_obs`` come right before ``indices``.

        Parameters
        ----------
        table : Table
            The table to read (this process's handle).
        batch : dict of str to Any
            The gathered minibatch (numpy arrays), without the frame field.

        Returns
        -------
        dict of str to Any
            A new dict. Cost: one read of the distinct frames.

        Raises
        ------
        RowError, StaleReadError
            As ``Table.read``.
        """
        field = self.field
        w = self.frames
        if self.next_frames is not None:  # n-step: next_obs follows each window's last row
            w = np.concatenate([w, self.next_frames], axis=-1)
        got = w >= 0
        uniq, inv = np.unique(w[got], return_inverse=True)
        f = table.read(uniq, columns=[field])[field]
        at = np.full(w.shape, -1, dtype=np.int64)  # each slot's row of f, -1 for a zero slot
        at[got] = inv.reshape(-1)
        k = self.frames.shape[-1] - 1  # frames per stack
        # obs and next_obs each gathered straight from f (contiguous, one copy each)
        obs = _frames_at(f, at[..., :k])
        nxt = _frames_at(f, at[..., 1:k + 1] if self.next_frames is None else at[..., k + 2:])
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if name == "indices":
                out["obs"], out["next_obs"] = obs, nxt
            out[name] = value
        if "obs" not in out:
            out["obs"], out["next_obs"] = obs, nxt
        return out


def _frames_at(f: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Rows ``at`` of ``f`` (shape ``(*at.shape, *f.shape[1:])``, C-contiguous), zeros where ``at`` is -1."""
    if not at.size or at.min() >= 0:
        return f.take(at, axis=0)
    out = np.zeros((*at.shape, *f.shape[1:]), dtype=f.dtype)
    real = at >= 0
    out[real] = f.take(at[real], axis=0)
    return out
