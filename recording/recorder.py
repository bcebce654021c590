"""The recording engine behind both wrappers.

Per-slot episode state, safe casts, buffered appends, commits carrying per-episode metadata.

A *slot* is one environment (a single env has one; a vector env one per sub-env) and writes one
stream. The wrappers translate Gymnasium's reset/step/autoreset rules into three calls:
:meth:`SlotRecorder.begin` (slots start an episode with an observation), :meth:`SlotRecorder.record`
(slots store one transition each) and :meth:`SlotRecorder.abandon` (slots leave an unfinished
episode). Every value of a step is cast and checked before any of it is buffered.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

from replaystore.errors import RecordingError, SchemaMismatchError, ShapeError, StoreError, StoreNotFoundError
from replaystore.gym.cast import as_array, cast, check_bounds
from replaystore.gym.episodes import EPISODE_KEYS
from replaystore.gym.framestack import DEFAULT_CODEC, FrameStack, frame_field
from replaystore.gym.nestobs import Leaves, is_nested, leaf_layout, leaves, pick
from replaystore.gym.spaces import InfoSpec, SpaceBounds, bounds, info_columns, schema_from_spaces
from replaystore.schemas import Dense, Schema
from replaystore.store import Store, Writer, open_store

STEP_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
ALL = np.ones(0, dtype=bool)
"""A ``record`` mask meaning every slot (those in an episode record)."""
_sum, _any, _min, _max = np.add.reduce, np.logical_or.reduce, np.minimum.reduce, np.maximum.reduce
APPEND_BYTES = 8 << 20
"""Buffered records are appended to the writer once they hold about this many bytes."""

InfoValues = dict[str, tuple[Any, np.ndarray]]
"""Per info key: the values of every slot (``[slots, ...]``, or None when no slot has the key)
and which slots have it."""


def _info_keys(info_keys: Sequence[str] | Mapping[str, InfoSpec | None]) -> dict[str, InfoSpec | None]:
    if isinstance(info_keys, str):
        raise RecordingError(f"info_keys: expected a sequence or mapping of keys, got the string {info_keys!r}")
    if isinstance(info_keys, Mapping):
        return dict(info_keys)
    return dict.fromkeys(info_keys)


class SlotRecorder:
    """Records the transitions of ``slots`` environment slots into one store.

    Parameters
    ----------
    target
        A store URL (created with the spaces' schema when absent) or an open :class:`Store`
        (its single table's schema is used; the caller keeps ownership).
    slots
        Environments recorded (1 for a single env).
    observation_space, action_space
        The (single) spaces.
    env
        The environment, for its spec in the schema metadata.
    schema
        The schema to create the store with (default: :func:`schema_from_spaces`).
    name
        The default schema's name.
    info_keys
        Info keys to record: keys (dtype from the first value) or ``{key: dtype or (dtype, shape)}``.
    commit_every
        Commit once this many records are pending.
    streams
        One stream key per slot; default ``"w<writer>-<slot>"``. Keys already in the store
        continue after their last stored step.
    capacity, storage_options
        Passed to :func:`open_store` when opening a URL.
    frame_stack
        Frames per stacked observation (``FrameStackObservation``'s ``stack_size``): the store
        then has the ``frames`` layout, each frame once (zstd; one field per leaf of a Dict or
        Tuple observation, ``frame_<key>``), and ``stack=`` samplers rebuild the stacks. Each
        observation is checked to be such a stack. None (default): observations are stored whole.
    frame_padding
        With ``frame_stack``: how the stacks are padded at an episode's start, ``"reset"``
        (gymnasium's default) or ``"zero"``.

    Raises
    ------
    SchemaMismatchError
        The existing store's schema cannot hold these spaces' steps.
    UnsupportedSpaceError
        A space without a column layout.
    """

    def __init__(self, target: str | os.PathLike[str] | Store, slots: int, observation_space: Any,
                 action_space: Any, *, env: Any = None, schema: Schema | None = None, name: str | None = None,
                 info_keys: Sequence[str] | Mapping[str, InfoSpec | None] = (), commit_every: int = 10_000,
                 streams: Sequence[str | int] | None = None, capacity: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, frame_stack: int | None = None,
                 frame_padding: str = "reset") -> None:
        if not isinstance(commit_every, int) or isinstance(commit_every, bool) or commit_every < 1:
            raise RecordingError(f"commit_every: expected a positive int, got {commit_every!r}")
        if streams is not None and (len(streams) != slots or len(set(streams)) != slots):
            raise RecordingError(f"streams: expected {slots} distinct stream keys, one per slot, got {streams!r}")
        self.slots = slots
        self.observation_space = observation_space
        self.action_space = action_space
        self.env = env
        self.name = name
        self.info_keys = _info_keys(info_keys)
        self.commit_every = commit_every
        self._given_streams = list(streams) if streams is not None else None
        self._capacity = capacity
        self._storage_options = storage_options
        self._bounds = bounds(action_space)
        # frame_stack: per observation leaf (column suffix; "" for a Box observation), its FrameStack
        self._fs: dict[str, FrameStack] = {}
        if frame_stack is not None:
            for sfx, _, sub in (leaves(observation_space) if is_nested(observation_space)
                                else [("", (), observation_space)]):
                if not isinstance(sub, gym_spaces.Box):
                    raise RecordingError(f"frame_stack: needs Box observations (each leaf stacked by "
                                         f"FrameStackObservation), got {type(sub).__name__} for 'obs{sfx}'")
                self._fs[sfx] = FrameStack(f"obs{sfx}", _space_shape(sub), frame_stack, frame_padding)
        # the integer ranges of the observation's Discrete/MultiDiscrete/MultiBinary leaves, by column suffix
        self._obs_bounds: dict[str, SpaceBounds] = {}
        for sfx, _, sub in (leaves(observation_space) if is_nested(observation_space)
                            else [("", (), observation_space)]):
            b = bounds(sub)
            if b is not None:
                self._obs_bounds[sfx] = b
        self.store: Store | None = None
        self.writer: Writer | None = None
        self.schema: Schema | None = None
        self._owns_store = False
        self._target = target
        self.stream_keys: list[str | int] = []
        self._keys = np.array([])
        # per-slot episode state
        self.in_episode = np.zeros(slots, dtype=bool)
        self._all_in = False  # every slot in an episode
        self.step = np.zeros(slots, dtype=np.int64)  # each slot's next step (one more per record it stores)
        self.ep_first = np.zeros(slots, dtype=np.int64)  # the step its episode started at
        self.ep_return = np.zeros(slots, dtype=np.float64)
        self.ep_seed: list[int | None] = [None] * slots
        self._all_slots = np.arange(slots)
        # the step fields as the spaces lay them out; an existing store's schema replaces them
        self._fields = {f.name: f for f in schema_from_spaces(observation_space, action_space).dense_fields}
        # a Dict/Tuple observation: (column suffix, path) of each leaf; its values kept as Leaves
        self._leaves = ([(sfx, path) for sfx, path, _ in leaves(observation_space)]
                        if is_nested(observation_space) else None)
        self.obs = self._obs_array()  # the current observation of each slot, in the obs field's dtype
        # buffered records (their slots; steps and resets are worked out at the flush) and the
        # (slot, step) where episodes started since the last flush; the episodes ended since the last commit
        self._buf: dict[str, list[np.ndarray]] = {}
        self._starts: list[tuple[np.ndarray, np.ndarray]] = []
        self._buffered = 0
        self._uncommitted = 0
        self._ended: dict[str, list[Any]] = {k: [] for k in EPISODE_KEYS}
        self.closed = False
        if isinstance(target, Store):
            self._attach(target, owns=False)
        elif schema is not None:
            self._attach(open_store(os.fspath(target), schema, mode="a", capacity=capacity,
                                    storage_options=storage_options), owns=True)
        else:
            try:
                existing = open_store(os.fspath(target), mode="r", storage_options=storage_options)
            except StoreNotFoundError:
                existing = None
            if existing is not None:
                existing.close()
                self._attach(open_store(os.fspath(target), mode="a", capacity=capacity,
                                        storage_options=storage_options), owns=True)
            elif all(spec is not None for spec in self.info_keys.values()):
                self._create({k: v for k, v in self.info_keys.items() if v is not None})
            # else: created at the first recorded step, when the info values' dtypes are known

    # -- the store ----------------------------------------------------------------------
    def _create(self, info: Mapping[str, InfoSpec]) -> None:
        schema = schema_from_spaces(self.observation_space, self.action_space, name=self.name, env=self.env,
                                    info=info)
        if self._fs:
            schema = self._frames_schema(schema)
        self._attach(open_store(os.fspath(self._target), schema, mode="a", capacity=self._capacity,  # type: ignore[arg-type]
                                storage_options=self._storage_options), owns=True)

    def _frames_schema(self, steps: Schema) -> Schema:
        """The ``frames`` layout of ``steps``: each ``obs``/``next_obs`` leaf becomes one frame field (zstd)."""
        frames = [Dense(frame_field(sfx), steps.field(f"obs{sfx}").dtype, fs.frame_shape,  # type: ignore[union-attr]
                        codec=DEFAULT_CODEC, description=f"the newest frame of observation s_t{sfx} (the final "
                        "one on the frame-only record closing an episode)") for sfx, fs in self._fs.items()]
        whole = {f"{base}{sfx}" for sfx in self._fs for base in ("obs", "next_obs")}
        fields = frames + [f for f in steps.fields if f.name not in whole]
        meta = dict(steps.metadata)
        first = next(iter(self._fs.values()))
        meta.update(frame_stack=first.stack, frame_padding=first.padding)
        return Schema(steps.name, fields, metadata=meta)

    def _attach(self, store: Store, *, owns: bool) -> None:
        """Check ``store``'s schema against the spaces and open a writer."""
        try:
            schema = store.schema
        except StoreError as exc:  # several tables
            raise SchemaMismatchError(f"{store.url}: recording needs a store with one table ({exc})") from None
        try:
            self._check_schema(store.url, schema)
        except SchemaMismatchError:
            if owns:
                store.close()
            raise
        self.store, self.schema, self._owns_store = store, schema, owns
        self.writer = store.writer()
        keys = self._given_streams or [f"w{self.writer.id}-{slot}" for slot in range(self.slots)]
        self.stream_keys = keys
        if all(isinstance(k, str) for k in keys) or all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
            self._keys = np.array(keys)  # coded by the writer without a Python object per record
        else:
            self._keys = np.array(keys, dtype=object)
        if self._given_streams is not None:  # continue streams already stored
            stored = set(store.streams())
            for slot, key in enumerate(keys):
                if key in stored:
                    _, steps = store.rows(key)
                    if len(steps):
                        self.step[slot] = max(int(self.step[slot]), int(steps.max()) + 1)
        self._fields = {f.name: f for f in schema.dense_fields}
        for sfx, fs in self._fs.items():  # (the whole stacks, cast and checked before their newest frame is kept)
            whole = Dense(f"obs{sfx}", self._fields[frame_field(sfx)].dtype, fs.obs_shape)
            self._fields[f"obs{sfx}"] = whole
            self._fields[f"next_obs{sfx}"] = dataclasses.replace(whole, name=f"next_obs{sfx}")
        if self._leaves is not None:
            if any(a.dtype != self._fields[f"obs{sfx}"].dtype for sfx, a in self.obs.arrays.items()):
                self.obs = self._obs_array()
        elif self.obs.dtype != self._fields["obs"].dtype:  # (an existing store, attached before any step)
            self.obs = self._obs_array()
        record_bytes = sum(f.dtype.itemsize * math.prod(f.shape) for f in schema.dense_fields) + 17
        self._append_rows = max(1, min(self.commit_every, APPEND_BYTES // record_bytes))

    def _obs_array(self) -> Any:
        if self._leaves is not None:
            return Leaves({sfx: np.zeros((self.slots, *self._fields[f"obs{sfx}"].shape),
                                         dtype=self._fields[f"obs{sfx}"].dtype) for sfx, _ in self._leaves})
        f = self._fields["obs"]
        return np.zeros((self.slots, *f.shape), dtype=f.dtype)

    def _check_schema(self, url: str, schema: Schema) -> None:
        want = {"obs": _space_shape(self.observation_space), "next_obs": _space_shape(self.observation_space),
                "action": _space_shape(self.action_space), "reward": (), "terminated": (), "truncated": ()}
        names: list[str] = list(STEP_FIELDS)
        if is_nested(self.observation_space):  # one column per leaf
            del want["obs"], want["next_obs"]
            names = [n for n in names if n not in ("obs", "next_obs")]
            for sfx, _, sub in leaves(self.observation_space):
                for base in ("obs", "next_obs"):
                    want[f"{base}{sfx}"] = leaf_layout(sub)[1]
                    names.append(f"{base}{sfx}")
        if self._fs:
            whole = {f"{base}{sfx}" for sfx in self._fs for base in ("obs", "next_obs")}
            for name in whole:
                want.pop(name, None)
            want.update({frame_field(sfx): fs.frame_shape for sfx, fs in self._fs.items()})
            names = [*(frame_field(sfx) for sfx in self._fs), *(n for n in names if n not in whole)]
        for key in self.info_keys:
            names += info_columns(key)
        problems = []
        if self._fs:
            meta = schema.metadata
            first = next(iter(self._fs.values()))
            if (meta.get("frame_stack"), meta.get("frame_padding")) != (first.stack, first.padding):
                problems.append(f"frames stacked {meta.get('frame_stack')!r} with padding "
                                f"{meta.get('frame_padding')!r}, expected {first.stack} with "
                                f"{first.padding!r} (frame_stack=, frame_padding=)")
        got = {f.name for f in schema.fields if f.kind != "meta"}
        if got != set(names):
            problems.append(f"fields {sorted(got)}, expected {sorted(names)}")
        for fname, shape in want.items():
            f = schema.field(fname) if fname in schema else None
            if isinstance(f, Dense) and f.shape != shape:
                problems.append(f"{fname!r} shape {f.shape}, expected {shape}")
        for fname in ("terminated", "truncated", *(info_columns(k)[1] for k in self.info_keys)):
            f = schema.field(fname) if fname in schema else None
            dtype = None if f is None else getattr(f, "dtype", "none (batch metadata)")
            if dtype is not None and dtype != np.bool_:
                problems.append(f"{fname!r} dtype {dtype}, expected bool")
        if problems:
            raise SchemaMismatchError(f"{url}: the store's schema {schema.name!r} cannot hold these steps: "
                                      + "; ".join(problems))

    # -- casts --------------------------------------------------------------------------
    def _rows(self, name: str, value: Any, mask: np.ndarray | slice) -> np.ndarray:
        arr = as_array(name, value)
        if arr.shape[:1] != (self.slots,):
            raise ShapeError(name, f"a leading axis of {self.slots} (one value per environment)",
                             f"shape {arr.shape}")
        return arr[mask]

    def _field(self, name: str, value: Any, mask: np.ndarray | slice, column: str | None = None) -> np.ndarray:
        f = self._fields[column or name]
        if type(value) is np.ndarray and value.dtype == f.dtype and value.shape == (self.slots, *f.shape):
            # the common case (values already as the field holds them): a copy and, for finite floats, a check
            rows = value[mask] if type(mask) is not slice else value.copy()
            # (a finite sum means every value is finite: one reduction; else the exact check below)
            if not (f.finite and f.dtype.kind == "f") or math.isfinite(_sum(rows, axis=None)):
                return rows
        rows = self._rows(name, value, mask)
        return cast(name, rows, f.dtype, (len(rows), *f.shape), finite=bool(f.finite))

    def _obs_field(self, name: str, value: Any, mask: np.ndarray | slice) -> Any:
        """Observations ``value`` of every slot cast to field ``name`` (per leaf for a Dict/Tuple space).

        An integer leaf (Discrete, MultiDiscrete, MultiBinary) outside its space is an IdRangeError
        naming the leaf's column (``obs``, ``next_obs__pos``).
        """
        if self._leaves is None:
            out = self._field(name, value, mask)
            b = self._obs_bounds.get("")
            if b is not None:
                _check_in(name, out, b)
            return out
        arrays = {}
        for sfx, path in self._leaves:
            column = f"{name}{sfx}"
            arrays[sfx] = leaf = self._field(column, pick(value, path, name), mask)
            b = self._obs_bounds.get(sfx)
            if b is not None:
                _check_in(column, leaf, b)
        return Leaves(arrays)

    def check_action(self, action: Any) -> np.ndarray:
        """The actions of every slot cast to the action field, or a typed error naming ``action``.

        Raises UnsafeCastError, ShapeError, IdRangeError (outside a Discrete, MultiDiscrete or
        MultiBinary space), NonFiniteError. Call it before stepping the environment.
        """
        f = self._fields["action"]
        out = cast("action", action, f.dtype, (self.slots, *f.shape), finite=bool(f.finite))
        if self._bounds is not None:
            _check_in("action", out, self._bounds)
        return out

    # -- episodes -----------------------------------------------------------------------
    def begin(self, mask: np.ndarray, obs: Any, seeds: Sequence[int | None]) -> None:
        """Slots in ``mask`` start an episode at observation ``obs`` (every slot's, ``[slots, ...]``).

        Any episode those slots were in is abandoned first. Raises the cast errors of ``obs``
        (the slots then record nothing until their next episode).
        """
        mask = np.asarray(mask, dtype=bool)
        self.abandon(mask)
        if not mask.any():
            return
        for slot in np.flatnonzero(mask).tolist():
            seed = seeds[slot]
            self.ep_seed[slot] = None if seed is None else int(seed)
        values = self._obs_field("obs", obs, mask)
        for sfx, fs in self._fs.items():
            bad = ~fs.starts(_leaf(values, sfx))
            if bad.any():
                raise fs.refuse("starts an episode without its padding", np.flatnonzero(mask)[bad])
        self.obs[mask] = values
        self.in_episode[mask] = True
        self._all_in = bool(self.in_episode.all())
        self._start(mask)

    def _start(self, mask: np.ndarray) -> None:
        self.ep_first[mask] = self.step[mask]
        self.ep_return[mask] = 0.0
        self._starts.append((self._all_slots[mask], self.step[mask]))  # (their next records are resets)

    def abandon(self, mask: np.ndarray) -> None:
        """Slots in ``mask`` leave their episode unfinished (reset mid-episode, a failed step, close)."""
        mask = np.asarray(mask, dtype=bool) & self.in_episode
        if mask.any():
            self._end(mask, np.zeros(self.slots, bool), np.zeros(self.slots, bool))
            if self._fs and self.schema is not None:  # the last transition's next frame (not one of its steps)
                slots = np.flatnonzero(mask & (self.step > self.ep_first))
                self._close_frames(slots, self._newest(self.obs[slots]))

    def _end(self, mask: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        for slot in np.flatnonzero(mask):
            length = int(self.step[slot] - self.ep_first[slot])  # (a step per record stored)
            if length > 0:  # an episode without a step stored nothing
                ret = float(self.ep_return[slot])
                for key, value in zip(EPISODE_KEYS, (
                        self.stream_keys[slot], int(self.ep_first[slot]), length,
                        ret if math.isfinite(ret) else None, self.ep_seed[slot], bool(terminated[slot]),
                        bool(truncated[slot])), strict=True):
                    self._ended[key].append(value)
        self.in_episode[mask] = False
        self._all_in = False

    # -- transitions --------------------------------------------------------------------
    def record(self, mask: np.ndarray, action: np.ndarray, next_obs: Any, reward: Any, terminated: Any,
               truncated: Any, infos: InfoValues) -> None:
        """Slots in ``mask`` (:data:`ALL`: every slot; only those in an episode record) store one transition each.

        ``action`` comes from :meth:`check_action`; the other values hold every slot
        (``[slots, ...]``). Everything is cast before anything is buffered; on a typed error
        nothing of the step is kept and the masked slots leave their episodes (their next
        records start a new episode). Slots whose transition ends the episode leave it.
        Cost: a cast per field; an append every few thousand records, a commit every
        ``commit_every``.
        """
        if mask is ALL and self._all_in:  # every slot records (the common step): no mask work
            sel: np.ndarray | slice = slice(None)
            mask = self.in_episode
        else:
            mask = self.in_episode.copy() if mask is ALL else np.asarray(mask, dtype=bool) & self.in_episode
            count = np.count_nonzero(mask)
            if not count:
                return
            sel = slice(None) if count == self.slots else mask  # (a view, not a copy, when all)
        try:
            if self.schema is None:
                self._create_from(infos, mask)
            cols = self._cast_step(sel, action, next_obs, reward, terminated, truncated, infos)
            for sfx, fs in self._fs.items():
                bad = ~fs.slides(_leaf(cols["obs"], sfx), _leaf(cols["next_obs"], sfx))
                if bad.any():
                    raise fs.refuse("and the next one are not one frame apart", np.flatnonzero(mask)[bad])
        except BaseException:
            self.abandon(mask)
            raise
        self._buffer(sel, cols)
        self.step[sel] += 1
        self.ep_return[sel] += cols["reward"]
        done = cols["terminated"] | cols["truncated"]
        if not _any(done, axis=None):
            self.obs[sel] = cols["next_obs"]
        else:  # (a few steps in an episode's length: the per-slot work here is rare)
            slots = self._all_slots[sel]
            self.obs[slots[~done]] = cols["next_obs"][~done]
            ended = np.zeros(self.slots, dtype=bool)
            ended[slots[done]] = True
            term = np.zeros(self.slots, dtype=bool)
            trunc = np.zeros(self.slots, dtype=bool)
            term[slots] = cols["terminated"]
            trunc[slots] = cols["truncated"]
            self._end(ended, term, trunc)
            if self._fs:  # an episode's final frame: a record of its own (after _end: not one of its steps)
                self._close_frames(slots[done], self._newest(cols["next_obs"][done]))
        if self._buffered >= self._append_rows:
            self.flush()
        if self._uncommitted >= self.commit_every:
            self.commit()

    def _create_from(self, infos: InfoValues, mask: np.ndarray) -> None:
        """Create the store once the first recorded step shows each info key's dtype and shape."""
        info: dict[str, InfoSpec] = {}
        for key, spec in self.info_keys.items():
            if spec is not None:
                info[key] = spec
                continue
            values, present = infos.get(key, (None, np.zeros(self.slots, bool)))
            have = np.asarray(present, bool) & mask
            if values is None or not have.any():
                raise RecordingError(f"info key {key!r}: absent from the first recorded step, so its dtype is "
                                     f"unknown; give it: info_keys={{{key!r}: dtype or (dtype, shape)}}")
            first = as_array(f"info[{key!r}]", values)[np.flatnonzero(have)[0]]
            info[key] = (first.dtype, first.shape)
        self._create(info)

    def _cast_step(self, mask: np.ndarray | slice, action: np.ndarray, next_obs: Any, reward: Any, terminated: Any,
                   truncated: Any, infos: InfoValues) -> dict[str, Any]:
        cols = {
            "obs": self.obs[mask].copy() if isinstance(mask, slice) else self.obs[mask],  # (not a view)
            "action": action[mask],
            "reward": self._field("reward", reward, mask),
            "next_obs": self._obs_field("next_obs", next_obs, mask),
            "terminated": self._field("terminated", terminated, mask),
            "truncated": self._field("truncated", truncated, mask),
        }
        for key in self.info_keys:
            value_col, valid_col = info_columns(key)
            f = self._fields[value_col]
            values, present = infos.get(key, (None, np.zeros(self.slots, bool)))
            have = np.asarray(present, dtype=bool)[mask]
            if values is None:
                cols[value_col] = np.zeros((len(have), *f.shape), dtype=f.dtype)
            else:
                rows = self._rows(value_col, values, mask)
                rows = np.where(have.reshape(-1, *([1] * (rows.ndim - 1))), rows, np.zeros((), rows.dtype))
                cols[value_col] = cast(value_col, rows, f.dtype, (len(rows), *f.shape))
            cols[valid_col] = have
        return cols

    def _buffer(self, mask: np.ndarray | slice, cols: dict[str, Any]) -> None:
        if self._fs:  # the frames layout: the newest frame of obs; next_obs is the next record's
            cols = {**self._newest(cols["obs"]), **{k: v for k, v in cols.items() if k not in ("obs", "next_obs")}}
        buf = self._buf
        if not buf:
            for name, values in cols.items():
                for column in ([f"{name}{sfx}" for sfx in values.arrays] if isinstance(values, Leaves) else [name]):
                    buf[column] = []
            buf["_slot"] = []
        for name, values in cols.items():
            if isinstance(values, Leaves):
                for sfx, leaf in values.arrays.items():
                    buf[f"{name}{sfx}"].append(leaf)
            else:
                buf[name].append(values)
        slots = self._all_slots if type(mask) is slice else self._all_slots[mask]  # (never written to)
        buf["_slot"].append(slots)
        n = len(slots)
        self._buffered += n
        self._uncommitted += n

    def _newest(self, obs: Any) -> dict[str, np.ndarray]:
        """Per frame field, the newest frame of each of the stacked observations ``obs`` (``[n, ...]``)."""
        return {frame_field(sfx): fs.newest(_leaf(obs, sfx)) for sfx, fs in self._fs.items()}

    def _close_frames(self, slots: np.ndarray, frames: dict[str, np.ndarray]) -> None:
        """Buffer the frame-only records closing the episodes of ``slots``: their final frames, at their next step."""
        m = len(slots)
        if not m:
            return
        assert self.schema is not None
        for f in self.schema.dense_fields:
            self._buf.setdefault(f.name, []).append(frames[f.name] if f.name in frames
                                                    else np.zeros((m, *f.shape), dtype=f.dtype))
        self._buf.setdefault("_slot", []).append(slots)
        self.step[slots] += 1  # (a record of its own: its step is the slot's next; never a reset)
        self._buffered += m
        self._uncommitted += m

    # -- appends and commits ------------------------------------------------------------
    @property
    def buffered(self) -> int:
        """Records recorded and not yet appended to the writer."""
        return self._buffered

    @property
    def uncommitted(self) -> int:
        """Records recorded and not yet committed."""
        return self._uncommitted

    def flush(self) -> None:
        """Append the buffered records to the writer (still uncommitted).

        Cost: one concatenation per field and one ``Writer.append``.
        """
        if not self._buffered:
            return
        assert self.writer is not None
        arrays = {name: np.concatenate(parts) for name, parts in self._buf.items()}
        slot = arrays.pop("_slot")
        step, reset = self._steps_of(slot)
        self.writer.append(arrays, stream=self._keys[slot], step=step, reset=reset)
        self._buf.clear()
        self._buffered = 0

    def _steps_of(self, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step and reset flag of each buffered record, whose slots are ``slot`` (in the order stored).

        A slot's step grows by one per record it stores and by nothing else, so its buffered
        records hold the steps just below its current one, in order; a record is a reset where
        an episode started at its step. The starts whose first record is still to come are
        kept. Cost: O(records) vectorised, once per flush.
        """
        order = np.argsort(slot, kind="stable")  # each slot's records together, in the order stored
        counts = np.bincount(slot, minlength=self.slots)
        starts = np.cumsum(counts) - counts  # where each slot's records begin in ``order``
        base = self.step - counts  # each slot's first buffered step
        step = np.empty(len(slot), dtype=np.int64)
        step[order] = np.arange(len(slot)) - np.repeat(starts, counts) + np.repeat(base, counts)
        reset = np.zeros(len(slot), dtype=bool)
        if self._starts:
            s_slot = np.concatenate([s for s, _ in self._starts])
            s_step = np.concatenate([t for _, t in self._starts])
            here = (s_step >= base[s_slot]) & (s_step < self.step[s_slot])  # its first record is buffered
            reset[order[starts[s_slot[here]] + (s_step[here] - base[s_slot[here]])]] = True
            waiting = s_step >= self.step[s_slot]  # no record of that episode yet
            self._starts = [(s_slot[waiting], s_step[waiting])] if waiting.any() else []
        return step, reset

    def commit(self) -> None:
        """Append what is buffered and commit, with the episodes ended since the last commit.

        The ended episodes go in the commit's metadata (``{"episodes": {column: [values]}}``).
        Cost: one commit.
        """
        if self.writer is None:
            return
        self.flush()
        ended = self._ended if self._ended["stream"] else None
        if ended is None and not self._uncommitted:
            return
        self.writer.commit(metadata={"episodes": ended} if ended is not None else None)
        self._ended = {k: [] for k in EPISODE_KEYS}
        self._uncommitted = 0

    def close(self) -> None:
        """Abandon open episodes (their records are kept), commit, and close.

        Closes the writer and, if this recorder opened the store, the store. Idempotent.
        """
        if self.closed:
            return
        self.closed = True
        try:
            self.abandon(np.ones(self.slots, dtype=bool))
            self.commit()
        finally:
            if self.writer is not None:
                self.writer.close()
            if self._owns_store and self.store is not None:
                self.store.close()


def _check_in(name: str, values: np.ndarray, b: SpaceBounds) -> None:
    """IdRangeError naming ``name`` unless every value lies in ``[b.low, b.high)``."""
    if isinstance(b.low, int) and isinstance(b.high, int):  # scalar bounds: two reductions, no temporaries
        if values.size and (int(_min(values, axis=None)) < b.low or int(_max(values, axis=None)) >= b.high):
            check_bounds(name, values, b.low, b.high)  # raises IdRangeError naming the values
    else:
        check_bounds(name, values, b.low, b.high)


def _leaf(values: Any, sfx: str) -> np.ndarray:
    """Leaf ``sfx`` of observations held as an array (a Box space) or as :class:`Leaves`."""
    return values.arrays[sfx] if isinstance(values, Leaves) else values


def _space_shape(space: Any) -> tuple[int, ...]:
    shape = getattr(space, "shape", None)
    return tuple(int(d) for d in shape) if shape else ()
