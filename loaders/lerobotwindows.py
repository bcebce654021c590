"""LeRobot's ``delta_timestamps`` windows and decoded video frames in ``make_loader(..., output="lerobot")``.

``LeRobotDataset(..., delta_timestamps={key: [seconds, ...]})`` returns, for a key with deltas,
the values at frames ``index + round(delta * fps)``, each clamped to the sample's episode
(its first and last frame), stacked to ``(T, ...)``, with ``<key>_is_pad`` (bool ``(T,)``) true
where the unclamped frame fell outside the episode. :class:`LeRobotView` does the same for a
store where a minibatch is gathered (a DataLoader worker or the main process): episodes are
the runs of a stream (split at resets and step gaps), as the LeRobot export writes them. It
also decodes each imported video feature's frames (loaders/lerobotvideo.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from replaystore.errors import LoaderArgumentError, RowError, SamplerParameterError, UnsupportedCombinationError
from replaystore.loaders.feature import Feature
from replaystore.loaders.lerobotvideo import KEY, PTS, VideoFrames, need_av
from replaystore.loaders.lerobotview import lerobot_keys, video_fields
from replaystore.schemas import Schema
from replaystore.store import Table

TOLERANCE_S = 1e-4
"""LeRobot's default ``tolerance_s``: a delta must be a multiple of ``1 / fps`` within it."""
WINDOW_SAMPLERS = ("uniform", "epoch", "prioritized")
"""Sampler kinds ``delta_timestamps`` takes: those drawing single records without features."""


class EpisodeMap:
    """Per visible row: its dense stream position, its episode's first position and the one after its last.

    Built from the table's stream index (cost: a sort of the visible rows); with ``keys``
    also the last keyframe position at or before each position, per video field.

    Parameters
    ----------
    table : Table
        The table (this process's handle).
    keys : sequence of str
        Video packet fields whose ``__key`` flags to index.
    """

    def __init__(self, table: Table, keys: Sequence[str] = ()) -> None:
        si = table.stream_index()
        self.stamp = (id(si), si.version)
        rows = np.asarray(si.rows, dtype=np.int64)
        n = len(rows)
        brk = np.ones(n, dtype=bool)
        if n > 1:
            sids, steps = si.stream_ids, si.steps
            brk[1:] = (sids[1:] != sids[:-1]) | (np.diff(steps) != 1) | si.resets[1:]
        starts = np.flatnonzero(brk)
        ep = np.cumsum(brk) - 1
        self.rows = rows
        self.first = starts[ep]
        self.end = np.r_[starts[1:], n][ep]
        self.order = np.argsort(rows, kind="stable")
        self.sorted = rows[self.order]
        self.key: dict[str, np.ndarray] = {}
        for name in keys:
            flags = table.read(rows, columns=[name + KEY])[name + KEY].astype(bool) if n else np.zeros(0, bool)
            at = np.where(flags, np.arange(n, dtype=np.int64), -1)
            self.key[name] = np.maximum.accumulate(at) if n else at

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Dense positions of row ids (-1 stays -1).

        Parameters
        ----------
        rows : numpy.ndarray
            Visible row ids, or -1.

        Returns
        -------
        numpy.ndarray
            int64, same shape.

        Raises
        ------
        RowError
            A row id is not in the stream index.
        """
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        at = np.searchsorted(self.sorted, flat).clip(0, max(len(self.sorted) - 1, 0))
        real = flat >= 0
        if len(self.sorted) == 0 or not (self.sorted[at[real]] == flat[real]).all():
            raise RowError("row ids not visible to this handle's stream index")
        return np.where(real, self.order[at] if len(self.order) else -1, -1).reshape(np.shape(rows))

    def windows(self, pos: np.ndarray, deltas: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """LeRobot's query positions and padding for positions ``pos`` (1-D) and frame deltas.

        Parameters
        ----------
        pos : numpy.ndarray
            Dense positions (B,).
        deltas : sequence of int
            Frame offsets (T,).

        Returns
        -------
        tuple of numpy.ndarray
            Positions ``(B, T)`` clamped to each episode, and bool ``(B, T)``: outside it.
        """
        want = pos[:, None] + np.asarray(deltas, dtype=np.int64)[None, :]
        lo, hi = self.first[pos][:, None], self.end[pos][:, None]
        return np.clip(want, lo, hi - 1), (want < lo) | (want >= hi)


class LeRobotView(Feature):
    """The worker half of ``output="lerobot"``: ``delta_timestamps`` windows and decoded video frames.

    Runs on every gathered minibatch (no payload): each field with deltas is replaced by its
    ``(B, T, ...)`` window and gains ``<field>_is_pad``; each video field (packets) by its
    uint8 frames ``(B, [T,] H, W, 3)``. Picklable; its episode map and decoders are made in
    the process that gathers and remade when the stream index changes.

    Parameters
    ----------
    deltas : dict of str to list of int
        Field name to frame offsets.
    videos : dict of str to dict
        Video field name to its stream parameters.
    """

    name = "lerobot"

    def __init__(self, deltas: dict[str, list[int]], videos: dict[str, dict[str, Any]]) -> None:
        self.deltas = deltas
        self.videos = {n: VideoFrames(n, p) for n, p in videos.items()}
        self._map: EpisodeMap | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the episode map (each process builds its own)."""
        return {**self.__dict__, "_map": None, "_pid": None}

    def episodes(self, table: Table) -> EpisodeMap:
        """The episode map of ``table``'s current stream index (rebuilt when it changed).

        Parameters
        ----------
        table : Table
            This process's handle.

        Returns
        -------
        EpisodeMap
            Cost: nothing when unchanged, else a build.
        """
        si = table.stream_index()
        m = self._map
        if m is None or self._pid != os.getpid() or m.stamp != (id(si), si.version):
            m = self._map = EpisodeMap(table, list(self.videos))
            self._pid = os.getpid()
        return m

    def reads(self, payload: Any) -> tuple[str, ...]:
        """The fields it reads itself: those with deltas and the video packet fields.

        Parameters
        ----------
        payload : Any
            None (the view has no payload).

        Returns
        -------
        tuple of str
            Field names the plain gather leaves out.
        """
        return (*self.deltas, *(n + s for n in self.videos for s in ("", PTS, "__dts", KEY)))

    def apply(self, table: Table, batch: dict[str, Any], payload: Any) -> dict[str, Any]:
        """Add the windows, their ``<field>_is_pad`` and the decoded frames to a gathered minibatch.

        Parameters
        ----------
        table : Table
            This process's handle.
        batch : dict of str to Any
            The gathered minibatch (numpy arrays, ``indices`` ``(B,)``; ``(B, T)`` for sequences,
            which only frames are decoded for).
        payload : Any
            None.

        Returns
        -------
        dict of str to Any
            A new dict. Cost: one read of the distinct window rows, and one decode of each
            group of pictures the frames need (:class:`~replaystore.loaders.lerobotvideo.VideoFrames`).

        Raises
        ------
        RowError
            A row is not in this handle's stream index.
        """
        if not self.deltas and not self.videos:
            return batch
        rows = np.asarray(batch["indices"], dtype=np.int64)
        m = self.episodes(table)
        pos = m.positions(rows)
        out = dict(batch)
        plain = [n for n in self.deltas if n not in self.videos]
        got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if plain:
            got = {n: m.windows(pos.reshape(-1), self.deltas[n]) for n in plain}
            qrows = m.rows[np.concatenate([got[n][0].reshape(-1) for n in plain])]
            uniq, inv = np.unique(qrows, return_inverse=True)
            values = table.read(uniq, columns=plain)
            at = 0
            for n in plain:
                q, pad = got[n]
                out[n] = values[n][inv[at:at + q.size]].reshape(*q.shape, *values[n].shape[1:])
                out[n + "_is_pad"] = pad
                at += q.size
        for n, dec in self.videos.items():
            if n in self.deltas:
                q, pad = m.windows(pos.reshape(-1), self.deltas[n])
                out[n + "_is_pad"] = pad
            else:
                q = pos
            out[n] = dec.frames(table, m.rows, q, m.first, m.end, m.key[n])
        return out


def view_parts(sampler: Any, output: str, delta_timestamps: Mapping[str, Sequence[float]] | None,
               fps: float | None) -> list[Feature]:
    """``make_loader``'s worker half for ``output="lerobot"`` (:func:`view_part`); none for other outputs.

    Parameters
    ----------
    sampler : StoreSampler
        The loader's sampler.
    output : str
        ``make_loader``'s ``output``.
    delta_timestamps : mapping of str to sequence of float, or None
        As :func:`view_part`.
    fps : float or None
        As :func:`view_part`.

    Returns
    -------
    list of Feature
        ``[LeRobotView]`` or ``[]``.

    Raises
    ------
    LoaderArgumentError
        ``delta_timestamps`` or ``fps`` with another ``output``.
    SamplerParameterError, UnsupportedCombinationError, MissingDependencyError
        As :func:`view_part`.
    """
    if output != "lerobot":
        if delta_timestamps or fps is not None:
            raise LoaderArgumentError(f"delta_timestamps= and fps= are for output='lerobot', not {output!r}")
        return []
    return [view_part(sampler, delta_timestamps, fps)]


def fps_of(schema: Schema, fps: float | None) -> float:
    """The frame rate ``delta_timestamps`` converts with: ``fps=`` or the schema metadata's ``fps``.

    Parameters
    ----------
    schema : Schema
        The table's schema (an import keeps the dataset's ``fps``).
    fps : float or None
        Given by the caller.

    Returns
    -------
    float
        Frames per second.

    Raises
    ------
    SamplerParameterError
        Neither is given (``field`` ``delta_timestamps``), or ``fps`` is not positive, or
        it differs from an imported dataset's.
    """
    kept = schema.metadata.get("fps")
    if fps is None:
        if not isinstance(kept, (int, float)) or isinstance(kept, bool) or kept <= 0:
            raise SamplerParameterError("delta_timestamps", "fps=, or an fps in the schema metadata "
                                        "(a LeRobot import keeps its dataset's)", "neither")
        return float(kept)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise SamplerParameterError("fps", "a positive number", repr(fps))
    if isinstance(schema.metadata.get("lerobot"), dict) and isinstance(kept, (int, float)) and kept != fps:
        raise SamplerParameterError("fps", f"the imported dataset's {kept}", repr(fps))
    return float(fps)


def view_part(sampler: Any, delta_timestamps: Mapping[str, Sequence[float]] | None,
              fps: float | None = None) -> LeRobotView:
    """The :class:`LeRobotView` worker half for ``sampler``'s table, ``delta_timestamps`` checked.

    Keys are LeRobot keys (``observation.state``) or field names (``observation__state``).
    Offsets are ``round(delta * fps)`` frames; each delta must be a multiple of ``1 / fps``
    within :data:`TOLERANCE_S` (LeRobot's ``check_delta_timestamps``).

    Parameters
    ----------
    sampler : StoreSampler
        The loader's sampler.
    delta_timestamps : mapping of str to sequence of float, or None
        Key to offsets in seconds.
    fps : float, optional
        Frames per second (default: the schema metadata's ``fps``).

    Returns
    -------
    LeRobotView
        Picklable.

    Raises
    ------
    SamplerParameterError
        An unknown key, an empty or non-numeric list, a delta off the frame grid (``field``:
        the key), or no frame rate (``field``: ``delta_timestamps``).
    UnsupportedCombinationError
        ``delta_timestamps`` with a sampler that is not uniform, epoch or prioritized, or with
        ``stack=``, ``n_step=`` or ``her=``.
    MissingDependencyError
        The table has an imported video feature and PyAV is missing.
    """
    schema = sampler.table.schema
    videos = video_fields(schema)
    for video_key in videos.values():
        need_av(video_key)
    deltas: dict[str, list[int]] = {}
    if delta_timestamps:
        kind = getattr(sampler, "kind", type(sampler).__name__)
        who = type(sampler).__name__
        if kind not in WINDOW_SAMPLERS:
            raise UnsupportedCombinationError(who, "delta_timestamps=", "windows are built around single drawn "
                                              f"records; only the {', '.join(WINDOW_SAMPLERS)} samplers take them")
        features = list(getattr(sampler, "features", ()))
        if features:
            raise UnsupportedCombinationError(f"{features[0].name}=", "delta_timestamps=", "LeRobot windows "
                                              "replace stacks, n-step windows and relabelled goals")
        rate = fps_of(schema, fps)
        keys = {**lerobot_keys(schema), **videos}
        by_key = {k: n for n, k in keys.items()}
        for key, ts in delta_timestamps.items():
            name: str | None = key if key in keys else by_key.get(key)
            if name is None:
                raise SamplerParameterError(str(key), f"a LeRobot key or field of the view ({sorted(by_key)})",
                                            "unknown")
            try:
                vals = [float(t) for t in ts]
            except (TypeError, ValueError):
                raise SamplerParameterError(str(key), "a list of offsets in seconds", repr(ts)) from None
            if not vals:
                raise SamplerParameterError(str(key), "at least one offset", "none")
            off = [t for t in vals if not abs(t * rate - round(t * rate)) / rate <= TOLERANCE_S]
            if off:
                raise SamplerParameterError(str(key), f"multiples of 1/{rate:g} s (within {TOLERANCE_S} s)",
                                            repr(off))
            deltas[name] = [round(t * rate) for t in vals]
    params = {n: schema.metadata["lerobot"]["videos"][k] for n, k in videos.items()}
    return LeRobotView(deltas, params)
