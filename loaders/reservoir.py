"""Reservoir sampling (Algorithm R) over the stream of records appended to a table."""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.limits import check_size
from replaystore.loaders.tracking import inside
from replaystore.store import ROW_BITS


class ReservoirSampler(StoreSampler):
    """Keeps a uniform sample of at most ``capacity`` of the records ever appended.

    Records are offered to the reservoir in row-id order as they become visible
    (new commits after ``refresh()``): the n-th record offered is kept with
    probability ``capacity / n``, replacing a uniformly chosen member. Minibatches
    are drawn uniformly with replacement from the reservoir, so an unbounded
    DeepCFR advantage or strategy table trains on a bounded uniform sample; the
    schema's per-record iteration numbers come out with the batch for weighting.
    Use it on an unbounded table: members evicted by a table capacity are dropped
    and their slots refilled by the records offered in the same refresh and after
    it, or, if every member was evicted and none of those took a slot, by a
    uniform choice of the visible rows (the sample is then no longer uniform over
    everything appended). Cost per refresh: the rows added (plus the members when
    rows were evicted).

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    capacity : int
        Reservoir size (a positive int; never overridable on resume).
    batch_size : int
        Records per minibatch.
    seed : int, optional
        Seed of the sampler's RNG.
    **kwargs
        :class:`StoreSampler`'s keyword arguments.

    Raises
    ------
    SamplerParameterError
        ``capacity`` is not an int in ``[1, 2**40]``; see also :class:`StoreSampler`.
    """

    kind = "reservoir"

    def __init__(self, store: Any, capacity: int, batch_size: int, seed: int = 0, **kwargs: Any) -> None:
        capacity = check_size("capacity", capacity, 1 << ROW_BITS)
        self.capacity = capacity
        self.members = np.zeros(0, dtype=np.int64)
        self.seen = 0
        self.offered_upto: dict[int, int] = {}  # writer -> next local row not yet offered
        super().__init__(store, batch_size, seed, **kwargs)

    def hyperparameters(self) -> dict[str, Any]:
        """The base hyperparameters and ``capacity`` (never overridable: the members are a sample of that size).

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        return {**super().hyperparameters(), "capacity": self.capacity}

    def _not_offered(self, rows: np.ndarray) -> np.ndarray:
        """Of ascending new visible rows, those not offered yet (each writer's rows arrive in order).

        A writer's rows are a contiguous run of ascending ``rows`` (its id is the high bits), so
        each writer costs one search, not a pass over every row.
        """
        parts = [rows[:0]]
        lo = 0
        while lo < len(rows):
            w = int(rows[lo]) >> ROW_BITS
            hi = int(np.searchsorted(rows, (w + 1) << ROW_BITS))
            upto = self.offered_upto.get(w, 0)
            parts.append(rows[lo + int(np.searchsorted(rows[lo:hi], (w << ROW_BITS) + upto)):hi])
            self.offered_upto[w] = max(upto, (int(rows[hi - 1]) & ((1 << ROW_BITS) - 1)) + 1)
            lo = hi
        return parts[-1] if len(parts) == 2 else np.concatenate(parts)

    def _sync(self) -> None:
        """Offer the rows that became visible; drop members that stopped being visible.

        Cost: the rows added, plus the members when rows were evicted (not the table size,
        but for the rare refill of a reservoir whose members were all evicted).
        """
        change = self.tracker.poll()
        if change is None:
            return
        # evicted members go first: the rows offered now fill their slots before any replacement
        if len(self.members) and (change.full or len(change.removed)):
            self.members = self.members[inside(self.members, self.tracker.view)]
        new = self._not_offered(self.restrict(change.added))
        if len(new):
            self._offer(new)
        if not len(self.members) and self.seen and (n := self.candidate_count()):
            # all evicted, and the visible rows were offered earlier without being kept
            picked = self.rng.choice(n, size=min(self.capacity, n), replace=False)
            self.members = self.candidate_rows(np.sort(picked))

    def _offer(self, rows: np.ndarray) -> None:
        k = self.capacity
        # free slots are filled first: n < k on an intact reservoir, and the slots of members
        # that a table capacity evicted (else a replacement index j could point past the end)
        free = max(k - len(self.members), 0)
        members = np.concatenate([self.members, rows[:free]])
        later = rows[free:]
        if len(later):
            # the i-th row is kept in slot j, uniform on [0, n_i] for n_i records offered before it
            j = self.rng.integers(0, np.arange(self.seen + free, self.seen + len(rows), dtype=np.int64) + 1)
            keep = j < k
            slots, values = j[keep], later[keep]
            # the last offer to a slot wins: keep each slot's final value
            last = len(slots) - 1 - np.unique(slots[::-1], return_index=True)[1]
            members[slots[last]] = values[last]
        self.members = members
        self.seen += len(rows)

    def draw(self) -> Request:
        """Offer the newly visible rows, then draw uniformly with replacement from the reservoir.

        Returns
        -------
        Request
            The drawn rows.

        Raises
        ------
        EmptyStoreError
            The reservoir is empty.
        """
        self._sync()
        if not len(self.members):
            raise self._empty()
        pos = self.rng.integers(0, len(self.members), size=self.batch_size)
        self.batches_drawn += 1
        return Request(self.members[pos])

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the reservoir.

        Returns
        -------
        dict of str to Any
            Besides the base state: ``capacity``, ``seen``, ``members`` and
            ``offered_upto`` (per writer, the next local row not yet offered).
        """
        self._sync()
        state = super().state_dict()
        state.update(capacity=self.capacity, seen=self.seen, members=self.members.copy(),
                     offered_upto={str(w): n for w, n in self.offered_upto.items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`.

        Parameters
        ----------
        state : dict of str to Any
            A state saved by a reservoir sampler.

        Raises
        ------
        StoreError
            The state is of another sampler kind.
        """
        super().load_state_dict(state)
        self.capacity = int(state["capacity"])
        self.seen = int(state["seen"])
        self.members = np.asarray(state["members"], dtype=np.int64)
        self.offered_upto = {int(w): int(n) for w, n in state["offered_upto"].items()}
        self.tracker.reset()
