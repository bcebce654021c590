"""Episode and Rollout containers -> step records of the ``episode`` / ``rollout`` schemas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import DTypeError, MissingFieldError, ShapeError, UnknownFieldError
from replaystore.schemas.columns import Columns
from replaystore.schemas.validate import batch_items, to_numpy

if TYPE_CHECKING:
    from replaystore.schemas.schema import Schema

STEP_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
EPISODE_FIELDS = ("obs", "action", "reward", "final_obs", "terminated", "truncated")


def _reject_unknown(items: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    """UnknownFieldError naming the first item of ``items`` not in ``known``."""
    unknown = sorted(set(items) - set(known))
    if unknown:
        raise UnknownFieldError(unknown[0], f"one of {sorted(known)}", "an unknown field",
                                f"{what} has no field(s) {unknown}")


def _require(items: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if name not in items:
            raise MissingFieldError(name, "present", "missing")


def _flag(name: str, value: Any) -> bool:
    arr = to_numpy(name, value) if not isinstance(value, (bool, np.bool_)) else np.asarray(value)
    if arr.dtype != np.bool_ or arr.ndim != 0:
        raise DTypeError(name, "a scalar bool", f"{arr.dtype} of shape {arr.shape}")
    return bool(arr)


def episode_columns(schema: Schema, episode: Any) -> Columns:
    """One episode as T step records.

    One episode (``obs`` [T, ...], ``action``, ``reward``, ``final_obs``, ``terminated`` and optionally ``truncated``,
    both scalar bools) as T step records.

    ``next_obs`` of step t is ``obs[t + 1]`` and, for the last step, ``final_obs``; the last
    step carries ``terminated`` and ``truncated`` as given (``truncated`` left out: ``not
    terminated``); earlier steps carry neither. Raises UnknownFieldError for any other item,
    MissingFieldError, ShapeError, DTypeError. Cost: one copy of the episode.
    """
    items = batch_items(episode)
    _reject_unknown(items, EPISODE_FIELDS, "an episode")
    _require(items, ("obs", "action", "reward", "final_obs", "terminated"))
    obs = to_numpy("obs", items["obs"])
    final = to_numpy("final_obs", items["final_obs"])
    if obs.ndim < 1 or len(obs) == 0:
        raise ShapeError("obs", "at least one step", f"shape {obs.shape}")
    if final.shape != obs.shape[1:]:
        raise ShapeError("final_obs", f"shape {obs.shape[1:]} (one observation)", f"shape {final.shape}")
    if final.dtype != obs.dtype:
        raise DTypeError("final_obs", f"dtype {obs.dtype} (as 'obs')", f"dtype {final.dtype}")
    steps = len(obs)
    terminated = _flag("terminated", items["terminated"])
    truncated = _flag("truncated", items["truncated"]) if "truncated" in items else not terminated
    term = np.zeros(steps, dtype=bool)
    trunc = np.zeros(steps, dtype=bool)
    term[-1], trunc[-1] = terminated, truncated
    return schema.validate({
        "obs": obs,
        "action": items["action"],
        "reward": items["reward"],
        "next_obs": np.concatenate([obs[1:], final[None]]),
        "terminated": term,
        "truncated": trunc,
    })


def rollout_columns(schema: Schema, rollout: Any) -> tuple[Columns, int, int, np.ndarray]:
    """A ``[T, B, ...]`` rollout as B streams of T records, stream-major.

    Returns ``(columns, T, B, reset)``: record ``b * T + t`` is step t of slot b, and
    ``reset`` is true where the previous step of the same slot ended an episode
    (terminated or truncated), i.e. where a new episode starts inside the rollout. Every
    field, ``truncated`` included, is stored as given. Raises UnknownFieldError for an item
    that is not a step field, MissingFieldError, ShapeError, and the schema's field errors.
    """
    items = batch_items(rollout)
    _reject_unknown(items, STEP_FIELDS, "a rollout")
    _require(items, STEP_FIELDS)
    arrays = {name: to_numpy(name, items[name]) for name in STEP_FIELDS}
    lead = arrays["obs"].shape[:2]
    if len(lead) != 2:
        raise ShapeError("obs", "shape [T, B, ...]", f"shape {arrays['obs'].shape}")
    for name, arr in arrays.items():
        if arr.shape[:2] != lead:
            raise ShapeError(name, f"leading shape [T, B] = {list(lead)}", f"shape {arr.shape}")
    steps, slots = lead
    flat = {name: np.swapaxes(arr, 0, 1).reshape((steps * slots, *arr.shape[2:])) for name, arr in arrays.items()}
    cols = schema.validate(flat)
    done = (flat["terminated"] | flat["truncated"]).reshape(slots, steps)
    reset = np.zeros((slots, steps), dtype=bool)
    reset[:, 1:] = done[:, :-1]
    return cols, steps, slots, reset.reshape(-1)
