"""What the episode formats (Minari, D4RL) share.

The field mapping, bounded per-stream reading, episode assembly, ragged-id masks, progress bars.

Reading is per stream, in step order, ``chunk`` records at a time (``Table.read`` of that
stream's row ids), so memory holds one chunk plus — for Minari — the episode being built, never
a whole table. See docs/EXPORT.md for the mapping each format uses.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.errors import ImportSourceError, StoreError, StoreExistsError
from replaystore.schemas import Dense, Ragged, Schema, dense_mask, map_tree
from replaystore.store import Table
from replaystore.tools.progress import progress_bar as progress_bar  # (re-exported: the formats import it)

TARGET_CHUNK_BYTES = 16 << 20
"""Records per read are chosen so that one chunk of a table holds about this many bytes."""
MIN_CHUNK_ROWS = 256
MAX_CHUNK_ROWS = 65536
RESERVED_INFOS = ("stream", "step", "reset", "cut")
"""Names D4RL export puts under ``infos/`` for the stream index (fields may not use them)."""
FRAME_FIELD = "frame"
"""The frame field of a ``frames`` store (``replaystore.schemas.frames``): exported as observations."""


def expand_local(path: Any) -> Any:
    """``path`` with a leading ``~`` expanded when it is a local path (or ``file://`` URL).

    Other URLs (``s3://``, ``memory://``) and non-path values are returned as they are.

    Parameters
    ----------
    path : object
        A path or URL given by the user (never a name read from a store).

    Returns
    -------
    object
        The expanded path (a str) or ``path`` itself.
    """
    if not isinstance(path, (str, os.PathLike)):
        return path
    text = os.fspath(path)
    if not isinstance(text, str):
        return path
    if text.startswith("file://"):
        return "file://" + os.path.expanduser(text[len("file://"):])
    return os.path.expanduser(text) if "://" not in text else text


def record_bytes(schema: Schema) -> int:
    """An estimate of one record's size in memory (ragged fields: a few values each).

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    int
        Bytes, at least 1.
    """
    total = 0
    for f in schema.fields:
        if isinstance(f, Dense):
            total += f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
        elif isinstance(f, Ragged):
            total += 8 + f.dtype.itemsize * int(schema.metadata.get("actions") or f.id_bound or 8)
    return max(total, 1)


def chunk_rows(schema: Schema, batch_rows: int | None = None) -> int:
    """Records per read: ``batch_rows`` if given, else about TARGET_CHUNK_BYTES worth.

    Parameters
    ----------
    schema : Schema
        The table's schema.
    batch_rows : int, optional
        An explicit count.

    Returns
    -------
    int
        Records per read (between MIN_CHUNK_ROWS and MAX_CHUNK_ROWS unless given).

    Raises
    ------
    StoreError
        ``batch_rows`` is not a positive int.
    """
    if batch_rows is not None:
        if not isinstance(batch_rows, int) or batch_rows <= 0:
            raise StoreError(f"batch_rows: expected a positive int, got {batch_rows!r}")
        return batch_rows
    return int(np.clip(TARGET_CHUNK_BYTES // record_bytes(schema), MIN_CHUNK_ROWS, MAX_CHUNK_ROWS))


def pick_table(store: Any, table: str | None) -> Table:
    """The table an episode format exports: the one named, or the store's only one.

    Parameters
    ----------
    store : Store
        The opened store.
    table : str, optional
        The table's name.

    Returns
    -------
    Table
        The table.

    Raises
    ------
    StoreError
        No table was named and the store has several (or an unknown table).
    """
    if table is not None:
        return store.table(table)
    if len(store.tables) != 1:
        raise StoreError(f"this store has tables {sorted(store.tables)}: choose one with table=NAME (--table)")
    return store.default


def require_h5py() -> Any:
    """Import h5py, or say how to install it.

    Returns
    -------
    module
        The ``h5py`` module.

    Raises
    ------
    StoreError
        h5py is not installed (``pip install 'replaystore[export]'``).
    """
    try:
        import h5py
    except ImportError:
        raise StoreError("HDF5 export/import needs h5py: pip install 'replaystore[export]'") from None
    return h5py


def mask_name(name: str) -> str:
    """Where a ragged id field goes as a mask: ``legal_ids`` -> ``legal_mask``.

    Parameters
    ----------
    name : str
        The ragged field's name.

    Returns
    -------
    str
        The mask's name.
    """
    return name.removesuffix("_ids") + "_mask"


def action_count(schema: Schema, name: str) -> int | None:
    """The declared action count for an id field: its ``id_bound`` or the schema's ``actions``.

    Parameters
    ----------
    schema : Schema
        The table's schema.
    name : str
        The field's name.

    Returns
    -------
    int or None
        The count, or None when neither is declared.

    Raises
    ------
    SchemaError
        The schema has no field ``name``.
    """
    f = schema.field(name)
    bound = getattr(f, "id_bound", None)
    if bound:
        return int(bound)
    actions = schema.metadata.get("actions")
    return int(actions) if isinstance(actions, int) and not isinstance(actions, bool) and actions > 0 else None


# -- the step mapping ----------------------------------------------------------------------


@dataclass
class StepMapping:
    """Which fields of a schema are the observation, action, reward and episode-end flags.

    * schemas with ``terminated`` (transitions, episode, rollout): terminations =
      ``terminated``, truncations = ``truncated`` (when the schema has it), an
      episode ends at either;
    * schemas with ``dones`` (dqn): an episode ends at ``dones``; terminations =
      ``dones & ~can_bootstrap``, truncations = ``dones & can_bootstrap``.

    Every other per-record field is an *extra* (Minari ``infos``, D4RL
    ``infos/*``); ragged integer id fields become boolean masks of width
    ``actions`` (see :class:`Extra`). Build one with :func:`step_mapping`.

    Attributes
    ----------
    schema : Schema
        The table's schema.
    obs, next_obs, action, reward : str
        The main fields' names.
    terminated, truncated, dones, can_bootstrap : str or None
        The flag fields' names, where the schema has them.
    extras : list of Extra
        The other per-record fields.
    frames : bool
        The ``frames`` layout (one frame per record, an episode's final frame on a
        frame-only record closing it): ``obs`` and ``next_obs`` are both the frame
        field, and an episode's T steps are its first T of T + 1 records
        (:func:`frame_steps`).
    """

    schema: Schema
    obs: str
    next_obs: str
    action: str
    reward: str
    terminated: str | None = None
    truncated: str | None = None
    dones: str | None = None
    can_bootstrap: str | None = None
    extras: list[Extra] = field(default_factory=list)
    frames: bool = False

    @property
    def main(self) -> set[str]:
        """The names of the main fields (observation, action, reward, flags)."""
        names = {self.obs, self.action, self.reward, self.terminated, self.truncated}
        return {n for n in names if n}

    @property
    def episodic(self) -> bool:
        """Whether ``next_obs[t] == obs[t + 1]`` inside an episode is expected (episode/rollout)."""
        return self.truncated is not None

    def flags(self, data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(terminations, truncations, episode ends)`` of a chunk of records.

        Parameters
        ----------
        data : dict of str to numpy.ndarray
            The chunk, as :func:`convert` returns it.

        Returns
        -------
        terminations, truncations, ends : numpy.ndarray
            Bool per record.
        """
        if self.terminated is not None:
            term = data[self.terminated].astype(bool)
            trunc = data[self.truncated].astype(bool) if self.truncated else np.zeros(len(term), bool)
            return term, trunc, term | trunc
        assert self.dones is not None
        dones = data[self.dones].astype(bool)
        boot = data[self.can_bootstrap].astype(bool) if self.can_bootstrap else np.zeros(len(dones), bool)
        return dones & ~boot, dones & boot, dones


@dataclass
class Extra:
    """A per-record field exported beside the main ones.

    Attributes
    ----------
    name : str
        The schema field.
    key : str
        The exported name.
    kind : str
        ``"dense"`` or ``"mask"``.
    width : int, optional
        Mask width (the action count), for masks.
    offsets : str, optional
        The ragged field's offsets name, for masks.
    """

    name: str
    key: str
    kind: str
    width: int | None = None
    offsets: str | None = None


def _first(schema: Schema, *names: str) -> str | None:
    nodes = schema.nesting.nodes if schema.nesting is not None else {}
    return next((n for n in names if (n in schema and isinstance(schema.field(n), Dense)) or n in nodes), None)


def step_mapping(schema: Schema, fmt: str) -> StepMapping:
    """The mapping of ``schema`` for format ``fmt``.

    Ragged fields that cannot become a mask (not integer ids, or no declared
    action count) are left out with a warning.

    Parameters
    ----------
    schema : Schema
        The table's schema.
    fmt : str
        The format's name, for messages (``"Minari"``, ``"D4RL"``).

    Returns
    -------
    StepMapping
        The mapping.

    Raises
    ------
    StoreError
        The schema lacks obs, next_obs, action(s), reward(s) or terminated/dones,
        or a field clashes with the exported stream index names.
    """
    obs, next_obs = _first(schema, "obs"), _first(schema, "next_obs")
    framed = obs is None and next_obs is None and _first(schema, FRAME_FIELD) is not None
    if framed:  # the frames layout: the observations are the frame field's records
        obs = next_obs = FRAME_FIELD
    action, reward = _first(schema, "action", "actions"), _first(schema, "reward", "rewards")
    term, dones = _first(schema, "terminated"), _first(schema, "dones")
    missing = [what for what, got in (("obs", obs), ("next_obs", next_obs), ("action/actions", action),
                                      ("reward/rewards", reward), ("terminated/dones", term or dones))
               if got is None]
    if missing:
        raise StoreError(f"{fmt} export needs step records with obs, next_obs, action(s), reward(s) and "
                         f"terminated or dones (or frame records: frame, action, reward, terminated); "
                         f"schema {schema.name!r} lacks {', '.join(missing)}")
    assert obs and next_obs and action and reward
    m = StepMapping(schema, obs, next_obs, action, reward, frames=framed)
    if term:
        m.terminated, m.truncated = term, _first(schema, "truncated")
    else:
        m.dones, m.can_bootstrap = dones, _first(schema, "can_bootstrap")
    main = m.main
    nesting = schema.nesting
    for f in schema.fields:
        if f.name in main or f.name == next_obs:
            continue
        if nesting is not None and nesting.root_of.get(f.name) in (obs, next_obs):
            continue  # a leaf of a nested observation
        if f.name in RESERVED_INFOS:
            raise StoreError(f"{fmt} export: field {f.name!r} clashes with the exported stream index "
                             f"(infos/{f.name})")
        if isinstance(f, Dense):
            m.extras.append(Extra(f.name, f.name, "dense"))
        elif isinstance(f, Ragged):
            width = action_count(schema, f.name) if f.dtype.kind in "iu" else None
            if width is None:
                why = ("the action count is unknown (give the schema metadata 'actions' or the field an "
                       "id_bound)" if f.dtype.kind in "iu" else "it is not an integer id list")
                warnings.warn(f"{fmt} export: ragged field {f.name!r} left out: {fmt} holds fixed-size "
                              f"per-step data only and {why}", stacklevel=3)
                continue
            m.extras.append(Extra(f.name, mask_name(f.name), "mask", width, f.offsets))
    return m


def convert(m: StepMapping, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A chunk as read (dense arrays, CSR values + offsets) -> one array per exported name.

    All arrays are shaped ``(records, ...)``: main fields under their own names,
    extras under their keys (ragged ids as dense bool masks).

    Parameters
    ----------
    m : StepMapping
        The mapping.
    raw : dict of str to numpy.ndarray
        The chunk as ``Table.read`` returns it.

    Returns
    -------
    dict of str to numpy.ndarray
        Exported name to array.

    Raises
    ------
    StoreError
        A ragged id lies outside ``[0, width)`` of its mask.
    """
    out = {n: raw[n] for n in (m.obs, m.next_obs, m.action, m.reward, m.terminated, m.truncated, m.dones,
                                m.can_bootstrap) if n}
    for e in m.extras:
        if e.kind == "dense":
            out[e.key] = raw[e.name]
            continue
        ids, offsets = raw[e.name], raw[e.offsets]  # type: ignore[index]
        if len(ids) and (ids.min() < 0 or ids.max() >= e.width):
            bad = ids[(ids < 0) | (ids >= e.width)][0]
            raise StoreError(f"field {e.name!r}: id {int(bad)} outside [0, {e.width}) cannot go into a mask")
        out[e.key] = dense_mask(ids, offsets, int(e.width))  # type: ignore[arg-type]
    return out


# -- reading streams ---------------------------------------------------------------------------


@dataclass
class Chunk:
    """Consecutive records of one stream, in step order, with their episode flags.

    Attributes
    ----------
    stream : Any
        The stream key.
    steps, resets : numpy.ndarray
        Per record: its step and whether it is a reset.
    data : dict of str to numpy.ndarray
        The records, as :func:`convert` returns them.
    term, trunc : numpy.ndarray
        Per record: terminated, and truncated (including the *cut* episodes:
        closed without an end flag).
    close : numpy.ndarray
        ``close[i]``: record i is the last of its episode (an end flag, or the
        next record starts a new episode at a reset or step gap, or the stream
        ends).
    """

    stream: Any
    steps: np.ndarray
    resets: np.ndarray
    data: dict[str, np.ndarray]
    term: np.ndarray
    trunc: np.ndarray
    close: np.ndarray

    def __len__(self) -> int:
        """The number of records."""
        return len(self.steps)


def stream_index(table: Table, stream: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, steps, resets)`` of a stream in step order, from the in-memory index (no data read).

    Parameters
    ----------
    table : Table
        The table.
    stream : Any
        A stream key of the table.

    Returns
    -------
    rows, steps, resets : numpy.ndarray
        Per record of the stream, in step order.
    """
    idx = table.stream_index()
    lo, hi = idx.span(stream)
    return idx.rows[lo:hi], idx.steps[lo:hi], idx.resets[lo:hi]


def iter_chunks(table: Table, m: StepMapping, rows_per_chunk: int) -> Iterator[Chunk]:
    """Every visible record, stream by stream (``table.streams()`` order), step order inside.

    Reads ``rows_per_chunk`` records at a time, so memory holds one chunk.

    Parameters
    ----------
    table : Table
        The table.
    m : StepMapping
        The mapping of its schema.
    rows_per_chunk : int
        Records per read.

    Yields
    ------
    Chunk
        Consecutive records of one stream. In the frames layout (``m.frames``) an
        episode closes only where the next record starts a new one (its flags are
        the records' own; see :func:`frame_steps`).

    Raises
    ------
    StoreError
        A ragged id lies outside its mask (see :func:`convert`).
    """
    table.view()
    for stream in table.streams():
        rows, steps, resets = stream_index(table, stream)
        n = len(rows)
        if not n:
            continue
        # a new episode starts at the first record, at a reset and after a step gap (retention)
        starts = np.ones(n, dtype=bool)
        starts[1:] = resets[1:] | (np.diff(steps) != 1)
        next_starts = np.r_[starts[1:], True]
        for lo in range(0, n, rows_per_chunk):
            hi = min(lo + rows_per_chunk, n)
            data = convert(m, table.read(rows[lo:hi]))
            term, trunc, end = m.flags(data)
            boundary = next_starts[lo:hi]
            if m.frames:  # an episode's records run to its frame-only record; frame_steps marks cuts
                yield Chunk(stream, steps[lo:hi], resets[lo:hi], data, term, trunc, boundary)
                continue
            trunc = trunc | (boundary & ~end)  # cut: the episode stops here without an end flag
            yield Chunk(stream, steps[lo:hi], resets[lo:hi], data, term, trunc, end | boundary)


@dataclass
class Episode:
    """One exported episode: T records of one stream (steps ``first_step ..``), flags per step.

    Attributes
    ----------
    stream : Any
        The stream key.
    first_step : int
        Step of the first record.
    data : dict of str to numpy.ndarray
        The records, by exported name.
    term, trunc : numpy.ndarray
        Per step: terminated and truncated.
    reset : bool
        Whether the first record is a reset (else the episode starts its stream or follows a step gap).
    """

    stream: Any
    first_step: int
    data: dict[str, np.ndarray]
    term: np.ndarray
    trunc: np.ndarray
    reset: bool = True

    def __len__(self) -> int:
        """The number of steps."""
        return len(self.term)


def iter_episodes(chunks: Iterator[Chunk]) -> Iterator[Episode]:
    """Assemble episodes from step-ordered chunks (an episode may span chunks, never streams).

    Parameters
    ----------
    chunks : iterator of Chunk
        As :func:`iter_chunks` yields them.

    Yields
    ------
    Episode
        Each episode, in order.
    """
    parts: list[tuple[Chunk, int, int]] = []
    for c in chunks:
        lo = 0
        for end in (np.flatnonzero(c.close) + 1).tolist():
            parts.append((c, lo, end))
            yield _episode(parts)
            parts = []
            lo = end
        if lo < len(c):
            parts.append((c, lo, len(c)))
    assert not parts, "the last chunk of every stream closes its episode"


def _episode(parts: list[tuple[Chunk, int, int]]) -> Episode:
    first, lo0, _ = parts[0]

    def cat(get: Any) -> np.ndarray:
        pieces = [map_tree(lambda a: a[lo:hi], get(c)) for c, lo, hi in parts]  # noqa: B023 - used at once
        return pieces[0] if len(pieces) == 1 else tree_concat(pieces)

    data = {k: cat(lambda c, k=k: c.data[k]) for k in first.data}
    return Episode(first.stream, int(first.steps[lo0]), data, cat(lambda c: c.term), cat(lambda c: c.trunc),
                   bool(first.resets[lo0]))


def stack_frames(frames: Any, k: int) -> Any:
    """Stacks of the ``k`` latest frames of one episode: ``out[t] = frames[t - k + 1 .. t]``.

    Slots before the episode's first frame repeat it, as gymnasium's
    ``FrameStackObservation(padding_type="reset")`` and the samplers' ``stack_padding="reset"``.

    Parameters
    ----------
    frames : numpy.ndarray
        One episode's frames, ``(N, *frame_shape)``.
    k : int
        Frames per stack.

    Returns
    -------
    numpy.ndarray
        ``(N, k, *frame_shape)``. Cost: one copy of ``k`` times the frames.
    """
    n = len(frames)
    idx = np.maximum(np.arange(n)[:, None] + np.arange(1 - k, 1)[None, :], 0)
    return frames[idx]


@dataclass
class FrameEpisode:
    """One episode of a frames store, as the episode formats export it.

    Attributes
    ----------
    stream : Any
        The stream key.
    first_step : int
        Step of the first record.
    frames : numpy.ndarray
        The T + 1 frames: the observation of each step, then the final one.
    steps : dict of str to numpy.ndarray
        The T step records' other fields (action, reward, extras), by exported name.
    extras : dict of str to numpy.ndarray
        The extras of all T + 1 records, by exported name.
    term, trunc : numpy.ndarray
        Per step: terminated and truncated (truncated includes the cut).
    cut : bool
        Whether the last step carried neither flag (the episode stops at a reset, a
        step gap or its stream's end without one); ``trunc[-1]`` is set for it.
    reset : bool
        Whether the first record is a reset.
    """

    stream: Any
    first_step: int
    frames: np.ndarray
    steps: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    term: np.ndarray
    trunc: np.ndarray
    cut: bool
    reset: bool = True

    def __len__(self) -> int:
        """The number of steps (T)."""
        return len(self.term)


def frame_steps(m: StepMapping, ep: Episode) -> FrameEpisode | None:
    """The steps of one frames-store episode of N records: T = N - 1 steps and N frames.

    Record t holds the frame seen at step t and the step taken on it; the last
    record holds the final frame only (its action, reward and flags are not a
    step). An episode of one record (a first frame, no step yet) has no steps.

    Parameters
    ----------
    m : StepMapping
        A frames mapping (``m.frames``).
    ep : Episode
        The episode's records, as :func:`iter_episodes` assembles them from
        :func:`iter_chunks` of the frames layout.

    Returns
    -------
    FrameEpisode or None
        The episode, or None when it has no step.
    """
    n = len(ep)
    if n < 2:
        return None
    t = n - 1
    term, trunc = ep.term[:t].astype(bool), ep.trunc[:t].astype(bool)
    cut = not (term[-1] or trunc[-1])
    if cut:
        trunc = trunc.copy()
        trunc[-1] = True
    steps = {k: ep.data[k][:t] for k in (m.action, m.reward)}
    extras = {e.key: ep.data[e.key] for e in m.extras}
    return FrameEpisode(ep.stream, ep.first_step, ep.data[m.obs], steps, extras, term, trunc, cut, ep.reset)


def frame_records(frames: np.ndarray, actions: np.ndarray, rewards: np.ndarray, term: np.ndarray,
                  trunc: np.ndarray, cut: bool) -> dict[str, np.ndarray]:
    """One episode's records of a frames store back from its T + 1 frames and T steps (import).

    The inverse of :func:`frame_steps`: record t holds frame t and step t's action,
    reward and flags; the last record holds the final frame with zero action and
    reward and false flags; a cut episode's last step gets its truncated flag
    cleared again.

    Parameters
    ----------
    frames : numpy.ndarray
        ``(T + 1, *frame_shape)``.
    actions, rewards, term, trunc : numpy.ndarray
        Per step (T rows).
    cut : bool
        Whether the export marked the last step truncated for a cut.

    Returns
    -------
    dict of str to numpy.ndarray
        ``frame``, ``action``, ``reward``, ``terminated``, ``truncated`` (T + 1 rows).
    """
    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((1, *a.shape[1:]), dtype=a.dtype)])

    trunc = np.asarray(trunc, dtype=bool).copy()
    if cut and len(trunc):
        trunc[-1] = False
    return {FRAME_FIELD: frames, "action": pad(np.asarray(actions)), "reward": pad(np.asarray(rewards)),
            "terminated": pad(np.asarray(term, dtype=bool)), "truncated": pad(trunc)}


def check_stack(stack: Any, m: StepMapping, fmt: str) -> int | None:
    """``stack`` checked: None, or a positive int for a frames store.

    Parameters
    ----------
    stack : Any
        The ``stack=`` the user gave.
    m : StepMapping
        The table's mapping.
    fmt : str
        The format's name, for messages.

    Returns
    -------
    int or None
        The stack size (None: one frame per observation).

    Raises
    ------
    StoreError
        ``stack`` is not a positive int, or the table is not a frames store.
    """
    if stack is None:
        return None
    if not isinstance(stack, (int, np.integer)) or isinstance(stack, bool) or stack < 1:
        raise StoreError(f"stack: expected a positive int (frames per stacked observation), got {stack!r}")
    if not m.frames:
        raise StoreError(f"{fmt} export: stack={stack} applies to frames stores (a {FRAME_FIELD!r} field, no "
                         f"obs/next_obs); schema {m.schema.name!r} stores its observations whole")
    return int(stack)


def stream_key_json(key: Any) -> Any:
    """A stream key as it goes into JSON/HDF5 attributes (int or str, type kept).

    Parameters
    ----------
    key : Any
        An int (numpy integers included) or str stream key.

    Returns
    -------
    int or str
        The key.
    """
    return int(key) if isinstance(key, (int, np.integer)) else str(key)


def tree_concat(parts: list[Any]) -> Any:
    """Leaf-wise ``np.concatenate`` of arrays, or of nested values (dicts/tuples) of one structure.

    Parameters
    ----------
    parts : list
        Arrays, or nested values of arrays.

    Returns
    -------
    Any
        The concatenation, in the same structure. Cost: one copy of the values.
    """
    first = parts[0]
    if isinstance(first, dict):
        return {k: tree_concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(tree_concat([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts)


# -- imports: a new destination, removed again if the import fails ------------------------------


class ImportDestination:
    """Where an import creates its store: refused unless new or empty, and left as it was if the import fails.

    Use it as a context manager around everything from the source's validation to the last
    commit; hand it the store once opened (:meth:`opened`). If the block raises, the store is
    closed and everything under the destination is removed (the directory too, for a local
    path that did not exist before), so a failed import leaves no half-made store.

    Parameters
    ----------
    url : str
        The new store's local path or URL.
    storage_options : mapping, optional
        The fsspec options of ``url``.

    Raises
    ------
    StoreExistsError
        Something (a store or any other object) is already at ``url``; nothing is touched.
    """

    def __init__(self, url: str, storage_options: Any = None) -> None:
        from replaystore.store.storage import open_storage

        self.url = url
        self.local = None if "://" in url and not url.startswith("file://") else url.removeprefix("file://")
        self.existed = self.local is not None and os.path.lexists(self.local)
        if self.local is not None and self.existed and (os.path.islink(self.local)
                                                         or not os.path.isdir(self.local)):
            raise self._refusal("a file (not a directory) is already there")
        if self.local is not None and self.existed and os.listdir(self.local):
            raise self._refusal(self._what_is_there(storage_options))
        self._storage = None if self.local is not None else open_storage(url, storage_options)
        if self._storage is not None and self._storage.list(""):
            raise self._refusal(self._what_is_there(storage_options))
        self.store: Any = None

    def _what_is_there(self, storage_options: Any) -> str:
        """What occupies the destination, in words: a store (its record count) or other files."""
        from replaystore.store import read_manifest
        from replaystore.store.storage import open_storage

        try:
            manifest = read_manifest(open_storage(self.url, storage_options))
        except Exception:  # noqa: BLE001 - unreadable: described as "not empty" below
            manifest = None
        return "a replaystore store is already there" if manifest is not None else "it is not empty"

    def _refusal(self, what: str) -> StoreExistsError:
        return StoreExistsError(f"{self.url}: {what}; an import creates a new store and never writes into or "
                                f"replaces an existing one: give a URL where nothing is (or an empty directory), "
                                f"or remove what is there first")

    def opened(self, store: Any) -> Any:
        """Remember ``store`` (closed before a failed import's cleanup); returns it.

        Parameters
        ----------
        store : Store
            The store the import created.

        Returns
        -------
        Store
            ``store``.
        """
        self.store = store
        return store

    def __enter__(self) -> ImportDestination:
        """Return self."""
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        """On an error: close the store and remove what the import made."""
        if kind is None:
            return
        if self.store is None and isinstance(exc, StoreExistsError):  # made by someone else since the check:
            raise self._refusal("a store was created there while this import ran") from None  # left alone
        if self.store is not None:
            try:
                self.store.close()
            except Exception:  # noqa: BLE001 - the import's own error is the one to report
                pass
        if self.local is not None:
            if not self.existed:
                shutil.rmtree(self.local, ignore_errors=True)
            elif os.path.isdir(self.local):
                for name in os.listdir(self.local):
                    path = os.path.join(self.local, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
        elif self._storage is not None:
            for name in self._storage.list(""):
                self._storage.delete(name)


class SourceErrors:
    """A context manager turning read errors of a source into ImportSourceError.

    pyarrow's, h5py's and the filesystem's errors while reading ``path`` become
    :class:`~replaystore.errors.ImportSourceError` naming it (a truncated or garbage file).

    Parameters
    ----------
    path : str
        The source file or directory read inside the block.
    what : str, optional
        What it should be, for the message.
    """

    def __init__(self, path: Any, what: str = "a readable file") -> None:
        self.path, self.what = str(path), what

    def __enter__(self) -> None:
        """Start reading."""
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        """Re-raise a read error as ImportSourceError."""
        import pyarrow as pa

        if exc is not None and isinstance(exc, (pa.ArrowException, OSError, EOFError)) and not isinstance(
                exc, ImportSourceError):
            text = " ".join(str(exc).split())[:200]
            raise ImportSourceError(self.path, self.what, f"an error ({type(exc).__name__}: {text})") from None


def h5_dataset(group: Any, name: str, source: str) -> Any:
    """Dataset ``name`` of an HDF5 group whose data is all in the file, or an ImportSourceError naming it.

    A dataset created with a large shape but never written (chunks never allocated) would read
    as zeros: the size it declares is not data, so it is refused before anything is read.

    Parameters
    ----------
    group : h5py.Group
        The group (or file).
    name : str
        The dataset's path in it.
    source : str
        The file, for messages.

    Returns
    -------
    h5py.Dataset
        The dataset.

    Raises
    ------
    ImportSourceError
        ``name`` is missing, is not a dataset, or declares more data than the file holds.
    """
    import h5py

    try:
        obj = group.get(name)
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise ImportSourceError(name, "a readable dataset", f"an unreadable object ({exc})", source) from None
    if obj is None:
        raise ImportSourceError(name, "a dataset", "none", source)
    if not isinstance(obj, h5py.Dataset):
        raise ImportSourceError(name, "a dataset", type(obj).__name__, source)
    if obj.size:
        try:
            if obj.chunks is not None:
                expected = 1
                for n, c in zip(obj.shape, obj.chunks, strict=True):
                    expected *= -(-n // c)
                held = obj.id.get_num_chunks()
                if held < expected:
                    raise ImportSourceError(name, f"data for its declared shape {obj.shape}",
                                            f"{held} of its {expected} chunks written", source)
            elif obj.id.get_storage_size() < obj.nbytes and obj.compression is None:
                raise ImportSourceError(name, f"data for its declared shape {obj.shape} ({obj.nbytes} bytes)",
                                        f"{obj.id.get_storage_size()} bytes written", source)
        except (OSError, RuntimeError) as exc:
            raise ImportSourceError(name, "a readable dataset", f"unreadable storage ({exc})", source) from None
    return obj


def numeric_kind(name: str, dtype: Any, source: str, kinds: str = "biuf") -> None:
    """ImportSourceError naming ``name`` unless ``dtype`` is bool, integer or float (as ``kinds`` allows).

    Complex values are refused (a cast to real would drop their imaginary part), as are strings
    and objects.

    Parameters
    ----------
    name : str
        The column or dataset.
    dtype : numpy.dtype
        Its dtype.
    source : str
        The source, for messages.
    kinds : str, optional
        The numpy kinds allowed.

    Raises
    ------
    ImportSourceError
        Another dtype.
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in kinds or dtype.fields is not None:
        names = {"b": "bool", "i": "integer", "u": "unsigned", "f": "float"}
        raise ImportSourceError(name, " or ".join(names[k] for k in kinds) + " values", f"{dtype} values", source)


def flags(name: str, values: np.ndarray, source: str) -> np.ndarray:
    """Episode-end flags as bool: bool values, or numbers that are all 0 or 1 (else an ImportSourceError).

    Parameters
    ----------
    name : str
        The column or dataset.
    values : numpy.ndarray
        The values read.
    source : str
        The source, for messages.

    Returns
    -------
    numpy.ndarray
        Bool values.

    Raises
    ------
    ImportSourceError
        Not bool or numeric, or a number other than 0 and 1.
    """
    numeric_kind(name, values.dtype, source)
    if values.dtype.kind != "b":
        bad = (values != 0) & (values != 1)
        if np.any(bad):
            raise ImportSourceError(name, "flags (bool, or 0 and 1)", f"value {values[bad][0].item()!r}", source)
    return values.astype(bool)
