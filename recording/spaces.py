"""Gymnasium spaces -> step schemas, the spaces' JSON form, and the value bounds a recorder checks."""

from __future__ import annotations

import dataclasses
import enum
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from gymnasium import spaces

from replaystore.errors import SchemaError, UnsupportedSpaceError
from replaystore.gym.nestobs import is_nested, structure
from replaystore.schemas import Dense, Schema, episode, nested

SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary"
"""The spaces :func:`schema_from_spaces` lays out as columns."""

INFO_PREFIX = "info_"
VALID_SUFFIX = "_valid"

InfoSpec = npt.DTypeLike | tuple[npt.DTypeLike, tuple[int, ...]]
"""What an info key holds: a dtype (a scalar per step) or ``(dtype, shape)``."""


def _check_space(space: Any, role: str) -> None:
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return
    kind = type(space).__name__
    if is_nested(space) and role in ("observation", "the"):
        structure(space, role, SUPPORTED + ", and Dict/Tuple of them for observations")
        return
    if is_nested(space):
        raise UnsupportedSpaceError(f"{role} space {kind}", SUPPORTED,
                                    "Dict and Tuple spaces are supported for observations only")
    raise UnsupportedSpaceError(f"{role} space {kind}", SUPPORTED,
                                "it has no fixed-shape numeric column layout")


def _layout(space: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and per-record shape of one value of ``space``."""
    if isinstance(space, spaces.Discrete):
        return np.dtype(space.dtype), ()
    return np.dtype(space.dtype), tuple(int(d) for d in space.shape)


def space_json(space: Any, *, use_minari: bool = True) -> str:
    """``space`` serialised as Minari serialises it (``minari.serialization.serialize_space``).

    Parameters
    ----------
    space
        A Box, Discrete, MultiDiscrete or MultiBinary space, or a Dict/Tuple of them.
    use_minari
        Call Minari's function when Minari is installed; without it (or with False) an
        equivalent form is written here, with the same text.

    Returns
    -------
    str
        The JSON text (infinite bounds as ``Infinity``, as Python's ``json`` writes them).

    Raises
    ------
    UnsupportedSpaceError
        Any other space.
    """
    _check_space(space, "the")
    if use_minari:
        try:
            from minari.serialization import serialize_space
        except ImportError:
            pass
        else:
            return str(serialize_space(space))
    return json.dumps(_space_doc(space))


def _space_doc(space: Any) -> dict[str, Any]:
    """Minari's JSON form of ``space`` as a dict (Dict and Tuple nest their subspaces)."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "subspaces": {k: _space_doc(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "subspaces": [_space_doc(s) for s in space.spaces]}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape),
                "low": space.low.tolist(), "high": space.high.tolist()}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "dtype": str(space.dtype), "nvec": space.nvec.tolist(),
                "start": space.start.tolist()}
    return {"type": "MultiBinary", "n": space.n}


def _jsonable(value: Any, path: str, changed: list[str]) -> Any:
    """``value`` as JSON data; each change is listed in ``changed`` as ``path (what was done)``.

    Arrays and numpy scalars become lists and numbers, enums their values, dataclasses dicts;
    anything else that JSON cannot hold becomes its ``repr``.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{path}[{k!r}]", changed) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}[{i}]", changed) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name), f"{path}.{f.name}", changed)
                for f in dataclasses.fields(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        changed.append(f"{path} ({type(value).__name__}, kept as {'a list' if value.ndim else 'a number'})")
        return _jsonable(value.tolist(), path, [])
    if isinstance(value, enum.Enum) and isinstance(value.value, (bool, int, float, str)):
        changed.append(f"{path} ({type(value).__name__}, kept as its value {value.value!r})")
        return value.value
    changed.append(f"{path} ({type(value).__name__}, replaced by its repr)")
    return repr(value)


def env_spec_json(env: Any) -> str | None:
    """The environment's ``spec.to_json()`` (for a vector env, its sub-environments' common spec).

    Returns None when the env has no spec. A spec that JSON cannot hold as it is (a kwarg that
    is a numpy array, an enum, an object; a callable entry point) is kept with those values
    converted: arrays and numpy scalars as lists and numbers, enums as their values, anything
    else as its ``repr``; a ``UserWarning`` names each converted value. Cost: for a vector env,
    one ``get_attr``.
    """
    spec = None
    if hasattr(env, "single_observation_space") and hasattr(env, "get_attr"):  # a vector env
        try:
            specs = env.get_attr("spec")
        except Exception:  # noqa: BLE001 - an env without the attribute: fall back to its own spec
            specs = ()
        if specs and all(s is not None and s == specs[0] for s in specs):
            spec = specs[0]
    if spec is None:
        spec = getattr(env, "spec", None)
    if spec is None:
        return None
    try:
        return str(spec.to_json())
    except (TypeError, ValueError):  # a value JSON cannot hold (TypeError) or a callable (ValueError)
        pass
    changed: list[str] = []
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        doc = _jsonable(spec, "spec", changed)
        for key in ("namespace", "name", "version"):  # what EnvSpec.to_json leaves out (derived from the id)
            doc.pop(key, None)
    else:  # not a gymnasium EnvSpec: nothing to keep
        warnings.warn(f"environment spec {spec!r} is not JSON-serialisable and is not kept", stacklevel=3)
        return None
    text = json.dumps(doc)
    warnings.warn(f"environment {getattr(spec, 'id', '?')!r}: its spec is not JSON-serialisable as it is; kept "
                  f"with these values converted: {', '.join(changed)}", UserWarning, stacklevel=3)
    return text


def info_columns(key: str, column: str | None = None) -> tuple[str, str]:
    """The value and presence column names of info key ``key`` (``info_<key>``, ``info_<key>_valid``).

    Raises SchemaError when the names are not identifiers.
    """
    name = column or f"{INFO_PREFIX}{key}"
    if not name.isidentifier():
        raise SchemaError(f"info key {key!r}: column {name!r} is not an identifier; give a column name "
                          f"with info_keys={{{key!r}: ...}} in the schema or rename the key")
    return name, f"{name}{VALID_SUFFIX}"


def schema_from_spaces(observation_space: Any, action_space: Any, *, name: str | None = None, env: Any = None,
                       reward_dtype: npt.DTypeLike = np.float64, info: Mapping[str, InfoSpec] | None = None,
                       metadata: Mapping[str, Any] | None = None) -> Schema:
    """A step schema for an environment's spaces, in the built-in ``episode`` layout.

    Fields: ``obs``, ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated`` (as
    :func:`replaystore.schemas.episode` builds them), then per info key ``info_<key>`` and the
    bool ``info_<key>_valid`` (false where the step's info lacked the key). ``Box`` keeps its
    dtype and shape, ``Discrete`` is a scalar int64 (range-checked when it starts at 0),
    ``MultiDiscrete`` and ``MultiBinary`` their dtype and shape. A ``Dict`` or ``Tuple``
    observation space (any depth) makes ``obs`` and ``next_obs`` nested fields, one column per
    leaf (``obs__image``; Tuple keys ``0``, ``1``, ...). The metadata keeps both spaces as
    Minari's JSON (``observation_space``, ``action_space``), the environment spec
    (``env_spec``, ``spec.to_json()``, when ``env`` has one) and ``env_id``.

    Parameters
    ----------
    observation_space, action_space
        Gymnasium spaces (for a vector env: its ``single_*`` spaces).
    name
        The schema name; default: the env id, else ``"gym"``.
    env
        The environment whose spec is kept (optional).
    reward_dtype
        A float dtype for ``reward`` (default float64, what Gymnasium returns).
    info
        Info keys to keep: ``{key: dtype}`` or ``{key: (dtype, shape)}``.
    metadata
        More schema metadata (JSON).

    Returns
    -------
    Schema

    Raises
    ------
    UnsupportedSpaceError
        ``Text``, ``Graph``, ``Sequence`` or any other space (also as a Dict/Tuple leaf), a
        ``Dict``/``Tuple`` action space, an empty Dict/Tuple, or a Dict key that is not an
        identifier without ``__``.
    SchemaError
        A non-float ``reward_dtype``, a bad info dtype or key.

    Cost: serialising the spaces (Box bounds are written out in full).
    """
    _check_space(observation_space, "observation")
    _check_space(action_space, "action")
    if np.dtype(reward_dtype).kind != "f":
        raise SchemaError(f"reward_dtype: expected a float dtype, got {np.dtype(reward_dtype)}")
    obs_tree = None
    obs_dtype: np.dtype
    obs_shape: tuple[int, ...]
    if is_nested(observation_space):
        obs_tree = structure(observation_space, "observation", SUPPORTED)
        obs_dtype, obs_shape = np.dtype(np.float32), ()
    else:
        obs_dtype, obs_shape = _layout(observation_space)
    act_dtype, act_shape = _layout(action_space)
    actions = None
    if isinstance(action_space, spaces.Discrete) and int(action_space.start) == 0:
        actions = int(action_space.n)
    base = episode(obs_shape, act_shape, act_dtype, obs_dtype=obs_dtype, reward_dtype=reward_dtype, actions=actions)
    fields: list[Any] = [f for f in base.fields if isinstance(f, Dense)]
    if obs_tree is not None:  # one column per leaf: obs__image, next_obs__image, ...
        fields = [nested(f.name, obs_tree) if f.name in ("obs", "next_obs") else f for f in fields]
    for key, spec in (info or {}).items():
        dtype, shape = spec if isinstance(spec, tuple) else (spec, ())
        value, valid = info_columns(key)
        fields.append(Dense(value, np.dtype(dtype), tuple(shape), finite=False,
                            description=f"info[{key!r}] of the step (zero where absent)"))
        fields.append(Dense(valid, np.dtype(np.bool_), description=f"whether the step's info had {key!r}"))
    meta: dict[str, Any] = dict(base.metadata)
    meta["observation_space"] = space_json(observation_space)
    meta["action_space"] = space_json(action_space)
    spec_json = env_spec_json(env) if env is not None else None
    if spec_json is not None:
        meta["env_spec"] = spec_json
        meta["env_id"] = json.loads(spec_json)["id"]
    meta.update(metadata or {})
    return Schema(name or meta.get("env_id") or "gym", fields, metadata=meta)


@dataclass(frozen=True)
class SpaceBounds:
    """The valid integer range ``[low, high)`` of a Discrete, MultiDiscrete or MultiBinary value."""

    low: np.ndarray | int
    high: np.ndarray | int


def bounds(space: Any) -> SpaceBounds | None:
    """The integer range a value of ``space`` must lie in; None for Box.

    Box is not checked: an agent's action is recorded as given, the environment clips it.
    """
    if isinstance(space, spaces.Discrete):
        return SpaceBounds(int(space.start), int(space.start) + int(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return SpaceBounds(np.asarray(space.start), np.asarray(space.start) + np.asarray(space.nvec))
    if isinstance(space, spaces.MultiBinary):
        return SpaceBounds(0, 2)
    return None
