"""Stable-Baselines3's ``HerReplayBuffer``, with its transitions in a store.

``ReplayStoreHerBuffer`` subclasses SB3's ``HerReplayBuffer`` (so SB3 hands it the env
whose ``compute_reward`` relabels, as it does its own) and keeps the transitions as
``ReplayStoreDictBuffer`` does. Pass it as ``replay_buffer_class`` with
``replay_buffer_kwargs={"url": ..., "n_sampled_goal": 4, "goal_selection_strategy":
"future"}`` to SAC, TD3, DDPG or DQN on a goal env.

Needs the optional dependency stable-baselines3: ``pip install "replaystore[sb3]"``.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th

from replaystore.errors import BufferArgumentError, MissingDependencyError

try:
    from gymnasium import spaces
    from stable_baselines3.common.type_aliases import DictReplayBufferSamples
    from stable_baselines3.common.vec_env import VecEnv, VecNormalize
    from stable_baselines3.her.goal_selection_strategy import KEY_TO_GOAL_STRATEGY, GoalSelectionStrategy
    from stable_baselines3.her.her_replay_buffer import HerReplayBuffer
except ImportError as exc:  # pragma: no cover - exercised without stable-baselines3
    raise MissingDependencyError('replaystore.integrations.sb3_her needs stable-baselines3: '
                                 'pip install "replaystore[sb3]"') from exc

from replaystore.integrations.sb3 import ReplayStoreDictBuffer
from replaystore.integrations.sb3_episodes import _EpisodeLedgerMixin

__all__ = ["ReplayStoreHerBuffer"]

_GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


class ReplayStoreHerBuffer(_EpisodeLedgerMixin, ReplayStoreDictBuffer, HerReplayBuffer):
    """SB3's ``HerReplayBuffer`` with its transitions in a store (a ``ReplayStoreDictBuffer`` too).

    Use it as ``SAC("MultiInputPolicy", env, replay_buffer_class=ReplayStoreHerBuffer,
    replay_buffer_kwargs={"url": path, "n_sampled_goal": 4, "goal_selection_strategy":
    "future"})`` (TD3, DDPG and DQN alike). Sampling is SB3's: transitions are drawn
    uniformly from the complete episodes (those that ended with a terminated or truncated
    step), the first ``int(batch_size * n_sampled_goal / (n_sampled_goal + 1))`` of them
    are relabelled with the ``next_obs["achieved_goal"]`` of a step of the same episode
    (``future``: at or after the sampled step; ``final``: the last; ``episode``: any) and
    their rewards recomputed with the env's ``compute_reward(next_achieved_goal,
    new_goal, infos)`` (one call through ``env.env_method``, as SB3 makes it), and the
    minibatch holds the real transitions first, then the relabelled ones. Records are
    numbered as SB3 numbers its ``(step, env)`` slots, so with the same ``np.random``
    seed and the same ``add`` calls (before the buffer wraps) the minibatches are SB3's.

    Storage, commits, kill-and-resume, ``model.save``/``load`` and pickling are
    ``ReplayStoreDictBuffer``'s; the HER arguments are saved with the other
    ``replay_buffer_kwargs``, the env never. After a restart the episodes the store holds
    are sampled again, except those the dead process left unfinished (no end flag), which
    stay unsampled, as an episode in progress is; ``load_replay_buffer`` with
    ``truncate_last_traj=True`` (SB3's default) ends them as truncated, as SB3 does.
    ``copy_info_dict=True`` keeps the ``infos`` of the steps added by this process in RAM
    (infos are not stored); steps from an earlier process get ``{}``.

    Parameters
    ----------
    buffer_size : int
        Transitions kept (as ``ReplayStoreDictBuffer``).
    observation_space : gymnasium.spaces.Dict
        A goal env's: keys ``observation``, ``achieved_goal`` and ``desired_goal``.
    action_space : gymnasium.spaces.Space
        The action space.
    env : VecEnv, optional
        The training env (SB3 passes it); needed to sample, settable later with ``set_env``.
    device : torch.device or str
        Where sampled tensors go.
    n_envs : int
        Environments of the vector env; one stream each.
    optimize_memory_usage : bool
        Must be False.
    handle_timeout_termination : bool
        True (SB3's default): ``dones`` is 1 only for terminations.
    n_sampled_goal : int
        Relabelled transitions per real one (SB3's default 4: 80% relabelled).
    goal_selection_strategy : str or GoalSelectionStrategy
        ``"future"`` (default), ``"final"`` or ``"episode"``.
    copy_info_dict : bool
        Pass each step's ``infos`` to ``compute_reward`` (kept in RAM for this process's steps).
    url : str or os.PathLike
        Where the store lives; required.
    commit_every : int, optional
        As ``ReplayStoreDictBuffer``.
    storage_options : mapping, optional
        Passed to the storage backend.
    create : bool
        Whether an absent store is created (as ``ReplayStoreDictBuffer``).
    frame_stack : None
        Refused (``BufferArgumentError``) unless None: this buffer stores whole observations;
        frames stored once are for ``ReplayStoreBuffer`` / ``ReplayStoreDictBuffer``.

    Attributes
    ----------
    stored_at_open : int
        Transitions the store held when the buffer opened it.
    her_ratio : float
        The fraction of a minibatch relabelled, ``1 - 1 / (n_sampled_goal + 1)``.

    Raises
    ------
    BufferArgumentError
        As ``ReplayStoreDictBuffer``; also an observation space without the goal keys, a bad
        ``n_sampled_goal`` or ``goal_selection_strategy``.
    SchemaMismatchError
        An existing store whose fields do not hold these spaces' steps.
    StoreNotFoundError
        As ``ReplayStoreDictBuffer``.

    Notes
    -----
    Cost: opening reads the store's stream index and its reward and flag columns once
    (about 70 bytes a record stay in RAM); ``add`` as ``ReplayStoreDictBuffer`` plus the
    ended episodes' lengths (O(1) a record, amortised); ``sample(b)`` scans the episode
    lengths (O(buffer_size), as SB3) and makes two gathered reads and one
    ``compute_reward`` call.
    """

    env: VecEnv | None

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space,
                 env: VecEnv | None = None, device: th.device | str = "auto", n_envs: int = 1,
                 optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                 n_sampled_goal: int = 4, goal_selection_strategy: GoalSelectionStrategy | str = "future",
                 copy_info_dict: bool = False, *, url: str | os.PathLike[str] | None = None,
                 commit_every: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 create: bool = True, frame_stack: int | None = None) -> None:
        if frame_stack is not None:  # (the twins read whole obs/next_obs columns)
            raise BufferArgumentError(f"frame_stack: the HER and n-step buffers store whole observations; got "
                                      f"{frame_stack!r} (frames stored once: ReplayStoreBuffer, ReplayStoreDictBuffer)")
        if isinstance(observation_space, spaces.Dict):
            missing = [k for k in _GOAL_KEYS if k not in observation_space.spaces]
            if missing:
                raise BufferArgumentError(f"observation_space: a goal env's Dict needs keys {list(_GOAL_KEYS)}, "
                                          f"missing {missing}")
        if isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, (int, np.integer)) \
                or int(n_sampled_goal) < 0:
            raise BufferArgumentError(f"n_sampled_goal: expected an int >= 0, got {n_sampled_goal!r}")
        strategy = goal_selection_strategy
        if isinstance(strategy, str):
            if strategy.lower() not in KEY_TO_GOAL_STRATEGY:
                raise BufferArgumentError(f"goal_selection_strategy: expected one of {sorted(KEY_TO_GOAL_STRATEGY)}, "
                                          f"got {strategy!r}")
            strategy = KEY_TO_GOAL_STRATEGY[strategy.lower()]
        if not isinstance(strategy, GoalSelectionStrategy):
            raise BufferArgumentError(f"goal_selection_strategy: expected one of {sorted(KEY_TO_GOAL_STRATEGY)}, "
                                      f"got {goal_selection_strategy!r}")
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
                         handle_timeout_termination, url=url, commit_every=commit_every,
                         storage_options=storage_options, create=create)
        self.env = env
        self.copy_info_dict = bool(copy_info_dict)
        self.goal_selection_strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.her_ratio = 1 - (1.0 / (self.n_sampled_goal + 1))
        self._init_args.update(
            n_sampled_goal=self.n_sampled_goal, goal_selection_strategy=strategy.name.lower(),
            copy_info_dict=self.copy_info_dict)
        self._build_ledger()
        self._session_g0 = self._ledger.n  # records numbered from here were added by this process
        self._infos: np.ndarray | None = (np.array([{} for _ in range(self.capacity)], dtype=object)
                                          if self.copy_info_dict else None)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Reopen the store a pickled buffer names, without an env (``set_env`` gives it)."""
        self.__init__(**state, env=None, create=False)  # type: ignore[misc]

    def add(self, obs: dict[str, np.ndarray], next_obs: dict[str, np.ndarray],  # type: ignore[override]
            action: np.ndarray, reward: np.ndarray, done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Keep one vector-env step, as :meth:`ReplayStoreDictBuffer.add`, and extend the episode ledger.

        Parameters
        ----------
        obs, next_obs : dict of str to numpy.ndarray
            Per key ``[n_envs, *shape]``.
        action : numpy.ndarray
            ``[n_envs, ...]``.
        reward, done : numpy.ndarray
            ``[n_envs]``.
        infos : list of dict
            One per env; kept in RAM with ``copy_info_dict``.

        Raises
        ------
        BufferArgumentError
            A value that does not fit the spaces; nothing of the step is kept.
        """
        g = self._ledger_add(obs, next_obs, action, reward, done, infos)
        if self._infos is not None:
            for j, gj in enumerate(g.tolist()):
                self._infos[gj % self.capacity] = infos[j]

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> DictReplayBufferSamples:  # type: ignore[override]
        """``batch_size`` transitions of complete episodes, the HER share of them relabelled, as SB3 samples.

        Parameters
        ----------
        batch_size : int
            Transitions.
        env : VecNormalize, optional
            Normalises observations and rewards as SB3 does.

        Returns
        -------
        DictReplayBufferSamples
            The real transitions first, then the relabelled ones.

        Raises
        ------
        RuntimeError
            No episode has ended yet (SB3's error and message).
        """
        led = self._ledger
        oldest = self._oldest()
        k = np.arange(oldest - led.base, led.n - led.base)
        valid = (led.length[k] > 0) & (led.start[k] >= oldest)
        if not valid.any():
            raise RuntimeError(
                "Unable to sample before the end of the first episode. We recommend choosing a value "
                "for learning_starts that is greater than the maximum number of timesteps in the environment.")
        sampled = np.random.choice(np.flatnonzero(valid) + oldest, size=batch_size, replace=True)
        nb_virtual = int(self.her_ratio * batch_size)
        virtual, real = np.split(sampled, [nb_virtual])
        real_data = self._her_part(real, env, relabel=False)
        virtual_data = self._her_part(virtual, env, relabel=True)
        return DictReplayBufferSamples(
            observations={key: th.cat((real_data.observations[key], virtual_data.observations[key]))
                          for key in virtual_data.observations},
            actions=th.cat((real_data.actions, virtual_data.actions)),
            next_observations={key: th.cat((real_data.next_observations[key], virtual_data.next_observations[key]))
                               for key in virtual_data.next_observations},
            dones=th.cat((real_data.dones, virtual_data.dones)),
            rewards=th.cat((real_data.rewards, virtual_data.rewards)),
        )

    def _her_part(self, g: np.ndarray, env: VecNormalize | None, relabel: bool) -> DictReplayBufferSamples:
        """Records ``g`` as SB3's ``_get_real_samples`` / ``_get_virtual_samples`` give them."""
        led = self._ledger
        cols = self._gather(g, self._read_columns)
        obs, next_obs = self._obs_of(cols, "obs"), self._obs_of(cols, "next_obs")
        term, trunc = led.at("terminated", g), led.at("truncated", g)
        dones = term if self.handle_timeout_termination else term | trunc
        if relabel:
            new_goals = self._goals_for(g)
            obs["desired_goal"] = new_goals
            next_obs["desired_goal"] = new_goals
            if self.copy_info_dict:
                assert self._infos is not None
                infos: Any = copy.deepcopy(np.array(
                    [self._infos[x % self.capacity] if x >= self._session_g0 else {} for x in g.tolist()] or [],
                    dtype=object))
            else:
                infos = [{} for _ in range(len(g))]
            if self.env is None:
                raise BufferArgumentError("env: ReplayStoreHerBuffer needs the training env to compute rewards "
                                          "for relabelled transitions; pass env= or call set_env(env)")
            rewards = self.env.env_method("compute_reward", next_obs["achieved_goal"], obs["desired_goal"], infos,
                                          indices=[0])
            reward = np.asarray(rewards[0]).astype(np.float32)
        else:
            reward = cols["reward"].astype(np.float32)
        action = cols["action"].reshape(-1, self.action_dim)
        if action.dtype != self._action_dtype:
            action = action.astype(self._action_dtype)
        obs_n = self._normalize_obs(obs, env)
        next_n = self._normalize_obs(next_obs, env)
        assert isinstance(obs_n, dict) and isinstance(next_n, dict)
        return DictReplayBufferSamples(
            observations={key: self.to_torch(v) for key, v in obs_n.items()},
            actions=self.to_torch(action),
            next_observations={key: self.to_torch(v) for key, v in next_n.items()},
            dones=self.to_torch(dones.astype(np.float32)).reshape(-1, 1),
            rewards=self.to_torch(self._normalize_reward(reward.reshape(-1, 1), env)),
        )

    def _goals_for(self, g: np.ndarray) -> np.ndarray:
        """New goals for records ``g``: the achieved goal of a step of the same episode, as SB3 picks it."""
        led = self._ledger
        length = led.at("length", g)
        if self.goal_selection_strategy == GoalSelectionStrategy.FINAL:
            index = length - 1
        elif self.goal_selection_strategy == GoalSelectionStrategy.FUTURE:
            index = np.random.randint(led.at("rank", g), length)
        else:
            index = np.random.randint(0, length)
        key = "next_obs__achieved_goal"
        return self._gather(led.member(g, index), [key])[key].reshape(-1, *self.obs_shape["achieved_goal"])

    def truncate_last_trajectory(self) -> None:
        """End each unfinished episode as truncated (in RAM only), so that it is sampled, as SB3 does.

        ``load_replay_buffer(..., truncate_last_traj=True)`` calls it: the episodes a dead or
        saved process left unfinished become complete, their last step a truncation (SB3
        marks it ``done`` and, with ``handle_timeout_termination``, a timeout). The store's
        records are not changed. Warns when there is an episode to end, as SB3.
        """
        led = self._ledger
        todo: list[tuple[np.ndarray, bool]] = []  # per unfinished episode: its records, whether listed
        if led.n > led.base:
            g = np.arange(led.base, led.n)
            newest = np.full(led.streams, -1, dtype=np.int64)
            np.maximum.at(newest, led.sid[:led.n - led.base], g)  # each stream's newest record
            x = newest[newest >= 0]
            x = x[~np.isin(x, self._last)]  # (this buffer's own episodes in progress: below)
            x = x[(led.at("length", x) == 0) & ~led.at("terminated", x) & ~led.at("truncated", x)
                  & (led.at("moff", x) >= 0)]
            for one in x.tolist():
                at = int(led.moff[one - led.base]) - led.mbase
                todo.append((led.members[at:at + int(led.rank[one - led.base]) + 1].copy(), True))
        todo.extend((np.asarray(ep, dtype=np.int64), False) for ep in self._episodes_open if ep)
        if not todo:
            return
        warnings.warn("The last trajectory in the replay buffer will be truncated.\n"
                      "If you are in the same episode as when the replay buffer was saved,\n"
                      "you should use `truncate_last_trajectory=False` to avoid that issue.", stacklevel=2)
        for ep, listed in todo:
            led.truncated[ep[-1] - led.base] = True
            if listed:
                led.length[ep[ep >= led.base] - led.base] = len(ep)
            else:
                led.list_episode(ep.tolist(), complete=True)
        self._episodes_open = [[] for _ in self._episodes_open]
