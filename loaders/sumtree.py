"""A vectorised sum tree: O(log n) batched updates and prefix-sum sampling in numpy."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from replaystore.compiled import kernels

# ``find`` starts at the level of this many nodes (or the quads', if fewer): one searchsorted
# over that level's prefix sums replaces the ~4 numpy calls of each level above it. Levels
# above it are not kept: the total is the last of those prefix sums. ``set`` recomputes the
# top level whole (one strided add, cheaper than the sparse path's four calls).
SEARCH_TOP = 1024

_accumulate = np.add.accumulate


def compiled_kernels() -> ModuleType | None:
    """The numba kernels (loaders/treekernels.py) or None (replaystore/compiled.py); asked
    when a tree is made or grown."""
    return kernels("replaystore.loaders.treekernels")


class SumTree:
    """Leaf values (priorities^alpha) in a complete binary tree stored as one array.

    Node i has children 2i and 2i+1; leaves live at ``tree[size + leaf]``. The nodes kept
    are those from the level of ``top`` nodes (``tree[top:2 * top]``) down to the level of
    *quads*, one node per four leaves (``tree[size // 4 + q]`` = the pairwise sum of leaves
    4q..4q+3); the level between quads and leaves is not kept: ``find`` resolves a quad's
    four leaves with three running sums, cheaper than two more levels. Every kept node is
    always the pairwise sum of what is under it, recomputed from it, so no value depends on
    the order or batching of updates. ``find`` searches the running sums of the top level
    (cached until the next ``set``; their last is the total), then descends the binary
    levels under it. Every operation handles a whole batch of leaves with a few numpy
    calls per level: the per-call overhead, not the batch size, dominates at minibatch
    sizes (docs/PERFORMANCE.md, "Loaders"). With numba installed, the sparse ``set`` and
    ``find`` run as compiled kernels doing the same arithmetic (:func:`compiled_kernels`):
    the same tree and the same leaves found, at about half the cost.
    """

    def __init__(self, size: int) -> None:
        self.size = max(1 << max(int(size) - 1, 1).bit_length(), 4)
        self.quads = self.size >> 2
        self.tree = np.zeros(2 * self.size, dtype=np.float64)
        self.top = min(SEARCH_TOP, self.quads)
        self._prefix: np.ndarray | None = None  # running sums of the top level from 0; None: stale
        # the kernels assume levels between the quads and the top
        self._kernels = compiled_kernels() if self.top < self.quads else None

    @property
    def total(self) -> float:
        return float(self._prefixes()[-1])

    def leaves(self) -> np.ndarray:
        return self.tree[self.size:]

    def _prefixes(self) -> np.ndarray:
        """``[0, p_1, ..., p_top]``: running sums of the top level (``p_top`` is the total)."""
        if self._prefix is None:
            top = self.top
            self._prefix = np.zeros(top + 1)
            _accumulate(self.tree[top:2 * top], out=self._prefix[1:])
        return self._prefix

    def _quad_sums(self, leaves: np.ndarray) -> np.ndarray:
        """Pairwise sums of rows of four leaves (``leaves``: shape ``(k, 4)``)."""
        return (leaves[:, 0] + leaves[:, 1]) + (leaves[:, 2] + leaves[:, 3])

    def _recompute(self, lo: int) -> None:
        """Recompute every node of the levels from ``lo`` (a power of two: its first node) up to the top."""
        tree = self.tree
        if lo == self.quads:
            tree[lo:2 * lo] = self._quad_sums(self.leaves().reshape(-1, 4))
            lo >>= 1
        while lo >= self.top:
            np.add(tree[2 * lo:4 * lo:2], tree[2 * lo + 1:4 * lo:2], out=tree[lo:2 * lo])
            lo >>= 1

    def set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set leaf values (the last write wins for repeated leaves) and refresh their ancestors."""
        leaves = np.asarray(leaves, dtype=np.int64)
        if not leaves.size:
            return
        tree = self.tree
        self._prefix = None
        if self._kernels is not None and leaves.size * 8 < self.size:
            leaves = np.ascontiguousarray(leaves.reshape(-1))
            values = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64), leaves.shape))
            self._kernels.set_sparse(tree, self.size, self.quads, self.top, leaves, values)
            return
        tree[self.size + leaves] = values
        if leaves.size * 8 >= self.size:  # a large share of the leaves: rebuild every level whole
            self._recompute(self.quads)
            return
        # sparse levels: only the ancestors of the changed leaves (a node listed twice is written
        # twice with the same sum of the same children: harmless)
        quad = leaves >> 2
        nodes = quad + self.quads
        tree.put(nodes, self._quad_sums(self.leaves().reshape(-1, 4).take(quad, axis=0)))
        pairs = tree.reshape(-1, 2)  # row i = (tree[2i], tree[2i+1]): the children of node i
        lo = self.quads
        while (lo := lo >> 1) > self.top:  # the levels between the quads and the top
            nodes >>= 1
            c = pairs.take(nodes, axis=0)
            tree.put(nodes, c[:, 0] + c[:, 1])
        if self.top < self.quads:
            self._recompute(self.top)  # the top level, whole

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For prefix sums ``0 <= t < total``, the leaf whose cumulative range holds each t."""
        if self._kernels is not None:
            leaf = np.empty(len(targets), dtype=np.int64)
            self._kernels.find(self.tree, self._prefixes(), self.top, self.quads,
                               self.quads.bit_length() - self.top.bit_length(),
                               np.ascontiguousarray(targets, dtype=np.float64).reshape(-1), leaf)
            return self._off_zero(leaf)
        t = np.array(targets, dtype=np.float64)  # a copy: reduced in place below
        tree = self.tree
        top = self.top
        prefix = self._prefixes()
        # count of the top nodes passed (prefix sum <= t): at most top-1, so slack stays in the last
        node = prefix[1:top].searchsorted(t, side="right")
        t -= prefix.take(node)
        node += top
        for _ in range(self.quads.bit_length() - top.bit_length()):
            node <<= 1  # the left child
            lv = tree.take(node)
            go_right = t >= lv
            np.putmask(t, go_right, t - lv)  # t -= lv where going right (cheaper than where=)
            node += go_right
        # the quad's leaf: how many of its first three running sums are <= t
        node -= self.quads
        four = self.leaves().reshape(-1, 4).take(node, axis=0)
        run = four[:, 0].copy()
        leaf = (t >= run).astype(np.int64)
        run += four[:, 1]
        leaf += t >= run
        run += four[:, 2]
        leaf += t >= run
        leaf += node << 2
        return self._off_zero(leaf)

    def _off_zero(self, leaf: np.ndarray) -> np.ndarray:
        """``leaf`` with any zero leaf moved to the next positive one (the last, past the end):
        floating-point slack can land a target on a zero leaf at the far right."""
        bad = self.leaves().take(leaf) <= 0
        if bad.any():
            positive = np.flatnonzero(self.leaves() > 0)
            leaf[bad] = positive[np.minimum(np.searchsorted(positive, leaf[bad]), len(positive) - 1)]
        return leaf

    def grow(self, size: int) -> None:
        """Enlarge to hold at least ``size`` leaves, keeping values."""
        if size <= self.size:
            return
        old = self.leaves().copy()
        self.__init__(size)  # type: ignore[misc]
        self.set(np.arange(len(old)), old)
