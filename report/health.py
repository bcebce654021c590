"""Data health: the defects a look at a dataset should catch before training on it.

Each check reads the statistics of :func:`replaystore.report.stats.field_stats`, the episodes
of :func:`replaystore.report.episodes.episodes_of` and the table's (stream, step) index; none
reads field data again. See :data:`CHECKS` and :func:`health` for what each one flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.report.episodes import Episodes, stream_order, table_view
from replaystore.report.stats import FieldStats

CHECKS = ("nan", "inf", "step_gaps", "truncated_share", "open_episodes", "constant", "magnitude_jump")
"""The checks :func:`health` runs, in the order it reports them."""

TRUNCATED_SHARE = 0.5
"""``truncated_share`` fires when more than this share of the ended episodes were truncated."""

OPEN_LENGTH_FACTOR = 2.0
"""``open_episodes`` fires for a stream whose trailing steps without an end flag outnumber this
many times the longest whole episode of the table."""

JUMP_FACTOR = 100.0
"""``magnitude_jump`` fires when a chunk's scale is this many times another's typical one (two
orders of magnitude)."""

OUTLIER_FACTOR = 1000.0
"""``magnitude_jump`` also fires when a field's largest magnitude is this many times its 1%/99%
quantiles' (three orders of magnitude)."""

STREAMS_NAMED = 10
"""At most this many streams get a finding each; more are summed up in one."""


@dataclass(frozen=True)
class Finding:
    """One thing a health check found.

    Attributes
    ----------
    check : str
        One of :data:`CHECKS`.
    subject : str
        What it is about: ``"field 'obs'"``, ``"stream 3"``, ``"table"``.
    severity : str
        ``"warning"`` (likely a defect) or ``"info"`` (worth knowing).
    message : str
        One sentence with the figures.
    count : int
        How many values, gaps, episodes or dimensions it counts.
    """

    check: str
    subject: str
    severity: str
    message: str
    count: int


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def _sample_note(s: FieldStats) -> str:
    return f" (a sample of {s.rows:,} records)" if s.sampled else ""


def _nonfinite(stats: Mapping[str, FieldStats]) -> list[Finding]:
    out = []
    for kind, word in (("nan", "NaN"), ("inf", "infinite")):
        for name, s in stats.items():
            n = s.nan if kind == "nan" else s.inf
            recs = s.nan_records if kind == "nan" else s.inf_records
            if n:
                out.append(Finding(kind, f"field {name!r}", "warning",
                                   f"field {name!r}: {_plural(n, word + ' value')} in {_plural(recs, 'record')}"
                                   f"{_sample_note(s)}", n))
    return out


def _gaps(table: Any) -> list[Finding]:
    order = stream_order(table_view(table))
    if not len(order.steps):
        return []
    gap = np.zeros(len(order.steps), dtype=bool)
    gap[1:] = np.diff(order.steps) != 1
    gap[order.firsts()] = False
    if not gap.any():
        return []
    at = np.flatnonzero(gap)
    sid = order.stream_ids()[at]
    missing = order.steps[at] - order.steps[at - 1] - 1  # < 0: steps out of order
    per = np.bincount(sid, minlength=len(order.keys))
    lost = np.bincount(sid, weights=np.maximum(missing, 0), minlength=len(order.keys)).astype(np.int64)
    hit = np.flatnonzero(per)
    if len(hit) > STREAMS_NAMED:
        worst = int(hit[np.argmax(per[hit])])
        total = int(per.sum())
        return [Finding("step_gaps", "table", "warning",
                        f"{_plural(len(hit), 'stream')} of {len(order.keys):,} have step gaps: "
                        f"{_plural(total, 'gap')} and {_plural(int(lost.sum()), 'missing step')} in all "
                        f"(most: stream {order.keys[worst]!r}, {_plural(int(per[worst]), 'gap')})", total)]
    return [Finding("step_gaps", f"stream {order.keys[i]!r}", "warning",
                    f"stream {order.keys[i]!r}: {_plural(int(per[i]), 'step gap')}, "
                    f"{_plural(int(lost[i]), 'missing step')}", int(per[i])) for i in hit.tolist()]


def _truncated(episodes: Episodes) -> list[Finding]:
    ended = int(np.count_nonzero(episodes.ended))
    trunc = int(np.count_nonzero(episodes.end == "truncated"))
    if not ended or trunc / ended <= TRUNCATED_SHARE:
        return []
    return [Finding("truncated_share", "table", "warning",
                    f"{trunc:,} of {_plural(ended, 'ended episode')} ({trunc / ended:.0%}) were truncated, not "
                    "terminated: their returns and lengths are cut short", trunc)]


def _open(episodes: Episodes) -> list[Finding]:
    n = len(episodes)
    if not n:
        return []
    out = []
    is_open = ~episodes.ended
    last = np.ones(n, dtype=bool)  # the last episode of its stream
    last[:-1] = episodes.stream[1:] != episodes.stream[:-1]
    cut = is_open & ~last
    if cut.any():
        k = int(np.count_nonzero(cut))
        out.append(Finding("open_episodes", "table", "warning",
                           f"{_plural(k, 'episode')} ({int(episodes.length[cut].sum()):,} records) end without a "
                           f"{'/'.join(episodes.end_flags)} flag: a reset or step gap starts the next one", k))
    whole = episodes.whole
    trailing = is_open & last
    if not episodes.ended.any():
        k = int(episodes.length.sum())
        out.append(Finding("open_episodes", "table", "info",
                           f"no episode has ended in {_plural(k, 'record')}: is the "
                           f"{'/'.join(episodes.end_flags)} flag written?", int(np.count_nonzero(trailing))))
    elif whole.any():
        longest = int(episodes.length[whole].max())
        long = trailing & (episodes.length > OPEN_LENGTH_FACTOR * longest)
        for i in np.flatnonzero(long)[:STREAMS_NAMED].tolist():
            out.append(Finding("open_episodes", f"stream {episodes.stream[i]!r}", "warning",
                               f"stream {episodes.stream[i]!r}: {int(episodes.length[i]):,} steps since its last "
                               f"episode end, over {OPEN_LENGTH_FACTOR:g} times the longest episode ({longest:,} "
                               "steps)", int(episodes.length[i])))
        rest = int(np.count_nonzero(long)) - STREAMS_NAMED
        if rest > 0:
            out.append(Finding("open_episodes", "table", "warning",
                               f"{_plural(rest, 'more stream')} run over {OPEN_LENGTH_FACTOR:g} times the longest "
                               "episode without an end", rest))
    return out


def _constant(stats: Mapping[str, FieldStats], skip: tuple[str, ...]) -> list[Finding]:
    out = []
    for name, s in stats.items():
        if name in skip or s.rows < 2 or not s.count:
            continue
        same = np.asarray(s.min == s.max).reshape(-1)
        if same.all():
            value = float(np.asarray(s.min).reshape(-1)[0])
            out.append(Finding("constant", f"field {name!r}", "info",
                               f"field {name!r}: every value is {value:g} in {_plural(s.rows, 'record')}"
                               f"{_sample_note(s)}", int(same.size)))
        elif same.any() and s.kind == "dense":
            k = int(np.count_nonzero(same))
            dims = [np.unravel_index(i, np.shape(s.min)) for i in np.flatnonzero(same)[:8].tolist()]
            shown = ", ".join(str(tuple(int(x) for x in d)) if len(d) > 1 else str(int(d[0])) for d in dims)
            more = "..." if k > 8 else ""
            out.append(Finding("constant", f"field {name!r}", "info",
                               f"field {name!r}: {_plural(k, 'dimension')} of {same.size} never "
                               f"{'changes' if k == 1 else 'change'} ({shown}{more})", k))
    return out


def _jumps(stats: Mapping[str, FieldStats], skip: tuple[str, ...]) -> list[Finding]:
    out = []
    for name, s in stats.items():
        if name in skip or s.kind == "image" or s.dtype == "bool" or not s.count:
            continue
        scales = s.chunk_scale[np.isfinite(s.chunk_scale)]
        typical = float(np.median(scales)) if len(scales) else 0.0
        if len(scales) >= 4 and typical > 0:
            hi, lo = float(scales.max()), float(scales.min())
            if hi >= JUMP_FACTOR * typical or (lo > 0 and typical >= JUMP_FACTOR * lo):
                ratio = max(hi / typical, typical / lo if lo > 0 else 0.0)
                size = s.rows // len(s.chunk_scale)
                out.append(Finding("magnitude_jump", f"field {name!r}", "warning",
                                   f"field {name!r}: the typical magnitude of its values changes {ratio:,.0f}-fold "
                                   f"between chunks of {size:,} records (from {lo:.3g} to {hi:.3g}; median "
                                   f"{typical:.3g})", int(round(ratio))))
                continue
        q = max(float(np.max(np.abs(s.quantiles[0.01]))), float(np.max(np.abs(s.quantiles[0.99]))))
        peak = max(float(np.max(np.abs(s.min))), float(np.max(np.abs(s.max))))
        if q > 0 and peak >= OUTLIER_FACTOR * q:
            out.append(Finding("magnitude_jump", f"field {name!r}", "warning",
                               f"field {name!r}: its largest magnitude {peak:.3g} is {peak / q:,.0f} times its "
                               f"1%/99% quantiles' ({q:.3g})", int(round(peak / q))))
    return out


def health(table: Any, stats: Mapping[str, FieldStats], episodes: Episodes) -> list[Finding]:
    """Run every check of :data:`CHECKS` and list what they found.

    ``nan`` / ``inf``
        A field holds NaN / infinite values (warning; figures: values and records).
    ``step_gaps``
        A stream's visible steps do not follow each other by 1: missing steps inside a
        stream (warning, one finding per stream, or one for all when more than
        :data:`STREAMS_NAMED` streams have gaps).
    ``truncated_share``
        More than :data:`TRUNCATED_SHARE` of the ended episodes were truncated (warning).
    ``open_episodes``
        Episodes without an end flag that are followed by another one of their stream (a
        reset or a step gap came first: warning); a stream's trailing steps without an end
        flag longer than :data:`OPEN_LENGTH_FACTOR` times the longest whole episode
        (warning); no episode ended at all (info).
    ``constant``
        A field (other than the end flags) whose every value read is the same, or a vector
        field with dimensions that never change (info).
    ``magnitude_jump``
        A numeric field (not bool, not an image, not an end flag) whose scale jumps by orders
        of magnitude: the records read are split into up to 16 consecutive chunks in row
        order, each with its typical magnitude (:attr:`FieldStats.chunk_scale`: the median of
        its non-zero finite absolute values); it fires when at least 4 chunks have a scale and the largest is at least
        :data:`JUMP_FACTOR` times their median, or the median at least :data:`JUMP_FACTOR`
        times the smallest non-zero one; or, failing that, when the field's largest magnitude
        (``max(|min|, |max|)``) is at least :data:`OUTLIER_FACTOR` times the larger of
        ``|q01|`` and ``|q99|`` (warning).

    Parameters
    ----------
    table : Table or TableView or Store
        The records.
    stats : mapping of str to FieldStats
        ``field_stats(table)`` (checks of fields not in it are skipped).
    episodes : Episodes
        ``episodes_of(table)``.

    Returns
    -------
    list of Finding
        In the order of :data:`CHECKS`; empty for a healthy table.

    Notes
    -----
    Cost: the table's (stream, step) index (shared with ``episodes_of``), then O(streams +
    episodes + fields).
    """
    flags = episodes.end_flags
    out = _nonfinite(stats)
    out.sort(key=lambda f: CHECKS.index(f.check))
    out += _gaps(table)
    out += _truncated(episodes)
    out += _open(episodes)
    out += _constant(stats, flags)
    out += _jumps(stats, flags)
    return out
