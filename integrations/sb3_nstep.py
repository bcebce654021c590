"""Stable-Baselines3's ``NStepReplayBuffer``, with its transitions in a store.

``ReplayStoreNStepBuffer`` is to SB3's ``NStepReplayBuffer`` (SB3 >= 2.7) what
``ReplayStoreBuffer`` is to its ``ReplayBuffer``: pass it as ``replay_buffer_class``
with ``replay_buffer_kwargs={"url": ..., "n_steps": 3, "gamma": 0.99}`` to DQN, SAC or
TD3. Sampled minibatches are SB3's n-step samples (rewards summed over the window,
``discounts`` for the bootstrap), computed from the store's records.

Needs the optional dependency stable-baselines3: ``pip install "replaystore[sb3]"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th

from replaystore.errors import BufferArgumentError, MissingDependencyError

try:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from stable_baselines3.common.vec_env import VecNormalize
except ImportError as exc:  # pragma: no cover - needs stable-baselines3 >= 2.7
    raise MissingDependencyError('replaystore.integrations.sb3_nstep needs stable-baselines3 >= 2.7: '
                                 'pip install "replaystore[sb3]"') from exc

from replaystore.integrations.sb3 import ReplayStoreBuffer
from replaystore.integrations.sb3_episodes import _EpisodeLedgerMixin
from replaystore.loaders import EmptyStoreError

__all__ = ["ReplayStoreNStepBuffer"]


def _gamma(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(value) <= 1.0:
        raise BufferArgumentError(f"gamma: expected a float in [0, 1], got {value!r}")
    return float(value)


class ReplayStoreNStepBuffer(_EpisodeLedgerMixin, ReplayStoreBuffer, NStepReplayBuffer):
    """SB3's ``NStepReplayBuffer`` with its transitions in a store (a ``ReplayStoreBuffer`` too).

    Use it as ``DQN("MlpPolicy", env, replay_buffer_class=ReplayStoreNStepBuffer,
    replay_buffer_kwargs={"url": path, "n_steps": 3, "gamma": 0.99})`` (SAC and TD3 alike).
    Each sampled transition is SB3's n-step transition: from the sampled step, up to
    ``n_steps`` steps of its env's episode, stopping after the first terminated or
    truncated step; ``rewards`` is their discounted sum, ``next_observations`` the last
    step's ``next_obs``, ``dones`` its termination (with ``handle_timeout_termination``;
    termination or truncation without), and ``discounts`` ``gamma ** steps``. The newest
    step of an episode in progress ends its window as a truncation would (SB3 does the
    same with its newest step), as does the last step an earlier process wrote before it
    died. Storage, commits, kill-and-resume, ``model.save``/``load`` and pickling are
    :class:`~replaystore.integrations.sb3.ReplayStoreBuffer`'s; ``n_steps`` and ``gamma``
    are saved with the other ``replay_buffer_kwargs``.

    Parameters
    ----------
    buffer_size : int
        Transitions kept (as ``ReplayStoreBuffer``).
    observation_space, action_space : gymnasium.spaces.Space
        The (single-env) spaces; not a Dict (as SB3's n-step buffer).
    device : torch.device or str
        Where sampled tensors go.
    n_envs : int
        Environments of the vector env; one stream each.
    optimize_memory_usage : bool
        Must be False.
    handle_timeout_termination : bool
        True (SB3's default): ``dones`` is 1 only for a window ending in a termination.
    n_steps : int
        The longest window (SB3's default 3).
    gamma : float
        Discount per step, in ``[0, 1]`` (SB3's default 0.99).
    url : str or os.PathLike
        Where the store lives; required (as ``ReplayStoreBuffer``).
    commit_every : int, optional
        As ``ReplayStoreBuffer``.
    storage_options : mapping, optional
        Passed to the storage backend.
    create : bool
        Whether an absent store is created (as ``ReplayStoreBuffer``).
    frame_stack : None
        Refused (``BufferArgumentError``) unless None: this buffer stores whole observations;
        frames stored once are for ``ReplayStoreBuffer`` / ``ReplayStoreDictBuffer``.

    Attributes
    ----------
    stored_at_open : int
        Transitions the store held when the buffer opened it.

    Raises
    ------
    BufferArgumentError
        As ``ReplayStoreBuffer``; also a bad ``n_steps`` or ``gamma``, or a Dict space.
    SchemaMismatchError
        An existing store whose fields do not hold these spaces' steps.
    StoreNotFoundError
        As ``ReplayStoreBuffer``.

    Notes
    -----
    Cost: opening reads the store's stream index and its reward and flag columns once
    (about 70 bytes a record stay in RAM); ``add`` as ``ReplayStoreBuffer`` plus O(n_envs);
    ``sample(b)`` is O(b * n_steps) in RAM plus two gathered reads (the sampled rows and the
    windows' last rows).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, n_steps: int = 3, gamma: float = 0.99, *,
                 url: str | os.PathLike[str] | None = None, commit_every: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, create: bool = True,
                 frame_stack: int | None = None) -> None:
        if frame_stack is not None:  # (the twins read whole obs/next_obs columns)
            raise BufferArgumentError(f"frame_stack: the HER and n-step buffers store whole observations; got "
                                      f"{frame_stack!r} (frames stored once: ReplayStoreBuffer, ReplayStoreDictBuffer)")
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or int(n_steps) < 1:
            raise BufferArgumentError(f"n_steps: expected a positive int, got {n_steps!r}")
        gamma = _gamma(gamma)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
                         handle_timeout_termination, url=url, commit_every=commit_every,
                         storage_options=storage_options, create=create)
        self.n_steps, self.gamma = int(n_steps), gamma
        self._init_args.update(n_steps=self.n_steps, gamma=self.gamma)
        self._build_ledger()

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Keep one vector-env step, as :meth:`ReplayStoreBuffer.add`, and extend the episode ledger.

        Parameters
        ----------
        obs, next_obs : numpy.ndarray
            ``[n_envs, *obs_shape]``.
        action : numpy.ndarray
            ``[n_envs, ...]``.
        reward, done : numpy.ndarray
            ``[n_envs]``.
        infos : list of dict
            One per env; ``"TimeLimit.truncated"`` marks a truncation.

        Raises
        ------
        BufferArgumentError
            A value that does not fit the spaces; nothing of the step is kept.
        """
        self._ledger_add(obs, next_obs, action, reward, done, infos)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` n-step transitions from start steps drawn uniformly with replacement.

        Parameters
        ----------
        batch_size : int
            Transitions.
        env : VecNormalize, optional
            Normalises observations and rewards as SB3 does (each reward of the window).

        Returns
        -------
        ReplayBufferSamples
            With ``discounts`` (``gamma`` to the window's length), as SB3's n-step buffer.

        Raises
        ------
        EmptyStoreError
            Nothing to sample.
        """
        oldest = self._oldest()
        if self._ledger.n - oldest <= 0:
            raise EmptyStoreError(f"{self.url}: the replay holds no transition to sample")
        return self._samples_at(np.random.randint(oldest, self._ledger.n, size=batch_size), env)

    def _samples_at(self, g: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """The n-step samples starting at records ``g`` (SB3's ``_get_samples`` for its flat indices)."""
        led, n = self._ledger, self.n_steps
        g = np.asarray(g, dtype=np.int64).reshape(-1)
        start = led.at("start", g)
        mask = np.zeros((len(g), n), dtype=bool)
        rewards = np.zeros((len(g), n), dtype=np.float32)
        alive = np.ones(len(g), dtype=bool)
        at = g.copy()
        last = g.copy()
        for k in range(n):
            if k:
                nxt = led.at("succ", at)
                ok = alive & (nxt >= 0)
                at = np.where(ok, nxt, at)
                alive = ok & (led.at("start", at) == start)  # (a reset starts another episode)
            mask[:, k] = alive
            rewards[:, k] = np.where(alive, led.at("reward", at), 0.0)
            last = np.where(alive, at, last)
            alive = alive & ~(led.at("terminated", at) | led.at("truncated", at))
        rewards = self._normalize_reward(rewards, env)
        # SB3's arithmetic, operation for operation (the same float32 results)
        target_q_discounts = self.gamma ** mask.sum(axis=1, keepdims=True).astype(np.float32)
        discounts = self.gamma ** np.arange(n, dtype=np.float32).reshape(1, -1)
        n_step_returns = (rewards * discounts * mask).sum(axis=1, keepdims=True)
        term, trunc = led.at("terminated", last), led.at("truncated", last)
        final = term if self.handle_timeout_termination else term | trunc
        first = self._gather(g, ["obs", "action"])
        next_obs = self._gather(last, ["next_obs"])["next_obs"].reshape(-1, *self.obs_shape)
        obs = first["obs"].reshape(-1, *self.obs_shape)
        action = first["action"].reshape(-1, self.action_dim)
        if action.dtype != self._action_dtype:
            action = action.astype(self._action_dtype)
        return ReplayBufferSamples(
            observations=self.to_torch(self._normalize_obs(obs, env)),  # type: ignore[arg-type]
            actions=self.to_torch(action),
            next_observations=self.to_torch(self._normalize_obs(next_obs, env)),  # type: ignore[arg-type]
            dones=self.to_torch(final.astype(np.float32)[:, None]),
            rewards=self.to_torch(n_step_returns),
            discounts=self.to_torch(target_q_discounts),
        )
