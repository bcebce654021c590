"""Features are parts: one small interface that stacking, n-step returns, HER and transforms implement once.

A sampler only chooses rows. Its features (built from its keywords ``stack=``, ``n_step=``,
``her=``; ``transform=`` is ``make_loader``'s) each do their share, at four points:

- at construction, :meth:`Feature.check` against the table's schema;
- when the sampler chooses rows, :meth:`Feature.eligibility`: which rows it may draw (None:
  every candidate);
- once a minibatch is drawn, :meth:`Feature.prepare`: the index work in the main process, its
  results put into the :class:`~replaystore.loaders.base.Request`;
- where the minibatch is gathered (a DataLoader worker or the main process), its worker half
  (:meth:`Feature.worker`): the loader's dataset runs each feature's :meth:`Feature.apply` on
  the gathered numpy minibatch with that feature's payload, in a fixed order (stacking's frame
  gather, n-step's windows, HER's relabelling, then the user's transform), with no per-feature
  code in the gather itself. A payload that carries all its worker half needs (stacking's
  ``FrameWindows``, n-step's ``NStepWindows``: a :class:`Payload`) applies itself, so a request
  gathers whole without its sampler; HER's worker half holds the relabelling (its
  ``compute_reward``, sent once to each worker, never in a request).

A feature's :meth:`Feature.hyperparameters` and :meth:`Feature.state_dict` join the sampler's
under the keys the sampler used before features were parts, so saved states resume. Which
features go together, and with which samplers, is loaders/combinations.py's table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from replaystore.loaders.her import HER
from replaystore.loaders.nstep import WindowIndex
from replaystore.loaders.stacking import FrameWindows, Stacker
from replaystore.loaders.transform import apply_transform
from replaystore.store import Table

if TYPE_CHECKING:
    from replaystore.loaders.base import Request


class Eligible(Protocol):
    """Which visible rows a sampler may draw, as a feature's index says (``FrameIndex`` is one)."""

    @property
    def key(self) -> Any:
        """Changes whenever the sets below change."""

    @property
    def valid_rows(self) -> np.ndarray:
        """Ascending row ids that may be drawn (valid until the next change)."""

    @property
    def invalid_rows(self) -> np.ndarray:
        """Ascending visible row ids that may not."""


class Payload(Protocol):
    """A feature's payload that applies itself where the minibatch is gathered (``FrameWindows``, ``NStepWindows``)."""

    def reads(self) -> tuple[str, ...]:
        """The record fields the plain gather leaves to :meth:`apply` (it reads them itself)."""

    def apply(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        """The minibatch with the feature's share done (``table``: this process's handle)."""


class Feature:
    """One part a sampler hands its draws to (the base does nothing: every hook is optional).

    Attributes
    ----------
    name : str
        The keyword that makes it (``"stack"``, ``"n_step"``, ``"her"``, ``"transform"``).
    what : str
        The rows it lets a sampler draw, in words (for ``EmptyStoreError``).
    """

    name = "feature"
    what = "records"

    def check(self, table: Table) -> None:
        """Check that ``table``'s schema has what the feature needs (nothing by default).

        Parameters
        ----------
        table : Table
            The sampler's table.
        """

    def eligibility(self) -> Eligible | None:
        """Which rows the sampler may draw, as of the table's current view; None: every candidate.

        Returns
        -------
        Eligible or None
            The feature's index. Cost: the feature's index work when the view changed.
        """
        return None

    def prepare(self, request: Request) -> None:
        """The main-process index work for a drawn minibatch: put its payload into ``request.parts[name]``.

        Parameters
        ----------
        request : Request
            The drawn minibatch; changed in place.
        """

    def worker(self) -> Feature:
        """The feature's worker half: what runs :meth:`apply` where minibatches are gathered.

        Sent once to each DataLoader worker (so small and picklable: no index, no table).

        Returns
        -------
        Feature
            By default a :class:`Carried` half: the payload applies itself.
        """
        return Carried(self.name)

    def reads(self, payload: Any) -> tuple[str, ...]:
        """The record fields the plain gather leaves to :meth:`apply` for ``payload`` (none by default).

        Parameters
        ----------
        payload : Any
            The feature's payload in the request (None: none).

        Returns
        -------
        tuple of str
            Field names.
        """
        return ()

    def apply(self, table: Table, batch: dict[str, Any], payload: Any) -> dict[str, Any]:
        """What the feature does to a gathered minibatch where it is gathered (nothing by default).

        Parameters
        ----------
        table : Table
            This process's handle of the table.
        batch : dict of str to Any
            The gathered minibatch (numpy arrays).
        payload : Any
            The feature's payload in the request (``request.parts[name]``; None: none).

        Returns
        -------
        dict of str to Any
            The minibatch.
        """
        return batch

    def hyperparameters(self) -> dict[str, Any]:
        """What a saved sampler state must agree with, under the sampler's keys.

        Returns
        -------
        dict of str to Any
            Name to value (none by default).
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The feature's share of the sampler's state, under the sampler's keys.

        Returns
        -------
        dict of str to Any
            Name to value (none by default).
        """
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from the sampler's saved state (nothing by default).

        Parameters
        ----------
        state : dict of str to Any
            The whole sampler state.
        """


class Carried(Feature):
    """The worker half of a feature whose payload applies itself (a :class:`Payload`; stacking, n-step).

    A payload that is not a :class:`Payload` (HER's goal rows without HER's own half) is left
    as it is.

    Parameters
    ----------
    name : str
        The feature's name (its key in ``Request.parts``).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def reads(self, payload: Any) -> tuple[str, ...]:
        # docstring inherited
        return tuple(payload.reads()) if _applies(payload) else ()

    def apply(self, table: Table, batch: dict[str, Any], payload: Any) -> dict[str, Any]:
        # docstring inherited
        return payload.apply(table, batch) if _applies(payload) else batch


def _applies(payload: Any) -> bool:
    """Whether ``payload`` is a :class:`Payload` (its methods looked up: ~0.2 µs, not a protocol check's ~8)."""
    return callable(getattr(payload, "apply", None)) and callable(getattr(payload, "reads", None))


class Stacking(Feature):
    """``stack=``: records with a next frame are drawn; requests carry their frame windows (loaders/stacking.py).

    Parameters
    ----------
    table : Table
        The sampler's table.
    stack, padding, field : int, str, str
        As :class:`~replaystore.loaders.stacking.Stacker` takes them.

    Raises
    ------
    SamplerParameterError
        As :class:`~replaystore.loaders.stacking.Stacker`.
    """

    name = "stack"
    what = "records with a next frame"

    def __init__(self, table: Table, stack: int, padding: str, field: str) -> None:
        self.stacker = Stacker(table, stack, padding, field)

    def eligibility(self) -> Eligible:
        # docstring inherited
        return self.stacker.index()

    def prepare(self, request: Request) -> None:
        """Put each row's frame window under ``parts["stack"]``; sequence slots also get ``next_valid``.

        ``next_valid`` (an output): the slot has a next frame.

        Parameters
        ----------
        request : Request
            The drawn minibatch; its payload is a ``FrameWindows``. Cost: ``FrameIndex.windows``.
        """
        st = self.stacker
        fi = st.index()
        rows = request.rows
        if request.sequence:
            request.outputs["next_valid"] = (rows >= 0) & fi.drawable(rows.reshape(-1)).reshape(rows.shape)
        request.parts[self.name] = FrameWindows(fi.windows(rows, st.stack, st.padding), st.field)

    def hyperparameters(self) -> dict[str, Any]:
        # docstring inherited
        st = self.stacker
        return {"stack": st.stack, "stack_padding": st.padding, "stack_field": st.field}


class NStep(Feature):
    """``n_step=``/``gamma=``: each drawn record's n-step window, applied where gathered (loaders/nstep.py).

    Parameters
    ----------
    table : Table
        The sampler's table.
    n : int
        The longest window (checked: ``loaders.nstep.check_nstep``).
    gamma : float
        The discount (checked).
    stacking : Stacking, optional
        The sampler's frame stacking: windows end where the stack after them exists, and
        ``next_obs`` is that stack.
    """

    name = "n_step"

    def __init__(self, table: Table, n: int, gamma: float, stacking: Stacking | None = None) -> None:
        self.n, self.gamma, self.stacking = n, gamma, stacking
        self.index = WindowIndex(table, n, stacked=stacking is not None)

    def prepare(self, request: Request) -> None:
        """Put the windows of the drawn start rows under ``parts["n_step"]`` (an ``NStepWindows``).

        When stacked, the frame windows after each window's last row go into stacking's
        payload (``FrameWindows.next_frames``): ``next_obs`` is read with the ``obs`` frames.

        Parameters
        ----------
        request : Request
            The drawn minibatch, stacking's payload already in (features prepare in order).
            Cost: ``WindowIndex.nstep``.
        """
        windows = self.index.nstep(request.rows, self.gamma)
        request.parts[self.name] = windows
        if self.stacking is not None:  # next_obs: the stack after each window's last row
            st = self.stacking.stacker
            frames = request.parts[self.stacking.name]
            frames.next_frames = st.index().windows(windows.last, st.stack, st.padding)

    def hyperparameters(self) -> dict[str, Any]:
        # docstring inherited
        return {"n_step": self.n, "gamma": self.gamma}


class Relabelling(Feature):
    """``her=``: goal rows picked in the main process, goals and rewards rewritten where gathered (loaders/her.py).

    Parameters
    ----------
    her : HER
        The relabelling.
    """

    name = "her"

    def __init__(self, her: HER) -> None:
        self.her = her
        self._table: Table | None = None

    def check(self, table: Table) -> None:
        # docstring inherited
        self.her.check(table)
        self._table = table

    def prepare(self, request: Request) -> None:
        """Put ``her_goal_rows`` (per drawn record, the row its new goal comes from, or -1) under ``parts["her"]``.

        They are also a per-sample output (the minibatch's ``her_goal_rows``; pickled once with
        the request).

        Parameters
        ----------
        request : Request
            The drawn minibatch. Cost: ``HER.goal_rows``.
        """
        assert self._table is not None
        goals = self.her.goal_rows(self._table, request.rows)
        request.outputs["her_goal_rows"] = goals
        request.parts[self.name] = goals

    def worker(self) -> Feature:
        # docstring inherited
        # the relabelling without the sampler's table and index (HER pickles without its episodes)
        return Relabelling(self.her)

    def apply(self, table: Table, batch: dict[str, Any], payload: Any) -> dict[str, Any]:
        # docstring inherited
        # payload: the goal rows (None: the request has none; the minibatch is left as it is)
        if payload is None:
            return batch
        return self.her.relabel(table, {**batch, "her_goal_rows": payload})

    def hyperparameters(self) -> dict[str, Any]:
        # docstring inherited
        return {"her": self.her.hyperparameters()}

    def state_dict(self) -> dict[str, Any]:
        # docstring inherited
        return {"her": self.her.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # docstring inherited
        if "her" in state:
            self.her.load_state_dict(state["her"])


class Transform(Feature):
    """``make_loader(transform=)``: a function of the gathered minibatch, run last where it is gathered.

    Parameters
    ----------
    fn : callable
        ``fn(batch of numpy arrays) -> batch`` (checked by ``make_loader``).
    """

    name = "transform"

    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.fn = fn

    def worker(self) -> Feature:
        # docstring inherited
        # the transform itself: its function is sent once to each worker
        return self

    def apply(self, table: Table, batch: dict[str, Any], payload: Any) -> dict[str, Any]:
        # docstring inherited
        # fn(batch); its exceptions as TransformError with their traceback text
        return apply_transform(self.fn, batch)


def features_of(table: Table, stack: int | None, stack_padding: str, stack_field: str, n_step: int | None,
                gamma: float, her: HER | None) -> list[Feature]:
    """A sampler's features from its keywords, checked against ``table``, in the order they prepare a request.

    Stacking comes first: n-step windows over stacked frames end where the stack after them exists.

    Parameters
    ----------
    table : Table
        The sampler's table.
    stack, stack_padding, stack_field : int or None, str, str
        Frame stacking (None: off).
    n_step, gamma : int or None, float
        N-step returns, already checked (``loaders.nstep.check_nstep``; None: off).
    her : HER or None
        Hindsight relabelling.

    Returns
    -------
    list of Feature
        The features. Cost: each feature's construction (no index is built yet).

    Raises
    ------
    SamplerParameterError
        A bad ``stack*`` argument.
    StoreError
        With ``her``: the schema lacks a field it uses.
    """
    parts: list[Feature] = []
    stacking = None if stack is None else Stacking(table, stack, stack_padding, stack_field)
    if stacking is not None:
        parts.append(stacking)
    if n_step is not None:
        parts.append(NStep(table, n_step, gamma, stacking))
    if her is not None:
        parts.append(Relabelling(her))
    for part in parts:
        part.check(table)
    return parts


def restricting(parts: list[Feature]) -> Feature | None:
    """The feature that restricts which rows a sampler draws (one that overrides :meth:`Feature.eligibility`).

    Parameters
    ----------
    parts : list of Feature
        A sampler's features (loaders/combinations.py admits at most one that restricts).

    Returns
    -------
    Feature or None
        The first such feature. Cost: O(features).
    """
    return next((f for f in parts if type(f).eligibility is not Feature.eligibility), None)
