"""The rows of one epoch pass in a uniformly random order, reproducible from a seed and made as needed.

Up to ``IN_CACHE`` rows, the order is one in-place shuffle at the start of the pass.
Beyond that a whole-array shuffle misses the CPU caches on nearly every row (~35-85 ns
per row at 10M rows against ~9 ns at 100k), so the order is made a chunk at a time
from cache-sized pieces instead:

1. at the start of the pass the rows are cut into blocks of ``BLOCK`` consecutive rows
   and each block is shuffled on its own (in cache);
2. each chunk of ``CHUNK`` positions takes from every block a number of rows drawn from
   the multivariate hypergeometric distribution (how many of a uniformly random
   ``CHUNK``-subset of the rows not yet handed out fall in each block), namely the next
   ones of that block's shuffled order, and shuffles them (in cache).

A uniform permutation's first ``CHUNK`` rows are a uniformly random subset of the rows in
uniformly random order; the next chunk is the same over the rest, and so on. Step 2
draws exactly that: the counts have the subset's distribution over blocks, the next
rows of a uniformly shuffled block are a uniformly random subset of its remaining rows,
and the final shuffle orders them uniformly. So the order is a uniformly random
permutation at every size, at ~25 ns per row at 10M rows, spread over the pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# up to this many rows: one permutation at the start of the pass (measured per row, permutation vs
# blocked: 12 vs 22 ns at 1M rows, 19 vs 24 ns at 4M, 29 vs 25 ns at 8M; docs/PERFORMANCE.md)
IN_CACHE = 1 << 22
BLOCK = 1 << 14     # rows per block (128 KiB of row ids: shuffled in the CPU's cache)
CHUNK = 1 << 16     # positions made at a time beyond IN_CACHE


class _Blocks:
    """The not yet made part of a blocked pass order (see the module docstring)."""

    def __init__(self, rows: np.ndarray, rng: np.random.Generator) -> None:
        """``rows`` is shuffled in place (blockwise)."""
        n = len(rows)
        whole = n - n % BLOCK
        blocks = rows[:whole].reshape(-1, BLOCK)
        rng.permuted(blocks, axis=1, out=blocks)
        rng.shuffle(rows[whole:])
        self.shuffled = rows
        blocks = -(-n // BLOCK)
        self.next = np.arange(blocks, dtype=np.int64) * BLOCK  # per block: its next row in ``shuffled``
        self.left = np.full(blocks, BLOCK, dtype=np.int64)  # per block: rows not yet handed out
        self.left[-1] = n - (blocks - 1) * BLOCK
        self.remaining = n
        self.rng = rng

    def chunk(self) -> np.ndarray:
        """The next ``CHUNK`` rows of the order (fewer at its end)."""
        size = min(CHUNK, self.remaining)
        counts = self.rng.multivariate_hypergeometric(self.left, size)
        ends = np.cumsum(counts)
        where = np.repeat(self.next - (ends - counts), counts)
        where += np.arange(size)
        out = self.shuffled.take(where)
        self.rng.shuffle(out)
        self.next += counts
        self.left -= counts
        self.remaining -= size
        return out


class PassOrder:
    """``rows`` (ascending row ids) in a uniformly random order determined by ``seed``, taken
    from the front (``taken`` rows so far); :meth:`keep` drops rows not taken yet, after
    which the order is no longer the seed's (``seed`` is None)."""

    def __init__(self, rows: np.ndarray, seed: int | None) -> None:
        """``rows`` becomes the order's storage (shuffled in place); ``seed=None``: ``rows`` are
        the order itself, already made."""
        self.seed = seed
        self.taken = 0
        self._blocks: _Blocks | None = None
        self._made = rows
        if seed is not None:
            rng = np.random.default_rng(seed)
            if len(rows) > IN_CACHE:
                self._blocks, self._made = _Blocks(rows, rng), rows[:0]
            else:
                rng.shuffle(rows)
        self._at = 0  # rows of ``_made`` before this were taken

    def __len__(self) -> int:
        """Rows not taken yet."""
        return len(self._made) - self._at + (self._blocks.remaining if self._blocks is not None else 0)

    def take(self, k: int) -> np.ndarray:
        """The next ``k`` rows (fewer at the end)."""
        blocks = self._blocks
        if blocks is not None and len(self._made) - self._at < k and blocks.remaining:
            parts = [self._made[self._at:]]
            have = len(parts[0])
            while have < k and blocks.remaining:  # (one concatenation: a resume takes millions at once)
                parts.append(blocks.chunk())
                have += len(parts[-1])
            self._made, self._at = np.concatenate(parts), 0
        out = self._made[self._at:self._at + k]
        self._at += len(out)
        self.taken += len(out)
        return out

    def rest(self) -> np.ndarray:
        """The rows not taken yet, in order (makes the whole order: cost the rows not taken)."""
        blocks = self._blocks
        if blocks is not None:
            chunks = [blocks.chunk() for _ in range(-(-blocks.remaining // CHUNK))]
            self._made, self._at, self._blocks = np.concatenate([self._made[self._at:], *chunks]), 0, None
        return self._made[self._at:]

    def keep(self, mask_of: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keep, of the rows not taken yet, those where ``mask_of(rows)`` is true."""
        rest = self.rest()
        self._made, self._at, self.seed = rest[mask_of(rest)], 0, None
