"""A vectorised sum tree: O(log n) batched updates and prefix-sum sampling in numpy."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaf values (priorities^alpha) in a complete binary tree stored as one array.

    ``tree[1]`` is the total; node i has children 2i and 2i+1; leaves live at
    ``tree[size + leaf]``. Every operation handles a whole batch of leaves with one
    numpy operation per tree level.
    """

    def __init__(self, size: int) -> None:
        self.size = 1 << max(int(size) - 1, 1).bit_length()
        self.tree = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self) -> np.ndarray:
        return self.tree[self.size:]

    def set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set leaf values (the last write wins for repeated leaves) and refresh their ancestors."""
        leaves = np.asarray(leaves, dtype=np.int64)
        if not leaves.size:
            return
        self.tree[self.size + leaves] = values
        nodes = np.unique((self.size + leaves) >> 1)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes >> 1)

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For prefix sums ``0 <= t < total``, the leaf whose cumulative range holds each t."""
        t = np.asarray(targets, dtype=np.float64).copy()
        node = np.ones(len(t), dtype=np.int64)
        while node[0] < self.size:
            left = 2 * node
            lv = self.tree[left]
            go_right = t >= lv
            t -= np.where(go_right, lv, 0.0)
            node = left + go_right
        leaf = node - self.size
        # floating-point slack can land on a zero leaf at the far right: step back to a positive one
        bad = self.tree[node] <= 0
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
