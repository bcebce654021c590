"""Prioritized replay: sampling proportional to priority^alpha, importance weights with beta."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaystore.errors import RowIdTypeError, SamplerParameterError, StoreError
from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.her import HER
from replaystore.loaders.sumtree import SumTree
from replaystore.loaders.tracking import RowSlots

MAX_LEAF = 2.0 ** 960
"""The largest leaf value ``priority ** alpha``: a sum of up to 2**63 of them stays finite
(float64 max ~ 2**1024), so the tree's total never overflows."""

MIN_LEAF = float(np.finfo(np.float64).tiny)
"""Leaf values below this (the smallest normal float64; ``0`` included) are raised to it, so no
stored record ever has zero mass and importance weights stay finite."""


def _real(name: str, value: Any, lo: float = 0.0) -> float:
    """``value`` as a finite float >= ``lo``; SamplerParameterError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SamplerParameterError(name, f"a finite real number >= {lo}", repr(value))
    out = float(value)
    if not math.isfinite(out) or out < lo:
        raise SamplerParameterError(name, f"a finite real number >= {lo}", repr(value))
    return out


def leaf_values(priorities: np.ndarray, alpha: float) -> np.ndarray:
    """``priorities ** alpha`` (priorities finite, >= 0), raised to at least :data:`MIN_LEAF`.

    Cost: O(n).

    Parameters
    ----------
    priorities : numpy.ndarray
        float64 priorities, finite and >= 0.
    alpha : float
        The exponent.

    Returns
    -------
    numpy.ndarray
        float64 leaf values.

    Raises
    ------
    SamplerParameterError
        A value exceeds :data:`MAX_LEAF` (``field`` ``"priorities"``); the whole
        call is then refused.
    """
    with np.errstate(over="ignore", under="ignore"):
        values = priorities ** alpha
    if len(values) and not float(values.max()) <= MAX_LEAF:
        bad = float(priorities[int(np.argmax(values))])
        limit = MAX_LEAF ** (1.0 / alpha) if alpha else math.inf
        raise SamplerParameterError("priorities", f"priorities whose |p| + eps is at most {limit:.6g} "
                                    f"(priority ** alpha <= 2**960 with alpha={alpha})", repr(bad))
    np.maximum(values, MIN_LEAF, out=values)
    return values


def _row_ids(values: Any) -> np.ndarray:
    """``values`` (array-like or tensor) as int64 row ids; RowIdTypeError unless they are integers."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    a = np.asarray(values)
    if a.size and a.dtype.kind not in "iu":  # (1.5 is no row id, a mask no list of them)
        raise RowIdTypeError("indices", f"values of dtype {a.dtype}")
    return a.astype(np.int64, copy=False).reshape(-1)


def _numpy(values: Any, dtype: Any) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype).reshape(-1)


class PrioritizedSampler(StoreSampler):
    """Proportional prioritized replay over the visible records.

    Each stored record has a priority; records not yet seen by the sampler enter
    at the running maximum priority. ``P(i) = p_i^alpha / sum_j p_j^alpha``; each
    minibatch carries importance weights ``(N * P(i))^-beta / max`` (max over the
    minibatch) as ``weights``. After the loss, call ``update(indices,
    priorities)`` with the minibatch's ``indices`` and |TD error|. Evicted records
    lose their priority. Sampling is stratified (one draw per equal slice of the
    total mass, in random order); sampling and updates cost O(log n) per record,
    as whole-batch numpy operations.

    A priority must be finite (its sign is dropped) with ``(|p| + eps) ** alpha
    <= 2**960`` (:data:`MAX_LEAF`), else ``update`` raises and changes nothing;
    smaller values, 0 included, count as at least the smallest normal float
    (:data:`MIN_LEAF`), so draws stay proportional to ``max(p ** alpha,
    MIN_LEAF)`` and never collapse. On ``resume=True, override=True``, ``alpha``,
    ``beta`` and ``eps`` may change: a new ``alpha`` re-exponentiates the saved
    priorities (``p ** new_alpha``; from a state saved with ``alpha=0``, whose
    priorities are lost, every record restarts at priority 1), refused like
    ``update`` if one would overflow.

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    batch_size : int
        Records per minibatch.
    alpha : float, optional
        Priority exponent; finite and >= 0 (0: uniform).
    beta : float, optional
        Importance-weight exponent; finite and >= 0.
    seed : int, optional
        Seed of the sampler's RNG.
    eps : float, optional
        Added to ``|priority|`` so no record starves; finite and >= 0.
    her : HER, optional
        Hindsight relabelling of the drawn records (loaders/her.py); priorities
        stay per record.
    **kwargs
        :class:`StoreSampler`'s keyword arguments.

    Raises
    ------
    SamplerParameterError
        ``alpha``, ``beta`` or ``eps`` is not a finite number >= 0, or a base
        parameter is bad (see :class:`StoreSampler`), or ``her`` is not a HER.
    StoreError
        With ``her``: the schema lacks a field it uses.
    ResumeMismatchError
        With ``resume=True``: see :meth:`StoreSampler.restore`.
    """

    kind = "prioritized"
    overridable = StoreSampler.overridable | {"alpha", "beta", "eps"}

    def __init__(self, store: Any, batch_size: int, alpha: float = 0.6, beta: float = 0.4, seed: int = 0, *,
                 eps: float = 1e-6, her: HER | None = None, **kwargs: Any) -> None:
        self.alpha = _real("alpha", alpha)
        self.beta = _real("beta", beta)
        self.eps = _real("eps", eps)
        self.max_priority = 1.0
        self.slots = RowSlots()
        self.tree = SumTree(1024)
        self._masked = np.zeros(0, dtype=np.int64)  # with stack=: tracked rows without a next frame (leaf 0)
        self._masked_key: tuple[int, int] | None = None
        super().__init__(store, batch_size, seed, her=her, **kwargs)

    def _sync(self) -> None:
        """Follow the table: new rows enter at the running maximum, rows no longer visible drop out.

        Cost: the rows changed since the last call (the first call, and the first after
        ``load_state_dict``, compare every visible row with the rows tracked).
        """
        change = self.tracker.poll()
        if change is None:
            self._mask()
            return
        if change.full:
            freed, new = self.slots.sync(self.restrict(change.added))
        else:
            freed = self.slots.remove(change.removed)
            new = self.slots.add(self.restrict(change.added))
        self.tree.grow(len(self.slots.row_of))
        self.tree.set(freed, np.zeros(len(freed)))
        self.tree.set(new, np.full(len(new), leaf_values(np.array([self.max_priority]), self.alpha)[0]))
        self._mask()

    def _mask(self) -> None:
        """Rows the features do not allow (``stack=``: no next frame) get no mass; those allowed again enter at max.

        Cost: nothing without such a feature, or unless its index changed; then the rows not allowed.
        """
        fi = self.eligible()
        if fi is None or fi.key == self._masked_key:
            return
        self._masked_key = fi.key
        now = fi.invalid_rows
        gained = np.setdiff1d(self._masked, now, assume_unique=True)
        slots, found = self.slots.lookup(gained)
        self.tree.set(slots[found], np.full(int(found.sum()),
                                            leaf_values(np.array([self.max_priority]), self.alpha)[0]))
        slots, found = self.slots.lookup(now)
        self.tree.set(slots[found], np.zeros(int(found.sum())))
        self._masked = now[found]

    def draw(self) -> Request:
        """Draw a stratified minibatch proportional to priority^alpha.

        Cost: the rows changed since the last call, then O(batch_size log n).

        Returns
        -------
        Request
            The rows and their importance ``weights`` (float32, max 1).

        Raises
        ------
        EmptyStoreError
            No candidate row is visible.
        """
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

        Rows evicted since they were sampled (and, with ``stack=``, rows without a next
        frame) are ignored. Priorities are made non-negative (absolute value) and offset
        by ``eps`` so no record starves. Cost: O(n log N) for n rows.

        Parameters
        ----------
        indices : array_like or torch.Tensor
            Row ids (the minibatch's ``indices``).
        priorities : array_like or torch.Tensor
            One priority per row.

        Raises
        ------
        SamplerParameterError
            A NaN or infinite priority, or one whose leaf value would exceed
            :data:`MAX_LEAF` (``field`` ``"priorities"``); nothing changes.
        StoreError
            ``indices`` and ``priorities`` differ in length.
        RowIdTypeError
            ``indices`` are not integers (floats, booleans).
        """
        rows = _row_ids(indices)
        prios = np.abs(_numpy(priorities, np.float64)) + self.eps
        if len(rows) != len(prios):
            raise StoreError(f"update: {len(rows)} indices but {len(prios)} priorities")
        top = float(prios.max()) if len(prios) else 0.0
        if not top < np.inf:  # NaN or inf somewhere
            bad = _numpy(priorities, np.float64)
            raise SamplerParameterError("priorities", "finite priorities",
                                        repr(float(bad[~np.isfinite(bad)][0])))
        values = leaf_values(prios, self.alpha)
        self._sync()
        slots, found = self.slots.lookup(rows)
        if len(self._masked):  # rows the features do not allow keep no mass
            found &= ~np.isin(rows, self._masked)
        if not found.all():  # rows evicted since they were sampled
            if not found.any():
                return
            slots, prios, values = slots[found], prios[found], values[found]
            top = float(prios.max())
        self.max_priority = max(self.max_priority, top)
        self.tree.set(slots, values)

    def priorities(self, rows: Any) -> np.ndarray:
        """Current priorities of rows (NaN for rows not tracked).

        Parameters
        ----------
        rows : array_like
            Row ids.

        Returns
        -------
        numpy.ndarray
            float64 priorities (``leaf ** (1 / alpha)``; 1 where ``alpha`` is 0).
        """
        self._sync()
        slots, found = self.slots.lookup(_row_ids(rows))
        vals = self.tree.leaves()[slots] ** (1.0 / self.alpha) if self.alpha else np.ones(len(slots))
        return np.where(found, vals, np.nan)

    def hyperparameters(self) -> dict[str, Any]:
        """The base hyperparameters and ``alpha``, ``beta``, ``eps``.

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        return {**super().hyperparameters(), "alpha": self.alpha, "beta": self.beta, "eps": self.eps}

    def _override(self, given: dict[str, Any], diff: dict[str, tuple[Any, Any]]) -> None:
        super()._override(given, diff)
        self.beta, self.eps = given["beta"], given["eps"]
        if "alpha" not in diff:
            return
        old, new = self.alpha, given["alpha"]
        leaves = self.tree.leaves()
        live = np.flatnonzero(leaves > 0)
        if old:
            with np.errstate(under="ignore"):
                prios = leaves[live] ** (1.0 / old)
            max_priority = self.max_priority
        else:  # every leaf was 1: the priorities are lost
            prios, max_priority = np.ones(len(live)), 1.0
        values = leaf_values(prios, new)  # refused before anything changes
        leaf_values(np.array([max_priority]), new)
        self.alpha, self.max_priority = new, max_priority
        self.tree.set(live, values)

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the priorities.

        Cost: a copy of the tree's leaves and the row slots.

        Returns
        -------
        dict of str to Any
            Besides the base state: ``alpha``, ``beta``, ``eps``, ``max_priority``,
            ``tree_leaves`` and the row-slot arrays.
        """
        self._sync()
        state = super().state_dict()
        state.update(alpha=self.alpha, beta=self.beta, eps=self.eps, max_priority=self.max_priority,
                     tree_leaves=self.tree.leaves().copy(), **self.slots.state())
        if self._filter is not None:  # (the key states saved before features were parts hold)
            state["stack_masked"] = self._masked.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: priorities, row slots and RNG.

        Cost: rebuilding the tree from the leaves, then comparing every visible row
        with the rows tracked.

        Parameters
        ----------
        state : dict of str to Any
            A state saved by a prioritized sampler.

        Raises
        ------
        StoreError
            The state is of another sampler kind.
        """
        super().load_state_dict(state)
        self.alpha, self.beta, self.eps = float(state["alpha"]), float(state["beta"]), float(state["eps"])
        self.max_priority = float(state["max_priority"])
        self.slots.load(state)
        leaves = np.asarray(state["tree_leaves"], dtype=np.float64)
        self.tree = SumTree(len(leaves))
        self.tree.set(np.arange(len(leaves)), leaves)
        self._masked = np.asarray(state.get("stack_masked", np.zeros(0)), dtype=np.int64)
        self._masked_key = None
        self.tracker.reset()
        self._sync()
