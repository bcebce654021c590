"""Which samplers take which features, and which features go together: the one table that decides.

Every sampler kind x feature pair and every feature x feature pair is either supported or
refused here, with the reason; a sampler's constructor calls :func:`check` before it builds
anything, so a refused combination raises :class:`~replaystore.errors.UnsupportedCombinationError`
naming both sides instead of being ignored or failing later. ``docs/GUIDE.md`` ("Which samplers
take which features") shows the same grid, and ``tests/loaders/test_feature_grid.py`` runs every
supported combination against a plain-Python reference and every refused one for its error.
"""

from __future__ import annotations

from collections.abc import Iterable

from replaystore.errors import UnsupportedCombinationError

SAMPLERS: dict[str, str] = {
    "uniform": "UniformSampler",
    "epoch": "EpochSampler",
    "sequence": "SequenceSampler",
    "prioritized": "PrioritizedSampler",
    "reservoir": "ReservoirSampler",
}
"""Sampler kind (``StoreSampler.kind``) to class name."""

FEATURES: tuple[str, ...] = ("stack", "n_step", "her", "transform", "rate_limiter", "subset", "refresh_every")
"""The features, by argument name (``transform`` is ``make_loader``'s, the others the samplers')."""

_EPISODIC = "a reservoir keeps a uniform sample of records, not of episodes: its members' neighbours are not followed"

SAMPLER_REFUSED: dict[tuple[str, str], str] = {
    ("sequence", "n_step"): "a sequence window already carries every step; n-step returns are per drawn record",
    ("sequence", "her"): "goals are relabelled per drawn record, not per window slot",
    ("reservoir", "stack"): _EPISODIC,
    ("reservoir", "n_step"): _EPISODIC,
    ("reservoir", "her"): _EPISODIC,
}
"""Sampler kind x feature pairs that are refused, with the reason; every other pair is supported."""

FEATURE_REFUSED: dict[tuple[str, str], str] = {
    ("stack", "her"): "goals are not relabelled in stacked frames",
    ("n_step", "her"): "a relabelled n-step reward would need compute_reward over every step of the window, "
                       "and the new goal and next achieved goal at the window's end",
}
"""Feature x feature pairs (in :data:`FEATURES` order) that are refused, with the reason."""

SAMPLER_FEATURES = ("stack", "n_step", "her")
"""The features whose support depends on the sampler kind (the others work with every sampler)."""


def sampler_reason(kind: str, feature: str) -> str | None:
    """Why sampler ``kind`` does not take ``feature``; None if it does.

    A kind outside :data:`SAMPLERS` (a sampler defined elsewhere) takes none of
    :data:`SAMPLER_FEATURES`: only the samplers here hand their draws to them.

    Parameters
    ----------
    kind : str
        A sampler kind (``StoreSampler.kind``).
    feature : str
        One of :data:`FEATURES`.

    Returns
    -------
    str or None
        The reason, in words. Cost: O(1).
    """
    if kind not in SAMPLERS and feature in SAMPLER_FEATURES:
        return f"only the samplers {sorted(SAMPLERS)} hand their draws to {feature}="
    return SAMPLER_REFUSED.get((kind, feature))


def feature_reason(a: str, b: str) -> str | None:
    """Why features ``a`` and ``b`` do not go together; None if they do.

    Parameters
    ----------
    a, b : str
        Two of :data:`FEATURES`, in either order.

    Returns
    -------
    str or None
        The reason, in words. Cost: O(1).
    """
    return FEATURE_REFUSED.get((a, b)) or FEATURE_REFUSED.get((b, a))


def supported(kind: str, features: Iterable[str]) -> bool:
    """Whether sampler ``kind`` takes all of ``features`` together.

    Parameters
    ----------
    kind : str
        A sampler kind.
    features : iterable of str
        Features of :data:`FEATURES`.

    Returns
    -------
    bool
        True when :func:`check` would pass. Cost: O(features**2).
    """
    try:
        check(kind, features)
    except UnsupportedCombinationError:
        return False
    return True


def check(kind: str, features: Iterable[str], name: str | None = None) -> None:
    """Refuse a sampler kind with a feature it does not take, or two features that do not go together.

    Parameters
    ----------
    kind : str
        The sampler kind (``StoreSampler.kind``).
    features : iterable of str
        The features given (of :data:`FEATURES`).
    name : str, optional
        The sampler's class name for the message (default: from :data:`SAMPLERS`).

    Raises
    ------
    UnsupportedCombinationError
        The first refused pair: the sampler and a feature (sampler pairs are checked first),
        or two features; it names both sides and why. Cost: O(features**2).
    """
    given = [f for f in FEATURES if f in set(features)]
    who = name or SAMPLERS.get(kind, kind)
    for f in given:
        why = sampler_reason(kind, f)
        if why is not None:
            raise UnsupportedCombinationError(who, f"{f}=", why)
    for i, a in enumerate(given):
        for b in given[i + 1:]:
            why = feature_reason(a, b)
            if why is not None:
                raise UnsupportedCombinationError(f"{a}=", f"{b}=", why)


def grid() -> dict[str, dict[str, bool]]:
    """The sampler x feature table: per sampler kind, per feature, whether it is taken.

    Returns
    -------
    dict of str to dict of str to bool
        Kind to feature to supported. Cost: O(kinds * features).
    """
    return {kind: {f: sampler_reason(kind, f) is None for f in FEATURES} for kind in SAMPLERS}
