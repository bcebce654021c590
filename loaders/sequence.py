"""Contiguous sequence windows with burn-in, per the sequence replay contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.limits import MAX_WINDOW, check_size
from replaystore.segments import Segments, grown
from replaystore.store import StreamIndex


@dataclass
class Windows:
    """Every legal window of the current view, by the position of its first learning step.

    Positions index the table's stream index (sorted by stream, then step).

    Attributes
    ----------
    learn : numpy.ndarray
        int64 position of each window's first learning step.
    start : numpy.ndarray
        int64 position of each window's first real step.
    pad : numpy.ndarray
        int64 number of left-padded slots of each window.
    """

    learn: np.ndarray
    start: np.ndarray
    pad: np.ndarray


def legal_windows(stream_ids: np.ndarray, steps: np.ndarray, resets: np.ndarray, length: int, burn_in: int,
                  ) -> Windows:
    """Windows of ``burn_in + length`` steps that respect the contract.

    The ``length`` learning steps must be consecutive steps of one stream (no
    stream switch, no step gap). The burn-in context is the up-to-``burn_in``
    consecutive steps before them, cut at the latest reset inside it (a reset is
    a recurrent boundary, so context before it is not used). Fewer than
    ``burn_in`` context steps are legal only when the context starts at an
    explicit reset; the missing slots are left-padded. Cost: a few vectorised
    passes over the entries.

    Parameters
    ----------
    stream_ids : numpy.ndarray
        Dense stream id of each entry, entries sorted by stream then step.
    steps : numpy.ndarray
        Step of each entry.
    resets : numpy.ndarray
        Bool: whether each entry starts a recurrent episode.
    length : int
        Learning steps per window.
    burn_in : int
        Context steps before them.

    Returns
    -------
    Windows
        Every legal window, in entry order.
    """
    m = len(steps)
    pos = np.arange(m, dtype=np.int64)
    if not m:
        return Windows(pos, pos.copy(), pos.copy())
    # entry p starts a run: a new stream or a step gap
    brk = np.empty(m, dtype=bool)
    brk[0] = True
    np.not_equal(stream_ids[1:], stream_ids[:-1], out=brk[1:])
    brk[1:] |= np.subtract(steps[1:], steps[:-1]) != 1
    run_start = np.where(brk, pos, 0)  # of the run holding each entry
    np.maximum.accumulate(run_start, out=run_start)
    last_reset = np.where(resets, pos, -1)
    np.maximum.accumulate(last_reset, out=last_reset)
    # the burn-in context starts at the later of pos - burn_in and the run's start, and is cut
    # at the latest reset inside it; with no reset it must be whole
    start = pos - burn_in
    whole = start >= run_start
    np.maximum(start, run_start, out=start)
    has_reset = last_reset >= start
    np.copyto(start, last_reset, where=has_reset)
    # the learning steps pos .. pos + length - 1 lie in pos's run
    ok = np.zeros(m, dtype=bool)
    if length <= m:
        np.equal(run_start[length - 1:], run_start[:m - length + 1], out=ok[:m - length + 1])
    ok &= has_reset | whole
    learn = np.flatnonzero(ok)
    start = start[ok]
    return Windows(learn, start, burn_in - (learn - start))


_COLUMNS = {"learn": np.dtype(np.int64), "start": np.dtype(np.int64), "pad": np.dtype(np.int64)}


class StreamWindows:
    """The legal windows of every stream of a :class:`StreamIndex`, followed across its changes.

    Windows are kept per index slot (stream) in :class:`Segments`, as relative
    positions of the index's segments, sorted by first learning step. After an
    index change only the streams it touched are revisited: entries appended
    after a stream's last step add the windows that end in them (cost: the
    entries appended, plus ``burn_in + length`` of context), oldest entries
    dropped drop the windows that used them (a prefix: cost log), and a stream
    the index rewrote (out-of-order arrival, eviction inside the stream) has its
    windows recomputed (cost: that stream). A new index object (the table rebuilt
    it) means a full recomputation. Windows are drawn in the order of
    :func:`legal_windows` on the index's dense views (stream id, then step), so a
    sampler that followed the changes and one built afresh draw the same windows
    from the same random numbers. Construction costs one pass over the index.

    Parameters
    ----------
    index : StreamIndex
        The table's stream index, followed by :meth:`follow`.
    length : int
        Learning steps per window.
    burn_in : int
        Context steps before them.
    subset : numpy.ndarray, optional
        Sorted row ids a window's first learning step must be one of.
    """

    def __init__(self, index: StreamIndex, length: int, burn_in: int, subset: np.ndarray | None) -> None:
        self.index, self.length, self.burn_in, self.subset = index, length, burn_in, subset
        w = legal_windows(index.stream_ids, index.steps, index.resets, length, burn_in)
        w = self._keep(w, index.rows)
        gids = index.stream_ids[w.learn]
        bounds = np.searchsorted(gids, np.arange(len(index.keys) + 1)).astype(np.int64)
        shift = np.repeat(index.dense_start()[index.order], np.diff(bounds))
        cols = {"learn": w.learn - shift, "start": w.start - shift, "pad": w.pad}
        self.seg = Segments(_COLUMNS, cols, bounds, slack=max(len(w.learn) // 8, 1024), slot_order=index.order,
                            slots=index.seg.slots)
        self._seen(index)

    def _keep(self, w: Windows, rows: np.ndarray) -> Windows:
        """Only windows whose first learning step's row is in the subset (if any)."""
        if self.subset is None or not len(w.learn):
            return w
        r = rows[w.learn]
        pos = np.minimum(np.searchsorted(self.subset, r), max(len(self.subset) - 1, 0))
        keep = self.subset[pos] == r if len(self.subset) else np.zeros(len(r), bool)
        return Windows(w.learn[keep], w.start[keep], w.pad[keep])

    def _seen(self, index: StreamIndex) -> None:
        """Per-slot state as of the index's current version, all slots."""
        self.version = index.version
        self.stamp = index.stamp.copy()
        self.rel_lo, self.rel_hi = index.seg.rel_lo(), index.seg.rel_hi()
        self._count()

    def _count(self) -> None:
        counts = (self.seg.hi - self.seg.lo)[self.index.order]
        self.cum = np.cumsum(counts)
        self.first = self.cum - counts

    def follow(self) -> None:
        """Bring the windows up to the index's current version.

        Cost: the streams touched since, as the index remembers them; else one
        vectorised pass over every stream.
        """
        index = self.index
        if index.version == self.version:
            return
        n = index.seg.slots
        self.seg.add_slots(n - self.seg.slots)
        self.stamp = grown(self.stamp, n, -1)
        self.rel_lo, self.rel_hi = grown(self.rel_lo, n, 0), grown(self.rel_hi, n, 0)
        cand = index.touched_since(self.version)
        if cand is None:
            cand = np.arange(n, dtype=np.int64)
        stamp, rel_lo = index.stamp[cand], index.seg.lo[cand] - index.seg.origin[cand]
        rel_hi = index.seg.hi[cand] - index.seg.origin[cand]
        old_stamp, old_lo, old_hi = self.stamp[cand], self.rel_lo[cand], self.rel_hi[cand]
        self.stamp[cand], self.rel_lo[cand], self.rel_hi[cand] = stamp, rel_lo, rel_hi
        self.version = index.version
        jobs: list[tuple[int, int, int, int, bool]] = []  # (slot, first, ctx, hi, replace)
        for i in np.flatnonzero((stamp != old_stamp) | (rel_lo != old_lo) | (rel_hi != old_hi)).tolist():
            s, lo, hi = int(cand[i]), int(rel_lo[i]), int(rel_hi[i])
            if stamp[i] != old_stamp[i]:
                jobs.append((s, lo, lo, hi, True))
                continue
            if lo > old_lo[i]:  # oldest entries dropped: windows using them go (a prefix)
                self.seg.drop_head(s, int(np.searchsorted(self.seg.view(s, "start"), lo)))
            if hi > old_hi[i]:  # entries appended: windows ending in them
                first = max(lo, int(old_hi[i]) - self.length + 1)
                jobs.append((s, first, max(lo, first - self.burn_in), hi, False))
        if jobs:
            self._windows_of(jobs)
        self._count()

    def _windows_of(self, jobs: list[tuple[int, int, int, int, bool]]) -> None:
        """Compute the legal windows of each job ``(slot, first, ctx, hi, replace)``, in one call.

        For each job: the slot's windows whose first learning step is at relative position
        ``>= first``, from its entries ``[ctx, hi)``; they replace the slot's windows or are
        appended. One :func:`legal_windows` call for all jobs.
        """
        seg = self.index.seg
        at = np.array([seg.origin[s] + ctx for s, _, ctx, _, _ in jobs], dtype=np.int64)
        counts = np.array([hi - ctx for _, _, ctx, hi, _ in jobs], dtype=np.int64)
        bounds = np.zeros(len(jobs) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        pos = np.repeat(at - bounds[:-1], counts) + np.arange(int(bounds[-1]), dtype=np.int64)
        w = legal_windows(np.repeat(np.arange(len(jobs), dtype=np.int64), counts), seg.cols["steps"][pos],
                          seg.cols["resets"][pos], self.length, self.burn_in)
        w = self._keep(w, seg.cols["rows"][pos])
        cuts = np.searchsorted(w.learn, bounds).tolist()
        for j, (s, first, ctx, _, replace) in enumerate(jobs):
            shift = ctx - int(bounds[j])
            learn = w.learn[cuts[j]:cuts[j + 1]] + shift
            keep = learn >= first
            cols = {"learn": learn[keep], "start": w.start[cuts[j]:cuts[j + 1]][keep] + shift,
                    "pad": w.pad[cuts[j]:cuts[j + 1]][keep]}
            if replace:
                self.seg.replace(s, cols)
            else:
                self.seg.append(s, cols)

    def __len__(self) -> int:
        """The number of legal windows."""
        return int(self.cum[-1]) if len(self.cum) else 0

    def pick(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Windows number ``k`` (in draw order).

        Cost: a binary search per window.

        Parameters
        ----------
        k : numpy.ndarray
            Window numbers in ``[0, len(self))``.

        Returns
        -------
        stream : numpy.ndarray
            Dense stream id of each window.
        start : numpy.ndarray
            Buffer position of its first real step in the index's columns.
        pad : numpy.ndarray
            Its number of left-padded slots.
        """
        g = np.searchsorted(self.cum, k, side="right")
        slot = self.index.order[g]
        at = self.seg.lo[slot] + (k - self.first[g])
        start = self.seg.cols["start"][at] + self.index.seg.origin[slot]
        return g, start, self.seg.cols["pad"][at]

    def dense(self) -> Windows:
        """Every window in draw order, as positions of the index's dense views.

        Cost: linear in the number of windows.

        Returns
        -------
        Windows
            The windows.
        """
        at, counts = self.seg.positions(self.index.order)
        shift = np.repeat(self.index.dense_start()[self.index.order], counts)
        c = self.seg.cols
        return Windows(c["learn"][at] + shift, c["start"][at] + shift, c["pad"][at])


class SequenceSampler(StoreSampler):
    """Minibatches of ``batch_size`` windows of ``burn_in + length`` steps, with replacement.

    Each window lies inside one stream and one run of consecutive steps. Outputs
    (shape ``[batch, burn_in + length]``): ``indices`` (row ids, -1 on padding),
    ``loss_mask`` (learning steps only), ``sequence_valid`` (real, not padded),
    ``steps`` (-1 on padding), ``reset`` (recurrent boundaries; a learner resets
    its state there), and per window ``stream_keys`` (the stream key) and
    ``stream`` (the table's current internal stream number; valid until the
    store changes). With ``burn_in=0, length=1`` it is plain transition
    sampling. ``subset`` restricts the rows a window's first learning step may
    be. ``length`` and ``burn_in`` are overridable on resume (windows are then
    rebuilt from the stream index). With ``stack=k`` every slot carries ``obs`` and
    ``next_obs`` (``[batch, window, k, *frame]``) stacked within the slot's own
    episode, the frame field is left out, and ``next_valid`` marks the slots whose
    record has a next frame (elsewhere ``next_obs`` ends in zeros).

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    length : int
        Learning steps per window; a positive int.
    burn_in : int, optional
        Context steps before them; an int >= 0.
    batch_size : int, optional
        Windows per minibatch.
    seed : int, optional
        Seed of the sampler's RNG.
    **kwargs
        :class:`StoreSampler`'s keyword arguments.

    Raises
    ------
    SamplerParameterError
        ``length`` is not an int in ``[1, MAX_WINDOW]`` (2**16), ``burn_in`` not an int
        >= 0 with ``burn_in + length`` at most ``MAX_WINDOW``; see also :class:`StoreSampler`.
    """

    kind = "sequence"

    def __init__(self, store: Any, length: int, burn_in: int = 0, batch_size: int = 32, seed: int = 0,
                 **kwargs: Any) -> None:
        length = check_size("length", length, MAX_WINDOW)
        burn_in = check_size("burn_in", burn_in, MAX_WINDOW - length, lo=0)
        self.length = length
        self.burn_in = burn_in
        self._windows: StreamWindows | None = None
        super().__init__(store, batch_size, seed, **kwargs)

    overridable = StoreSampler.overridable | {"length", "burn_in"}
    """``length``/``burn_in`` overridden on resume: windows are rebuilt from the stream index."""

    def hyperparameters(self) -> dict[str, Any]:
        """The base hyperparameters and ``length``, ``burn_in``.

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        return {**super().hyperparameters(), "length": self.length, "burn_in": self.burn_in}

    def _override(self, given: dict[str, Any], diff: dict[str, tuple[Any, Any]]) -> None:
        super()._override(given, diff)
        self._windows = None  # rebuilt for the given window on next use

    @property
    def window(self) -> int:
        """Slots per window: ``burn_in + length``."""
        return self.burn_in + self.length

    def _followed(self) -> StreamWindows:
        """The legal windows, brought up to date with the table (cost: what changed)."""
        index = self.table.stream_index()
        if self._windows is None or self._windows.index is not index:
            self._windows = StreamWindows(index, self.length, self.burn_in, self.subset)
        self._windows.follow()
        return self._windows

    def windows(self) -> Windows:
        """Every legal window, in draw order.

        Windows are given as positions of the table's stream index (``table.stream_index()``)
        dense views.

        Cost: the table (inspection, not sampling).

        Returns
        -------
        Windows
            The windows.
        """
        return self._followed().dense()

    def draw(self) -> Request:
        """Draw ``batch_size`` legal windows uniformly with replacement.

        Cost: following the table's changes since the last call, then
        O(batch_size * window).

        Returns
        -------
        Request
            A sequence request: ``[batch, window]`` rows (-1 on padding), the
            outputs listed in the class docstring, and each window's stream key.

        Raises
        ------
        EmptyStoreError
            No legal window exists.
        """
        w = self._followed()
        if not len(w):
            raise self._empty(f"windows of {self.burn_in} + {self.length} steps")
        cols = w.index.seg.cols
        gid, start, pad = w.pick(self.rng.integers(0, len(w), size=self.batch_size))
        offset = np.arange(self.window, dtype=np.int64)
        real = offset[None, :] >= pad[:, None]
        pos = np.where(real, start[:, None] + offset[None, :] - pad[:, None], start[:, None])
        rows = np.where(real, cols["rows"][pos], -1)
        outputs = {
            "loss_mask": np.broadcast_to(offset >= self.burn_in, real.shape).copy(),
            "sequence_valid": real,
            "steps": np.where(real, cols["steps"][pos], -1),
            "reset": real & cols["resets"][pos],
            "stream": gid,
        }
        self.batches_drawn += 1
        keys = [w.index.keys[g] for g in gid.tolist()]
        return Request(rows, outputs, sequence=True, stream_keys=keys)
