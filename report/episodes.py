"""Episodes of a table as flat arrays: where each starts and ends, its return and how it ended.

One vectorised pass over the table's (stream, step) index and its end-flag and reward
columns; the split is :func:`replaystore.episodebounds.episode_spans`, the rule
``replaystore.loaders.iter_episodes`` follows, so both agree episode for episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.episodebounds import end_fields, episode_spans
from replaystore.store import Store, TableView

REWARD_FIELDS = ("reward", "rewards")
"""The fields an episode's return sums, the first the schema has (``rewards``: the ``dqn`` schema)."""

ENDS = ("terminated", "truncated", "open")
"""The values of :attr:`Episodes.end`."""


def table_view(table: Any) -> TableView:
    """The immutable view a report reads: of a ``Table``, a ``TableView`` or a single-table ``Store``.

    Parameters
    ----------
    table : Table or TableView or Store
        What to read.

    Returns
    -------
    TableView
        ``table`` itself when it is a view, else its current view. Cost: O(1) once current.
    """
    if isinstance(table, TableView):
        return table
    if isinstance(table, Store):
        table = table.default
    view: TableView = table.view()
    return view


@dataclass(frozen=True)
class StreamOrder:
    """A table's visible records in (stream, step) order.

    Attributes
    ----------
    keys : list
        The stream keys with visible records, in the table's stream order (``Table.streams()``).
    bounds : numpy.ndarray
        int64, ``len(keys) + 1``: stream ``i``'s records are ``bounds[i]:bounds[i + 1]``.
    rows, steps, resets : numpy.ndarray
        Row id (int64), step (int64) and reset flag (bool) of each record, in that order.
    """

    keys: list[Any]
    bounds: np.ndarray
    rows: np.ndarray
    steps: np.ndarray
    resets: np.ndarray

    def stream_ids(self) -> np.ndarray:
        """The index into :attr:`keys` of each record's stream (int64; cost: O(records))."""
        return np.repeat(np.arange(len(self.keys), dtype=np.int64), np.diff(self.bounds))

    def firsts(self) -> np.ndarray:
        """Whether each record is the first of its stream (bool; cost: O(records))."""
        first = np.zeros(len(self.rows), dtype=bool)
        first[self.bounds[:-1][np.diff(self.bounds) > 0]] = True
        return first


def stream_order(view: TableView) -> StreamOrder:
    """The records of ``view`` in (stream, step) order.

    Parameters
    ----------
    view : TableView
        The records.

    Returns
    -------
    StreamOrder
        Read from the table's shared stream index when ``view`` is the table's current one
        (cost: nothing once the index is built), else from the view's index arrays and a
        sort (cost: O(records log records)). The arrays are shared: read them, never change them.
    """
    if view.current:
        idx = view.stream_index()
        counts = np.diff(idx.bounds)
        keep = counts > 0
        keys = [k for k, c in zip(idx.keys, keep.tolist(), strict=True) if c]
        bounds = np.r_[0, np.cumsum(counts[keep])].astype(np.int64)
        return StreamOrder(keys, bounds, idx.rows, idx.steps, idx.resets)
    ids = view.row_ids()
    skeys, steps, resets = view.index_of(ids)
    codes_of: dict[Any, int] = {}
    for k in skeys.tolist():  # first appearance in row order
        codes_of.setdefault(k, len(codes_of))
    codes = np.fromiter((codes_of[k] for k in skeys.tolist()), dtype=np.int64, count=len(skeys))
    order = np.lexsort((steps, codes))
    bounds = np.searchsorted(codes[order], np.arange(len(codes_of) + 1)).astype(np.int64)
    return StreamOrder(list(codes_of), bounds, ids[order], np.asarray(steps)[order], np.asarray(resets)[order])


@dataclass(frozen=True)
class Episodes:
    """The episodes of one table, one entry per episode, sorted by (stream order, first step).

    Every array attribute has one entry per episode.

    Attributes
    ----------
    stream : numpy.ndarray
        Object array: the stream key of each episode.
    first_row, last_row : numpy.ndarray
        int64 row ids of its first and last record.
    first_step : numpy.ndarray
        int64 step of its first record.
    length : numpy.ndarray
        int64 records in the episode.
    ret : numpy.ndarray
        float64 sum of its ``reward`` (``rewards``) values, a vector reward summed over its
        elements; NaN when the schema has no reward field.
    end : numpy.ndarray
        str: ``"terminated"`` (the terminated or dones flag of its last record is set),
        ``"truncated"`` (only the truncated flag) or ``"open"`` (no end flag: the stream's
        trailing steps, or steps a reset or step gap cut off before an end flag).
    complete : numpy.ndarray
        bool: it begins the episode: at a reset, at step 0, or right after an episode end
        at the previous step (not after a gap left by retention). ``iter_episodes``'s
        ``complete`` is ``complete & (end != "open")``.
    end_time : numpy.ndarray
        float64 Unix seconds of the commit that holds its last record.
    end_flags : tuple of str
        The fields that end episodes: ``("terminated", "truncated")``, ``("terminated",)``,
        ``("dones",)``; ``()`` when the schema has none (and there are no episodes).
    """

    stream: np.ndarray
    first_row: np.ndarray
    last_row: np.ndarray
    first_step: np.ndarray
    length: np.ndarray
    ret: np.ndarray
    end: np.ndarray
    complete: np.ndarray
    end_time: np.ndarray
    end_flags: tuple[str, ...]

    def __len__(self) -> int:
        """The number of episodes."""
        return len(self.first_row)

    @property
    def ended(self) -> np.ndarray:
        """Per episode (bool): its last record has an end flag (``end != "open"``)."""
        return np.asarray(self.end != "open")

    @property
    def whole(self) -> np.ndarray:
        """Per episode (bool): complete and ended (what ``iter_episodes`` yields by default)."""
        return self.complete & self.ended

    @classmethod
    def empty(cls, end_flags: tuple[str, ...] = ()) -> Episodes:
        """No episodes.

        Parameters
        ----------
        end_flags : tuple of str, optional
            As :attr:`end_flags`.

        Returns
        -------
        Episodes
            Zero-length arrays of the documented dtypes.
        """
        i64 = np.zeros(0, dtype=np.int64)
        f64 = np.zeros(0, dtype=np.float64)
        return cls(np.zeros(0, dtype=object), i64, i64.copy(), i64.copy(), i64.copy(), f64, np.zeros(0, dtype="<U10"),
                   np.zeros(0, dtype=bool), f64.copy(), end_flags)


def frames_layout(schema: Any) -> bool:
    """Whether a schema stores frames (``replaystore.schemas.frames``, the recorders' ``frame_stack=``).

    Such a schema has a ``frame`` field (or ``frame_<key>`` fields) and no ``obs`` or ``next_obs``;
    an episode of T steps is T + 1 records, the last a frame-only record (docs/SCHEMAS.md, "Frames").

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    bool
        The answer.
    """
    names = set(schema.names)
    nodes = schema.nesting.nodes if schema.nesting is not None else {}
    if {"obs", "next_obs"} & (names | set(nodes)):
        return False
    return any(n == "frame" or n.startswith("frame_") for n in names)


def reward_field(schema: Any) -> str | None:
    """The field an episode's return sums: the first of :data:`REWARD_FIELDS` the schema has as a dense field.

    Parameters
    ----------
    schema : Schema
        The table's schema.

    Returns
    -------
    str or None
        The field's name; None when there is none.
    """
    dense = {f.name for f in schema.dense_fields}
    return next((n for n in REWARD_FIELDS if n in dense), None)


def commit_times(view: TableView, rows: np.ndarray) -> np.ndarray:
    """The time of the commit that holds each of ``rows``.

    Read from the visible fragments' ``parts`` (each commit's records in row order with its
    ``time_ns``): no storage read.

    Parameters
    ----------
    view : TableView
        The records.
    rows : numpy.ndarray
        Visible row ids.

    Returns
    -------
    numpy.ndarray
        float64 Unix seconds per row. Cost: O(parts + rows log parts).
    """
    starts: list[int] = []
    times: list[int] = []
    for f in view.fragments:
        pos = f.first_id
        for _, time_ns, n in f.parts:
            starts.append(pos)
            times.append(time_ns)
            pos += n
    rows = np.asarray(rows, dtype=np.int64)
    if not starts or not len(rows):
        return np.full(len(rows), np.nan)
    s = np.asarray(starts, dtype=np.int64)
    t = np.asarray(times, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    s, t = s[order], t[order]
    at = np.clip(np.searchsorted(s, rows, side="right") - 1, 0, len(s) - 1)
    out: np.ndarray = t[at] / 1e9
    return out


def _flag(values: np.ndarray, n: int) -> np.ndarray:
    flat = np.asarray(values).astype(bool, copy=False).reshape(n, -1)
    return np.asarray(flat.any(axis=1))


def episodes_of(table: Any) -> Episodes:
    """The episodes of a table's visible records.

    An episode starts at a stream's first visible record, at a reset, after a record whose
    end flag is set, or after a step gap, and ends where the next starts: the episodes of
    ``replaystore.loaders.iter_episodes(table, complete_only=False)``, in the same order. In
    the frames layout (:func:`frames_layout`) the frame-only record closing an episode (the
    record after an end flag, at the next step, without a reset) belongs to no episode: an
    episode's ``length`` counts its steps, as the exporters do.

    Parameters
    ----------
    table : Table or TableView or Store
        The records (a ``Store`` with a single table reads that table).

    Returns
    -------
    Episodes
        Empty (``end_flags == ()``) when the schema has no ``terminated`` or ``dones`` field.

    Notes
    -----
    Cost: the table's stream index (built on first use), one read of the end-flag and
    reward columns, O(records) vectorised work.
    """
    view = table_view(table)
    schema = view.schema
    flags = end_fields(schema)
    if not flags:
        return Episodes.empty()
    order = stream_order(view)
    if not len(order.rows):
        return Episodes.empty(flags)
    reward = reward_field(schema)
    rows, steps, resets, first = order.rows, order.steps, order.resets, order.firsts()
    sid = order.stream_ids()
    cols = view.read_columns(rows, [*flags, *([reward] if reward else [])])
    term = _flag(cols[flags[0]], len(rows))
    trunc = _flag(cols[flags[1]], len(rows)) if len(flags) > 1 else np.zeros(len(rows), dtype=bool)
    r = (np.asarray(cols[reward], dtype=np.float64).reshape(len(rows), -1).sum(axis=1) if reward is not None
         else np.full(len(rows), np.nan))
    ended = np.logical_or(term, trunc)
    if frames_layout(schema):  # the frame-only record closing an episode is no step of any episode
        closing = np.zeros(len(rows), dtype=bool)
        closing[1:] = ended[:-1] & (np.diff(steps) == 1) & ~resets[1:] & ~first[1:]
        if closing.any():
            keep = ~closing
            rows, steps, resets, first, sid = rows[keep], steps[keep], resets[keep], first[keep], sid[keep]
            term, trunc, ended, r = term[keep], trunc[keep], ended[keep], r[keep]
    lo, hi, began = episode_spans(steps, resets, ended, first)
    last = hi - 1
    ret = np.add.reduceat(r, lo) if len(lo) else np.zeros(0)
    keys = np.empty(len(order.keys), dtype=object)
    keys[:] = order.keys
    end = np.where(term[last], "terminated", np.where(trunc[last], "truncated", "open")).astype("<U10")
    last_row = np.asarray(rows[last], dtype=np.int64)
    return Episodes(keys[sid[lo]], np.asarray(rows[lo], dtype=np.int64), last_row,
                    np.asarray(steps[lo], dtype=np.int64), (hi - lo).astype(np.int64), ret, end,
                    np.asarray(began, dtype=bool), commit_times(view, last_row), flags)


@dataclass(frozen=True)
class StreamSummary:
    """One stream of a table at a glance.

    Attributes
    ----------
    stream : int or str
        The stream's key.
    records : int
        Its visible records.
    first_step, last_step : int
        Its first and last visible steps.
    gaps : int
        Places where a visible step does not follow the previous one by 1 (missing or
        evicted steps inside the stream).
    episodes : int
        Its ended episodes (``end`` terminated or truncated), whole or not.
    open : int
        Its episodes without an end flag.
    return_mean, return_min, return_max : float
        Over its whole episodes (complete and ended); NaN where none (or no reward field).
    length_mean, length_min, length_max : float
        Over its whole episodes; NaN where none.
    """

    stream: Any
    records: int
    first_step: int
    last_step: int
    gaps: int
    episodes: int
    open: int
    return_mean: float
    return_min: float
    return_max: float
    length_mean: float
    length_min: float
    length_max: float


def _mmm(values: np.ndarray) -> tuple[float, float, float]:
    if not len(values):
        return float("nan"), float("nan"), float("nan")
    return float(np.mean(values)), float(np.min(values)), float(np.max(values))


def stream_summaries(table: Any, episodes: Episodes) -> list[StreamSummary]:
    """One :class:`StreamSummary` per stream with visible records, in the table's stream order.

    Parameters
    ----------
    table : Table or TableView or Store
        The records.
    episodes : Episodes
        ``episodes_of(table)``.

    Returns
    -------
    list of StreamSummary
        Cost: O(records) vectorised, then O(streams + episodes).
    """
    order = stream_order(table_view(table))
    b = order.bounds
    n = len(order.keys)
    gap = np.zeros(len(order.steps), dtype=bool)
    gap[1:] = np.diff(order.steps) != 1
    gap[order.firsts()] = False
    gaps = np.bincount(order.stream_ids()[gap], minlength=n)
    slot = {k: i for i, k in enumerate(order.keys)}
    esid = np.fromiter((slot.get(k, -1) for k in episodes.stream.tolist()), dtype=np.int64, count=len(episodes))
    by = np.argsort(esid, kind="stable")
    ebounds = np.searchsorted(esid[by], np.arange(n + 1))
    ended = episodes.ended[by]
    whole = episodes.whole[by]
    ret = episodes.ret[by]
    length = episodes.length[by].astype(np.float64)
    out = []
    for i, key in enumerate(order.keys):
        lo, hi = int(ebounds[i]), int(ebounds[i + 1])
        w = whole[lo:hi]
        rmean, rmin, rmax = _mmm(ret[lo:hi][w])
        lmean, lmin, lmax = _mmm(length[lo:hi][w])
        done = int(np.count_nonzero(ended[lo:hi]))
        out.append(StreamSummary(key, int(b[i + 1] - b[i]), int(order.steps[b[i]]), int(order.steps[b[i + 1] - 1]),
                                 int(gaps[i]), done, hi - lo - done, rmean, rmin, rmax, lmean, lmin, lmax))
    return out
