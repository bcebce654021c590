"""Wrappers that put every transition an environment makes into a store.

``RecordEpisodes`` is a ``gymnasium.Wrapper``; ``RecordVectorEpisodes`` a
``gymnasium.vector.VectorWrapper``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from replaystore.errors import RecordingError, ReplayStoreError
from replaystore.gym.nestobs import replace_rows
from replaystore.gym.recorder import ALL, InfoValues, SlotRecorder
from replaystore.gym.spaces import InfoSpec
from replaystore.schemas import Schema
from replaystore.store import Store

_ONE = np.ones(1, dtype=bool)
_any = np.logical_or.reduce


class RecordEpisodes(gym.Wrapper):
    """Record every transition of a Gymnasium environment into a store.

    One stream, step numbers counting the environment's steps; each episode starts with a
    ``reset`` record; its last record keeps the terminal (or truncation) observation as
    ``next_obs`` and ``terminated``/``truncated`` as the environment reported them. The store
    is created with :func:`~replaystore.gym.schema_from_spaces` when absent. Records are
    committed every ``commit_every`` records and by :meth:`close`; each commit's metadata holds
    the episodes that ended since the previous one (see :func:`~replaystore.gym.recorded_episodes`).

    Parameters
    ----------
    env
        The environment (Box, Discrete, MultiDiscrete or MultiBinary spaces).
    url_or_store
        A store URL or path (opened with mode ``"a"``), or an open :class:`Store` (kept open by
        :meth:`close`).
    commit_every
        Commit once this many records are pending.
    info_keys
        Info keys recorded as ``info_<key>`` plus ``info_<key>_valid``: keys (dtype and shape
        from the first value) or ``{key: dtype or (dtype, shape)}``.
    schema
        The schema to create the store with (default: from the spaces).
    name
        The default schema's name (default: the env id).
    stream
        The stream key (default ``"w<writer>-0"``); a key already stored continues after its last step.
    capacity, storage_options
        For :func:`~replaystore.store.open_store`.
    frame_stack
        Frames per stacked observation (``FrameStackObservation(env, k)``: ``frame_stack=k``).
        The store then holds each frame once, zstd-compressed (the ``frames`` layout: the newest
        frame of each observation, one frame-only record closing each episode), and
        ``UniformSampler(st, n, stack=k, stack_padding=frame_padding)`` gives back the stacks
        the environment returned. Each observation is checked to be such a stack
        (RecordingError otherwise). A Dict observation (``FrameStackObservation`` stacks every
        leaf) stores each leaf as a frame field ``frame_<key>`` (``stack_field=``); every leaf
        must be a Box. None (default): observations are stored whole.
    frame_padding
        With ``frame_stack``: ``"reset"`` (default; ``FrameStackObservation``'s default
        ``padding_type``) or ``"zero"``.

    Raises
    ------
    UnsupportedSpaceError
        A space without a column layout.
    SchemaMismatchError
        An existing store's schema cannot hold this environment's steps.

    Notes
    -----
    ``step`` checks the action first (UnsafeCastError, IdRangeError, ShapeError naming
    ``action``) and does not step the environment if it is refused. A value the environment
    returns that cannot be cast raises after the step: nothing of it is stored, the episode is
    left unfinished and ``step`` raises RecordingError until the next ``reset``. Cost per step:
    a cast per field (microseconds); an append every few thousand records.
    """

    def __init__(self, env: gym.Env[Any, Any], url_or_store: str | os.PathLike[str] | Store, *,
                 commit_every: int = 10_000, info_keys: Sequence[str] | Mapping[str, InfoSpec | None] = (),
                 schema: Schema | None = None, name: str | None = None, stream: str | int | None = None,
                 capacity: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 frame_stack: int | None = None, frame_padding: str = "reset") -> None:
        super().__init__(env)
        self.recorder = SlotRecorder(url_or_store, 1, env.observation_space, env.action_space, env=env,
                                     schema=schema, name=name, info_keys=info_keys, commit_every=commit_every,
                                     streams=None if stream is None else [stream], capacity=capacity,
                                     storage_options=storage_options, frame_stack=frame_stack,
                                     frame_padding=frame_padding)

    @property
    def store(self) -> Store | None:
        """The store recorded into (None until created, with info keys whose dtype is inferred)."""
        return self.recorder.store

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the environment and start an episode (an unfinished one is left as it is).

        Parameters
        ----------
        seed : int, optional
            Passed to the environment's ``reset``; kept with the episode.
        options : dict, optional
            Passed to the environment's ``reset``.

        Returns
        -------
        tuple
            ``(observation, info)`` as the environment returned them. Cost: the environment's
            reset plus buffering one observation.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self.recorder.begin(_ONE, _one(obs), [seed])
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step the environment and record the transition.

        Parameters
        ----------
        action : object
            The action, passed to the environment as given.

        Returns
        -------
        tuple
            ``(observation, reward, terminated, truncated, info)`` as the environment returned
            them. Cost: the environment's step plus buffering one record; a commit every
            ``commit_every`` records.

        Raises
        ------
        RecordingError
            Before stepping, when no episode is in progress (no reset yet, the episode ended,
            or the last step failed to record), or after :meth:`close`.
        UnsafeCastError
            The action (before stepping) or a recorded value cannot be cast to its field's dtype.
        """
        if self.recorder.closed:
            raise RecordingError("step() after close()")
        if not self.recorder.in_episode[0]:
            raise RecordingError("no episode in progress (call reset() first: before the first step, after an "
                                 "episode ended and after a step that could not be recorded)")
        act = self.recorder.check_action(_one(action))
        obs, reward, terminated, truncated, info = self.env.step(action)
        infos: InfoValues = {}
        for key in self.recorder.info_keys:
            if key in info:
                infos[key] = (_one(info[key]), _ONE)
        self.recorder.record(_ONE, act, _one(obs), _one(reward), _one(terminated), _one(truncated), infos)
        return obs, reward, terminated, truncated, info

    def commit(self) -> None:
        """Commit what is pending now (``close`` does it too)."""
        self.recorder.commit()

    def close(self) -> None:
        """Commit what is pending, close the writer (and the store, if opened from a URL), then the env."""
        try:
            self.recorder.close()
        finally:
            super().close()


class RecordVectorEpisodes(VectorWrapper):
    """Record every transition of a Gymnasium vector environment into a store.

    One stream per sub-environment, in every autoreset mode.

    The mode is read from ``venv.metadata["autoreset_mode"]``:

    * ``NEXT_STEP`` (the default): the step after an episode's end resets that sub-env; it is
      not a transition and is not stored (its observation starts the next episode).
    * ``SAME_STEP``: an ending step's observation is the next episode's first; the terminal
      observation (``infos["final_obs"]``) is stored as ``next_obs`` and info keys are read
      from ``infos["final_info"]``.
    * ``DISABLED``: ended sub-envs wait for ``reset(options={"reset_mask": ...})``.

    ``reset(seed=s)`` gives sub-env ``i`` the seed ``s + i`` (a list: one each), kept with the
    episode; autoreset episodes have no seed. Info keys respect Gymnasium's ``_key`` masks.
    A value that cannot be cast stores nothing of that step for any sub-env; the sub-envs
    stepped leave their episodes unfinished and record again from their next reset or
    autoreset. Errors and costs as :class:`RecordEpisodes`.

    Parameters
    ----------
    env
        The vector environment; its ``metadata["autoreset_mode"]`` must be set.
    url_or_store
        A store URL or path (opened with mode ``"a"``), or an open :class:`Store`.
    commit_every
        Commit once this many records are pending.
    info_keys
        Info keys recorded, as for :class:`RecordEpisodes`.
    schema
        The schema to create the store with (default: from the single spaces).
    name
        The default schema's name (default: the env id).
    streams
        One stream key per sub-env (default ``"w<writer>-<i>"``).
    capacity, storage_options
        For :func:`~replaystore.store.open_store`.
    frame_stack, frame_padding
        As :class:`RecordEpisodes` (each sub-env's observations are checked to be stacks; the
        sub-envs' frames go to their own streams).

    Raises
    ------
    RecordingError
        The vector environment's metadata has no valid ``autoreset_mode``.
    UnsupportedSpaceError
        A space without a column layout.
    """

    def __init__(self, env: VectorEnv, url_or_store: str | os.PathLike[str] | Store, *,
                 commit_every: int = 10_000, info_keys: Sequence[str] | Mapping[str, InfoSpec | None] = (),
                 schema: Schema | None = None, name: str | None = None,
                 streams: Sequence[str | int] | None = None, capacity: int | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 frame_stack: int | None = None, frame_padding: str = "reset") -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode")
        if mode is None:
            raise RecordingError("the vector env's metadata has no 'autoreset_mode'; set "
                                 "env.metadata['autoreset_mode'] to a gymnasium.vector.AutoresetMode")
        try:
            self.autoreset_mode = AutoresetMode(mode)
        except ValueError:
            raise RecordingError(f"autoreset_mode {mode!r}: expected a gymnasium.vector.AutoresetMode") from None
        self.recorder = SlotRecorder(url_or_store, env.num_envs, env.single_observation_space,
                                     env.single_action_space, env=env, schema=schema, name=name,
                                     info_keys=info_keys, commit_every=commit_every, streams=streams,
                                     capacity=capacity, storage_options=storage_options,
                                     frame_stack=frame_stack, frame_padding=frame_padding)
        self._autoreset = np.zeros(env.num_envs, dtype=bool)  # sub-envs the next step resets (NEXT_STEP)
        self._started = False

    @property
    def store(self) -> Store | None:
        """The store recorded into (None until created, with info keys whose dtype is inferred)."""
        return self.recorder.store

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs, or those in ``options["reset_mask"]``, and start their episodes.

        Parameters
        ----------
        seed : int or list of int or None, optional
            Passed to the environment; sub-env ``i`` is recorded with seed ``seed + i`` (a list:
            one each).
        options : dict, optional
            Passed to the environment; ``"reset_mask"`` selects the sub-envs reset.

        Returns
        -------
        tuple
            ``(observations, infos)`` as the environment returned them. Cost: the
            environment's reset plus buffering the observations.
        """
        n = self.num_envs
        mask = options.get("reset_mask") if options else None
        mask = np.ones(n, dtype=bool) if mask is None else np.array(mask, dtype=bool)
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
        # (vector envs take a list of seeds too; VectorEnv.reset's annotation says int | None)
        obs, infos = self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]
        self._autoreset[mask] = False
        self._started = True
        self.recorder.begin(mask, obs, seeds)
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every sub-env and record the transitions (see the class notes for each mode).

        Parameters
        ----------
        actions : object
            One action per sub-env, passed to the environment as given.

        Returns
        -------
        tuple
            ``(observations, rewards, terminated, truncated, infos)`` as the environment
            returned them. Cost: the environment's step plus buffering one record per sub-env
            recording; a commit every ``commit_every`` records.

        Raises
        ------
        RecordingError
            Before the first ``reset``, or after :meth:`close`.
        UnsafeCastError
            Before stepping, an action that cannot be cast (every sub-env's action is checked,
            also one an autoreset will ignore); after, a recorded value that cannot be cast.
        """
        rec = self.recorder
        if rec.closed:
            raise RecordingError("step() after close()")
        if not self._started:
            raise RecordingError("call reset() before the first step()")
        act = rec.check_action(actions)
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        n = self.num_envs
        mode = self.autoreset_mode
        error: BaseException | None = None
        # (the recorder records only the slots in an episode: ``recording`` need not say so)
        done = np.logical_or(terminated, truncated)
        starting: np.ndarray | None = None  # sub-envs whose observation starts an episode, if any
        next_obs, info_values = obs, _vector_infos(rec.info_keys, infos, n) if rec.info_keys else {}
        if mode == AutoresetMode.NEXT_STEP:
            # reset by this step: their observation starts an episode (they record nothing)
            starting = self._autoreset if _any(self._autoreset, axis=None) else None
            recording = ALL if starting is None else ~starting
        else:
            recording = ALL
            if mode == AutoresetMode.SAME_STEP and _any(done, axis=None):
                starting = done
                next_obs, info_values = _same_step_final(rec.info_keys, obs, infos, done, info_values)
        try:
            rec.record(recording, act, next_obs, rewards, terminated, truncated, info_values)
        except ReplayStoreError as exc:
            error = exc
        if starting is not None:
            try:
                rec.begin(starting, obs, [None] * n)
            except ReplayStoreError as exc:
                error = error or exc
        if mode == AutoresetMode.NEXT_STEP:
            self._autoreset = done
        if error is not None:
            raise error
        return obs, rewards, terminated, truncated, infos

    def commit(self) -> None:
        """Commit what is pending now (``close`` does it too)."""
        self.recorder.commit()

    def close(self, **kwargs: Any) -> None:
        """Commit what is pending, close the writer (and the store, if opened from a URL), then the env."""
        try:
            self.recorder.close()
        finally:
            super().close(**kwargs)


def _one(value: Any) -> Any:
    """A single env's value as a batch of one (per leaf of a Dict/Tuple observation)."""
    if isinstance(value, Mapping):
        return {k: _one(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_one(v) for v in value)
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)[None]


def _vector_infos(keys: Mapping[str, Any], infos: Mapping[str, Any], n: int) -> InfoValues:
    """Per recorded key: the batched values and Gymnasium's ``_key`` mask (all true when absent)."""
    out: InfoValues = {}
    for key in keys:
        if key in infos:
            mask = infos.get(f"_{key}")
            out[key] = (infos[key], np.ones(n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool))
    return out


def _same_step_final(keys: Mapping[str, Any], obs: Any, infos: Mapping[str, Any], done: np.ndarray,
                     info_values: InfoValues) -> tuple[np.ndarray, InfoValues]:
    """SAME_STEP: the terminal observations and infos of the sub-envs that ended this step."""
    final_obs = infos.get("final_obs")
    final_mask = infos.get("_final_obs")
    if final_obs is None or final_mask is None or not np.all(np.asarray(final_mask, dtype=bool)[done]):
        raise RecordingError("autoreset mode SAME_STEP: infos['final_obs'] is missing for a sub-env that ended")
    if isinstance(obs, (Mapping, tuple)):  # a Dict/Tuple observation: per leaf
        next_obs = replace_rows(obs, final_obs, done)
    else:
        next_obs = np.array(obs, copy=True)
        for i in np.flatnonzero(done):
            next_obs[i] = final_obs[i]
    final_info = infos.get("final_info") or {}
    out: InfoValues = {}
    n = len(done)
    for key in keys:
        values, present = info_values.get(key, (None, np.zeros(n, dtype=bool)))
        present = np.where(done, False, present)
        final_values = final_info.get(key)
        if final_values is not None:
            fmask = final_info.get(f"_{key}")
            fmask = np.ones(n, dtype=bool) if fmask is None else np.asarray(fmask, dtype=bool)
            final_values = np.asarray(final_values)
            if values is None:
                values = np.zeros_like(final_values)
            values = np.array(values, copy=True)
            values[done & fmask] = final_values[done & fmask]
            present = present | (done & fmask)
        if values is not None:
            out[key] = (values, present)
    return next_obs, out
