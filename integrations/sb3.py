"""Stable-Baselines3 replay buffers whose transitions live in a store.

``ReplayStoreBuffer`` (Box/Discrete/MultiDiscrete/MultiBinary observations) and
``ReplayStoreDictBuffer`` (Dict observations) subclass SB3's ``ReplayBuffer`` and
``DictReplayBuffer``; pass them as ``replay_buffer_class`` with
``replay_buffer_kwargs={"url": ...}`` to DQN, SAC, TD3 (any off-policy algorithm).
The replay survives its process: ``DQN.load`` of a saved model reopens the same
store (SB3 keeps ``replay_buffer_kwargs`` in its zip), and nothing of the replay is
pickled.

Needs the optional dependency stable-baselines3: ``pip install "replaystore[sb3]"``.
"""

from __future__ import annotations

import inspect
import math
import os
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th

from replaystore.errors import (
    BufferArgumentError,
    MissingDependencyError,
    RecordingError,
    SchemaMismatchError,
    StoreError,
    StoreNotFoundError,
)

try:
    from gymnasium import spaces
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
    from stable_baselines3.common.vec_env import VecNormalize
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without stable-baselines3
    raise MissingDependencyError('replaystore.integrations.sb3 needs stable-baselines3: '
                                 'pip install "replaystore[sb3]"') from exc

from replaystore.gym import schema_from_spaces
from replaystore.gym.framestack import DEFAULT_CODEC, FrameStack, frame_field
from replaystore.integrations.pending import EPISODE_KEYS, FramesLog, PendingLog, commit_collected, orphan, track
from replaystore.loaders import EmptyStoreError
from replaystore.loaders.stacking import FrameWindows, Stacker
from replaystore.schemas import Dense, Schema, nested
from replaystore.store import Store, open_store

__all__ = ["ReplayStoreBuffer", "ReplayStoreDictBuffer", "commit_collected", "resume_learning_starts", "train_offline"]

DEFAULT_COMMIT_EVERY = 1000
"""Environment steps (``add`` calls) between commits by default, fewer where they would not fit
:data:`TAIL_BYTES`."""

TAIL_BYTES = 64 << 20
"""By default the pending (uncommitted) transitions kept in RAM hold at most about this many bytes."""

_SEP = "__"


def _loading_model() -> str | None:
    """The directory of the model file being loaded when called under SB3's ``load`` (``""``: a file object)."""
    code = BaseAlgorithm.load.__func__.__code__  # type: ignore[attr-defined]
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code is code:
            path = frame.f_locals.get("path")
            if isinstance(path, (str, os.PathLike)):
                return os.path.dirname(os.path.abspath(os.path.expanduser(os.fspath(path))))
            return ""
        frame = frame.f_back
    return None


def _local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or int(value) < 1:
        raise BufferArgumentError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


class _StoreBufferMixin:
    """The store-backed body shared by :class:`ReplayStoreBuffer` and :class:`ReplayStoreDictBuffer`."""

    # set by SB3's BaseBuffer.__init__ and by this class
    observation_space: Any
    action_space: Any
    device: th.device
    n_envs: int
    buffer_size: int
    action_dim: int
    obs_shape: Any
    optimize_memory_usage: bool
    handle_timeout_termination: bool

    def _open(self, url: Any, buffer_size: int, n_envs: int, handle_timeout_termination: bool,
              optimize_memory_usage: bool, commit_every: int | None,
              storage_options: Mapping[str, Any] | None, create: bool = True, frame_stack: int | None = None,
              frame_padding: str = "zero") -> None:
        if url is None:
            raise BufferArgumentError("url: expected the store's URL (a local path, file://, s3://, memory://) "
                                      "in replay_buffer_kwargs={'url': ...}, got none")
        if not isinstance(url, (str, os.PathLike)):
            raise BufferArgumentError(f"url: expected a str or path, got {type(url).__name__}")
        if optimize_memory_usage:
            raise BufferArgumentError("optimize_memory_usage: not supported (the store keeps next_obs per record "
                                      "on disk, so there is no RAM to save); pass optimize_memory_usage=False")
        if commit_every is not None:
            commit_every = _positive_int("commit_every", commit_every)
        self.url = os.fspath(url)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.optimize_memory_usage = False
        self._init_args: dict[str, Any] = {"buffer_size": buffer_size, "n_envs": n_envs, "commit_every": commit_every,
                           "handle_timeout_termination": self.handle_timeout_termination,
                           "storage_options": dict(storage_options) if storage_options is not None else None}
        if frame_stack is not None:
            self._init_args["frame_stack"], self._init_args["frame_padding"] = frame_stack, frame_padding
        self.capacity = max(buffer_size // n_envs, 1) * n_envs  # records kept, as SB3's arrays would keep them
        self._leaves = self._obs_leaves()
        steps = schema_from_spaces(self.observation_space, self.action_space, name="sb3",
                                   reward_dtype=np.float32,
                                   metadata={"producer": "replaystore.integrations.sb3"})
        self._frames = self._frame_stacks(frame_stack, frame_padding)
        expected = steps if not self._frames else self._frames_schema(steps, frame_stack, frame_padding)
        commit_collected()  # (the pending steps of collected buffers first: a reopened url holds them)
        store = self._open_store(expected, storage_options, bool(create))
        schema = store.schema if not self._frames else steps  # (frames: the pending rows keep whole stacks)
        self._columns = {f.name: f for f in schema.dense_fields}
        self._read_columns = [f.name for f in store.schema.dense_fields]
        if commit_every is None:  # the default: 1000 steps, fewer for large observations
            step_bytes = n_envs * sum(f.dtype.itemsize * math.prod(f.shape) for f in self._columns.values())
            commit_every = max(1, min(DEFAULT_COMMIT_EVERY, TAIL_BYTES // step_bytes))
        self.commit_every: int = commit_every
        if self._frames:
            self._log: PendingLog = FramesLog(store, self._columns, commit_every * n_envs, n_envs,
                                              {frame_field(sfx): (sfx, fs.newest) for sfx, fs in self._frames.items()})
            first = next(iter(self._frames.values()))
            self._stacker: Stacker | None = Stacker(store.default, first.stack, first.padding,
                                                    frame_field(next(iter(self._frames))))
        else:
            self._log = PendingLog(store, self._columns, commit_every * n_envs, n_envs)
            self._stacker = None
        # collected (SB3 models are reference cycles: at any allocation of any thread): the finalizer only
        # hands the log to the flusher thread, since no store I/O may run inside the garbage collector
        self._finalizer = weakref.finalize(self, orphan, self._log)
        self._finalizer.atexit = False  # (track's exit hook commits what is left, before the thread pools stop)
        track(self._log)
        self.stored_at_open = len(self._log.table)
        # per env: continuity and the episode in progress
        self._obs_specs = [(f"obs{sfx}", f"next_obs{sfx}", key, (n_envs, *self._columns[f"obs{sfx}"].shape))
                           for sfx, key in self._leaves]
        self._action_rows = (n_envs, *self._columns["action"].shape)
        self._env_ids = np.arange(n_envs)
        self._prev_next = {c: np.zeros(shape, self._columns[c].dtype) for c, _, _, shape in self._obs_specs}
        self._has_prev = False
        self._added = 0  # add() calls since the store was opened
        # sampled actions in SB3's dtype: the space's, float64 as float32
        space_dtype = np.dtype(self.action_space.dtype)
        self._action_dtype = np.dtype(np.float32) if space_dtype == np.float64 else space_dtype
        self._prev_done = np.ones(n_envs, dtype=bool)
        self._step = np.zeros(n_envs, dtype=np.int64)
        self._ep_first = np.zeros(n_envs, dtype=np.int64)
        self._ep_length = np.zeros(n_envs, dtype=np.int64)
        self._ep_return = np.zeros(n_envs, dtype=np.float64)
        self._finite = [name for name, f in self._columns.items() if f.dtype.kind == "f" and f.finite]
        self._n_actions = (int(self.action_space.n) if isinstance(self.action_space, spaces.Discrete)
                           and int(self.action_space.start) == 0 else None)

    def _obs_leaves(self) -> list[tuple[str, str | None]]:
        """``(column suffix, Dict key)`` per observation leaf: ``[("", None)]`` for a flat space."""
        space = self.observation_space
        if not isinstance(space, spaces.Dict):
            if isinstance(space, spaces.Tuple):
                raise BufferArgumentError("observation_space: a Tuple space is not supported by SB3's buffers; "
                                          "use a Dict observation space")
            return [("", None)]
        out: list[tuple[str, str | None]] = []
        for key, sub in space.spaces.items():
            if isinstance(sub, (spaces.Dict, spaces.Tuple)):
                raise BufferArgumentError(f"observation_space: key {key!r} is a nested {type(sub).__name__}; SB3's "
                                          "Dict buffers take one level of Box/Discrete/MultiDiscrete/MultiBinary")
            out.append((f"{_SEP}{key}", key))
        return out

    def _frame_stacks(self, frame_stack: int | None, padding: str) -> dict[str, FrameStack]:
        """Per observation leaf stored as frames (by column suffix): its :class:`FrameStack` (none without one).

        A flat Box observation is one stack; in a Dict, every image leaf (uint8 Box of 3 dims).
        The stacking axis is the channel axis as SB3's ``VecFrameStack`` uses it: first for a
        channel-first image (after ``VecTransposeImage``), last otherwise.
        """
        if frame_stack is None:
            return {}
        space = self.observation_space
        subs = ([("", "obs", space)] if not isinstance(space, spaces.Dict) else
                [(f"{_SEP}{key}", f"obs{_SEP}{key}", sub) for key, sub in space.spaces.items()
                 if is_image_space(sub, check_channels=False)])
        if not subs or not all(isinstance(sub, spaces.Box) for _, _, sub in subs):
            raise BufferArgumentError(f"frame_stack: needs a Box observation or a Dict with an image leaf (uint8 "
                                      f"Box of 3 dims), got {space}")
        out = {}
        for sfx, name, sub in subs:
            assert isinstance(sub, spaces.Box)
            image = is_image_space(sub, check_channels=False)
            axis = 0 if image and is_image_space_channels_first(sub) else -1
            try:
                # (one channel per frame, first: frames of the image's own shape, as the recorders store them)
                out[sfx] = FrameStack(name, tuple(sub.shape), frame_stack, padding, axis=axis, new_axis=axis == 0)
            except RecordingError as exc:
                raise BufferArgumentError(str(exc)) from None
        return out

    def _frames_schema(self, steps: Schema, frame_stack: Any, padding: str) -> Schema:
        """The ``frames`` layout of these steps: each frame once (zstd), the other leaves as recorded."""
        fields: list[Any] = []
        space = self.observation_space
        fields += [Dense(frame_field(sfx), steps.field(f"obs{sfx}").dtype, fs.frame_shape,  # type: ignore[union-attr]
                         codec=DEFAULT_CODEC) for sfx, fs in self._frames.items()]
        if isinstance(space, spaces.Dict):
            raw = {key: steps.field(f"obs{_SEP}{key}") for key in space.spaces if f"{_SEP}{key}" not in self._frames}
            if raw:
                fields += [nested("obs", raw), nested("next_obs", raw)]
        fields += [steps.field(name) for name in ("action", "reward", "terminated", "truncated")]
        meta = dict(steps.metadata)
        meta.update(frame_stack=int(frame_stack), frame_padding=padding)
        return Schema("sb3_frames", fields, metadata=meta)

    def _open_store(self, expected: Schema, storage_options: Mapping[str, Any] | None, create: bool) -> Store:
        """Open the store at ``self.url`` (created if absent and ``create``) and check it holds these steps.

        Under SB3's ``load`` a relative local url is looked up in the model file's directory first, and
        nothing is created.
        """
        loading = _loading_model()
        where = self.url
        if loading and _local(where):
            path = os.path.expanduser(where[len("file://"):] if where.startswith("file://") else where)
            if not os.path.isabs(path) and os.path.exists(os.path.join(loading, path)):
                where = os.path.join(loading, path)
        try:
            store = open_store(where, mode="r+", storage_options=storage_options)
        except StoreNotFoundError:
            if create and loading is None:
                return open_store(where, expected, mode="a", capacity=self.capacity,
                                  storage_options=storage_options)
            raise StoreNotFoundError(self._missing(where, loading)) from None
        try:
            self._check_store(store, expected)
        except BaseException:
            store.close()
            raise
        return store

    def _missing(self, where: str, loading: str | None) -> str:
        """The message for a store that a loaded model or buffer (or ``create=False``) does not find."""
        what = "loading a saved model never creates its store" if loading is not None else (
            "a loaded replay buffer (or create=False) never creates its store")
        msg = (f"{where}: no replay store here, and {what} (has the run moved, or the store been deleted?). "
               f"Pass where the store is now: Model.load(path, replay_buffer_kwargs={{'url': NEW_URL, ...}}) "
               f"(the other keys as saved), or custom_objects={{'replay_buffer_kwargs': {{...}}}}")
        if loading and _local(where):
            moved = os.path.join(loading, os.path.basename(os.path.normpath(os.path.expanduser(where))))
            if os.path.exists(moved):
                msg += f"; a directory {moved!r} is next to the model file"
        return msg

    def _check_store(self, store: Store, expected: Schema) -> None:
        if len(store.tables) != 1:
            raise SchemaMismatchError(f"{self.url}: a replay buffer needs a store with one table, "
                                      f"found tables {store.tables}")
        if store.default.capacity is not None and store.default.capacity != self.capacity:
            raise BufferArgumentError(
                f"buffer_size: the store at {self.url} keeps {store.default.capacity} records (capacity), this "
                f"buffer would keep {self.capacity} (buffer_size {self._init_args['buffer_size']} with n_envs "
                f"{self.n_envs}); pass the buffer_size it was created with, or another url")
        schema = store.schema
        if self._frames:
            meta = schema.metadata
            first = next(iter(self._frames.values()))
            if meta.get("frame_stack") != first.stack or meta.get("frame_padding") != first.padding:
                raise SchemaMismatchError(
                    f"{self.url}: the store holds frames stacked {meta.get('frame_stack')!r} with padding "
                    f"{meta.get('frame_padding')!r}, this buffer stacks {first.stack} with {first.padding!r} "
                    f"(frame_stack=, frame_padding=)")
        got = {f.name: f for f in schema.fields if f.kind != "meta"}
        want = {f.name: f for f in expected.dense_fields}
        extra = sorted(set(got) - set(want))
        if extra:
            raise SchemaMismatchError(f"{self.url}: field {extra[0]!r} is in the store but not in the steps of "
                                      f"these spaces (expected fields {sorted(want)})")
        for name, f in want.items():
            g = got.get(name)
            if g is None:
                raise SchemaMismatchError(f"{self.url}: field {name!r} is missing from the store's schema "
                                          f"(expected {f.dtype} {f.shape} for these spaces)")
            if not isinstance(g, Dense):
                raise SchemaMismatchError(f"{self.url}: field {name!r} is {g.kind} in the store, expected dense")
            dtype_ok = g.dtype == f.dtype or (name == "reward" and g.dtype.kind == "f")
            if not dtype_ok or g.shape != f.shape:
                raise SchemaMismatchError(
                    f"{self.url}: field {name!r} is {g.dtype} {g.shape} in the store, expected {f.dtype} {f.shape} "
                    f"for observation space {self.observation_space} and action space {self.action_space}")

    # -- SB3's interface ------------------------------------------------------------------
    @property
    def pos(self) -> int:
        """Where SB3's own buffer would write next (read only): the steps held, modulo ``buffer_size``."""
        steps = -(-self.stored_at_open // self.n_envs) + self._added
        return steps % self.buffer_size if self.full else self.size()

    @pos.setter
    def pos(self, value: int) -> None:
        """Ignored (SB3's base class sets it to 0 on construction; the store is the position)."""

    @property
    def full(self) -> bool:
        """Whether the replay holds ``buffer_size * n_envs`` transitions (its capacity) or more."""
        return self._transitions() >= self.capacity

    @full.setter
    def full(self, value: bool) -> None:
        """Ignored (SB3's base class sets it to False on construction)."""

    def _transitions(self) -> int:
        if self._stacker is not None:  # (frames: the records with a next frame, and each env's last one
            assert isinstance(self._log, FramesLog)  # waiting for it; frame-only records are not steps)
            return len(self._stacker.index().valid_rows) + self._log.n + int(self._log.open.sum())
        return len(self._log.table) + self._log.n

    def size(self) -> int:
        """Transitions held, in SB3's unit: vector-env steps (transitions / ``n_envs``, rounded up).

        Returns
        -------
        int
            At most ``buffer_size``. Cost: O(1).
        """
        return min(self.buffer_size, -(-self._transitions() // self.n_envs))

    def reset(self) -> None:
        """Refused: the replay is persistent; delete the store or use another ``url`` to start afresh.

        Raises
        ------
        StoreError
            Always.
        """
        raise StoreError(f"{self.url}: a store-backed replay is not reset in place; use another url")

    def _add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
             infos: list[dict[str, Any]]) -> None:
        log = self._log
        if log.closed:
            raise StoreError(f"{self.url}: the buffer is closed")
        n = self.n_envs
        if log.n + n > log.rows:  # (a commit that failed at the last add: try again before adding)
            log.commit()
        i = log.n
        a = log.arrays
        rows = slice(i, i + n)
        try:
            for obs_col, next_col, key, shape in self._obs_specs:
                a[obs_col][rows] = np.reshape(obs if key is None else obs[key], shape)
                a[next_col][rows] = np.reshape(next_obs if key is None else next_obs[key], shape)
            a["action"][rows] = np.reshape(action, self._action_rows)
            a["reward"][rows] = np.reshape(reward, n)
            done_ = np.array(done, dtype=bool).reshape(n)  # (a copy: kept until the next add)
            timeout = [bool(info.get("TimeLimit.truncated", False)) for info in infos]
            if len(timeout) != n:
                raise ValueError(f"{len(timeout)} infos for {n} envs")
        except (ValueError, TypeError, KeyError) as exc:
            raise BufferArgumentError(f"add: the transition does not fit the buffer's spaces "
                                      f"(n_envs {n}): {exc}") from None
        self._check_values(rows)
        any_done = bool(done_.any())
        if any_done:
            trunc = done_ & np.array(timeout, dtype=bool)
            a["terminated"][rows] = done_ & ~trunc
            a["truncated"][rows] = trunc
        else:
            a["terminated"][rows] = False
            a["truncated"][rows] = False
        # a new episode where the last one ended, or where obs does not continue the last next_obs
        begin = self._prev_done
        cut = None
        if self._has_prev and not begin.all() and not self._continues(rows):
            same = np.ones(n, dtype=bool)
            for obs_col, _, _, _ in self._obs_specs:
                same &= (a[obs_col][rows] == self._prev_next[obs_col]).reshape(n, -1).all(axis=1)
            cut = ~same & ~begin
            begin = begin | ~same
        if self._frames:
            self._check_frames(rows, begin)
            assert isinstance(log, FramesLog)
            log.end[rows] = done_
            if cut is not None and cut.any() and i >= n:  # (the cut episode's last row is pending: close it)
                log.end[i - n:i] |= cut
        if cut is not None and cut.any():  # the env was reset mid-episode (e.g. a new learn()): abandoned
            self._end(cut, np.zeros(n, bool), np.zeros(n, bool))
        log.reset[rows] = begin
        if begin.any():
            self._ep_first[begin] = self._step[begin]
            self._ep_length[begin] = 0
            self._ep_return[begin] = 0.0
        self._step += 1
        self._ep_length += 1
        self._ep_return += a["reward"][rows]
        if any_done:
            self._end(done_, a["terminated"][rows], a["truncated"][rows])
        self._prev_done = done_
        for obs_col, next_col, _, _ in self._obs_specs:
            np.copyto(self._prev_next[obs_col], a[next_col][rows])
        self._has_prev = True
        self._added += 1
        log.n = i + n
        if log.n + n > log.rows:
            log.commit()

    def _check_frames(self, rows: slice, begin: np.ndarray) -> None:
        """BufferArgumentError unless each stacked observation is an episode start or continues, and slides."""
        a = self._log.arrays
        for sfx, fs in self._frames.items():
            obs, nxt = a[f"obs{sfx}"][rows], a[f"next_obs{sfx}"][rows]
            bad = ~fs.slides(obs, nxt)
            if bad.any():
                raise BufferArgumentError(str(fs.refuse("and its next_obs are not one frame apart",
                                                        np.flatnonzero(bad))))
            if begin.any():
                starts = np.flatnonzero(begin)
                bad = ~fs.starts(obs[starts])
                if bad.any():
                    raise BufferArgumentError(str(fs.refuse("starts an episode without its padding", starts[bad])))

    def _continues(self, rows: slice) -> bool:
        """Whether every env's ``obs`` is bytewise its last ``next_obs`` (the common case, checked cheaply)."""
        a = self._log.arrays
        return all(a[obs_col][rows].tobytes() == self._prev_next[obs_col].tobytes()
                   for obs_col, _, _, _ in self._obs_specs)

    def _check_values(self, rows: slice) -> None:
        a = self._log.arrays
        for name in self._finite:
            values = a[name][rows]
            if not math.isfinite(values.sum()) and not np.isfinite(values).all():  # (a sum can overflow)
                raise BufferArgumentError(f"add: {name!r} holds a NaN or infinite value")
        if self._n_actions is not None:
            act = a["action"][rows].tolist()
            if min(act) < 0 or max(act) >= self._n_actions:
                raise BufferArgumentError(f"add: 'action' outside Discrete({self._n_actions}): {act}")

    def _end(self, mask: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        keys = self._log.stream_keys()
        for j in np.flatnonzero(mask).tolist():
            if self._ep_length[j] <= 0:
                continue
            for key, value in zip(EPISODE_KEYS, (str(keys[j]), int(self._ep_first[j]), int(self._ep_length[j]),
                                                 float(self._ep_return[j]), None, bool(terminated[j]),
                                                 bool(truncated[j])), strict=True):
                self._log.ended[key].append(value)
            self._ep_length[j] = 0

    def _draw(self, batch_size: int) -> dict[str, np.ndarray]:
        """The flat columns of ``batch_size`` transitions drawn uniformly (with replacement)."""
        log = self._log
        if self._stacker is not None:
            return self._draw_frames(batch_size)
        view = log.table.view()  # (its read keeps a nested field's leaves flat, under their column names)
        committed = len(view)
        total = committed + log.n
        low = max(0, total - self.capacity)  # (the oldest positions come first: drop those past capacity)
        if total - low <= 0:
            raise EmptyStoreError(f"{self.url}: the replay holds no transition to sample")
        idx = np.random.randint(low, total, size=batch_size)
        if not log.n or int(idx.max()) < committed:
            return self._flat(view.read(view.rows_at(idx), self._read_columns))
        in_store = idx < committed
        tail = idx[~in_store] - committed
        if not in_store.any():
            return {name: arr[tail] for name, arr in log.arrays.items()}
        # (draws from the store first, then from RAM: the same i.i.d. uniform draws, grouped)
        stored = self._flat(view.read(view.rows_at(idx[in_store]), self._read_columns))
        return {name: np.concatenate((stored[name], arr[tail])) for name, arr in log.arrays.items()}

    def _draw_frames(self, batch_size: int) -> dict[str, np.ndarray]:
        """As :meth:`_draw`, from a ``frames`` store: stacks rebuilt by the loaders' frame stacking.

        Drawn uniformly from the committed records with a next frame and the pending rows
        (which keep their whole stacks in RAM).
        """
        log = self._log
        assert self._stacker is not None
        index = self._stacker.index()
        valid = index.valid_rows
        committed = len(valid)
        total = committed + log.n
        if total <= 0:
            raise EmptyStoreError(f"{self.url}: the replay holds no transition to sample")
        idx = np.random.randint(0, total, size=batch_size)
        in_store = idx < committed
        tail = idx[~in_store] - committed
        if not in_store.any():
            return {name: arr[tail] for name, arr in log.arrays.items()}
        rows = valid[idx[in_store]]
        table = log.table
        frames = {frame_field(sfx) for sfx in self._frames}
        raw = [name for name in self._read_columns if name not in frames]
        stored = self._flat(table.read(rows, columns=raw))
        windows = index.windows(rows, self._stacker.stack, self._stacker.padding)
        for sfx, fs in self._frames.items():
            got = FrameWindows(windows, frame_field(sfx)).apply(table, {})
            stored[f"obs{sfx}"], stored[f"next_obs{sfx}"] = fs.join(got["obs"]), fs.join(got["next_obs"])
        if not len(tail):
            return stored
        return {name: np.concatenate((stored[name], arr[tail])) for name, arr in log.arrays.items()}

    def _flat(self, cols: dict[str, Any]) -> dict[str, np.ndarray]:
        """``cols`` with a nested field's leaves under their column names (``obs__image``)."""
        if self._leaves == [("", None)]:
            return cols
        out: dict[str, np.ndarray] = {}
        for name, value in cols.items():
            if isinstance(value, dict):
                out.update({f"{name}{_SEP}{key}": leaf for key, leaf in value.items()})
            else:
                out[name] = value
        return out

    def _obs_of(self, cols: dict[str, np.ndarray], base: str) -> Any:
        shape = self.obs_shape
        if self._leaves == [("", None)]:
            return cols[base].reshape(-1, *shape)
        return {key: cols[f"{base}{sfx}"].reshape(-1, *shape[key]) for sfx, key in self._leaves}

    def _parts(self, batch_size: int, env: VecNormalize | None) -> tuple[Any, th.Tensor, Any, th.Tensor, th.Tensor]:
        cols = self._draw(batch_size)
        obs = self._normalize_obs(self._obs_of(cols, "obs"), env)  # type: ignore[attr-defined]
        next_obs = self._normalize_obs(self._obs_of(cols, "next_obs"), env)  # type: ignore[attr-defined]
        done = cols["terminated"] if self.handle_timeout_termination else cols["terminated"] | cols["truncated"]
        action = cols["action"].reshape(-1, self.action_dim)
        if action.dtype != self._action_dtype:
            action = action.astype(self._action_dtype)
        reward = cols["reward"].reshape(-1, 1)
        if reward.dtype != np.float32:
            reward = reward.astype(np.float32)
        reward = self._normalize_reward(reward, env)  # type: ignore[attr-defined]
        dev = self.device
        return (obs, th.as_tensor(action, device=dev), next_obs,
                th.as_tensor(done.astype(np.float32).reshape(-1, 1), device=dev), th.as_tensor(reward, device=dev))

    # -- durability -------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Transitions added and not yet committed (kept in RAM, sampled from, lost by a crash)."""
        return self._log.n

    def flush(self) -> None:
        """Commit the pending transitions now: durable, and visible to other readers of the store.

        Cost: one append and one commit (file syncs, ~2-15 ms on local disk); nothing when
        nothing is pending.
        """
        self._log.commit()

    def close(self) -> None:
        """Commit the pending transitions and release the store (also done at interpreter exit).

        A buffer that is garbage-collected unclosed has its pending transitions committed by a
        background thread soon after (never inside the garbage collector), or at interpreter
        exit.

        Cost: a commit, and waiting for the writer's background work.
        """
        self._finalizer.detach()
        self._log.close()

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps: the URL and the constructor arguments, never the transitions.

        ``model.save_replay_buffer(path)`` therefore writes a small file (after committing the
        pending transitions) and ``model.load_replay_buffer(path)`` reopens the same store.
        """
        self._log.commit()
        return {"url": self.url, "observation_space": self.observation_space, "action_space": self.action_space,
                "device": str(self.device), **self._init_args}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Reopen the store a pickled buffer names (see :meth:`__getstate__`)."""
        self.__init__(**state, create=False)  # type: ignore[misc]


class ReplayStoreBuffer(_StoreBufferMixin, ReplayBuffer):
    """SB3's ``ReplayBuffer``, with its transitions in a store instead of RAM arrays.

    Use it as ``DQN("MlpPolicy", env, replay_buffer_class=ReplayStoreBuffer,
    replay_buffer_kwargs={"url": path})`` (also SAC, TD3 and the other off-policy
    algorithms). Each ``add`` is kept in RAM until it is committed (every
    ``commit_every`` steps, at :meth:`flush`, :meth:`close`, pickling, and at
    interpreter exit); ``sample`` draws uniformly from the committed transitions and
    the pending ones alike, so the learner sees its newest transitions as SB3's own
    buffer does. A process killed at any instant loses only the pending transitions:
    reopening the same ``url`` (``DQN.load`` does, from the saved kwargs) continues
    with the replay as committed. Each env index is a stream (``"w<writer>-<env>"``);
    an episode start is a ``reset`` record; a time-limit truncation
    (``infos[i]["TimeLimit.truncated"]``) is stored as ``truncated``, a termination as
    ``terminated``, and the ended episodes go into each commit's metadata as
    ``replaystore.gym``'s recorders write them.

    Parameters
    ----------
    buffer_size : int
        Transitions kept, as SB3 counts them: the store's capacity is
        ``max(buffer_size // n_envs, 1) * n_envs`` records; the oldest are evicted
        beyond it. An existing bounded store must have that capacity. An unbounded
        store (one recorded with ``RecordEpisodes``/``RecordVectorEpisodes`` without
        ``capacity``) is taken for any ``buffer_size``: it keeps every record, and the
        buffer samples its newest ``capacity`` records, as SB3's own buffer holds its
        last ``buffer_size`` steps.
    observation_space, action_space : gymnasium.spaces.Space
        The (single-env) spaces; the store's schema is ``schema_from_spaces`` of them
        (rewards float32).
    device : torch.device or str
        Where sampled tensors go.
    n_envs : int
        Environments of the vector env; one stream each.
    optimize_memory_usage : bool
        Must be False (``next_obs`` is stored per record, on disk).
    handle_timeout_termination : bool
        True (SB3's default): sampled ``dones`` are 1 only for terminations; False:
        for truncations too. The store holds both flags either way.
    url : str or os.PathLike
        Where the store lives (created when absent, unless ``create=False``); required.
        ``~`` is expanded. Under ``Model.load`` a relative local path is looked up in
        the saved model file's directory first (then the working directory), so a run
        directory holding the model file and its store can move.
    commit_every : int, optional
        Commit once this many ``add`` calls (vector-env steps) are pending. Default: 1000, or
        fewer so that the pending steps take at most ~64 MiB of RAM (e.g. 148 steps of 8 Atari
        envs, 84x84x4 frames).
    storage_options : mapping, optional
        Passed to the storage backend (e.g. S3 options).
    create : bool
        Whether an absent store is created (default). Never under ``Model.load`` or
        when a pickled buffer is loaded (``load_replay_buffer``): a missing store then
        raises ``StoreNotFoundError``.
    frame_stack : int, optional
        Frames per stacked observation, as ``VecFrameStack(venv, n_stack)`` stacks them
        (``frame_stack=n_stack``; along the channel axis, first after DQN's
        ``VecTransposeImage``, last otherwise). The store then holds each frame once,
        zstd-compressed (the ``frames`` layout: the newest frame of each observation and one
        frame-only record closing each episode; ~100-600x fewer bytes per Atari step than
        SB3's buffer), and ``sample`` rebuilds the stacks with the loaders' frame stacking:
        the same arrays SB3's own buffer gives. Each ``add`` is checked (``next_obs`` one
        frame on from ``obs``, an episode's first ``obs`` padded); otherwise
        ``BufferArgumentError`` and nothing of the step is kept. The frame-only records count
        towards the capacity; once records are evicted, the oldest kept episode of each env
        is stacked as if it started at its oldest kept frame (its first ``frame_stack - 1``
        transitions differ from what was added). None (default): whole observations.
    frame_padding : str
        With ``frame_stack``: ``"zero"`` (default; ``VecFrameStack``) or ``"reset"`` (the first
        frame repeated, as gymnasium's ``FrameStackObservation``).

    Attributes
    ----------
    stored_at_open : int
        Transitions the store held when the buffer opened it.

    Raises
    ------
    BufferArgumentError
        No ``url``, ``optimize_memory_usage=True``, a bad ``commit_every``,
        ``buffer_size`` or ``n_envs``, a ``buffer_size`` that does not match an
        existing store's capacity, a nested or Tuple observation space.
    SchemaMismatchError
        An existing store whose fields do not hold these spaces' steps (the message
        names the field).
    StoreNotFoundError
        No store at ``url`` where none may be created (``create=False``, a loaded
        model or buffer); the message names the path and how to pass the new one.
    UnsupportedSpaceError
        A space without a column layout.

    Notes
    -----
    Cost: ``add`` copies one step into RAM (~20 µs); a commit every ``commit_every``
    steps appends and syncs (~2-15 ms on local disk); ``sample(256)`` is one gathered
    read of the sampled rows.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, url: str | os.PathLike[str] | None = None,
                 commit_every: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 create: bool = True, frame_stack: int | None = None, frame_padding: str = "zero") -> None:
        if isinstance(observation_space, spaces.Dict):
            raise BufferArgumentError("observation_space: a Dict space; use ReplayStoreDictBuffer")
        _positive_int("buffer_size", buffer_size)
        _positive_int("n_envs", n_envs)
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self._open(url, buffer_size, n_envs, handle_timeout_termination, optimize_memory_usage, commit_every,
                   storage_options, create, frame_stack, frame_padding)

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Keep one vector-env step (``n_envs`` transitions), as SB3's ``_store_transition`` gives it.

        Parameters
        ----------
        obs, next_obs : numpy.ndarray
            ``[n_envs, *obs_shape]``; ``next_obs`` already holds ``terminal_observation``
            where an episode ended.
        action : numpy.ndarray
            ``[n_envs, ...]`` (the buffer action).
        reward, done : numpy.ndarray
            ``[n_envs]``.
        infos : list of dict
            One per env; ``"TimeLimit.truncated"`` marks a truncation.

        Raises
        ------
        BufferArgumentError
            A value that does not fit the spaces, a non-finite value where the field
            refuses one, a Discrete action out of range; nothing of the step is kept.

        Notes
        -----
        Cost: a copy into RAM and a comparison of ``obs`` with the last ``next_obs``
        (episode continuity); a commit every ``commit_every`` calls.
        """
        self._add(obs, next_obs, action, reward, done, infos)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly with replacement (``np.random``, as SB3 draws).

        Parameters
        ----------
        batch_size : int
            Transitions.
        env : VecNormalize, optional
            Normalises observations and rewards as SB3 does.

        Returns
        -------
        ReplayBufferSamples
            ``dones`` is ``terminated`` (with ``handle_timeout_termination``) or
            ``terminated | truncated``; dtypes and shapes as SB3's own buffer.

        Raises
        ------
        EmptyStoreError
            Nothing to sample.

        Notes
        -----
        Cost: one gathered read of the sampled committed rows plus a RAM gather of the
        pending ones; no store refresh.
        """
        obs, action, next_obs, done, reward = self._parts(batch_size, env)
        dev = self.device
        return ReplayBufferSamples(th.as_tensor(obs, device=dev), action, th.as_tensor(next_obs, device=dev),
                                   done, reward)


class ReplayStoreDictBuffer(_StoreBufferMixin, DictReplayBuffer):
    """SB3's ``DictReplayBuffer`` (Dict observations), with its transitions in a store.

    The observation is stored as nested fields, one column per key (``obs__image``,
    ``next_obs__image``; see ``schema_from_spaces``). Everything else is as
    :class:`ReplayStoreBuffer`.

    Parameters
    ----------
    buffer_size : int
        Transitions kept: capacity ``max(buffer_size // n_envs, 1) * n_envs`` records.
    observation_space : gymnasium.spaces.Dict
        One level of Box/Discrete/MultiDiscrete/MultiBinary spaces.
    action_space : gymnasium.spaces.Space
        The action space.
    device : torch.device or str
        Where sampled tensors go.
    n_envs : int
        Environments; one stream each.
    optimize_memory_usage : bool
        Must be False.
    handle_timeout_termination : bool
        As :class:`ReplayStoreBuffer`.
    url : str or os.PathLike
        Where the store lives; required (as :class:`ReplayStoreBuffer`).
    commit_every : int, optional
        Commit once this many ``add`` calls are pending (default as :class:`ReplayStoreBuffer`).
    storage_options : mapping, optional
        Passed to the storage backend.
    create : bool
        Whether an absent store is created (as :class:`ReplayStoreBuffer`).
    frame_stack : int, optional
        Frames per stacked observation: each image leaf (a uint8 Box of 3 dims) is stored
        as a frame field ``frame_<key>`` (zstd), the other leaves whole; as
        :class:`ReplayStoreBuffer`.
    frame_padding : str
        As :class:`ReplayStoreBuffer`.

    Attributes
    ----------
    stored_at_open : int
        Transitions the store held when the buffer opened it.

    Raises
    ------
    BufferArgumentError
        As :class:`ReplayStoreBuffer`; also an observation space that is not a Dict.
    SchemaMismatchError
        An existing store whose fields do not hold these spaces' steps.
    StoreNotFoundError
        As :class:`ReplayStoreBuffer`.

    Notes
    -----
    Cost: as :class:`ReplayStoreBuffer`, one array per key.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, url: str | os.PathLike[str] | None = None,
                 commit_every: int | None = None, storage_options: Mapping[str, Any] | None = None,
                 create: bool = True, frame_stack: int | None = None, frame_padding: str = "zero") -> None:
        if not isinstance(observation_space, spaces.Dict):
            raise BufferArgumentError(f"observation_space: expected a Dict space, got "
                                      f"{type(observation_space).__name__}; use ReplayStoreBuffer")
        _positive_int("buffer_size", buffer_size)
        _positive_int("n_envs", n_envs)
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self._open(url, buffer_size, n_envs, handle_timeout_termination, optimize_memory_usage, commit_every,
                   storage_options, create, frame_stack, frame_padding)

    def add(self, obs: dict[str, np.ndarray], next_obs: dict[str, np.ndarray],  # type: ignore[override]
            action: np.ndarray, reward: np.ndarray, done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Keep one vector-env step (``n_envs`` transitions).

        Parameters
        ----------
        obs, next_obs : dict of str to numpy.ndarray
            Per key ``[n_envs, *shape]``.
        action : numpy.ndarray
            ``[n_envs, ...]``.
        reward, done : numpy.ndarray
            ``[n_envs]``.
        infos : list of dict
            One per env.

        Raises
        ------
        BufferArgumentError
            A value that does not fit the spaces (a missing key included).

        Notes
        -----
        Cost: as :meth:`ReplayStoreBuffer.add`, per key.
        """
        self._add(obs, next_obs, action, reward, done, infos)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> DictReplayBufferSamples:  # type: ignore[override]
        """``batch_size`` transitions drawn uniformly with replacement.

        Parameters
        ----------
        batch_size : int
            Transitions.
        env : VecNormalize, optional
            Normalises observations and rewards as SB3 does.

        Returns
        -------
        DictReplayBufferSamples
            Observations as dicts of tensors.

        Raises
        ------
        EmptyStoreError
            Nothing to sample.
        """
        obs, action, next_obs, done, reward = self._parts(batch_size, env)
        dev = self.device
        return DictReplayBufferSamples({k: th.as_tensor(v, device=dev) for k, v in obs.items()}, action,
                                       {k: th.as_tensor(v, device=dev) for k, v in next_obs.items()}, done, reward)


def resume_learning_starts(model: Any) -> int:
    """Lower ``model.learning_starts`` by the transitions its store-backed buffer already held.

    A run restarted with ``DQN.load`` (whose ``num_timesteps`` starts again at 0 with
    ``learn(reset_num_timesteps=True)``) then trains from its first step when the
    store holds at least ``learning_starts`` transitions, instead of collecting them
    again.

    Parameters
    ----------
    model : stable_baselines3.common.off_policy_algorithm.OffPolicyAlgorithm
        A model whose ``replay_buffer`` is a :class:`ReplayStoreBuffer` or
        :class:`ReplayStoreDictBuffer`.

    Returns
    -------
    int
        The new ``learning_starts``.

    Raises
    ------
    BufferArgumentError
        The model's replay buffer is not store-backed.

    Notes
    -----
    Cost: O(1).
    """
    buf = getattr(model, "replay_buffer", None)
    if not isinstance(buf, _StoreBufferMixin):
        raise BufferArgumentError(f"model.replay_buffer: expected a ReplayStoreBuffer or ReplayStoreDictBuffer, "
                                  f"got {type(buf).__name__}")
    model.learning_starts = max(0, int(model.learning_starts) - buf.stored_at_open)
    return int(model.learning_starts)


def train_offline(model: Any, gradient_steps: int, batch_size: int | None = None) -> int:
    """Train ``model`` on what its store-backed replay already holds, without stepping the env.

    Offline pre-training with SB3's public API: ``model.train`` on the replay the model
    was constructed with (``replay_buffer_class=ReplayStoreBuffer``), a silent logger
    set with ``model.set_logger`` when the model has none yet, and for DQN the target
    network copied every ``target_update_interval`` gradient steps, as ``learn`` does
    every ``target_update_interval`` env steps (SAC and TD3 update their targets inside
    ``train``). ``model.learn`` afterwards fine-tunes online on the same store.

    Parameters
    ----------
    model : stable_baselines3.common.off_policy_algorithm.OffPolicyAlgorithm
        A model whose ``replay_buffer`` is a :class:`ReplayStoreBuffer` or
        :class:`ReplayStoreDictBuffer`.
    gradient_steps : int
        Gradient steps to take.
    batch_size : int, optional
        Transitions per gradient step (default: ``model.batch_size``).

    Returns
    -------
    int
        The gradient steps taken.

    Raises
    ------
    BufferArgumentError
        The model's replay buffer is not store-backed, or a bad ``gradient_steps`` or
        ``batch_size``.
    EmptyStoreError
        The replay holds no transition.

    Notes
    -----
    Cost: ``gradient_steps`` sampled minibatches and optimizer steps.
    """
    buf = getattr(model, "replay_buffer", None)
    if not isinstance(buf, _StoreBufferMixin):
        raise BufferArgumentError(f"model.replay_buffer: expected a ReplayStoreBuffer or ReplayStoreDictBuffer, "
                                  f"got {type(buf).__name__}")
    steps = _positive_int("gradient_steps", gradient_steps)
    batch = _positive_int("batch_size", model.batch_size if batch_size is None else batch_size)
    try:
        model.logger  # noqa: B018 (set by learn() or set_logger)
    except AttributeError:
        from stable_baselines3.common.logger import configure

        model.set_logger(configure(None, []))
    if buf.size() == 0:
        raise EmptyStoreError(f"{buf.url}: the replay holds no transition to train on")
    q_net, target = getattr(model, "q_net", None), getattr(model, "q_net_target", None)
    every = int(getattr(model, "target_update_interval", 0) or 0)
    if q_net is None or target is None or every <= 0:
        model.train(gradient_steps=steps, batch_size=batch)
        return steps
    from stable_baselines3.common.utils import polyak_update

    done = 0
    while done < steps:
        chunk = min(every, steps - done)
        model.train(gradient_steps=chunk, batch_size=batch)
        done += chunk
        if chunk == every:
            polyak_update(q_net.parameters(), target.parameters(), float(model.tau))
            polyak_update(getattr(model, "batch_norm_stats", []), getattr(model, "batch_norm_stats_target", []), 1.0)
    return steps
