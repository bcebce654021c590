"""Saving a sampler's state into its store, and restoring it with the hyperparameters checked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import ResumeMismatchError
from replaystore.store import Store

if TYPE_CHECKING:
    from replaystore.loaders.ratelimit import SampleGate


class Resumable:
    """What a sampler adds to its ``state_dict``/``load_state_dict`` to persist them: :meth:`save`, :meth:`restore`.

    A mixin of ``StoreSampler``, which provides the attributes and methods it uses.
    """

    store: Store
    name: str
    batch_size: int
    seed: int
    rng: np.random.Generator
    rate_limit: SampleGate | None
    overridable: frozenset[str] = frozenset({"batch_size", "seed"})
    """The hyperparameters ``restore(override=True)`` lets the given values replace."""

    def hyperparameters(self) -> dict[str, Any]:
        """The constructor arguments saved state must agree with (the sampler's).

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue sampling exactly (the sampler's).

        Returns
        -------
        dict of str to Any
            Name to value.
        """
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (the sampler's).

        Parameters
        ----------
        state : dict of str to Any
            A saved state.
        """
        raise NotImplementedError

    def save(self) -> int:
        """Persist :meth:`state_dict` into the store's state slot ``name``.

        The slot keeps its newest two versions (``Store.save_state``'s
        ``keep_last``). Cost: one state-slot write (a JSON document plus the numpy
        arrays of the state).

        Returns
        -------
        int
            The version of the saved state.
        """
        state = self.state_dict()
        if self.rate_limit is not None:
            self.rate_limit.sync()
        arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
        doc = {k: v for k, v in state.items() if k not in arrays}
        return self.store.save_state(self.name, doc, arrays)

    def restore(self, override: bool = False) -> bool:
        """Load the state saved in slot ``name``.

        The saved :meth:`hyperparameters` must equal this sampler's. With
        ``override=True`` the given values win for the parameters in
        :attr:`overridable`, and the state is kept otherwise: ``batch_size`` applies
        to the next minibatch; a new ``seed`` starts a fresh RNG from it (the saved
        RNG state is dropped, counters and sampler data are kept); see the subclasses
        for theirs. States saved without hyperparameters are checked on the ones they
        hold. Cost: reading the slot.

        Parameters
        ----------
        override : bool, optional
            Let the given values of overridable hyperparameters replace saved ones.

        Returns
        -------
        bool
            True if a state was loaded, False if none was saved.

        Raises
        ------
        ResumeMismatchError
            A saved hyperparameter differs (without ``override``), or one outside
            :attr:`overridable` differs (with it); it names every differing one and
            nothing is loaded.
        StoreError
            The slot holds the state of another kind of sampler.
        """
        saved = self.store.load_state(self.name)
        if saved is None:
            return False
        doc, arrays = saved
        state = {**doc, **arrays}
        given = self.hyperparameters()
        stored = state.get("hyperparameters")
        if not isinstance(stored, dict):  # saved before hyperparameters were: those the state holds
            stored = {k: state[k] for k in given if k in state}
        diff = {k: (stored[k], v) for k, v in given.items() if k in stored and stored[k] != v}
        fixed = {k: d for k, d in diff.items() if k not in self.overridable}
        if fixed and override:
            raise ResumeMismatchError(self.name, fixed, f"{sorted(fixed)} cannot be overridden "
                                      f"(overridable: {sorted(self.overridable)})")
        if diff and not override:
            raise ResumeMismatchError(self.name, diff)
        self.load_state_dict(state)
        if diff:
            self._override(given, diff)
        return True

    def _override(self, given: dict[str, Any], diff: dict[str, tuple[Any, Any]]) -> None:
        """After loading state saved with other hyperparameters: make the ``given`` ones current."""
        self.batch_size = given["batch_size"]
        if "seed" in diff:
            self.seed = given["seed"]
            self.rng = np.random.default_rng(self.seed)
