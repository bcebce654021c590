"""Dict and Tuple observation spaces: their leaves, nested schema fields, and per-slot leaf arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from replaystore.errors import ShapeError, UnsupportedSpaceError
from replaystore.schemas import Dense
from replaystore.schemas.nesting import SEP

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def is_nested(space: Any) -> bool:
    """Whether ``space`` is a Dict or Tuple space."""
    return isinstance(space, (spaces.Dict, spaces.Tuple))


def leaf_layout(space: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and per-record shape of one value of leaf space ``space``."""
    if isinstance(space, spaces.Discrete):
        return np.dtype(space.dtype), ()
    return np.dtype(space.dtype), tuple(int(d) for d in space.shape)


def structure(space: Any, role: str, supported: str) -> Any:
    """The nested field structure (dicts/tuples of :class:`Dense`) of a Dict or Tuple space.

    Raises UnsupportedSpaceError for a leaf space that is not Box/Discrete/MultiDiscrete/MultiBinary,
    an empty Dict/Tuple, or a Dict key that is not an identifier without ``__``. Cost: O(leaves).
    """
    if isinstance(space, spaces.Dict):
        if not space.spaces:
            raise UnsupportedSpaceError(f"{role} space Dict", supported, "an empty Dict has no column to store")
        out = {}
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or not key.isidentifier() or SEP in key or key.startswith("_"):
                raise UnsupportedSpaceError(f"{role} space Dict key {key!r}", "identifier keys without '__'",
                                            "a key must be a valid column name part")
            out[key] = structure(sub, f"{role}[{key!r}]", supported)
        return out
    if isinstance(space, spaces.Tuple):
        if not space.spaces:
            raise UnsupportedSpaceError(f"{role} space Tuple", supported, "an empty Tuple has no column to store")
        return tuple(structure(sub, f"{role}[{i}]", supported) for i, sub in enumerate(space.spaces))
    if isinstance(space, LEAF_SPACES):
        dtype, shape = leaf_layout(space)
        return Dense("leaf", dtype, shape)
    raise UnsupportedSpaceError(f"{role} space {type(space).__name__}", supported,
                                "it has no fixed-shape numeric column layout")


def leaves(space: Any) -> list[tuple[str, tuple[Any, ...], Any]]:
    """``(suffix, path, leaf space)`` of each leaf of a Dict/Tuple space, in column order.

    ``suffix`` is what follows the field name in the leaf's column (``__image``); ``path`` the
    keys (str for Dict, int for Tuple) that reach it. Cost: O(leaves).
    """
    out: list[tuple[str, tuple[Any, ...], Any]] = []

    def walk(sub: Any, suffix: str, path: tuple[Any, ...]) -> None:
        if isinstance(sub, spaces.Dict):
            for k, s in sub.spaces.items():
                walk(s, f"{suffix}{SEP}{k}", (*path, k))
        elif isinstance(sub, spaces.Tuple):
            for i, s in enumerate(sub.spaces):
                walk(s, f"{suffix}{SEP}{i}", (*path, i))
        else:
            out.append((suffix, path, sub))

    walk(space, "", ())
    return out


def pick(value: Any, path: tuple[Any, ...], name: str) -> Any:
    """The leaf of nested observation ``value`` at ``path`` (a ShapeError naming ``name`` if absent)."""
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise ShapeError(name, f"an observation with key {key!r}", f"{type(value).__name__}") from exc
    return value


class Leaves:
    """The leaf arrays of nested observations, indexed together (``[slots, ...]`` per leaf).

    Parameters
    ----------
    arrays : dict of str to numpy.ndarray
        Leaf suffix (``__image``) to array; every array has the same leading axis.
    """

    __slots__ = ("arrays",)

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def __getitem__(self, index: Any) -> Leaves:
        """The rows ``index`` of every leaf."""
        return Leaves({k: a[index] for k, a in self.arrays.items()})

    def __setitem__(self, index: Any, other: Leaves) -> None:
        """Set rows ``index`` of every leaf from ``other``'s leaves."""
        for k, a in self.arrays.items():
            a[index] = other.arrays[k]

    def copy(self) -> Leaves:
        """A copy of every leaf array."""
        return Leaves({k: a.copy() for k, a in self.arrays.items()})


def replace_rows(obs: Any, final_obs: Any, done: np.ndarray) -> Any:
    """``obs`` with the rows of ended envs taken from ``final_obs``.

    ``obs`` is a nested value of ``[envs, ...]`` arrays; ``final_obs`` one nested observation per
    env, as SAME_STEP's ``infos["final_obs"]``. Cost: a copy of each leaf.
    """
    if isinstance(obs, Mapping):
        return {k: replace_rows(v, _child(final_obs, k, done), done) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(replace_rows(v, _child(final_obs, i, done), done) for i, v in enumerate(obs))
    out = np.array(obs, copy=True)
    for i in np.flatnonzero(done):
        out[i] = final_obs[i]
    return out


def _child(final_obs: Any, key: Any, done: np.ndarray) -> list[Any]:
    """Per env: ``final_obs[i][key]`` for ended envs (None for the others)."""
    return [final_obs[i][key] if done[i] else None for i in range(len(done))]
