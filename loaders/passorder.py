"""The rows of one epoch pass in a uniformly random order, reproducible from a seed and made as needed.

Up to ``IN_CACHE`` rows, the order is one in-place shuffle at the start of the pass.
Beyond that a whole-array shuffle misses the CPU caches on nearly every row (~35-85 ns
per row at 10M rows against ~9 ns at 100k), so the order is made from cache-sized
buckets instead (``"buckets"``, the method of every new pass):

1. at the start of the pass every position ``0..n-1`` of the pass's rows gets a uniformly
   random bucket label (``B``, a power of two: about ``BUCKET`` rows per bucket), and the
   positions are grouped by label, each bucket in ascending order (a counting sort:
   loaders/passkernels.py, or numpy's stable argsort; the same result);
2. as the pass goes, each bucket in label order is shuffled (in cache) and handed out.

This is Rao and Sandelius's method: a given order of the ``n`` rows comes out when the
labels give the buckets sizes ``c_1..c_B`` with the right rows in each (probability
``B**-n``) and each bucket's shuffle is the right one (``1 / c_b!``); summed over all
sizes, ``B**-n * sum(1 / prod(c_b!)) = B**-n * B**n / n! = 1 / n!``. So the order is a
uniformly random permutation, at ~1 in-cache shuffle and one counting sort per row.

Passes saved by earlier versions name no method; they were made in ``"blocks"``: beyond
``BLOCKS_IN_CACHE`` rows, blocks of ``BLOCK`` consecutive rows each shuffled at the pass's
start, and chunks of ``CHUNK`` positions drawn from them (a multivariate hypergeometric
draw of how many rows each block supplies, their next rows gathered and shuffled). It is
kept so that those states resume exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from replaystore.compiled import kernels
from replaystore.loaders.tracking import expand

# A seed's order depends on these sizes, and saved states name only the method: a change to
# them is a new method (keep the old one for saved states, as "blocks" is kept).

# up to this many rows: one permutation at the start of the pass ("buckets" passes; measured
# per row in docs/PERFORMANCE.md, "Epoch passes in buckets")
IN_CACHE = 1 << 19
BUCKET = 1 << 17    # rows per bucket about this (1 MiB of row ids: shuffled in the CPU's cache)
METHOD = "buckets"  # the method of new passes
METHODS = ("buckets", "blocks")
# "blocks" passes (states saved before buckets)
BLOCKS_IN_CACHE = 1 << 22
BLOCK = 1 << 14     # rows per block
CHUNK = 1 << 16     # positions made at a time


class PassRows:
    """The rows of a pass, ascending: row-id intervals (no array of every id) or an array of ids.

    Give exactly one of the two.

    Parameters
    ----------
    intervals : numpy.ndarray, optional
        Sorted disjoint ``(k, 2)`` int64 ``[lo, hi)`` row-id intervals.
    ids : numpy.ndarray, optional
        Ascending int64 row ids.
    """

    def __init__(self, *, intervals: np.ndarray | None = None, ids: np.ndarray | None = None) -> None:
        self._ids = ids
        self._iv = intervals
        if intervals is not None:
            counts = intervals[:, 1] - intervals[:, 0]
            self._ends = np.cumsum(counts)
            self._shift = intervals[:, 0] - (self._ends - counts)  # row id - position, per interval
        self.n = len(ids) if ids is not None else int(self._ends[-1]) if len(self._ends) else 0

    def __len__(self) -> int:
        """The number of rows."""
        return self.n

    def ids(self) -> np.ndarray:
        """Every row id, ascending, in an array the caller may reorder.

        Cost: linear in the rows (for intervals).

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        if self._ids is not None:
            return self._ids
        assert self._iv is not None  # one of the two is given
        return expand(self._iv)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The row ids at ``positions`` (int64, ``0 <= p < n``).

        Parameters
        ----------
        positions : numpy.ndarray
            int64 positions.

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        if self._ids is not None:
            return self._ids.take(positions)
        if len(self._shift) == 1:
            return positions + self._shift[0]
        return positions + self._shift[np.searchsorted(self._ends, positions, side="right")]

    def fingerprint(self) -> list[int]:
        """Row count and the sum of the row ids (in int64, as numpy sums them).

        Returns
        -------
        list of int
            ``[count, sum]``.
        """
        if self._ids is not None:
            return [self.n, int(np.add.reduce(self._ids, dtype=np.int64))]
        assert self._iv is not None  # one of the two is given
        total = sum((lo + hi - 1) * (hi - lo) // 2 for lo, hi in self._iv.tolist())
        return [self.n, (total + 2**63) % 2**64 - 2**63]


class _Source(Protocol):
    remaining: int

    def chunk(self) -> np.ndarray: ...


class _Buckets:
    """The not yet handed out buckets of a ``"buckets"`` pass (see the module docstring)."""

    def __init__(self, rows: PassRows, rng: np.random.Generator) -> None:
        n = len(rows)
        buckets = 1 << ((-(-n // BUCKET)) - 1).bit_length()
        width = 1 if buckets <= 1 << 8 else 2 if buckets <= 1 << 16 else 4
        labels = np.frombuffer(rng.bytes(n * width), dtype=f"<u{width}") & (buckets - 1)
        compiled = kernels("replaystore.loaders.passkernels")
        if compiled is not None:
            self.grouped = np.empty(n, np.uint32 if n <= 1 << 32 else np.int64)
            self.ends = compiled.group(labels, buckets, self.grouped)
        else:
            self.grouped = np.argsort(labels, kind="stable")
            self.ends = np.cumsum(np.bincount(labels, minlength=buckets))
        self.rows = rows
        self.rng = rng
        self.next = 0  # the next bucket to hand out
        self.remaining = n

    def chunk(self) -> np.ndarray:
        """The next non-empty bucket's rows, shuffled."""
        ends = self.ends
        while ends[self.next] == (ends[self.next - 1] if self.next else 0):
            self.next += 1
        b = self.next
        positions = self.grouped[ends[b - 1] if b else 0:ends[b]].astype(np.int64)
        self.rng.shuffle(positions)
        self.next += 1
        self.remaining -= len(positions)
        return self.rows.at(positions)


class _Blocks:
    """The not yet made part of a ``"blocks"`` pass (see the module docstring)."""

    def __init__(self, rows: np.ndarray, rng: np.random.Generator) -> None:
        """``rows`` is shuffled in place (blockwise)."""
        n = len(rows)
        whole = n - n % BLOCK
        blocks = rows[:whole].reshape(-1, BLOCK)
        rng.permuted(blocks, axis=1, out=blocks)
        rng.shuffle(rows[whole:])
        self.shuffled = rows
        nblocks = -(-n // BLOCK)
        self.next = np.arange(nblocks, dtype=np.int64) * BLOCK  # per block: its next row in ``shuffled``
        self.left = np.full(nblocks, BLOCK, dtype=np.int64)  # per block: rows not yet handed out
        self.left[-1] = n - (nblocks - 1) * BLOCK
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
    """A pass's rows in a uniformly random order determined by ``seed`` (and ``method``).

    Rows are taken from the front (``taken`` rows so far); :meth:`keep` drops
    rows not taken yet, after which the order is no longer the seed's (``seed``
    is None). Construction costs one shuffle up to the in-cache size, else one
    counting sort of bucket labels (``"buckets"``) or one blockwise shuffle
    (``"blocks"``).

    Parameters
    ----------
    rows : PassRows
        The pass's rows.
    seed : int
        Seed of the order.
    method : {"buckets", "blocks"}, optional
        How the order is made (``"blocks"``: passes saved by earlier versions).

    Raises
    ------
    ValueError
        An unknown ``method``.
    """

    def __init__(self, rows: PassRows, seed: int, method: str = METHOD) -> None:
        if method not in METHODS:
            raise ValueError(f"pass order method: expected one of {METHODS}, got {method!r}")
        self.seed: int | None = seed
        self.method = method
        self.taken = 0
        self._source: _Source | None = None
        self._made = np.zeros(0, dtype=np.int64)
        self._at = 0  # rows of ``_made`` before this were taken
        rng = np.random.default_rng(seed)
        if len(rows) <= (IN_CACHE if method == "buckets" else BLOCKS_IN_CACHE):
            self._made = rows.ids()
            rng.shuffle(self._made)
        elif method == "buckets":
            self._source = _Buckets(rows, rng)
        else:
            self._source = _Blocks(rows.ids(), rng)

    @classmethod
    def made(cls, order: np.ndarray) -> PassOrder:
        """An order already made (no seed): ``order`` itself.

        Parameters
        ----------
        order : numpy.ndarray
            int64 row ids in order.

        Returns
        -------
        PassOrder
            An order that hands out ``order``.
        """
        self = cls(PassRows(ids=np.zeros(0, dtype=np.int64)), 0)
        self.seed, self._made = None, order
        return self

    def __len__(self) -> int:
        """Rows not taken yet."""
        return len(self._made) - self._at + (self._source.remaining if self._source is not None else 0)

    def take(self, k: int) -> np.ndarray:
        """The next ``k`` rows (fewer at the end).

        Cost: ``k``, plus making the buckets or chunks it reaches.

        Parameters
        ----------
        k : int
            Rows to take.

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        source = self._source
        if source is not None and len(self._made) - self._at < k and source.remaining:
            parts = [self._made[self._at:]]
            have = len(parts[0])
            while have < k and source.remaining:  # (one concatenation: a resume takes millions at once)
                parts.append(source.chunk())
                have += len(parts[-1])
            self._made, self._at = np.concatenate(parts), 0
        out = self._made[self._at:self._at + k]
        self._at += len(out)
        self.taken += len(out)
        return out

    def rest(self) -> np.ndarray:
        """The rows not taken yet, in order (makes the whole order: cost the rows not taken).

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        source = self._source
        if source is not None:
            chunks = [self._made[self._at:]]
            while source.remaining:
                chunks.append(source.chunk())
            self._made, self._at, self._source = np.concatenate(chunks), 0, None
        return self._made[self._at:]

    def keep(self, mask_of: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keep, of the rows not taken yet, those where ``mask_of(rows)`` is true.

        Cost: :meth:`rest`, plus the mask.

        Parameters
        ----------
        mask_of : callable
            Maps an array of row ids to a bool array of the same length.
        """
        rest = self.rest()
        self._made, self._at, self.seed = rest[mask_of(rest)], 0, None
