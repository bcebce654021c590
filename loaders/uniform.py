"""Uniform sampling with replacement, and epoch minibatches without replacement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from replaystore.errors import StoreError
from replaystore.loaders.base import Request, StoreSampler
from replaystore.loaders.her import HER
from replaystore.loaders.passorder import METHODS, PassOrder, PassRows
from replaystore.loaders.tracking import difference, inside


class UniformSampler(StoreSampler):
    """``batch_size`` visible records drawn uniformly with replacement, every minibatch.

    Sees records committed by other writers once the store was ``refresh()``-ed.
    Cost per minibatch: O(batch_size) (plus a binary search per draw with a
    subset; with ``her``, :meth:`HER.goal_rows`).

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    batch_size : int
        Records per minibatch.
    seed : int, optional
        Seed of the sampler's RNG.
    her : HER, optional
        Hindsight relabelling of the drawn goal-conditioned records (loaders/her.py).
    **kwargs
        :class:`StoreSampler`'s keyword arguments.

    Raises
    ------
    SamplerParameterError
        See :class:`StoreSampler`; ``her`` is not a :class:`HER`.
    StoreError
        With ``her``: the schema lacks a field it uses.

    Examples
    --------
    >>> import numpy as np
    >>> from replaystore.loaders import UniformSampler, make_loader
    >>> from replaystore.schemas import transitions
    >>> from replaystore.store import open_store
    >>> store = open_store("memory://examples/uniform", transitions(4), mode="w+")
    >>> with store.writer() as writer:
    ...     n = writer.append({"obs": np.zeros((10, 4), np.float32), "action": np.arange(10),
    ...                        "reward": np.ones(10, np.float32), "next_obs": np.zeros((10, 4), np.float32),
    ...                        "terminated": np.zeros(10, bool)})
    ...     result = writer.commit()
    >>> sampler = UniformSampler(store, batch_size=4, seed=0, num_batches=2)
    >>> [batch["obs"].shape for batch in make_loader(store, sampler)]
    [torch.Size([4, 4]), torch.Size([4, 4])]
    """

    kind = "uniform"

    def __init__(self, store: Any, batch_size: int, seed: int = 0, *, her: HER | None = None, **kwargs: Any) -> None:
        super().__init__(store, batch_size, seed, her=her, **kwargs)

    def draw(self) -> Request:
        """Draw ``batch_size`` candidate rows uniformly with replacement (of those the features allow).

        Returns
        -------
        Request
            The drawn rows.

        Raises
        ------
        EmptyStoreError
            No candidate row is visible.
        """
        cand = self.drawable_rows()  # with stack=: the rows with a next frame
        n = self.candidate_count() if cand is None else len(cand)
        if n == 0:
            raise self._empty()
        # floor(u * n), u uniform on the 2^-53 grid of [0, 1): the bias is below n / 2^53 (no
        # concern under 2^40 rows), at half the cost of Generator.integers at minibatch sizes
        positions = self.rng.random(self.batch_size)
        positions *= n
        picks = positions.astype(np.int64)
        np.minimum(picks, n - 1, out=picks)  # u * n can round up to n for u within 2^-53 of 1
        rows = self.candidate_rows(picks) if cand is None else cand[picks]
        self.batches_drawn += 1
        return Request(rows)


class EpochSampler(StoreSampler):
    """Passes over the visible records: each pass partitions them into shuffled minibatches.

    Every record lands in exactly one minibatch per pass, a different partition
    each pass; the last minibatch may be smaller (``drop_last=True`` drops it).
    Iterating the sampler runs one pass (``num_batches`` bounds it further); the
    records of a pass are fixed when it starts. A pass's order is a uniformly
    random permutation made from a seed drawn at its start (loaders/passorder.py:
    beyond 512k records it is made a cache-sized bucket at a time as the pass
    goes), so the resumable state is that seed, the pass's row intervals and a
    count, not the order. Rows evicted during a pass are dropped from its rest.
    With ``stack=`` a pass is over the records with a next frame, and the state
    holds the rest of the pass's order (cost: the pass's rows per save).

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    batch_size : int
        Records per minibatch.
    seed : int, optional
        Seed of the sampler's RNG.
    drop_last : bool, optional
        Drop a pass's last minibatch when it is smaller than ``batch_size``;
        overridable on resume (applies from the pass in progress on).
    **kwargs
        :class:`StoreSampler`'s keyword arguments.

    Raises
    ------
    SamplerParameterError
        See :class:`StoreSampler`.
    """

    kind = "epoch"

    def __init__(self, store: Any, batch_size: int, seed: int = 0, *, drop_last: bool = False,
                 **kwargs: Any) -> None:
        self.drop_last = drop_last
        self.epoch = 0
        self._order: PassOrder | None = None
        self._pass_rows = np.zeros((0, 2), dtype=np.int64)  # the visible row intervals at the pass's start
        self._pass_check = [0, 0]  # the pass's row count and row-id sum: a resumed pass must be over the same rows
        super().__init__(store, batch_size, seed, **kwargs)

    overridable = StoreSampler.overridable | {"drop_last"}
    """``drop_last`` overridden on resume: applies from the pass in progress on."""

    def hyperparameters(self) -> dict[str, Any]:
        """The base hyperparameters and ``drop_last``.

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        return {**super().hyperparameters(), "drop_last": self.drop_last}

    def _override(self, given: dict[str, Any], diff: dict[str, tuple[Any, Any]]) -> None:
        super()._override(given, diff)
        self.drop_last = given["drop_last"]

    def _start_pass(self) -> None:
        self.tracker.poll()  # later changes count from this view
        self._pass_rows = self.tracker.view
        rows = self._rows_of(self._pass_rows)
        if not len(rows):
            raise self._empty()
        self._pass_check = rows.fingerprint()
        self._order = PassOrder(rows, int(self.rng.integers(2**63)))

    def _rows_of(self, iv: np.ndarray) -> PassRows:
        """The rows the sampler draws from among row-id intervals ``iv`` (as intervals without a subset)."""
        el = self.eligible()
        if el is not None:  # with stack=: only records with a next frame
            return PassRows(ids=np.intersect1d(self.restrict(iv), el.valid_rows, assume_unique=True))
        return PassRows(intervals=iv) if self.subset is None else PassRows(ids=self.restrict(iv))

    def _prune(self) -> None:
        """Drop the rest of the pass's rows that were evicted since it started (they cannot be read).

        Only when rows stopped being visible; appends cost nothing. A pass whose rows all
        stay visible keeps its seeded order; otherwise the rest of the order is made and
        filtered (cost: the rest of the pass).
        """
        change = self.tracker.poll()
        order = self._order
        if order is None or change is None or not (change.full or len(change.removed)):
            return
        view = self.tracker.view
        if order.seed is not None and not len(self.restrict(difference(self._pass_rows, view))):
            return
        order.keep(lambda rows: inside(rows, view))

    def _remaining(self) -> int:
        return 0 if self._order is None else len(self._order)

    def _exhausted(self) -> bool:
        self._prune()
        return self._remaining() == 0 or (self.drop_last and self._remaining() < self.batch_size)

    def _next_pass(self) -> None:
        if self._order is not None:
            self.epoch += 1
        self._start_pass()
        if self._exhausted():
            raise self._empty(f"full minibatches of {self.batch_size}")

    def draw(self) -> Request:
        """The next minibatch of the current pass (a new pass starts when one is exhausted).

        Cost: the minibatch, plus making the next bucket of the order when the pass
        reaches it; after evictions, filtering the rest of the pass once.

        Returns
        -------
        Request
            The rows of the minibatch.

        Raises
        ------
        EmptyStoreError
            A new pass would have no rows (or, with ``drop_last``, no full minibatch).
        """
        if self._exhausted():
            self._next_pass()
        assert self._order is not None
        rows = self._order.take(self.batch_size)
        self.batches_drawn += 1
        return Request(rows)

    def __iter__(self) -> Iterator[Request]:
        """One pass (continuing the current one after ``load_state_dict``)."""
        if self._exhausted():
            self._next_pass()
        drawn = 0
        while not self._exhausted() and (self.num_batches is None or drawn < self.num_batches):
            yield self.sample()
            drawn += 1

    def __len__(self) -> int:
        """Minibatches the next iteration yields: the rest of a pass in progress, else a whole pass."""
        if not self._exhausted():
            n = self._remaining()
        else:
            n = self.candidate_count()
        full = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return full if self.num_batches is None else min(full, self.num_batches)

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the pass in progress.

        Returns
        -------
        dict of str to Any
            Besides the base state: ``epoch``, ``drop_last`` and the pass as its seed,
            row intervals, row count and row-id sum (checked on load: a sampler with
            another subset is refused) and rows taken, or, once evictions made it
            depart from its seed, the rows it has left (``rest``).
        """
        state = super().state_dict()
        state.update(epoch=self.epoch, drop_last=self.drop_last)
        order = self._order
        if order is not None and order.seed is not None and self._filter is None:
            state.update(pass_seed=order.seed, pass_order=order.method, pass_rows=self._pass_rows,
                         pass_check=self._pass_check, taken=order.taken)
        elif order is not None:
            state["rest"] = order.rest().copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the pass a :meth:`state_dict` describes.

        Parameters
        ----------
        state : dict of str to Any
            A state saved by an epoch sampler.

        Raises
        ------
        StoreError
            The state is of another sampler kind, the saved pass was over other rows
            than this sampler's subset selects, or it names an unknown pass order.
        """
        super().load_state_dict(state)
        self.epoch = int(state["epoch"])
        self._order = None
        if "pass_seed" in state:
            self._pass_rows = np.asarray(state["pass_rows"], dtype=np.int64).reshape(-1, 2)
            rows = self._rows_of(self._pass_rows)
            self._pass_check = rows.fingerprint()
            if self._pass_check != [int(v) for v in state["pass_check"]]:
                raise StoreError("epoch state: the saved pass was over other rows than this sampler's subset "
                                 "selects from them (construct the sampler with the subset it was saved with)")
            method = state.get("pass_order", "blocks")  # (states saved before buckets name none)
            if method not in METHODS:
                raise StoreError(f"epoch state: pass_order: expected one of {METHODS}, got {method!r}")
            self._order = PassOrder(rows, int(state["pass_seed"]), method)
            self._order.take(int(state["taken"]))
        elif "rest" in state:
            self._order = PassOrder.made(np.asarray(state["rest"], dtype=np.int64))
        elif state.get("order") is not None:  # saved before pass seeds: the whole order and a cursor
            self._order = PassOrder.made(np.asarray(state["order"], dtype=np.int64)[int(state["cursor"]):])
        self.tracker.reset()
