"""What every sampler shares: the table it draws from, its RNG, subsets, and resumable state."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from replaystore.errors import ReplayStoreError, SamplerParameterError, StoreError
from replaystore.loaders import combinations
from replaystore.loaders.her import HER
from replaystore.loaders.limits import MAX_BATCH_SIZE, check_size
from replaystore.loaders.nstep import check_nstep
from replaystore.loaders.resumable import Resumable
from replaystore.loaders.tracking import ViewTracker, expand, rows_in
from replaystore.store import Store, Table

if TYPE_CHECKING:
    from replaystore.loaders.feature import Eligible, Feature
    from replaystore.loaders.ratelimit import RateLimiter, SampleGate


class EmptyStoreError(ReplayStoreError):
    """A sampler was asked for a minibatch while it has nothing to draw from.

    Raised by every sampler's ``sample`` (and by ``ReplayBuffer.sample``) when the
    table, or the sampler's subset of it, has no visible record (or, for sequence
    samplers, no legal window). Append and commit, then ``refresh()``.
    """


@dataclass
class Request:
    """One minibatch to gather, as a sampler yields it.

    Attributes
    ----------
    rows : numpy.ndarray
        int64 row ids; ``[batch]``, or ``[batch, window]`` for ``sequence``
        requests, where ``-1`` marks a padding slot.
    outputs : dict of str to numpy.ndarray
        Per-sample sampler outputs (e.g. importance ``weights``), passed through
        into the minibatch.
    sequence : bool
        Whether ``rows`` is a ``[batch, window]`` array of sequence windows.
    stream_keys : list of int or str, optional
        For sequence requests, each window's stream key.
    parts : dict of str to Any
        The features' payloads, each under its feature's name (``"stack"``, ``"n_step"``,
        ``"her"``), put there by its ``prepare`` in the sampler's feature order: small and
        picklable (arrays, no index), for the feature's worker half where the minibatch is
        gathered (loaders/feature.py).
    """

    rows: np.ndarray
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    sequence: bool = False
    stream_keys: list[int | str] | None = None
    parts: dict[str, Any] = field(default_factory=dict)


class StoreSampler(Resumable, Sampler[Request]):
    """Base class: yields :class:`Request` minibatches (a torch batch sampler) from one table.

    ``refresh_every`` and/or ``refresh_every_s`` make :meth:`sample` (so iteration,
    ``make_loader`` and direct calls alike) call ``store.refresh()`` by itself before
    a minibatch when that many minibatches were drawn, or that many seconds passed,
    since the last refresh it made; the sampler then follows the new commits (and
    evictions) as after an explicit refresh. Cost of a refresh: reading the log
    records committed since the last one; without either, :meth:`sample` costs
    nothing more.

    Parameters
    ----------
    store : Store
        The opened store to draw from.
    batch_size : int
        Records (or windows) per minibatch; an int in ``[1, MAX_BATCH_SIZE]`` (2**24).
    seed : int, optional
        Seed of the sampler's RNG.
    table : str, optional
        Table to draw from (default: the store's default table).
    subset : array_like of int, optional
        Restrict draws to these row ids (e.g. rows a SQL query returned, or the
        latest commit's records).
    num_batches : int, optional
        Bound on iteration (None: endless, except for samplers with passes).
    name : str, optional
        The state slot :meth:`save` and :meth:`restore` use (default
        ``"{kind}-{table}"``).
    resume : bool, optional
        Restore the state saved in slot ``name`` at construction (see :meth:`restore`).
    override : bool, optional
        With ``resume``, let the given hyperparameters replace saved ones (see
        :meth:`restore`).
    refresh_every : int, optional
        Refresh the store every this many minibatches.
    refresh_every_s : float, optional
        Refresh the store when this many seconds passed since the last refresh.
    stack : int, optional
        Frame stacking (loaders/stacking.py): minibatches carry ``obs`` and ``next_obs``
        of ``stack`` consecutive frames of the record's episode, and only records with a
        next frame are drawn (every sampler but the reservoir).
    stack_padding : str, optional
        Slots before an episode's first frame: ``"reset"`` repeats it, ``"zero"`` zeros.
    stack_field : str, optional
        The frame field (default ``"frame"``).
    n_step : int, optional
        Uniform, prioritized and epoch samplers: n-step returns over windows of up to this
        many steps from each drawn record (docs/GUIDE.md, "N-step returns"); None: off.
    gamma : float, optional
        The discount of ``n_step`` returns, in [0, 1].
    her : HER, optional
        Hindsight relabelling of the drawn goal-conditioned records (loaders/her.py;
        uniform, prioritized and epoch samplers).
    rate_limiter : RateLimiter, optional
        Gate every :meth:`sample` (so iteration and ``make_loader`` too) on a sample-to-insert
        ratio (loaders/ratelimit.py; docs/GUIDE.md, "Rate limiting"): a minibatch waits while
        the learner is ahead of the collectors, and the sampler's sample count is kept in the
        store (state slot ``ratelimit.<limiter>.<name>``). Not a hyperparameter: a resume may
        add, drop or change it.

    Raises
    ------
    SamplerParameterError
        A bad ``batch_size``, ``refresh_every``, ``refresh_every_s``, ``stack*``, ``n_step`` or
        ``gamma``, ``n_step`` over a table without ``reward`` and ``terminated``, or ``her`` not
        a :class:`HER`.
    UnsupportedCombinationError
        A feature the sampler does not take, or two features that do not go together
        (loaders/combinations.py; docs/GUIDE.md, "Which samplers take which features"); it
        names both. Checked before anything else is built.
    StoreError
        With ``her``: the schema lacks a field it uses.
    ResumeMismatchError
        With ``resume=True``: see :meth:`restore`.
    """

    kind = "sampler"
    her: HER | None = None
    """Hindsight relabelling (``her=``; loaders/her.py)."""

    @property
    def takes_n_step(self) -> bool:
        """Whether this kind of sampler takes ``n_step`` (loaders/combinations.py decides)."""
        return combinations.sampler_reason(self.kind, "n_step") is None

    def __init__(self, store: Store, batch_size: int, seed: int = 0, *, table: str | None = None,
                 subset: Any = None, num_batches: int | None = None, name: str | None = None,
                 resume: bool = False, override: bool = False, refresh_every: int | None = None,
                 refresh_every_s: float | None = None, stack: int | None = None, stack_padding: str = "reset",
                 stack_field: str = "frame", n_step: int | None = None, gamma: float = 0.99,
                 her: HER | None = None, rate_limiter: RateLimiter | None = None) -> None:
        if her is not None and not isinstance(her, HER):
            raise SamplerParameterError("her", "None or a replaystore.loaders.HER", repr(her))
        given = {"stack": stack, "n_step": n_step, "her": her, "rate_limiter": rate_limiter, "subset": subset,
                 "refresh_every": refresh_every if refresh_every is not None else refresh_every_s}
        combinations.check(self.kind, [f for f, v in given.items() if v is not None], type(self).__name__)
        batch_size = check_size("batch_size", batch_size, MAX_BATCH_SIZE)
        if refresh_every is not None and (not isinstance(refresh_every, int) or isinstance(refresh_every, bool)
                                          or refresh_every <= 0):
            raise SamplerParameterError("refresh_every", "None or a positive int (minibatches)", repr(refresh_every))
        if refresh_every_s is not None and (isinstance(refresh_every_s, bool)
                                            or not isinstance(refresh_every_s, (int, float))
                                            or not math.isfinite(refresh_every_s) or refresh_every_s <= 0):
            raise SamplerParameterError("refresh_every_s", "None or a positive finite number of seconds",
                                        repr(refresh_every_s))
        self.refresh_every = refresh_every
        self.refresh_every_s = None if refresh_every_s is None else float(refresh_every_s)
        self._since_refresh = 0
        self._refreshed_at = time.monotonic()
        self.store = store
        self.table: Table = store.table(table) if table is not None else store.default
        from replaystore.loaders.feature import features_of, restricting  # (they import Request)

        self.n_step: int | None = None
        self.gamma = float(gamma) if isinstance(gamma, (int, float)) else gamma
        if n_step is not None:
            self.n_step, self.gamma = check_nstep(self.table.schema, n_step, gamma)
        self.batch_size = batch_size
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.subset = None if subset is None else np.unique(np.asarray(subset, dtype=np.int64))
        self._view_version = -1
        self._spans = np.zeros((0, 2), dtype=np.int64)  # visible subset entries: [lo, hi) into subset
        self._cum = np.zeros(1, dtype=np.int64)  # their cumulative counts
        self.num_batches = num_batches
        self.name = name or f"{self.kind}-{self.table.name}"
        self.batches_drawn = 0
        self.tracker = ViewTracker(self.table)  # changes of the visible rows, for incremental samplers
        self.features: list[Feature] = features_of(self.table, stack, stack_padding, stack_field, self.n_step,
                                                   self.gamma, her)
        """The parts the sampler hands its draws to, in order (loaders/feature.py)."""
        self.her = her
        self._filter = restricting(self.features)
        self.rate_limit: SampleGate | None = None
        """The rate limiter's gate, consulted before every draw (None: none)."""
        if rate_limiter is not None:
            self.rate_limit = rate_limiter.bind(self)
        if resume:
            self.restore(override=override)

    # -- sampling -------------------------------------------------------------------------
    def sample(self) -> Request:
        """Draw one minibatch request: refresh if due, pass the rate limiter, draw, hand it to the features.

        In order: :meth:`auto_refresh`; with ``rate_limiter``, wait until the limiter admits
        ``batch_size`` items; :meth:`draw` (the rows); each feature's ``prepare`` (stacks, n-step
        windows, goal rows); count the drawn items with the limiter.

        Returns
        -------
        Request
            The rows to gather, the sampler's per-sample outputs and the features' parts.

        Raises
        ------
        EmptyStoreError
            There is nothing to draw from.
        RateLimitTimeout
            The rate limiter did not admit the minibatch within its timeout.
        """
        self.auto_refresh()
        gate = self.rate_limit
        if gate is not None:
            gate.admit(self.batch_size)
        request = self.draw()
        for part in self.features:
            part.prepare(request)
        if gate is not None:
            gate.drawn(len(request.rows))
        self._since_refresh += 1
        return request

    def draw(self) -> Request:
        """Choose the rows of one minibatch (each sampler kind's own part of :meth:`sample`).

        Returns
        -------
        Request
            The drawn rows and the sampler's per-sample outputs.

        Raises
        ------
        EmptyStoreError
            There is nothing to draw from (in the subclasses).
        NotImplementedError
            Called on the base class.
        """
        raise NotImplementedError

    def eligible(self) -> Eligible | None:
        """Which visible rows the features let the sampler draw; None: every candidate.

        Returns
        -------
        Eligible or None
            The restricting feature's index (``stack=``: the rows with a next frame). Cost:
            that feature's index work when the view changed.
        """
        return None if self._filter is None else self._filter.eligibility()

    def drawable_rows(self) -> np.ndarray | None:
        """Ascending rows the sampler may draw when a feature restricts them (of the subset); None otherwise.

        Returns
        -------
        numpy.ndarray or None
            int64 row ids. Cost: :meth:`eligible`, plus an intersection with a subset.
        """
        el = self.eligible()
        if el is None:
            return None
        valid = el.valid_rows
        return valid if self.subset is None else np.intersect1d(valid, self.subset, assume_unique=True)

    def __iter__(self) -> Iterator[Request]:
        """Yield :meth:`sample` requests (each refreshing when due, :meth:`auto_refresh`), up to ``num_batches``."""
        drawn = 0
        while self.num_batches is None or drawn < self.num_batches:
            yield self.sample()
            drawn += 1

    def auto_refresh(self) -> bool:
        """Refresh the store if ``refresh_every`` minibatches or ``refresh_every_s`` seconds went by.

        Counted since this sampler last refreshed (or was made). :meth:`sample` calls this
        before each minibatch by itself; calling it by hand as well refreshes at most
        once (a refresh restarts the count). Cost: nothing unless due; then one
        ``store.refresh()``.

        Returns
        -------
        bool
            Whether it refreshed.
        """
        if self.refresh_every is None and self.refresh_every_s is None:
            return False
        due = self.refresh_every is not None and self._since_refresh >= self.refresh_every
        if self.refresh_every_s is not None and time.monotonic() - self._refreshed_at >= self.refresh_every_s:
            due = True
        if not due:
            return False
        self.store.refresh()
        self._since_refresh = 0
        self._refreshed_at = time.monotonic()
        return True

    def __len__(self) -> int:
        """``num_batches``; a TypeError for an endless sampler."""
        if self.num_batches is None:
            raise TypeError(f"{type(self).__name__} is endless; pass num_batches= for a length")
        return self.num_batches

    def _subset_view(self) -> None:
        """Where the visible rows fall in the subset: one span of subset entries per visible interval.

        Cost: number of fragments, once per change of the table's view.
        """
        view = self.table.view()
        if self._view_version == view.version:
            return
        self._view_version = view.version
        assert self.subset is not None
        iv = view.intervals()
        self._spans = np.stack((np.searchsorted(self.subset, iv[:, 0]), np.searchsorted(self.subset, iv[:, 1])),
                               axis=1)
        self._cum = np.r_[0, np.cumsum(self._spans[:, 1] - self._spans[:, 0])].astype(np.int64)

    def candidate_count(self) -> int:
        """How many rows the sampler draws from (visible rows, of the subset if any).

        Cost: O(1) without a subset; with one, O(fragments) once per change of the
        table's view.

        Returns
        -------
        int
            The number of candidate rows.
        """
        if self.subset is None:
            return len(self.table)
        self._subset_view()
        return int(self._cum[-1])

    def candidate_rows(self, positions: np.ndarray) -> np.ndarray:
        """Row ids at positions ``0 <= p < candidate_count()`` in row-id order, vectorised.

        Parameters
        ----------
        positions : numpy.ndarray
            Integer positions among the candidates.

        Returns
        -------
        numpy.ndarray
            int64 row ids, one per position.
        """
        if self.subset is None:
            return self.table.rows_at(positions)
        self._subset_view()
        span = np.searchsorted(self._cum[1:], positions, side="right")
        return self.subset[self._spans[span, 0] + positions - self._cum[span]]

    def restrict(self, iv: np.ndarray) -> np.ndarray:
        """The rows the sampler draws from among row-id intervals ``iv``, ascending.

        Cost: linear in the result (plus a binary search per interval with a subset).

        Parameters
        ----------
        iv : numpy.ndarray
            ``(n, 2)`` int64 half-open row-id intervals ``[lo, hi)``.

        Returns
        -------
        numpy.ndarray
            int64 row ids.
        """
        return expand(iv) if self.subset is None else rows_in(self.subset, iv)

    def _empty(self, what: str | None = None) -> EmptyStoreError:
        if what is None:  # the rows the features allow
            what = "records" if self._filter is None else self._filter.what
        return EmptyStoreError(f"{type(self).__name__}: table {self.table.name!r} has no {what} to sample "
                               "(append and commit first, then refresh())")

    # -- state ----------------------------------------------------------------------------
    def hyperparameters(self) -> dict[str, Any]:
        """The constructor arguments saved state must agree with (:meth:`restore`).

        Returns
        -------
        dict of str to Any
            Name to value; the base class has ``batch_size`` and ``seed``.
        """
        hp: dict[str, Any] = {"batch_size": self.batch_size, "seed": self.seed}
        if self.takes_n_step:  # n_step None too: a resume that adds or drops n-step windows is refused
            hp["n_step"] = None
        for part in self.features:
            hp.update(part.hyperparameters())
        return hp

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue sampling exactly.

        Returns
        -------
        dict of str to Any
            RNG state, counters, sampler data (numpy arrays for the large parts), and
            the :meth:`hyperparameters` it was drawn with.
        """
        state = {"kind": self.kind, "seed": self.seed, "rng": self.rng.bit_generator.state,
                 "batches_drawn": self.batches_drawn, "hyperparameters": self.hyperparameters()}
        for part in self.features:
            state.update(part.state_dict())
        if self.rate_limit is not None:
            state["rate_limit_samples"] = self.rate_limit.own
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (RNG state and counters).

        Parameters
        ----------
        state : dict of str to Any
            A state of a sampler of the same kind.

        Raises
        ------
        StoreError
            The state was saved by a sampler of another kind.
        """
        if state.get("kind") != self.kind:
            raise StoreError(f"state of a {state.get('kind')!r} sampler cannot load into a {self.kind!r} sampler")
        self.rng.bit_generator.state = state["rng"]
        self.batches_drawn = int(state["batches_drawn"])
        for part in self.features:
            part.load_state_dict(state)
        if self.rate_limit is not None and isinstance(state.get("rate_limit_samples"), int):
            self.rate_limit.restore(state["rate_limit_samples"])
