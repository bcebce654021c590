"""Prioritized replay: sampling proportional to priority^alpha, importance weights with beta."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaystore.errors import StoreError
from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.sumtree import SumTree
from replaystore.loaders.tracking import RowSlots


def _numpy(values: Any, dtype: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype).reshape(-1)


class PrioritizedSampler(StoreSampler):
    """Proportional prioritized replay over the visible records.

    Each stored record has a priority; records not yet seen by the sampler enter at
    the running maximum priority. ``P(i) = p_i^alpha / sum_j p_j^alpha``; each
    minibatch carries importance weights ``(N * P(i))^-beta / max`` (max over the
    minibatch) as ``weights``. After the loss, call ``update(indices, priorities)``
    with the minibatch's ``indices`` and |TD error|. Evicted records lose their
    priority. Sampling is stratified (one draw per equal slice of the total mass, in
    random order);
    sampling and updates cost O(log n) per record, as whole-batch numpy operations.
    """

    kind = "prioritized"

    def __init__(self, store: Any, batch_size: int, alpha: float = 0.6, beta: float = 0.4, seed: int = 0, *,
                 eps: float = 1e-6, **kwargs: Any) -> None:
        if alpha < 0 or beta < 0:
            raise StoreError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.eps = float(eps)
        self.max_priority = 1.0
        self.slots = RowSlots()
        self.tree = SumTree(1024)
        super().__init__(store, batch_size, seed, **kwargs)

    def _sync(self) -> None:
        """Follow the table: new rows enter at the running maximum, rows no longer visible drop out.

        Cost: the rows changed since the last call (the first call, and the first after
        ``load_state_dict``, compare every visible row with the rows tracked).
        """
        change = self.tracker.poll()
        if change is None:
            return
        if change.full:
            freed, new = self.slots.sync(self.restrict(change.added))
        else:
            freed = self.slots.remove(change.removed)
            new = self.slots.add(self.restrict(change.added))
        self.tree.grow(len(self.slots.row_of))
        self.tree.set(freed, np.zeros(len(freed)))
        self.tree.set(new, np.full(len(new), self.max_priority ** self.alpha))

    def sample(self) -> Request:
        self._sync()
        total = self.tree.total
        if not len(self.slots) or total <= 0:
            raise self._empty()
        b = self.batch_size
        order = self.rng.permutation(b)
        # stratified: one target per equal slice of the mass, searched in ascending order (the
        # descents then walk the tree in memory order: ~15% faster than shuffled targets), and
        # handed out in the random order ``order``
        targets = self.rng.random(b)
        targets += np.arange(b)
        targets *= total / b
        targets[-1] = min(targets[-1], math.nextafter(total, 0))  # ascending: only the last can round up
        slots = self.tree.find(targets).take(order)
        rows = self.slots.row_of.take(slots)
        # (N * P(i))^-beta / max_j (N * P(j))^-beta = (v_min / v_i)^beta, v: the leaf values p^alpha
        values = self.tree.leaves().take(slots)
        weights = np.minimum.reduce(values) / values
        weights **= self.beta
        self.batches_drawn += 1
        return Request(rows, {"weights": weights.astype(np.float32)})

    def update(self, indices: Any, priorities: Any) -> None:
        """Write back priorities (e.g. |TD error|) for the rows ``indices`` of a minibatch.

        Rows evicted since they were sampled are ignored. Priorities are made
        non-negative (absolute value) and offset by ``eps`` so no record starves.
        """
        rows = _numpy(indices, np.int64)
        prios = np.abs(_numpy(priorities, np.float64)) + self.eps
        if len(rows) != len(prios):
            raise StoreError(f"update: {len(rows)} indices but {len(prios)} priorities")
        top = float(prios.max()) if len(prios) else 0.0
        if not top < np.inf:  # NaN or inf somewhere
            raise StoreError("update: priorities must be finite")
        self._sync()
        slots, found = self.slots.lookup(rows)
        if not found.all():  # rows evicted since they were sampled
            if not found.any():
                return
            slots, prios = slots[found], prios[found]
            top = float(prios.max())
        self.max_priority = max(self.max_priority, top)
        self.tree.set(slots, prios ** self.alpha)

    def priorities(self, rows: Any) -> np.ndarray:
        """Current priorities of rows (NaN for rows not tracked)."""
        self._sync()
        slots, found = self.slots.lookup(_numpy(rows, np.int64))
        vals = self.tree.leaves()[slots] ** (1.0 / self.alpha) if self.alpha else np.ones(len(slots))
        return np.where(found, vals, np.nan)

    def state_dict(self) -> dict[str, Any]:
        self._sync()
        state = super().state_dict()
        state.update(alpha=self.alpha, beta=self.beta, eps=self.eps, max_priority=self.max_priority,
                     tree_leaves=self.tree.leaves().copy(), **self.slots.state())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.alpha, self.beta, self.eps = float(state["alpha"]), float(state["beta"]), float(state["eps"])
        self.max_priority = float(state["max_priority"])
        self.slots.load(state)
        leaves = np.asarray(state["tree_leaves"], dtype=np.float64)
        self.tree = SumTree(len(leaves))
        self.tree.set(np.arange(len(leaves)), leaves)
        self.tracker.reset()
        self._sync()
