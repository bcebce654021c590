"""Built-in schemas for the batch formats replaystore serves.

Field names and shapes follow the producers' batch formats exactly. Dtypes (see
docs/SCHEMAS.md): observations float32; bootstrap masks float32; every other
float (targets, rewards, discounts, advantages, probabilities, weights) float64;
ids, players, actions and iterations int64; flags bool; CSR offsets int64.
When the action count is known, action ids are range-checked at append.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaystore.schemas.fields import BatchMeta, Dense, Ragged
from replaystore.schemas.schema import Schema

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def _meta(extra: Mapping[str, Any] | None, **known: Any) -> dict[str, Any]:
    return {**{k: v for k, v in known.items() if v is not None}, **(extra or {})}


def _obs(name: str, observation_size: int, what: str) -> Dense:
    return Dense(name, F32, (observation_size,), description=what)


def _legal(prefix: str, actions: int | None, what: str) -> Ragged:
    return Ragged(f"{prefix}legal_ids", I64, f"{prefix}legal_offsets", id_bound=actions, description=what)


def treestrap(observation_size: int, heads: int, actions: int, *,
              metadata: Mapping[str, Any] | None = None) -> Schema:
    """TreeStrapBatch: searched action targets per ensemble head.

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    heads : int
        Number of ensemble heads.
    actions : int
        Number of actions (bounds the action ids).
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"treestrap"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("treestrap", [
        _obs("obs", observation_size, "acting/player-perspective observation"),
        Dense("players", I64, description="perspective/player id"),
        Dense("targets", F64, (heads, actions), description="searched action targets per ensemble head"),
        Dense("masks", F32, (heads,), description="record/head bootstrap membership"),
        BatchMeta("telemetry", "collection measurements"),
    ], metadata=_meta(metadata, observation_size=observation_size, heads=heads, actions=actions))


def dqn(observation_size: int, heads: int, *, actions: int | None = None,
        metadata: Mapping[str, Any] | None = None) -> Schema:
    """DqnBatch: n-step transitions with CSR current/next legal actions.

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    heads : int
        Number of ensemble heads.
    actions : int, optional
        Number of actions; when given, action ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"dqn"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("dqn", [
        _obs("obs", observation_size, "transition start observation"),
        _obs("next_obs", observation_size, "transition end observation"),
        Dense("players", I64, description="record perspective"),
        Dense("actions", I64, id_bound=actions, description="chosen action ids"),
        Dense("rewards", F64, description="reward sum over the record's window"),
        Dense("dones", BOOL, description="episode-ended flag (not the bootstrap rule)"),
        Dense("can_bootstrap", BOOL, description="whether the TD target includes a next-state value"),
        Dense("discounts", F64, description="gamma^k over the k decisions spanned; 0 where not bootstrapping"),
        Dense("masks", F32, (heads,), description="record/head bootstrap membership"),
        _legal("", actions, "current legal actions"),
        _legal("next_", actions, "next legal actions"),
    ], metadata=_meta(metadata, observation_size=observation_size, heads=heads, actions=actions))


def ppo(observation_size: int, *, actions: int | None = None,
        metadata: Mapping[str, Any] | None = None) -> Schema:
    """PpoBatch: on-policy records with GAE advantages and CSR legal actions.

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    actions : int, optional
        Number of actions; when given, action ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"ppo"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("ppo", [
        _obs("obs", observation_size, "acting-player observation"),
        Dense("players", I64, description="acting player id"),
        Dense("actions", I64, id_bound=actions, description="sampled action ids, encoder head frame"),
        Dense("behavior_log_probs", F64, description="log-probability of the sampled action at collection"),
        Dense("advantages", F64, description="GAE(lambda) advantages"),
        Dense("returns", F64, description="advantages + values: the value regression target"),
        Dense("values", F64, description="collection-time critic values"),
        _legal("", actions, "legal actions at each decision, head frame"),
        BatchMeta("telemetry", "collection measurements"),
    ], metadata=_meta(metadata, observation_size=observation_size, actions=actions))


def alphazero(observation_size: int, actions: int, *, metadata: Mapping[str, Any] | None = None) -> Schema:
    """AlphaZeroBatch: root visit distributions, realized returns and CSR legality.

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    actions : int
        Number of actions (bounds the action ids).
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"alphazero"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("alphazero", [
        _obs("obs", observation_size, "player-perspective observation"),
        Dense("players", I64, description="perspective/player id"),
        Dense("policy_targets", F64, (actions,), description="root visit distribution"),
        Dense("value_targets", F64, description="realized return-to-go"),
        Dense("policy_weights", F64, description="whether the row contributes policy loss"),
        _legal("", actions, "legal action ids in the encoder's head frame"),
    ], metadata=_meta(metadata, observation_size=observation_size, actions=actions))


def deep_cfr_advantage(observation_size: int, *, actions: int | None = None,
                       metadata: Mapping[str, Any] | None = None) -> Schema:
    """The advantage stream of a DeepCfrBatch (targets aligned with legal ids).

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    actions : int, optional
        Number of actions; when given, action ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"deep_cfr_advantage"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("deep_cfr_advantage", [
        _obs("advantage_obs", observation_size, "information-state observations"),
        Dense("advantage_iterations", I64, description="CFR iteration, for loss weighting"),
        _legal("advantage_", actions, "legal action ids"),
        Ragged("advantage_targets", F64, "advantage_legal_offsets", description="advantages aligned with legal ids"),
        BatchMeta("telemetry", "traversal and inference measurements"),
    ], metadata=_meta(metadata, observation_size=observation_size, actions=actions))


def deep_cfr_strategy(observation_size: int, *, actions: int | None = None,
                      metadata: Mapping[str, Any] | None = None) -> Schema:
    """The strategy stream of a DeepCfrBatch (probabilities aligned with legal ids).

    Parameters
    ----------
    observation_size : int
        Length of the flat float32 observation vector.
    actions : int, optional
        Number of actions; when given, action ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"deep_cfr_strategy"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    return Schema("deep_cfr_strategy", [
        _obs("strategy_obs", observation_size, "average-policy observations"),
        Dense("strategy_iterations", I64, description="CFR iteration, for sampling/weighting"),
        Dense("strategy_players", I64, description="acting player"),
        _legal("strategy_", actions, "legal action ids"),
        Ragged("strategy_probs", F64, "strategy_legal_offsets",
               description="action probabilities aligned with legal ids"),
        BatchMeta("telemetry", "traversal and inference measurements"),
    ], metadata=_meta(metadata, observation_size=observation_size, actions=actions))


def _step_fields(obs_shape: tuple[int, ...], action_shape: tuple[int, ...], action_dtype: npt.DTypeLike,
                 obs_dtype: npt.DTypeLike, reward_dtype: npt.DTypeLike, actions: int | None,
                 truncated: bool) -> list[Dense]:
    action_dt = np.dtype(action_dtype)
    fields = [
        Dense("obs", np.dtype(obs_dtype), tuple(obs_shape), description="observation s_t"),
        Dense("action", action_dt, action_shape,
              id_bound=actions if action_dt.kind in "iu" else None, description="action a_t"),
        Dense("reward", np.dtype(reward_dtype), description="reward r_{t+1}"),
        Dense("next_obs", np.dtype(obs_dtype), tuple(obs_shape), description="successor s_{t+1}"),
        Dense("terminated", BOOL, description="whether s_{t+1} is terminal"),
    ]
    if truncated:
        fields.append(Dense("truncated", BOOL, description="whether the episode was truncated at this step"))
    return fields


def transitions(obs_shape: tuple[int, ...] | int, action_shape: tuple[int, ...] = (),
                action_dtype: npt.DTypeLike = np.int64, *, obs_dtype: npt.DTypeLike = np.float32,
                reward_dtype: npt.DTypeLike = np.float32, actions: int | None = None,
                metadata: Mapping[str, Any] | None = None) -> Schema:
    """Transitions: a flat batch of (s, a, r, s', terminated).

    Parameters
    ----------
    obs_shape : int or tuple of int
        Shape of one observation.
    action_shape : tuple of int, optional
        Shape of one action (``()``: a scalar).
    action_dtype : numpy dtype-like, optional
        Dtype of actions (default int64).
    obs_dtype : numpy dtype-like, optional
        Dtype of observations (default float32).
    reward_dtype : numpy dtype-like, optional
        Dtype of rewards (default float32).
    actions : int, optional
        Number of actions; for integer action dtypes, ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"transitions"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    shape = (obs_shape,) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape)
    return Schema("transitions",
                  _step_fields(shape, action_shape, action_dtype, obs_dtype, reward_dtype, actions, False),
                  metadata=_meta(metadata, actions=actions))


def episode(obs_shape: tuple[int, ...] | int, action_shape: tuple[int, ...] = (),
            action_dtype: npt.DTypeLike = np.int64, *, obs_dtype: npt.DTypeLike = np.float32,
            reward_dtype: npt.DTypeLike = np.float32, actions: int | None = None,
            metadata: Mapping[str, Any] | None = None) -> Schema:
    """Episode steps: one record per step; the final observation is the last step's ``next_obs``.

    An Episode (T steps, ``final_obs``, ``terminated``) converts with
    :func:`replaystore.schemas.containers.episode_columns`. Each step also
    carries ``truncated``.

    Parameters
    ----------
    obs_shape : int or tuple of int
        Shape of one observation.
    action_shape : tuple of int, optional
        Shape of one action (``()``: a scalar).
    action_dtype : numpy dtype-like, optional
        Dtype of actions (default int64).
    obs_dtype : numpy dtype-like, optional
        Dtype of observations (default float32).
    reward_dtype : numpy dtype-like, optional
        Dtype of rewards (default float32).
    actions : int, optional
        Number of actions; for integer action dtypes, ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"episode"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    shape = (obs_shape,) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape)
    return Schema("episode",
                  _step_fields(shape, action_shape, action_dtype, obs_dtype, reward_dtype, actions, True),
                  metadata=_meta(metadata, actions=actions))


def rollout(obs_shape: tuple[int, ...] | int, action_shape: tuple[int, ...] = (),
            action_dtype: npt.DTypeLike = np.int64, *, obs_dtype: npt.DTypeLike = np.float32,
            reward_dtype: npt.DTypeLike = np.float32, actions: int | None = None,
            metadata: Mapping[str, Any] | None = None) -> Schema:
    """Rollout steps: a ``[T, B]`` rollout is stored as B streams of T step records.

    Convert with :func:`replaystore.schemas.containers.rollout_columns`. Each
    step also carries ``truncated``.

    Parameters
    ----------
    obs_shape : int or tuple of int
        Shape of one observation.
    action_shape : tuple of int, optional
        Shape of one action (``()``: a scalar).
    action_dtype : numpy dtype-like, optional
        Dtype of actions (default int64).
    obs_dtype : numpy dtype-like, optional
        Dtype of observations (default float32).
    reward_dtype : numpy dtype-like, optional
        Dtype of rewards (default float32).
    actions : int, optional
        Number of actions; for integer action dtypes, ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"rollout"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    shape = (obs_shape,) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape)
    return Schema("rollout",
                  _step_fields(shape, action_shape, action_dtype, obs_dtype, reward_dtype, actions, True),
                  metadata=_meta(metadata, actions=actions))


def frames(frame_shape: tuple[int, ...] | int, actions: int | None = None, action_shape: tuple[int, ...] = (),
           action_dtype: npt.DTypeLike = np.int64, *, frame_dtype: npt.DTypeLike = np.uint8,
           reward_dtype: npt.DTypeLike = np.float32, codec: Any = None,
           metadata: Mapping[str, Any] | None = None) -> Schema:
    """Frame steps: one frame per record, stored once; samplers stack them at read time (``stack=``).

    Record t of an episode holds the observation seen at step t (``frame``), the
    action taken on it, the reward that followed and whether the step ended the
    episode. An episode of T steps is T + 1 records: after the last step comes a
    frame-only record holding the final observation (its action, reward and flags
    are zero / False and are never sampled). Each episode starts with
    ``reset=True`` (or its own stream). A sampler with ``stack=k`` draws only
    records with a next record in the same episode, so the terminal step's
    ``next_obs`` ends with the final observation (docs/SCHEMAS.md, "Frames").

    Parameters
    ----------
    frame_shape : int or tuple of int
        Shape of one frame (e.g. ``(84, 84)``).
    actions : int, optional
        Number of actions; for integer action dtypes, ids are checked against ``[0, actions)``.
    action_shape : tuple of int, optional
        Shape of one action (``()``: a scalar).
    action_dtype : numpy dtype-like, optional
        Dtype of actions (default int64).
    frame_dtype : numpy dtype-like, optional
        Dtype of frames (default uint8).
    reward_dtype : numpy dtype-like, optional
        Dtype of rewards (default float32).
    codec : Any, optional
        Compression of the frame field, passed to ``Dense(..., codec=)``
        (None: the field's default).
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"frames"``.

    Raises
    ------
    SchemaError
        A size that is not a positive int, metadata that is not JSON-serialisable,
        or a ``codec`` that is not one of ``Dense``'s (the error names the frame field).
    """
    shape = (frame_shape,) if isinstance(frame_shape, (int, np.integer)) else tuple(frame_shape)
    action_dt = np.dtype(action_dtype)
    fields = [
        Dense("frame", np.dtype(frame_dtype), shape, description="observation s_t (the final one on the "
              "frame-only record closing an episode)", codec=codec),
        Dense("action", action_dt, action_shape,
              id_bound=actions if action_dt.kind in "iu" else None, description="action a_t"),
        Dense("reward", np.dtype(reward_dtype), description="reward r_{t+1}"),
        Dense("terminated", BOOL, description="whether s_{t+1} is terminal"),
        Dense("truncated", BOOL, description="whether the episode was truncated at this step"),
    ]
    return Schema("frames", fields, metadata=_meta(metadata, actions=actions))


BUILTINS: dict[str, Callable[..., Schema]] = {
    "treestrap": treestrap,
    "dqn": dqn,
    "ppo": ppo,
    "alphazero": alphazero,
    "deep_cfr_advantage": deep_cfr_advantage,
    "deep_cfr_strategy": deep_cfr_strategy,
    "transitions": transitions,
    "episode": episode,
    "rollout": rollout,
    "frames": frames,
}

EXAMPLE_ARGS: dict[str, dict[str, Any]] = {
    "treestrap": {"observation_size": 16, "heads": 2, "actions": 9},
    "dqn": {"observation_size": 16, "heads": 2, "actions": 9},
    "ppo": {"observation_size": 16, "actions": 9},
    "alphazero": {"observation_size": 16, "actions": 9},
    "deep_cfr_advantage": {"observation_size": 16, "actions": 9},
    "deep_cfr_strategy": {"observation_size": 16, "actions": 9},
    "transitions": {"obs_shape": (16,)},
    "episode": {"obs_shape": (16,)},
    "rollout": {"obs_shape": (16,)},
    "frames": {"frame_shape": (84, 84), "actions": 6},
}
"""Example sizes used by ``replaystore schemas`` to print each built-in."""


def goal_transitions(obs_dim: int, goal_dim: int, action_dim: int | None = None, *,
                     action_dtype: npt.DTypeLike | None = None, obs_dtype: npt.DTypeLike = np.float32,
                     goal_dtype: npt.DTypeLike = np.float32, reward_dtype: npt.DTypeLike = np.float32,
                     actions: int | None = None, metadata: Mapping[str, Any] | None = None) -> Schema:
    """Goal-conditioned transitions, flat: gymnasium-robotics' Dict observation as three fields, twice.

    Fields: ``observation``, ``achieved_goal``, ``desired_goal`` (the observation
    s_t), ``action``, ``reward``, ``next_observation``, ``next_achieved_goal``,
    ``next_desired_goal`` (s_{t+1}), ``terminated`` and ``truncated``; the fields
    hindsight relabelling (``replaystore.loaders.HER``) reads and rewrites.

    Parameters
    ----------
    obs_dim : int
        Size of ``observation``.
    goal_dim : int
        Size of ``achieved_goal`` and ``desired_goal``.
    action_dim : int, optional
        Size of a continuous action vector; None (default): a scalar discrete action.
    action_dtype : numpy dtype-like, optional
        Dtype of actions (default float32 with ``action_dim``, int64 without).
    obs_dtype : numpy dtype-like, optional
        Dtype of ``observation`` (default float32).
    goal_dtype : numpy dtype-like, optional
        Dtype of the goals (default float32).
    reward_dtype : numpy dtype-like, optional
        Dtype of rewards (default float32).
    actions : int, optional
        Number of discrete actions; integer action ids are checked against ``[0, actions)``.
    metadata : mapping, optional
        Extra schema metadata, merged over the sizes recorded here.

    Returns
    -------
    Schema
        The schema named ``"goal_transitions"``. Cost: O(1).

    Raises
    ------
    SchemaError
        A size that is not a positive int, or metadata that is not JSON-serialisable.
    """
    action_shape: tuple[int, ...] = () if action_dim is None else (action_dim,)
    action_dt = np.dtype(action_dtype if action_dtype is not None else np.int64 if action_dim is None else np.float32)
    fields = []
    for prefix, when in (("", "s_t"), ("next_", "s_{t+1}")):
        fields += [Dense(f"{prefix}observation", np.dtype(obs_dtype), (obs_dim,), description=f"observation of {when}"),
                   Dense(f"{prefix}achieved_goal", np.dtype(goal_dtype), (goal_dim,),
                         description=f"goal achieved in {when}"),
                   Dense(f"{prefix}desired_goal", np.dtype(goal_dtype), (goal_dim,),
                         description=f"goal pursued in {when}")]
        if not prefix:
            fields += [Dense("action", action_dt, action_shape,
                             id_bound=actions if action_dt.kind in "iu" else None, description="action a_t"),
                       Dense("reward", np.dtype(reward_dtype), description="reward r_{t+1}")]
    fields += [Dense("terminated", BOOL, description="whether s_{t+1} is terminal"),
               Dense("truncated", BOOL, description="whether the episode was truncated at this step")]
    return Schema("goal_transitions", fields,
                  metadata=_meta(metadata, obs_dim=obs_dim, goal_dim=goal_dim, action_dim=action_dim, actions=actions))
