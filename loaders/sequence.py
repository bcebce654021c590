"""Contiguous sequence windows with burn-in, per the sequence replay contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import StoreError
from replaystore.loaders.base import Request, StoreSampler


@dataclass
class Windows:
    """Every legal window of the current view, by the position of its first learning step.

    Positions index the table's stream index (sorted by stream, then step).
    ``start`` is the position of the window's first real step and ``pad`` its
    number of left-padded slots.
    """

    learn: np.ndarray
    start: np.ndarray
    pad: np.ndarray


def legal_windows(stream_ids: np.ndarray, steps: np.ndarray, resets: np.ndarray, length: int, burn_in: int,
                  ) -> Windows:
    """Windows of ``burn_in + length`` steps that respect the contract.

    The ``length`` learning steps must be consecutive steps of one stream (no
    stream switch, no step gap). The burn-in context is the up-to-``burn_in``
    consecutive steps before them, cut at the latest reset inside it (a reset is a
    recurrent boundary, so context before it is not used). Fewer than ``burn_in``
    context steps are legal only when the context starts at an explicit reset; the
    missing slots are left-padded.
    """
    m = len(steps)
    pos = np.arange(m, dtype=np.int64)
    brk = np.ones(m, dtype=bool)
    brk[1:] = (stream_ids[1:] != stream_ids[:-1]) | (steps[1:] != steps[:-1] + 1)
    run_starts = np.flatnonzero(brk)
    run_id = np.cumsum(brk) - 1
    run_start = run_starts[run_id] if m else pos
    run_end = np.r_[run_starts[1:], m][run_id] if m else pos
    last_reset = np.maximum.accumulate(np.where(resets, pos, -1)) if m else pos
    ctx = np.minimum(burn_in, pos - run_start)
    has_reset = last_reset >= pos - ctx
    start = np.where(has_reset, last_reset, pos - burn_in)
    ok = (run_end - pos >= length) & (has_reset | (ctx == burn_in))
    return Windows(pos[ok], start[ok], (burn_in - (pos - start))[ok])


class SequenceSampler(StoreSampler):
    """Minibatches of ``batch_size`` windows of ``burn_in + length`` steps, with replacement.

    Each window lies inside one stream and one run of consecutive steps. Outputs
    (shape ``[batch, burn_in + length]``): ``indices`` (row ids, -1 on padding),
    ``loss_mask`` (learning steps only), ``sequence_valid`` (real, not padded),
    ``steps`` (-1 on padding), ``reset`` (recurrent boundaries; a learner resets
    its state there), and per window ``stream_keys`` (the stream key) and ``stream``
    (the table's current internal stream number; valid until the store changes).
    With ``burn_in=0, length=1`` it is plain transition sampling. ``subset``
    restricts the rows a window's first learning step may be.
    """

    kind = "sequence"

    def __init__(self, store: Any, length: int, burn_in: int = 0, batch_size: int = 32, seed: int = 0,
                 **kwargs: Any) -> None:
        if not isinstance(length, int) or length <= 0:
            raise StoreError(f"length: expected a positive int, got {length!r}")
        if not isinstance(burn_in, int) or burn_in < 0:
            raise StoreError(f"burn_in: expected an int >= 0, got {burn_in!r}")
        self.length = length
        self.burn_in = burn_in
        self._version = -1
        self._windows: Windows | None = None
        super().__init__(store, batch_size, seed, **kwargs)

    @property
    def window(self) -> int:
        return self.burn_in + self.length

    def windows(self) -> Windows:
        reader = self.table.reader
        reader.sync()
        if self._windows is None or reader.log.version != self._version:
            index = reader.index
            w = legal_windows(index.stream_ids, index.steps, index.resets, self.length, self.burn_in)
            if self.subset is not None:
                keep = np.isin(index.rows[w.learn], self.subset)
                w = Windows(w.learn[keep], w.start[keep], w.pad[keep])
            self._windows, self._version = w, reader.log.version
        return self._windows

    def sample(self) -> Request:
        w = self.windows()
        if not len(w.learn):
            raise self._empty(f"windows of {self.burn_in} + {self.length} steps")
        index = self.table.reader.index
        pick = self.rng.integers(0, len(w.learn), size=self.batch_size)
        start, pad = w.start[pick], w.pad[pick]
        offset = np.arange(self.window, dtype=np.int64)
        real = offset[None, :] >= pad[:, None]
        pos = np.where(real, start[:, None] + offset[None, :] - pad[:, None], 0)
        rows = np.where(real, index.rows[pos], -1)
        outputs = {
            "loss_mask": np.broadcast_to(offset >= self.burn_in, real.shape).copy(),
            "sequence_valid": real,
            "steps": np.where(real, index.steps[pos], -1),
            "reset": real & index.resets[pos],
            "stream": index.stream_ids[w.learn[pick]],
        }
        self.batches_drawn += 1
        keys = [index.keys[g] for g in outputs["stream"]]
        return Request(rows, outputs, sequence=True, stream_keys=keys)
