"""A vectorised sum tree: O(log n) batched updates and prefix-sum sampling in numpy."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from replaystore.compiled import kernels

# A node holds the sum of FANOUT children stored side by side: one 64-byte cache line of
# float64, so a descent fetches one line per level (docs/PERFORMANCE.md, "An 8-ary sum tree").
FANOUT = 8
SHIFT = 3  # log2(FANOUT)
# ``find`` starts at the highest level, of at most this many nodes: one binary search over its
# running sums (cached until the next ``set``; their last is the total) replaces the levels above.
SEARCH_TOP = 1024

_accumulate = np.add.accumulate


def compiled_kernels() -> ModuleType | None:
    """The numba kernels (loaders/treekernels.py) or None (replaystore/compiled.py).

    Asked when a tree is made or grown.
    """
    return kernels("replaystore.loaders.treekernels")


def _aligned_zeros(n: int) -> np.ndarray:
    """``n`` float64 zeros starting on a 64-byte boundary.

    Every run of 8 children that starts at a multiple of 8 is then one cache line.
    """
    raw = np.zeros(n + FANOUT)
    skip = (-(raw.ctypes.data >> 3)) % FANOUT
    return raw[skip:skip + n]


def node_sums(children: np.ndarray) -> np.ndarray:
    """Each row's pairwise sum (``children``: shape ``(k, 8)``); the kernels add in this order too."""
    c = children
    return ((c[:, 0] + c[:, 1]) + (c[:, 2] + c[:, 3])) + ((c[:, 4] + c[:, 5]) + (c[:, 6] + c[:, 7]))


class SumTree:
    """Leaf values (priorities^alpha) under an 8-ary tree of sums, stored as one array.

    Level 0 is the highest kept level, of ``top`` nodes (at most :data:`SEARCH_TOP`); level
    ``depth`` holds the ``size = top * 8**depth`` leaves; node i of level j is the pairwise sum
    of nodes 8i..8i+7 of level j+1 (:func:`node_sums`), always recomputed from them, so no
    value depends on the order or batching of updates. Each level starts on a 64-byte boundary:
    a node's children are one cache line. ``find`` searches the running sums of level 0, then
    at each level below picks the child whose range holds the target, by three binary steps
    over the pairwise sums the node's value is made of: at 10M leaves a descent reads five
    cache lines where a binary tree under the same searched top read thirteen, and an update
    recomputes five ancestors per leaf (docs/PERFORMANCE.md, "An 8-ary sum tree").
    Every operation handles a whole batch of leaves with a few numpy calls per level; with
    numba installed, the sparse ``set`` and ``find`` run as compiled kernels doing the same
    arithmetic (:func:`compiled_kernels`): the same tree and the same leaves found.
    """

    def __init__(self, size: int) -> None:
        size = max(int(size), 1)
        depth = 0
        while -(-size // FANOUT ** depth) > SEARCH_TOP:
            depth += 1
        self.depth = depth
        self.top = -(-size // FANOUT ** depth)
        self.size = self.top << (SHIFT * depth)
        starts = [0]
        for j in range(depth + 1):
            starts.append(starts[-1] + -(-(self.top << (SHIFT * j)) // FANOUT) * FANOUT)
        self.starts = np.array(starts, dtype=np.int64)  # level j is tree[starts[j]:], starts[-1]: the length
        self.tree = _aligned_zeros(starts[-1])
        self._prefix: np.ndarray | None = None  # running sums of level 0 from 0; None: stale
        self._kernels = compiled_kernels() if depth else None  # (no levels: nothing for them to do)

    def level(self, j: int) -> np.ndarray:
        """Level ``j``'s nodes (level ``depth``: the leaves)."""
        start = int(self.starts[j])
        return self.tree[start:start + (self.top << (SHIFT * j))]

    @property
    def total(self) -> float:
        return float(self._prefixes()[-1])

    def leaves(self) -> np.ndarray:
        return self.level(self.depth)

    def _prefixes(self) -> np.ndarray:
        """``[0, p_1, ..., p_top]``: running sums of level 0 (``p_top`` is the total)."""
        if self._prefix is None:
            self._prefix = np.zeros(self.top + 1)
            _accumulate(self.level(0), out=self._prefix[1:])
        return self._prefix

    def set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set leaf values (the last write wins for repeated leaves) and refresh their ancestors."""
        leaves = np.asarray(leaves, dtype=np.int64).reshape(-1)
        if not leaves.size:
            return
        self._prefix = None
        if self._kernels is not None and leaves.size * FANOUT < self.size:
            values = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64), leaves.shape))
            self._kernels.set_sparse(self.tree, self.starts, self.depth, self.size,
                                     np.ascontiguousarray(leaves), values)
            return
        if leaves.min() < 0 or leaves.max() >= self.size:
            raise IndexError("SumTree.set: leaf index out of range")
        self.leaves()[leaves] = values
        if leaves.size * FANOUT >= self.size:  # a large share of the leaves: every level whole
            for j in range(self.depth - 1, -1, -1):
                self.level(j)[:] = node_sums(self.level(j + 1).reshape(-1, FANOUT))
            return
        nodes = leaves  # the ancestors of the changed leaves, level by level (a node listed twice
        for j in range(self.depth - 1, -1, -1):  # is written twice with the same sum: harmless)
            nodes = nodes >> SHIFT
            self.level(j).put(nodes, node_sums(self.level(j + 1).reshape(-1, FANOUT).take(nodes, axis=0)))

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For prefix sums ``0 <= t < total``, the leaf whose cumulative range holds each t."""
        prefix = self._prefixes()
        if self._kernels is not None:
            leaf = np.empty(len(targets), dtype=np.int64)
            self._kernels.find(self.tree, self.starts, self.depth, prefix,
                               np.ascontiguousarray(targets, dtype=np.float64).reshape(-1), leaf)
            return self._off_zero(leaf)
        t = np.array(targets, dtype=np.float64).reshape(-1)  # a copy: reduced in place below
        # level 0: how many of its running sums are <= t (at most top-1: slack stays in the last)
        node = prefix[1:self.top].searchsorted(t, side="right")
        t -= prefix.take(node)
        lanes = np.arange(len(t))
        for j in range(1, self.depth + 1):
            # the child: three binary steps over the 8 children, by the same pairwise sums a
            # node's value is made of (a half, then a pair, then one child)
            kids = self.level(j).reshape(-1, FANOUT).take(node, axis=0)
            pairs = kids[:, 0::2] + kids[:, 1::2]
            half = pairs[:, 0] + pairs[:, 1]
            go = t >= half
            t -= np.where(go, half, 0.0)  # (t - 0.0 is t)
            k = go.astype(np.int64) << 2
            pair = pairs[lanes, k >> 1]
            go = t >= pair
            t -= np.where(go, pair, 0.0)
            k += go.astype(np.int64) << 1
            one = kids[lanes, k]
            go = t >= one
            t -= np.where(go, one, 0.0)
            k += go
            node = (node << SHIFT) + k
        return self._off_zero(node)

    def _off_zero(self, leaf: np.ndarray) -> np.ndarray:
        """``leaf`` with any zero leaf moved to the next positive one (the last, past the end).

        Floating-point slack can land a target on a zero leaf at the far right.
        """
        bad = self.leaves().take(leaf) <= 0
        if bad.any():
            positive = np.flatnonzero(self.leaves() > 0)
            leaf[bad] = positive[np.minimum(np.searchsorted(positive, leaf[bad]), len(positive) - 1)]
        return leaf

    def grow(self, size: int) -> None:
        """Enlarge to hold at least ``size`` leaves, keeping values.

        At least doubles, so a tree that follows a growing table (a commit at a time) is rebuilt O(log n) times in all.
        """
        if size <= self.size:
            return
        old = self.leaves().copy()
        self.__init__(max(size, 2 * self.size))  # type: ignore[misc]
        self.set(np.arange(len(old)), old)
