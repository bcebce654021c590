"""Hindsight experience replay (HER): relabel sampled goal-conditioned transitions with achieved goals.

Two halves. In the main process, :meth:`HER.goal_rows` picks, per sampled row,
the row whose ``next_achieved_goal`` becomes the new goal (or -1: not
relabelled), from the table's public stream index; the sampler passes these as
the request output ``her_goal_rows`` and as HER's payload (``request.parts["her"]``). Where the minibatch is gathered (a
DataLoader worker, or the main process), :meth:`HER.relabel` reads those goals
and rewrites ``desired_goal``, ``next_desired_goal`` and ``reward``.

Two goal layouts: flat (``schemas.goal_transitions``'s fields) and nested
(gymnasium-robotics' Dict observation ``{"observation", "achieved_goal",
"desired_goal"}`` as the nested fields ``obs`` and ``next_obs``, as
``replaystore.gym.RecordEpisodes`` records it; :meth:`GoalFields.nested`). Field
names are schema column names; a nested leaf's (``obs__desired_goal``) is found
in the gathered minibatch at its path (``batch["obs"]["desired_goal"]``).

Episodes are those of ``iter_episodes``: within a stream, an episode starts at a
reset, after a step whose ``terminated`` or ``truncated`` flag is set, or after a
step gap; it is complete when it ends with such a flag and its start is known (a
reset, step 0, or right after an episode end).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import SamplerParameterError, StoreError, TransformError
from replaystore.loaders.follow import EntryFollower
from replaystore.schemas import Schema
from replaystore.schemas.nesting import SEP
from replaystore.store import StreamIndex, Table

STRATEGIES = ("future", "final", "episode")


@dataclass(frozen=True)
class GoalFields:
    """The field names hindsight relabelling reads and writes (flat by default).

    Names are schema column names: a nested observation's leaves are named by
    their path joined with ``__`` (``"obs__desired_goal"``); :meth:`nested` builds
    the names of a recorded Dict-observation goal env. Map them to other names
    when a schema spells them otherwise.

    Attributes
    ----------
    achieved : str
        Goal achieved in s_t (kept; listed for completeness).
    desired : str
        Goal pursued in s_t: rewritten.
    next_achieved : str
        Goal achieved in s_{t+1}: the source of new goals and of the new reward.
    next_desired : str
        Goal pursued in s_{t+1}: rewritten with the same goal.
    reward : str
        Reward: recomputed for relabelled rows.
    terminated : str
        Episode-end flag.
    truncated : str or None
        Second episode-end flag (None: the schema has none).
    """

    achieved: str = "achieved_goal"
    desired: str = "desired_goal"
    next_achieved: str = "next_achieved_goal"
    next_desired: str = "next_desired_goal"
    reward: str = "reward"
    terminated: str = "terminated"
    truncated: str | None = "truncated"

    @classmethod
    def nested(cls, obs: str = "obs", next_obs: str = "next_obs", *, reward: str = "reward",
               terminated: str = "terminated", truncated: str | None = "truncated") -> GoalFields:
        """The fields of a store whose observations are gymnasium-robotics' goal Dicts.

        ``obs`` and ``next_obs`` are nested fields with (at least) the leaves
        ``achieved_goal`` and ``desired_goal``: the schema ``replaystore.gym``
        records from a goal env.

        Parameters
        ----------
        obs, next_obs : str, optional
            The nested observation fields (``"obs"``, ``"next_obs"``).
        reward, terminated, truncated : str, optional
            As in :class:`GoalFields` (``truncated=None``: the schema has none).

        Returns
        -------
        GoalFields
            ``obs__achieved_goal``, ``obs__desired_goal``, ``next_obs__achieved_goal``,
            ``next_obs__desired_goal`` and the given flat names. Cost: O(1).
        """
        return cls(f"{obs}{SEP}achieved_goal", f"{obs}{SEP}desired_goal", f"{next_obs}{SEP}achieved_goal",
                   f"{next_obs}{SEP}desired_goal", reward, terminated, truncated)

    @classmethod
    def detect(cls, schema: Schema) -> GoalFields:
        """The default fields for ``schema``: flat, or nested when only ``obs``/``next_obs`` hold the goals.

        Parameters
        ----------
        schema : Schema
            The table's schema.

        Returns
        -------
        GoalFields
            :meth:`nested` when the schema lacks a flat ``desired_goal`` and has the
            leaves ``obs__desired_goal`` and ``next_obs__achieved_goal``; otherwise the
            flat defaults (checked by the sampler). Cost: O(1).
        """
        nested = cls.nested()
        if "desired_goal" not in schema and nested.desired in schema and nested.next_achieved in schema:
            return nested
        return cls()


def _get(batch: dict[str, Any], name: str) -> Any:
    """The array of column ``name`` in a gathered minibatch: flat, or at its nested path."""
    if name in batch:
        return batch[name]
    node: Any = batch
    for key in name.split(SEP):
        node = node[int(key)] if isinstance(node, tuple) else node[key]
    return node


def _put(batch: dict[str, Any], name: str, value: Any) -> None:
    """Set column ``name`` of a gathered minibatch, rebuilding (not mutating) the nested nodes on its path."""
    if name in batch:
        batch[name] = value
        return
    root, *path = name.split(SEP)
    batch[root] = _replaced(batch[root], path, value)


def _replaced(node: Any, path: list[str], value: Any) -> Any:
    """A copy of the dict/tuple ``node`` whose leaf at ``path`` is ``value``."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(node, tuple):
        i = int(key)
        return (*node[:i], _replaced(node[i], rest, value), *node[i + 1:])
    return {**node, key: _replaced(node[key], rest, value)}


class _Episodes(EntryFollower):
    """Per visible row: its episode's bounds (relative positions in its stream) and completeness, followed.

    Per row: its episode's first entry, its end (-1 while the episode is open: the last of its
    stream, not ended), whether the episode began at a known start and whether it ended with
    an end flag. After a commit, each stream touched has the entries appended computed, from
    the entry before them; an open episode that the commit closes gets its end written to its
    earlier entries (once per episode: O(1) a record, amortised). The oldest entries evicted
    cost nothing (bounds and completeness clip to the stream's first visible entry when read,
    :meth:`bounds`). The end flags of the records appended are read once.
    """

    columns = {"end": (bool, False), "lo": (np.int64, 0), "hi": (np.int64, -1), "began": (bool, False),
               "ended": (bool, False)}

    def __init__(self, table: Table, fields: GoalFields) -> None:
        self.fields = fields
        super().__init__(table)

    def _added(self, rows: np.ndarray, slots: np.ndarray) -> None:
        f = self.fields
        cols = [f.terminated] + ([f.truncated] if f.truncated is not None else [])
        flags = self.table.read(rows, columns=cols)
        ends = np.asarray(flags[f.terminated], dtype=bool).copy()
        if f.truncated is not None:
            ends |= np.asarray(flags[f.truncated], dtype=bool)
        self.cols["end"][slots] = ends

    def _first(self, index: StreamIndex, s: np.ndarray, lo: np.ndarray, old_hi: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray]:
        return np.maximum(old_hi - 1, lo), old_hi  # the entry before the appended ones carries its episode

    def _compute(self, jid: np.ndarray, bounds: np.ndarray, has_ctx: np.ndarray, rows: np.ndarray,
                 steps: np.ndarray, resets: np.ndarray, slots: np.ndarray, rel: np.ndarray,
                 write: np.ndarray) -> None:
        cols = self.cols
        ends = cols["end"][slots]
        lo, hi, _ = episode_bounds(jid, steps, resets, ends)
        m = len(rows)
        same = np.zeros(m, dtype=bool)  # as episode_bounds: continues the previous entry's stream, no step gap
        same[1:] = (jid[1:] == jid[:-1]) & (steps[1:] == steps[:-1] + 1)
        began = resets[lo] | (steps[lo] == 0)
        inner = lo > 0
        began[inner] |= same[lo[inner]] & ends[lo[inner] - 1]
        first = rel[lo]
        ctx = bounds[:-1]
        carried = has_ctx[jid] & (lo == ctx[jid])  # the episode began at or before the context entry
        first[carried] = cols["lo"][slots[ctx[jid[carried]]]]
        began[carried] = cols["began"][slots[ctx[jid[carried]]]]
        closed = (hi < bounds[1:][jid]) | ends[hi - 1]
        end = np.where(closed, rel[hi - 1] + 1, -1)
        w = slots[write]
        cols["lo"][w], cols["hi"][w] = first[write], end[write]
        cols["began"][w], cols["ended"][w] = began[write], ends[hi - 1][write]
        # an open episode the new entries closed: its end, on its earlier entries
        j = np.flatnonzero(has_ctx)
        j = j[(cols["hi"][slots[ctx[j]]] < 0) & closed[ctx[j]]]
        if not len(j):
            return
        assert self.index is not None
        seg = self.index.seg
        c = ctx[j]
        s = cols["stream"][slots[c]]
        a = np.maximum(first[c], seg.lo[s] - seg.origin[s])
        counts = rel[c] + 1 - a
        at = np.repeat(seg.origin[s] + a - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        old, _ = self.slots.lookup(seg.cols["rows"][at])
        cols["hi"][old] = np.repeat(end[c], counts)
        cols["ended"][old] = np.repeat(ends[hi[c] - 1], counts)

    def bounds(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per visible row: its position, its episode's ``[lo, hi)`` and completeness, and its stream's origin.

        Positions are relative to the stream's segment in the stream index (add ``origin`` for
        the column buffers). Cost: a lookup and a few gathers per row.

        Parameters
        ----------
        rows : numpy.ndarray
            Visible row ids.

        Returns
        -------
        tuple of numpy.ndarray
            ``pos``, ``lo``, ``hi`` (int64 relative positions), ``complete`` (bool) and ``origin``.
        """
        assert self.index is not None
        slots, _, p, origin, first = self.locate(rows)
        seg, cols = self.index.seg, self.cols
        lo, hi = cols["lo"][slots], cols["hi"][slots]
        hi = np.where(hi < 0, seg.hi[cols["stream"][slots]] - origin, hi)  # open: the stream's visible end
        began = cols["began"][slots]
        clipped = lo <= first  # the episode starts at the stream's first visible entry: began as of it
        if clipped.any():
            at = (origin + first)[clipped]
            began[clipped] = seg.cols["resets"][at] | (seg.cols["steps"][at] == 0)
        return p - origin, np.maximum(lo, first), hi, began & cols["ended"][slots], origin


def episode_bounds(stream_ids: np.ndarray, steps: np.ndarray, resets: np.ndarray, ends: np.ndarray,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each entry's episode ``[lo, hi)`` and whether that episode is complete, vectorised.

    Parameters
    ----------
    stream_ids, steps, resets : numpy.ndarray
        The stream index's dense arrays, sorted by (stream, step).
    ends : numpy.ndarray
        bool, per entry: its terminated or truncated flag.

    Returns
    -------
    tuple of numpy.ndarray
        ``lo`` and ``hi`` (int64 positions) and ``complete`` (bool), per entry.
        Cost: O(entries).
    """
    n = len(steps)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=bool)
    same = np.zeros(n, dtype=bool)  # entry i continues entry i-1's stream without a step gap
    same[1:] = (stream_ids[1:] == stream_ids[:-1]) & (steps[1:] == steps[:-1] + 1)
    start = ~same | resets
    start[1:] |= ends[:-1]
    starts = np.flatnonzero(start)
    episode = np.cumsum(start) - 1
    stops = np.r_[starts[1:], n]
    began = resets[starts] | (steps[starts] == 0)
    inner = starts > 0
    began[inner] |= same[starts[inner]] & ends[starts[inner] - 1]
    complete = began & ends[stops - 1]
    return starts[episode], stops[episode], complete[episode]


class HER:
    """Hindsight relabelling for Uniform, Prioritized and Epoch samplers (``her=HER(...)``).

    A fraction ``k / (k + 1)`` of the sampled records (each independently, with
    that probability; SB3 relabels exactly ``int(ratio * batch)``) whose
    episode is complete (or, with ``online=True``, any episode, over its visible
    part) gets a new goal: the ``next_achieved_goal`` of a record of the same
    episode, for ``future`` one at or after the sampled step, for ``final`` the
    last, for ``episode`` any. The new goal is written into ``desired_goal`` and
    ``next_desired_goal``; ``reward`` becomes ``compute_reward(next_achieved_goal,
    new goals, info)``, one vectorised call per minibatch over the relabelled
    records. This is SB3 ``HerReplayBuffer``'s semantics. The minibatch also holds
    ``her_goal_rows``: per record, the row its goal came from, or -1.

    ``compute_reward`` runs where the minibatch is gathered (in DataLoader
    workers: it must be picklable for ``spawn``). Field names are parameters
    (:class:`GoalFields`); by default those of ``replaystore.schemas.goal_transitions``,
    or, for a schema whose ``obs`` and ``next_obs`` are nested goal Dicts (a recorded
    gymnasium-robotics env), :meth:`GoalFields.nested`'s: the new goal then goes into
    ``obs["desired_goal"]`` and ``next_obs["desired_goal"]``.

    Parameters
    ----------
    strategy : str, optional
        ``"future"`` (default), ``"final"`` or ``"episode"``.
    k : int, optional
        Relabelled goals per real one (SB3's ``n_sampled_goal``); >= 0, default 4.
    compute_reward : callable
        ``compute_reward(achieved_goal, desired_goal, info) -> rewards``, vectorised
        over the first axis (gymnasium-robotics' ``env.unwrapped.compute_reward``).
    online : bool, optional
        Relabel records of incomplete episodes too (goals from their visible part).
    fields : GoalFields, optional
        The field names (default: :meth:`GoalFields.detect` of the sampler's schema).
    info_fields : sequence of str, optional
        Fields passed to ``compute_reward`` as ``info`` (a mapping of the relabelled
        records' arrays); default none (an empty mapping).
    seed : int, optional
        Seed of HER's own RNG (its state is saved with the sampler's).

    Raises
    ------
    SamplerParameterError
        An unknown strategy, a bad ``k``, or ``compute_reward`` not callable.
    """

    def __init__(self, strategy: str = "future", k: int = 4, compute_reward: Callable[..., Any] | None = None, *,
                 online: bool = False, fields: GoalFields | None = None, info_fields: tuple[str, ...] = (),
                 seed: int = 0) -> None:
        if strategy not in STRATEGIES:
            raise SamplerParameterError("her.strategy", f"one of {STRATEGIES}", repr(strategy))
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise SamplerParameterError("her.k", "an int >= 0", repr(k))
        if not callable(compute_reward):
            raise SamplerParameterError("her.compute_reward", "a callable (achieved, desired, info) -> rewards",
                                        repr(compute_reward))
        self.strategy = strategy
        self.k = k
        self.ratio = k / (k + 1)
        self.compute_reward = compute_reward
        self.online = bool(online)
        self.fields = fields or GoalFields()
        self._detect = fields is None
        self.info_fields = tuple(info_fields)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._episodes: _Episodes | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the episode cache (workers only relabel)."""
        return {**self.__dict__, "_episodes": None}

    # -- main process: which goals ------------------------------------------------------
    def check(self, table: Table) -> None:
        """Check that ``table``'s schema has the fields relabelling uses.

        Parameters
        ----------
        table : Table
            The sampler's table.

        Raises
        ------
        StoreError
            A field is missing (named). Cost: O(fields).
        """
        if self._detect:
            self.fields = GoalFields.detect(table.schema)
        f = self.fields
        names = [f.desired, f.next_achieved, f.next_desired, f.reward, f.terminated, *self.info_fields]
        if f.truncated is not None:
            names.append(f.truncated)
        missing = [n for n in names if n not in table.schema]
        if missing:
            raise StoreError(f"HER on table {table.name!r}: schema {table.schema.name!r} lacks {missing} "
                             "(see GoalFields to map other names)")

    def hyperparameters(self) -> dict[str, Any]:
        """What saved sampler state must agree with.

        Returns
        -------
        dict of str to Any
            ``strategy``, ``k``, ``online`` and ``seed``.
        """
        return {"strategy": self.strategy, "k": self.k, "online": self.online, "seed": self.seed}

    def _index(self, table: Table) -> _Episodes:
        """The episode bounds of the table's current view (followed across its changes, :class:`_Episodes`)."""
        ep = self._episodes
        if ep is None or ep.table is not table or ep.fields != self.fields:
            ep = self._episodes = _Episodes(table, self.fields)
        ep.sync()
        return ep

    def goal_rows(self, table: Table, rows: np.ndarray) -> np.ndarray:
        """The row each sampled row takes its new goal from (-1: keep its goal).

        Parameters
        ----------
        table : Table
            The sampler's table (its current view).
        rows : numpy.ndarray
            The sampled row ids.

        Returns
        -------
        numpy.ndarray
            int64, one per row. Cost: two draws per row plus a lookup; the episode
            bounds follow the table's changes at their cost (O(k), amortised, after a
            commit or eviction of k records).
        """
        ep = self._index(table)
        rows = np.asarray(rows, dtype=np.int64)
        pos, lo, hi, complete, origin = ep.bounds(rows)
        pick = self.rng.random(len(rows)) < self.ratio
        u = self.rng.random(len(rows))
        if not self.online:
            pick &= complete
        if self.strategy == "future":
            first = pos
        elif self.strategy == "episode":
            first = lo
        else:
            first = hi - 1
        target = first + np.minimum((u * (hi - first)).astype(np.int64), hi - first - 1)
        assert ep.index is not None
        return np.where(pick, ep.index.seg.cols["rows"][origin + np.where(pick, target, pos)], -1)

    # -- where gathered: relabel ---------------------------------------------------------
    def relabel(self, table: Table, batch: dict[str, Any]) -> dict[str, Any]:
        """Write the goals of ``batch["her_goal_rows"]`` into the minibatch and recompute rewards.

        Parameters
        ----------
        table : Table
            The table the minibatch was gathered from.
        batch : dict of str to Any
            A gathered minibatch (numpy arrays) with ``her_goal_rows``.

        Returns
        -------
        dict of str to Any
            ``batch``, its goal and reward arrays replaced by relabelled copies (a
            nested observation's dicts/tuples on the goal's path are rebuilt, not
            mutated). Cost: one read of the next achieved goal's column for the
            relabelled rows and one ``compute_reward`` call.

        Raises
        ------
        RowError
            A goal row is not visible to this handle.
        StaleReadError
            A goal row was reclaimed since this handle's view.
        TransformError
            ``compute_reward`` returned rewards of another shape (not one per relabelled
            record), of a dtype that does not cast to the reward field's within its kind,
            or non-finite ones for a finite reward field; it names the function and the
            expected and returned shapes or dtypes.
        """
        goal_rows = np.asarray(batch["her_goal_rows"], dtype=np.int64)
        mask = goal_rows >= 0
        if not mask.any():
            return batch
        f = self.fields
        goals = table.read(goal_rows[mask], columns=[f.next_achieved])[f.next_achieved]
        for name in (f.desired, f.next_desired):
            arr = np.array(_get(batch, name), copy=True)
            arr[mask] = goals
            _put(batch, name, arr)
        info: Mapping[str, Any] = {n: np.asarray(_get(batch, n))[mask] for n in self.info_fields}
        reward = np.array(_get(batch, f.reward), copy=True)
        out = self.compute_reward(np.asarray(_get(batch, f.next_achieved))[mask], goals, info)
        finite = getattr(table.schema.field(f.reward), "finite", False)
        reward[mask] = self._rewards(out, reward[mask].shape, reward.dtype, finite)
        _put(batch, f.reward, reward)
        return batch

    def _rewards(self, out: Any, shape: tuple[int, ...], dtype: np.dtype, finite: bool | None) -> np.ndarray:
        """``compute_reward``'s result as rewards of ``shape`` and ``dtype``, or a TransformError saying why not.

        Taken: any array of ``shape`` (or of its size, ``shape[0]`` first: ``(m, 1)`` for
        ``(m,)``) whose dtype casts to ``dtype`` within its kind (numpy's ``same_kind``:
        float64 to float32, ints or bools to floats); finite where the reward field is.
        """
        fn = getattr(self.compute_reward, "__qualname__", None) or repr(self.compute_reward)
        where = f"HER compute_reward {fn!r} (reward field {self.fields.reward!r})"
        try:
            arr = np.asarray(out)
        except Exception as exc:  # ragged nested sequences and the like
            raise TransformError(f"{where}: returned {type(out).__name__} that is not an array ({exc})") from exc
        m = shape[0] if shape else 1
        if arr.shape != shape and (arr.size != int(np.prod(shape)) or arr.ndim == 0 or arr.shape[0] != m):
            raise TransformError(f"{where}: returned shape {arr.shape}, expected {shape} (one reward per "
                                 f"relabelled record: {m})")
        if arr.dtype != dtype and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise TransformError(f"{where}: returned dtype {arr.dtype}, which does not cast safely to the reward "
                                 f"field's {dtype}")
        rewards = arr.astype(dtype, copy=False).reshape(shape)
        if finite and rewards.dtype.kind in "fc" and not np.isfinite(rewards).all():
            bad = rewards[~np.isfinite(rewards)].ravel()[:4].tolist()
            raise TransformError(f"{where}: returned non-finite rewards {bad} (the reward field is finite)")
        return rewards

    # -- resumable state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """HER's RNG state.

        Returns
        -------
        dict of str to Any
            ``{"rng": ...}``.
        """
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`.

        Parameters
        ----------
        state : dict of str to Any
            As :meth:`state_dict` returned it.
        """
        self.rng.bit_generator.state = state["rng"]
