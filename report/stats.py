"""Per-field statistics of a table (count, min, max, mean, std, quantiles), and LeRobot's ``stats.json`` layout.

Every dense field (nested leaves by their flat names, ``obs__image``) and every ragged field
is summarised from the store's public read API, one field at a time: exactly over every
record when the field's data is at most ``max_bytes``, else over a seeded uniform sample of
records (:attr:`FieldStats.rows` says how many were read).

Values are summarised per dimension for small vectors (at most :data:`SMALL_VECTOR` values per
record: the statistics have the field's shape), per channel for images (uint8 frames, values
scaled to [0, 1] as LeRobot does), else over all of the field's values (shape ``()``). NaN and
infinite values are counted (:attr:`FieldStats.nan`, :attr:`FieldStats.inf`) and left out of
every statistic; bools count as 0/1. Quantiles are numpy's (``np.quantile``, linear
interpolation) on the values as float64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.errors import UnknownColumnError
from replaystore.report.episodes import table_view
from replaystore.schemas import Dense, Ragged
from replaystore.store import TableView

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
"""The quantiles of :attr:`FieldStats.quantiles` (LeRobot's ``q01 q10 q50 q90 q99``)."""

SMALL_VECTOR = 32
"""Fields with at most this many values per record are summarised per dimension."""

DEFAULT_MAX_BYTES = 64 << 20
"""A field whose data is larger is summarised from a sample of records (64 MiB: a 1M-record
``transitions(obs_shape=4)`` store's observations, 16 MB, are summarised exactly)."""

IMAGE_FRAMES = 1000
"""The most frames an image field's statistics are taken from."""

IMAGE_MIN_SIDE = 16
"""An image's height and width are at least this many pixels (smaller uint8 grids are not images)."""

CHUNKS = 16
"""The records read are split into this many consecutive chunks for :attr:`FieldStats.chunk_scale`."""

_SCALE_VALUES = 8192  # a chunk's scale is the median of at most about this many of its values (evenly strided)
_BINCOUNT_SPAN = 1 << 20  # integer columns spanning fewer values are counted with bincount


@dataclass(frozen=True)
class FieldStats:
    """Statistics of one field.

    Attributes
    ----------
    name : str
        The flat field name (a nested leaf as the schema names it: ``obs__image``).
    dtype : str
        The field's numpy dtype (``"float32"``).
    shape : tuple of int
        One record's shape (``()`` for a ragged field's values).
    kind : str
        ``"dense"``, ``"ragged"`` or ``"image"``.
    count : int
        Finite values counted (over every dimension).
    rows : int
        Records read: the table's length, or fewer when sampled.
    min, max, mean, std : numpy.ndarray
        float64, per dimension (the field's shape) for fields of at most
        :data:`SMALL_VECTOR` values per record, per channel (``(C,)``, values in [0, 1])
        for images, else over every value (shape ``()``). ``std`` is the population
        standard deviation (``ddof=0``); NaN where no finite value was seen.
    quantiles : dict of float to numpy.ndarray
        For each of :data:`QUANTILES`, shaped like ``mean``.
    nan, inf : int
        NaN and infinite values seen (left out of the statistics).
    sampled : bool
        Whether ``rows`` is a sample of the table's records.
    lengths : FieldStats or None
        For a ragged field, the statistics of its list lengths (values per record).
    nan_records, inf_records : int
        Records read holding at least one NaN / infinite value.
    chunk_scale : numpy.ndarray
        float64, the typical magnitude of each of up to :data:`CHUNKS` consecutive chunks of
        the records read, in row order: the median of the chunk's non-zero finite absolute
        values (of at most about 8192 of them, evenly strided); NaN for a chunk without one.
        What the ``magnitude_jump`` health check compares.
    overall : FieldStats or None
        For a field summarised per dimension or per channel (more than one), the same
        statistics over all of its values at once (shape ``()``; for images, scaled to
        [0, 1]); None otherwise (the field's own statistics are already over all its values).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    count: int
    rows: int
    min: np.ndarray
    max: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    quantiles: dict[float, np.ndarray]
    nan: int
    inf: int
    sampled: bool = False
    lengths: FieldStats | None = field(default=None, repr=False)
    nan_records: int = 0
    inf_records: int = 0
    chunk_scale: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    overall: FieldStats | None = field(default=None, repr=False)


def is_image(f: Any) -> bool:
    """Whether a field holds images: uint8, ``(H, W)`` or ``(H, W, C)`` with C in 1, 3, 4, H and W at least 16.

    Parameters
    ----------
    f : Field
        A schema field.

    Returns
    -------
    bool
        The answer.
    """
    if not isinstance(f, Dense) or f.dtype != np.uint8:
        return False
    shape = tuple(f.shape)
    if len(shape) == 3 and shape[-1] not in (1, 3, 4):
        return False
    return len(shape) in (2, 3) and min(shape[:2]) >= IMAGE_MIN_SIDE


def _quantiles_sorted_counts(values: np.ndarray, counts: np.ndarray, qs: Iterable[float]) -> np.ndarray:
    """The linear quantiles (numpy's) of the multiset {values[i] x counts[i]} (values ascending)."""
    n = int(counts.sum())
    cum = np.cumsum(counts)
    out = []
    for q in qs:
        h = (n - 1) * q
        lo = int(np.floor(h))
        hi = min(lo + 1, n - 1)
        a = float(values[np.searchsorted(cum, lo, side="right")])
        b = float(values[np.searchsorted(cum, hi, side="right")])
        t = h - lo
        # numpy's _lerp: a + (b - a) * t, computed from b for t >= 0.5
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)
    return np.asarray(out, dtype=np.float64)


def _column_stats(c: np.ndarray, own: bool = False) -> tuple[float, float, float, float, np.ndarray, int]:
    """(min, max, mean, std, quantiles, count) of one column of finite values (``own``: it may be reordered)."""
    n = len(c)
    if not n:
        nan = float("nan")
        return nan, nan, nan, nan, np.full(len(QUANTILES), np.nan), 0
    if c.dtype.kind in "biu":
        lo, hi = int(c.min()), int(c.max())
        if hi - lo < _BINCOUNT_SPAN:
            # uint8 frames are counted as they are (no int64 copy of every value)
            direct = lo == 0 and c.dtype != np.uint64
            counts = np.bincount(c if direct else c.astype(np.int64) - lo, minlength=1)
            present = np.flatnonzero(counts)
            vals = present.astype(np.float64) + lo
            cnt = counts[present].astype(np.float64)
            mean = float((vals * cnt).sum() / n)
            std = float(np.sqrt((cnt * (vals - mean) ** 2).sum() / n))
            return float(lo), float(hi), mean, std, _quantiles_sorted_counts(vals, cnt, QUANTILES), n
    f = c.astype(np.float64, copy=False)
    own = own or f is not c
    lo_, hi_, mean_, std_ = float(f.min()), float(f.max()), float(f.mean()), float(f.std())
    return lo_, hi_, mean_, std_, np.quantile(f, QUANTILES, overwrite_input=own), n


def summarise(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """Statistics of each column of a ``(values, columns)`` matrix.

    Parameters
    ----------
    matrix : numpy.ndarray
        Two-dimensional; bools are read as 0/1.

    Returns
    -------
    tuple
        ``(min, max, mean, std, quantiles, count, nan, inf)``: float64 arrays of one entry per
        column (``quantiles``: ``(len(QUANTILES), columns)``), then the finite values counted and
        the NaN and infinite values left out, over every column.
    """
    if matrix.dtype == np.bool_:
        matrix = matrix.view(np.uint8)
    d = matrix.shape[1]
    nan = inf = count = 0
    mins, maxs, means, stds = (np.full(d, np.nan) for _ in range(4))
    qs = np.full((len(QUANTILES), d), np.nan)
    for j in range(d):  # one column at a time, contiguous: fast reductions, memory for one column
        c = matrix[:, j]
        own = d > 1 or c.dtype != np.float64  # a copy is made below: the quantiles may reorder it
        c = np.ascontiguousarray(c, dtype=np.float64) if c.dtype.kind == "f" else np.ascontiguousarray(c)
        if c.dtype.kind == "f":
            ok = np.isfinite(c)
            if not ok.all():
                bad_nan = int(np.count_nonzero(np.isnan(c)))
                nan += bad_nan
                inf += int(np.count_nonzero(~ok)) - bad_nan
                c, own = c[ok], True
        mins[j], maxs[j], means[j], stds[j], qs[:, j], n = _column_stats(c, own)
        count += n
    return mins, maxs, means, stds, qs, count, nan, inf


def _record_of(values: np.ndarray, records: int, offsets: np.ndarray | None) -> np.ndarray:
    """The record index of each value (dense: ``values`` is ``(records, ...)``; ragged: CSR)."""
    if offsets is None:
        per = values.size // max(records, 1)
        return np.repeat(np.arange(records, dtype=np.int64), per)
    return np.repeat(np.arange(records, dtype=np.int64), np.diff(offsets))


def _bad_records(values: np.ndarray, records: int, offsets: np.ndarray | None) -> tuple[int, int]:
    if values.dtype.kind != "f":
        return 0, 0
    flat = values.reshape(-1)
    nan = np.isnan(flat)
    inf = np.isinf(flat)
    if not nan.any() and not inf.any():
        return 0, 0
    rec = _record_of(values, records, offsets)
    return len(np.unique(rec[nan])), len(np.unique(rec[inf]))


def chunk_scales(values: np.ndarray, records: int, offsets: np.ndarray | None = None,
                 chunks: int = CHUNKS) -> np.ndarray:
    """The typical magnitude of each of ``chunks`` consecutive chunks of records.

    The median of the chunk's non-zero finite absolute values (of at most about 8192 of
    them, evenly strided: zeros are left out so that sparse values, a reward paid now and
    then, keep a scale).

    Parameters
    ----------
    values : numpy.ndarray
        A dense field's ``(records, ...)`` values, or a ragged field's values.
    records : int
        The records they belong to.
    offsets : numpy.ndarray, optional
        A ragged field's CSR offsets (``records + 1``).
    chunks : int, optional
        At most this many chunks (fewer when there are fewer records).

    Returns
    -------
    numpy.ndarray
        float64 per chunk; NaN for a chunk without a non-zero finite value.
    """
    k = min(chunks, records)
    if k <= 0:
        return np.zeros(0)
    cuts = np.linspace(0, records, k + 1).astype(np.int64)
    flat = values.reshape(-1)
    if offsets is None:
        per = flat.size // max(records, 1)
        at = cuts * per
    else:
        at = np.asarray(offsets, dtype=np.int64)[cuts]
    out = np.full(k, np.nan)
    for i in range(k):
        part = flat[at[i]:at[i + 1]]
        if len(part) > _SCALE_VALUES:
            part = part[::len(part) // _SCALE_VALUES]
        a = np.abs(part, dtype=np.float64)
        a = a[np.isfinite(a) & (a > 0)]
        if len(a):
            out[i] = float(np.median(a))
    return out


def _stats_of(name: str, dtype: np.dtype, shape: tuple[int, ...], kind: str, values: np.ndarray, records: int,
              sampled: bool, lengths: FieldStats | None = None, offsets: np.ndarray | None = None) -> FieldStats:
    size = int(np.prod(shape, dtype=np.int64))
    if kind == "image":
        channels = shape[2] if len(shape) == 3 else 1
        matrix = values.reshape(-1, channels)
        out_shape: tuple[int, ...] = (channels,)
    elif kind == "dense" and size <= SMALL_VECTOR:
        matrix = values.reshape(len(values), size)
        out_shape = shape
    else:
        matrix = values.reshape(-1, 1)
        out_shape = ()
    mins, maxs, means, stds, qs, count, nan, inf = summarise(matrix)
    scale = 255.0 if kind == "image" else 1.0
    overall = None
    if matrix.shape[1] > 1:  # per dimension or channel: the field over all its values too
        o_min, o_max, o_mean, o_std, o_qs, o_count, o_nan, o_inf = summarise(matrix.reshape(-1, 1))
        overall = FieldStats(name, str(dtype), shape, kind, o_count, records, np.asarray(o_min[0] / scale),
                             np.asarray(o_max[0] / scale), np.asarray(o_mean[0] / scale), np.asarray(o_std[0] / scale),
                             {q: np.asarray(o_qs[i, 0] / scale) for i, q in enumerate(QUANTILES)}, o_nan, o_inf,
                             sampled)
    nan_records, inf_records = _bad_records(values, records, offsets) if nan or inf else (0, 0)
    chunk = np.zeros(0) if kind == "image" else chunk_scales(values, records, offsets)
    return FieldStats(name, str(dtype), shape, kind, count, records,
                      (mins / scale).reshape(out_shape), (maxs / scale).reshape(out_shape),
                      (means / scale).reshape(out_shape), (stds / scale).reshape(out_shape),
                      {q: (qs[i] / scale).reshape(out_shape) for i, q in enumerate(QUANTILES)},
                      nan, inf, sampled, lengths, nan_records, inf_records, chunk, overall)


def _sample_rows(view: TableView, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if k >= n:
        return view.row_ids()
    positions = np.sort(rng.choice(n, size=max(k, 1), replace=False))
    return view.rows_at(positions)


def _field_names(view: TableView, fields: Iterable[str] | str | None) -> list[str]:
    schema = view.schema
    known = [f.name for f in schema.fields if isinstance(f, (Dense, Ragged))]
    if fields is None:
        return known
    asked = [fields] if isinstance(fields, str) else list(fields)
    if schema.nesting is not None:
        asked = schema.nesting.columns(asked) or []
    unknown = [n for n in asked if n not in known]
    if unknown:
        raise UnknownColumnError(view.name, unknown, known)
    return list(dict.fromkeys(asked))


def field_stats(table: Any, fields: Iterable[str] | str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
                seed: int = 0, progress: Callable[[str, int, int], None] | None = None,
                image_frames: int = IMAGE_FRAMES) -> dict[str, FieldStats]:
    """The statistics of a table's fields.

    Parameters
    ----------
    table : Table or TableView or Store
        The records (a ``Store`` with a single table reads that table).
    fields : iterable of str, optional
        Field names (default: every dense and ragged field); a nested field's name stands
        for its leaves.
    max_bytes : int, optional
        A field whose data (all its records) is larger is summarised from a uniform sample
        of ``max_bytes`` worth of records (default :data:`DEFAULT_MAX_BYTES`).
    seed : int, optional
        Seeds the sample.
    progress : callable, optional
        Called as ``progress(name, done, total)`` after each field.
    image_frames : int, optional
        The most frames an image field is summarised from (default :data:`IMAGE_FRAMES`).

    Returns
    -------
    dict of str to FieldStats
        In schema order; a ragged field's list lengths under its ``lengths``.

    Raises
    ------
    UnknownColumnError
        A name in ``fields`` the table has no dense or ragged field for.

    Notes
    -----
    Cost: one read per field of the records summarised; sorting them for the quantiles
    (integer fields of a small range, images and bools: one count of their values).
    """
    view = table_view(table)
    names = _field_names(view, fields)
    schema = view.schema
    n = len(view)
    nnz: dict[str, int] = {}
    for fr in view.fragments:
        for off, v in fr.nnz.items():
            nnz[off] = nnz.get(off, 0) + int(v)
    out: dict[str, FieldStats] = {}
    for done, name in enumerate(names, 1):
        f = schema.field(name)
        rng = np.random.default_rng([seed, done])
        if isinstance(f, Ragged):
            item = f.dtype.itemsize
            total = nnz.get(f.offsets, 0) * item
            k = n if total <= max_bytes else max(1, int(n * max_bytes / max(total, 1)))
            rows = _sample_rows(view, n, k, rng)
            cols = view.read_columns(rows, [name])
            values, offsets = cols[name], cols[f.offsets]
            lengths = _stats_of(f.offsets, np.dtype(np.int64), (), "dense", np.diff(offsets), len(rows), k < n)
            out[name] = _stats_of(name, f.dtype, (), "ragged", values, len(rows), k < n, lengths, offsets)
        else:
            assert isinstance(f, Dense)
            shape = tuple(f.shape)
            per = max(1, f.dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
            kind = "image" if is_image(f) else "dense"
            k = min(n, max(1, max_bytes // per))
            if kind == "image":
                k = min(k, image_frames)
            rows = _sample_rows(view, n, k, rng)
            values = view.read_columns(rows, [name])[name]
            out[name] = _stats_of(name, f.dtype, shape, kind, values, len(rows), k < n)
        if progress is not None:
            progress(name, done, len(names))
    return out


def _q_key(q: float) -> str:
    return f"q{round(q * 100):02d}"


def lerobot_stats(stats: Mapping[str, FieldStats]) -> dict[str, dict[str, list[Any]]]:
    """The statistics in the layout of a LeRobot dataset's ``meta/stats.json``.

    Each field becomes one feature under its own name (a nested leaf under its flat name,
    ``obs__image``), with ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantiles
    ``q01``, ``q10``, ``q50``, ``q90``, ``q99``. Shapes are LeRobot's: per dimension for
    vectors (a scalar field as ``(1,)``), ``(C, 1, 1)`` for images (values in [0, 1]);
    ``count`` is ``(1,)``: the records the statistics were taken from. A ragged field's list
    lengths appear as a feature named after its offsets array.

    Parameters
    ----------
    stats : mapping of str to FieldStats
        From :func:`field_stats`.

    Returns
    -------
    dict of str to dict of str to list
        JSON-ready: lists of floats (``None``, JSON ``null``, where a statistic has no value:
        no finite value was seen), ``count`` a list of one int.
    """
    out: dict[str, dict[str, list[Any]]] = {}

    def put(name: str, s: FieldStats) -> None:
        def shaped(a: np.ndarray) -> list[Any]:
            a = np.asarray(a, dtype=np.float64)
            if s.kind == "image":
                a = a.reshape(-1, 1, 1)
            elif a.ndim == 0:
                a = a.reshape(1)
            values: list[Any] = np.where(np.isnan(a), None, a).tolist()  # type: ignore[call-overload]
            return values

        doc = {"min": shaped(s.min), "max": shaped(s.max), "mean": shaped(s.mean), "std": shaped(s.std),
               "count": [int(s.rows)]}
        for q, v in s.quantiles.items():
            doc[_q_key(q)] = shaped(v)
        out[name] = doc

    for name, s in stats.items():
        put(name, s)
        if s.lengths is not None:
            put(s.lengths.name, s.lengths)
    return out
