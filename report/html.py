"""The self-contained HTML report of a store: ``replaystore report``, ``Store.report`` and :func:`build_report`.

One file that needs nothing at view time: the style is inline, plots are inline SVG (matplotlib,
text kept as text), frames inline PNG (pillow), and there is no script. Its sections, in
order (each a ``<section id=...>``, listed in :data:`SECTIONS`):

``summary``
    The store: schema, records, streams, episodes, writers, commits and their time span, size
    on disk as ``du`` counts it, capacity, state slots (:func:`~replaystore.report.summary.summary_html`).
``streams``
    Per stream: records, steps, gaps, episodes, open episodes, mean/min/max return and length
    (the first :data:`MAX_STREAM_ROWS` streams; the rest counted).
``episodes``
    Histograms of the returns and lengths of whole episodes, and the learning curve: returns
    over the commit time of each episode's end, a line per stream (past
    :data:`~replaystore.report.plots.MAX_LINES` streams: the streams with most episodes and the
    mean of all).
``fields``
    Per field: count, min, max, mean, std and quantiles, per dimension for small vectors and per channel for images, as
    ``field_stats`` gives them (nested leaves under their column names).
``health``
    The data-health findings (NaN/Inf, step gaps, truncated and unfinished episodes, constant
    fields, jumps of orders of magnitude).
``frames``
    Frame strips of the image fields (:mod:`replaystore.report.frames`).
``samplers``
    Saved sampler states: where each stands, a prioritized sampler's priority histogram
    (:mod:`replaystore.report.samplers`).
``commits``
    Rows committed over time per writer, and a table of each writer's commits.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from replaystore import __version__
from replaystore.report import frames, plots, samplers, summary
from replaystore.report.markup import duration, esc, note, num, size, stream_key, table, utc
from replaystore.store import Store, Table

SECTIONS = ("summary", "streams", "episodes", "fields", "health", "frames", "samplers", "commits")
"""The ids of the report's sections, in page order."""
TITLES = {"summary": "Summary", "streams": "Streams", "episodes": "Episodes", "fields": "Fields",
          "health": "Data health", "frames": "Frames", "samplers": "Samplers", "commits": "Commits"}
MAX_STREAM_ROWS = 50
"""The streams table shows at most this many streams (the first, in key order: ints numerically, strings
naturally, ``env2`` before ``env10``)."""
MAX_WRITER_ROWS = 200
"""The writers table shows at most this many writers."""
HISTORY_COMMITS = 2_000
"""The commits section reads the commit history (``Store.commits()``, a storage read per commit the first
time) only for stores of at most this many commits; past it, the table's fragments tell the commits whose
records it holds."""
MAX_FINDINGS = 200
"""The health table shows at most this many findings (the worst first)."""
MAX_FIELD_ROWS = 400
"""The fields table shows at most this many rows (fields and dimensions)."""
OPEN_DIMENSIONS = 8
"""A field's per-dimension rows are shown under its summary row up to this many; past it they are
folded into a ``<details>`` element (one click opens them)."""
QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

STYLE = """<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d28;background:#fafafd}
header{background:#263056;color:#fff;padding:14px 28px}
header h1{margin:0 0 4px 0;font-size:22px}
header p{margin:0;font-size:13px;opacity:.85}
nav{padding:6px 28px;background:#e8eaf4;font-size:14px;position:sticky;top:0;z-index:2}
nav a{margin-right:14px;color:#263056;text-decoration:none}
main{padding:8px 28px 40px 28px;max-width:1400px}
section{margin-top:18px}
h2{border-bottom:2px solid #263056;padding-bottom:3px;font-size:19px}
h3{font-size:15px;margin:14px 0 4px 0}
table{border-collapse:collapse;margin:.3em 0 .8em 0;font-size:13px}
th,td{border:1px solid #ccd;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#eef}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:2px 0}
.note{color:#555;font-size:13px}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:12px;margin:6px 0 10px 0}
figure.plot{margin:0;background:#fff;border:1px solid #dde;padding:4px;min-width:0}
figure.plot.wide{grid-column:1/-1}
div.slot>figure.plot{max-width:calc(50% - 6px);box-sizing:border-box}
figure.plot svg{width:100%;height:auto;display:block}
tr.field td{border-top:2px solid #99a}
table.fields td:first-child{white-space:nowrap}
tr.dim td:first-child{padding-left:22px;color:#444}
tr.dims>td{padding:0 0 0 14px;border-top:none}
tr.dims details>summary{cursor:pointer;font-size:12px;color:#263056;padding:2px 0}
tr.dims table{margin:0 0 4px 0;font-size:12px}
.strip{margin:4px 0 10px 0}
.strip-label{margin:2px 0;font-size:12px;color:#333}
figure.frame{display:inline-block;margin:0 8px 0 0;text-align:center;font-size:11px;color:#555}
figure.frame img{height:128px;image-rendering:pixelated;border:1px solid #bbc;display:block}
tr.sev-error td{background:#fde2e2}
tr.sev-warning td{background:#fff3d6}
tr.sev-info td{background:#eef6ff}
pre{font-size:12px;max-height:20em;overflow:auto;background:#f0f0f6;padding:4px}
footer{padding:10px 28px;font-size:12px;color:#666}
</style>"""


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`build_report` wrote.

    Attributes
    ----------
    path : str
        The HTML file.
    bytes : int
        Its size.
    seconds : float
        The time it took to build and write.
    sections : tuple of str
        The ids of its sections, in page order (:data:`SECTIONS`).
    """

    path: str
    bytes: int
    seconds: float
    sections: tuple[str, ...]

    def __str__(self) -> str:
        """One human line: the path, its size and the build time."""
        return f"wrote {self.path} ({size(self.bytes)}) in {self.seconds:.1f} s"


def _data() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The data layer: ``episodes_of``, ``stream_summaries``, ``field_stats`` and ``health``."""
    from replaystore.report.episodes import episodes_of, stream_summaries
    from replaystore.report.health import health
    from replaystore.report.stats import field_stats

    return episodes_of, stream_summaries, field_stats, health


# -- sections -------------------------------------------------------------------------------
def streams_html(rows: Sequence[Any]) -> str:
    """The per-stream table, streams in key order (at most :data:`MAX_STREAM_ROWS` streams).

    Parameters
    ----------
    rows : sequence of StreamSummary
        ``stream_summaries(table, episodes)``.

    Returns
    -------
    str
        The table, and a note of the streams left out.
    """
    if not rows:
        return note("No records.")
    rows = sorted(rows, key=lambda r: stream_key(r.stream))
    shown = rows[:MAX_STREAM_ROWS]
    body = [[esc(s.stream), num(s.records), f"{num(s.first_step)}–{num(s.last_step)}", num(s.gaps),
             num(s.episodes), num(s.open), num(s.return_mean), num(s.return_min), num(s.return_max),
             num(s.length_mean), num(s.length_min), num(s.length_max)] for s in shown]
    out = table(["stream", "records", "steps", "gaps", "episodes", "open", "return mean", "return min",
                 "return max", "length mean", "length min", "length max"], body, cls="streams")
    if len(rows) > len(shown):
        out += note(f"{len(rows) - len(shown):,} more streams not shown ({len(rows):,} in all; "
                    f"the first {len(shown)} in key order are).")
    return out


def _time_axis(seconds: np.ndarray) -> tuple[np.ndarray, str]:
    """Seconds since the first value, in the unit that fits their span, and its label."""
    if not len(seconds):
        return seconds, "time"
    rel = seconds - np.nanmin(seconds)
    span = float(np.nanmax(rel))
    for unit, div in (("s", 1.0), ("min", 60.0), ("h", 3600.0), ("days", 86400.0)):
        if span < 120 * div or unit == "days":
            return rel / div, f"commit time ({unit} since the first)"
    return rel, "commit time (s)"  # (never reached)


def learning_curve(episodes: Any) -> str:
    """Returns of whole episodes over their end's commit time: the mean per stream, and the min–max band of all.

    Each stream's line is the mean return of its episodes that ended at each commit time (in
    bins past :data:`~replaystore.report.plots.MAX_POINTS` times); a grey band under the lines
    spans the least to the greatest return of every stream's episodes at that time. A
    two-player zero-sum stream, whose episodes cancel two by two, has a flat mean and shows
    its spread in the band; one band, not one per stream, so that the lines stay readable. Past
    :data:`~replaystore.report.plots.MAX_LINES` streams: the 4 with most episodes, and the mean
    of all. Streams are in key order (ints numerically, strings naturally).

    Parameters
    ----------
    episodes : Episodes
        The table's episodes.

    Returns
    -------
    str
        The ``<svg>`` element (wide: a row of its own). When every episode ended in one commit
        (one time), the x axis is the episode's number in its stream instead.
    """
    whole = np.asarray(episodes.whole)
    ret = np.asarray(episodes.ret, np.float64)[whole]
    when = np.asarray(episodes.end_time, np.float64)[whole]
    streams = list(np.asarray(episodes.stream, dtype=object)[whole])
    keys = sorted(set(streams), key=stream_key)
    slot = {k: i for i, k in enumerate(keys)}
    inverse = np.fromiter((slot[k] for k in streams), dtype=np.int64, count=len(streams))
    x, xlabel = _time_axis(when)
    integer_x = False
    if len(x) and float(np.nanmax(x)) == 0.0:  # one commit: the episode's number in its stream
        x = np.zeros(len(ret))
        for k in range(len(keys)):
            at = np.flatnonzero(inverse == k)
            x[at] = np.arange(len(at))
        xlabel = "episode (in its stream)"
        integer_x = True
    counts = np.bincount(inverse, minlength=len(keys)) if len(keys) else np.zeros(0, np.int64)
    if len(keys) <= plots.MAX_LINES:
        chosen, mean = list(range(len(keys))), None
    else:
        chosen = sorted(int(k) for k in np.argsort(-counts, kind="stable")[:4])
        mean = (x, ret)
    series = [(f"stream {keys[k]}", x[inverse == k], ret[inverse == k]) for k in chosen]
    what = "episode" if integer_x else "commit time"
    title = (f"return per {what}: mean per stream, min–max of all" +
             (f" ({len(keys):,} streams: 4 with most episodes, and all)" if mean is not None else ""))
    return plots.lines(series, title, xlabel, "return", mean=mean, band=True, integer_x=integer_x, wide=True)


def episodes_html(episodes: Any) -> str:
    """The episodes section: return and length histograms and the learning curve.

    Parameters
    ----------
    episodes : Episodes
        The table's episodes.

    Returns
    -------
    str
        Three ``<figure class="plot">`` (a note instead when there are no whole episodes).
    """
    if not len(episodes):
        return note("No episodes: the schema has no end flag (terminated, truncated or dones) or the "
                    "table no records.")
    whole = np.asarray(episodes.whole)
    n = int(whole.sum())
    lead = note(f"{len(episodes):,} episodes, {n:,} whole (begun and ended in the table): "
                "the plots show the whole ones.")
    if not n:
        return lead + note("No whole episode to plot yet.")
    ret = np.asarray(episodes.ret, np.float64)[whole]
    length = np.asarray(episodes.length)[whole]
    figs = []
    if np.isfinite(ret).any():
        figs.append(("returns", plots.histogram(ret, f"episode return ({n:,} episodes)", "return")))
    figs.append(("lengths", plots.histogram(length, f"episode length ({n:,} episodes)", "records",
                                            integer=True)))
    if np.isfinite(ret).any():
        figs.append(("learning-curve", learning_curve(episodes)))
    return lead + '<div class="plots">' + "".join(
        f'<figure class="plot{" wide" if name == "learning-curve" else ""}" data-plot="{name}">{s}</figure>'
        for name, s in figs) + "</div>"


def _flat(value: Any) -> np.ndarray:
    return np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()


def _index(d: int, shape: tuple[int, ...], n: int) -> str:
    if len(shape) > 1 and int(np.prod(shape)) == n:
        return ", ".join(str(int(i)) for i in np.unravel_index(d, shape))
    return str(d)


def _cells(s: Any, d: int | None) -> list[str]:
    """The min, max, mean, std and quantile cells of dimension ``d`` of ``s`` (None: its only values)."""
    def at(a: Any) -> Any:
        flat = _flat(a)
        return flat[d] if d is not None and len(flat) > d else (flat[0] if d is None and len(flat) else None)

    return [num(at(s.min)), num(at(s.max)), num(at(s.mean)), num(at(s.std)),
            *(num(at(s.quantiles[q])) if q in s.quantiles else "–" for q in QUANTILES)]


def _records(s: Any) -> str:
    return num(s.rows) + (" (sample)" if s.sampled else "")


def _field_label(name: str, s: Any) -> str:
    values = int(np.prod(tuple(s.shape), dtype=np.int64))
    if s.kind == "image":
        return f"{name} (pixels in [0, 1])"
    if values > 1 and s.kind == "dense":
        return f"{name} (all {values:,} values)"
    return name


def _field_rows(name: str, s: Any) -> tuple[list[list[str]], list[list[str]]]:
    """One field's summary row (over all its values) and its per-dimension (per-channel) rows.

    The summary row has every column; a dimension's row has its own min, max, mean, std and
    quantiles, its records read (those of the field), and its count, NaN and Inf where they are
    known per dimension (the field has no NaN or Inf: each dimension counts the same values).
    """
    overall = getattr(s, "overall", None)
    top = overall if overall is not None else s
    head = [esc(_field_label(name, s)), esc(s.kind), esc(s.dtype), num(s.count), _records(s), *_cells(top, None),
            num(s.nan), num(s.inf)]
    if overall is None:
        return [head], []
    dims = len(_flat(s.mean))
    clean = not s.nan and not s.inf
    shape = tuple(s.shape)
    dim_rows = []
    for d in range(dims):
        label = f"{name} channel {d}" if s.kind == "image" else f"{name}[{_index(d, shape, dims)}]"
        dim_rows.append([esc(label), "", "", num(s.count // dims) if clean else "–", _records(s), *_cells(s, d),
                         "0" if clean else "–", "0" if clean else "–"])
    return [head], dim_rows


def _tr(cells: Sequence[str], cls: str) -> str:
    return f'<tr class="{cls}">' + "".join(
        f'<td{" class=num" if i >= 3 else ""}>{c}</td>' for i, c in enumerate(cells)) + "</tr>"


def fields_html(stats: dict[str, Any]) -> str:
    """The per-field statistics table: a row per field over all its values, its dimensions under it.

    Parameters
    ----------
    stats : dict of str to FieldStats
        ``field_stats(table)``: per dimension for small vectors, per channel for images, else
        over every value of the field.

    Returns
    -------
    str
        The table. Each field has a summary row (``<tr class="field">``) over all its values,
        with every column; a field summarised per dimension or channel has a row per dimension
        under it (``<tr class="dim">``), up to :data:`OPEN_DIMENSIONS` of them, past that folded
        into a ``<details>`` element in a row of its own (``<tr class="dims">``). A ragged
        field has a row of its list lengths too. At most :data:`MAX_FIELD_ROWS` rows (fields and
        dimensions), with a note.
    """
    if not stats:
        return note("No field statistics.")
    header = ["field", "kind", "dtype", "count", "records read", "min", "max", "mean", "std",
              *(f"q{round(q * 100):02d}" for q in QUANTILES), "nan", "inf"]
    head = "".join(f'<th{" class=num" if i >= 3 else ""}>{esc(h)}</th>' for i, h in enumerate(header))
    body: list[str] = []
    shown = total = 0
    for name, s in stats.items():
        parts = [(name, s)] + ([(f"{name} (list length)", s.lengths)] if getattr(s, "lengths", None) is not None
                               else [])
        for label, stat in parts:
            top, dims = _field_rows(label, stat)
            total += 1 + len(dims)
            if shown >= MAX_FIELD_ROWS:
                continue
            body.append(_tr(top[0], "field"))
            shown += 1
            dims = dims[:max(0, MAX_FIELD_ROWS - shown)]
            shown += len(dims)
            if len(dims) <= OPEN_DIMENSIONS:
                body += [_tr(r, "dim") for r in dims]
            else:
                inner = "".join(_tr(r, "dim") for r in dims)
                body.append(f'<tr class="dims"><td colspan="{len(header)}"><details data-field="{esc(label)}">'
                            f"<summary>{len(dims):,} dimensions of {esc(label)}</summary>"
                            f'<table class="dims"><thead><tr>{head}</tr></thead><tbody>{inner}</tbody></table>'
                            f"</details></td></tr>")
    out = f'<table class="fields"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    if total > shown:
        out += note(f"{total - shown:,} more rows not shown (replaystore stats writes them all).")
    return out + note("Each field's first row is over all its values; the rows under it are per dimension "
                      "(per channel for images), folded past "
                      f"{OPEN_DIMENSIONS} dimensions. count: finite values counted; NaN and Inf are left out of the "
                      "statistics and counted apart. Large fields are summarised from a seeded sample of records "
                      "(records read).")


def health_html(findings: Sequence[Any]) -> str:
    """The data-health findings as a table, worst first.

    Parameters
    ----------
    findings : sequence of Finding
        ``health(table, stats, episodes)``.

    Returns
    -------
    str
        The table (at most :data:`MAX_FINDINGS` rows); a note when nothing was found.
    """
    if not findings:
        return note("No findings: no NaN or Inf, no step gaps, no unfinished or truncated episodes worth "
                    "a note, no constant fields, no jumps of orders of magnitude.")
    ordered = sorted(findings, key=lambda f: SEVERITY_ORDER.get(str(f.severity), 9))
    more = note(f"{len(ordered) - MAX_FINDINGS:,} more findings not shown.") if len(ordered) > MAX_FINDINGS else ""
    ordered = ordered[:MAX_FINDINGS]
    rows = "".join(
        f'<tr class="sev-{esc(f.severity)}"><td>{esc(f.severity)}</td><td>{esc(f.check)}</td><td>{esc(f.subject)}</td>'
        f'<td class="num">{num(f.count)}</td><td>{esc(f.message)}</td></tr>' for f in ordered)
    return ('<table class="health"><thead><tr><th>severity</th><th>check</th><th>subject</th>'
            f'<th class="num">count</th><th>finding</th></tr></thead><tbody>{rows}</tbody></table>{more}')


def _rows_added(commit: dict[str, Any], table_name: str) -> int:
    appends = commit.get("tables", {}).get(table_name, {}).get("appends", [])
    return int(sum(a["rows"][1] - a["rows"][0] for a in appends))


def commit_records(tab: Table, store: Store | None, commits: int | None) -> tuple[list[dict[str, Any]], bool]:
    """Each commit's writer, time, kind and rows added to ``tab``: from the history, or the table's fragments.

    Parameters
    ----------
    tab : Table
        The table whose rows are counted.
    store : Store or None
        Its store; None when only the table was given.
    commits : int or None
        The store's commit count (``Store.info()["commits"]``).

    Returns
    -------
    tuple of (list of dict, bool)
        ``{"writer", "time_ns", "kind", "rows"}`` per commit, oldest first, and whether they
        are the whole history. ``Store.commits()`` is read when the store has at most
        :data:`HISTORY_COMMITS` commits (its first read costs a storage read per commit);
        otherwise, and for a table alone, the commits come from the visible fragments'
        ``parts`` (no storage read): the appends whose records the table still holds, without
        compactions.
    """
    if store is not None and commits is not None and commits <= HISTORY_COMMITS:
        return [{"writer": int(c["writer"]), "time_ns": int(c["time_ns"]), "kind": c.get("kind"),
                 "rows": _rows_added(c, tab.name) if c.get("kind") == "append" else 0} for c in store.commits()], True
    by: dict[tuple[int, int], dict[str, Any]] = {}
    for frag in tab.view().fragments:
        for seq, time_ns, rows in frag.parts:
            rec = by.setdefault((frag.writer, int(seq)), {"writer": int(frag.writer), "time_ns": int(time_ns),
                                                          "kind": "append", "rows": 0})
            rec["rows"] += int(rows)
    return sorted(by.values(), key=lambda r: (r["time_ns"], r["writer"])), False


def commits_html(commits: Sequence[dict[str, Any]], table_name: str, history: bool = True) -> str:
    """Rows committed over time per writer, and a table of each writer's commits.

    Parameters
    ----------
    commits : sequence of dict
        :func:`commit_records`' records.
    table_name : str
        The table whose rows are counted.
    history : bool, optional
        Whether they are the whole commit history (else the appends the table's fragments
        hold: a note says so and compactions are not counted).

    Returns
    -------
    str
        A ``<figure class="plot">`` (cumulative rows per writer over commit time; past
        :data:`~replaystore.report.plots.MAX_LINES` writers the 4 largest and the total; when
        the appends all have one time, a single append, over the commits' numbers) and a table of
        each writer's commits, compactions, rows added and first and last append.
    """
    if not commits:
        return note("No commits.")
    times = np.array([c["time_ns"] / 1e9 for c in commits])
    x, xlabel = _time_axis(times)
    kinds = np.array([c["kind"] for c in commits], dtype=object)
    one_time = len(np.unique(x[kinds == "append"])) <= 1
    if one_time:  # the appends at one time (one append, and the close's compaction): number the commits
        x = np.argsort(np.argsort(times, kind="stable"), kind="stable").astype(np.float64) + 1  # rank in time
        xlabel = "commit (in order)"
    writer = np.array([c["writer"] for c in commits], dtype=np.int64)
    added = np.array([c["rows"] for c in commits], dtype=np.int64)
    compact = np.array([c["kind"] == "compact" for c in commits], dtype=bool)
    ws = sorted(set(writer.tolist()))
    totals = {w: int(added[writer == w].sum()) for w in ws}
    chosen = ws if len(ws) <= plots.MAX_LINES else sorted(ws, key=lambda w: -totals[w])[:4]
    order = np.argsort(x, kind="stable")
    series = [(f"writer {w}", x[order][writer[order] == w], np.cumsum(added[order][writer[order] == w]))
              for w in chosen]
    total = (x[order], np.cumsum(added[order])) if len(ws) > 1 else None
    writers = f"{len(ws):,} writer{'s' if len(ws) != 1 else ''}"
    fig = plots.lines(series, f"rows committed to {table_name!r} per writer ({writers})", xlabel,
                      "rows (cumulative)", mean=total, steps=True, integer_x=one_time)
    rows = []
    for w in ws:
        mine = writer == w
        appended = times[mine & ~compact]  # appends only: the same whether from the history or the fragments
        rows.append([num(w), num(int(mine.sum())), num(int(compact[mine].sum())) if history else "–", num(totals[w]),
                     esc(utc(float(appended.min()))) if len(appended) else "–",
                     esc(utc(float(appended.max()))) if len(appended) else "–"])
    tab = table(["writer", "commits", "compactions", "rows added", "first append", "last append"],
                rows[:MAX_WRITER_ROWS], cls="writers", numeric_from=1, text_from=4)
    if len(rows) > MAX_WRITER_ROWS:
        tab += note(f"{len(rows) - MAX_WRITER_ROWS:,} more writers not shown.")
    lead = "" if history else note(
        f"Over {HISTORY_COMMITS:,} commits (or a table alone): these are the appends whose records the table "
        "still holds, read from its fragments, not the whole commit history (Store.commits()); compactions "
        "are not counted.")
    return f'{lead}<div class="plots"><figure class="plot" data-plot="commits">{fig}</figure></div>{tab}'


# -- the page -------------------------------------------------------------------------------
def _name(store: Store | Table) -> str:
    if isinstance(store, Store):
        return store_name(store.url)
    return store.name


def store_name(url: str) -> str:
    """A store's name for titles and file names: the last part of its URL's path (``memory://a/b``: ``b``).

    Parameters
    ----------
    url : str
        The store's URL.

    Returns
    -------
    str
        The name (``store`` when the URL has no path).
    """
    tail = url.split("://", 1)[-1].rstrip("/\\")
    return os.path.basename(tail.replace("\\", "/")) or "store"


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced by an object without isatty, or closed
        return False


def build_report(store_or_table: Store | Table, path: str | os.PathLike[str], *, table: str | None = None,
                 progress: bool | None = None) -> ReportSummary:
    """Write the self-contained HTML report of a store (or of one of its tables).

    Parameters
    ----------
    store_or_table : Store or Table
        What to report on. A ``Table`` has no size, commit history or state slots of its own:
        the summary leaves those out, the samplers section says so and the commits section
        shows the appends its fragments hold.
    path : str or path-like
        The HTML file to write (replaced if it exists; written whole or not at all).
    table : str, optional
        The table of a store with several (default: the store's only table).
    progress : bool, optional
        A progress bar of the sections on stderr, drawn only when stderr is a terminal (as
        the other long calls draw theirs): None (default) and True draw it there, False never.

    Returns
    -------
    ReportSummary
        The path, its size in bytes, the seconds it took and the sections written.

    Raises
    ------
    StoreError
        ``table`` names no table of the store, or the store has several tables and none is named.
    OSError
        The file cannot be written (its folder is missing, no permission).

    Notes
    -----
    Cost: the data layer's passes over the table (episodes: the end flags and rewards; field
    statistics: every field once, large ones sampled), ``Store.info()`` (a walk of the store's
    objects), the commit history when it has at most :data:`HISTORY_COMMITS` commits, each state slot,
    a few records per image field, and a dozen small plots. The page stays within a few MB
    whatever the store's size: lines are binned, tables capped, frames few.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from replaystore.schemas import transitions
    >>> from replaystore.store import open_store
    >>> doc_store = open_store("memory://doc-report", transitions(obs_shape=2), mode="x")
    >>> with doc_store.writer() as w:
    ...     _ = w.append({"obs": np.zeros((3, 2), np.float32), "action": np.arange(3),
    ...                   "reward": np.ones(3, np.float32), "next_obs": np.zeros((3, 2), np.float32),
    ...                   "terminated": np.array([False, False, True])}, stream=0)
    >>> with tempfile.TemporaryDirectory() as where:
    ...     out = build_report(doc_store, f"{where}/report.html", progress=False)
    >>> out.sections[0], out.bytes > 0
    ('summary', True)
    """
    started = time.perf_counter()
    store: Store | None = store_or_table if isinstance(store_or_table, Store) else None
    if store is not None:
        tab = store.table(table) if table is not None else store.default
    else:
        assert isinstance(store_or_table, Table)
        tab = store_or_table
        if table is not None and table != tab.name:
            from replaystore.errors import StoreError

            raise StoreError(f"table {table!r}: a Table was given, named {tab.name!r}")
    episodes_of, stream_summaries, field_stats, health = _data()
    show = progress is not False and _on_terminal()
    parts: dict[str, str] = {}
    fields = len(tab.schema.record_names)  # field_stats reports each field it has summarised
    with tqdm(total=len(SECTIONS) + 3 + fields, desc="report", unit="step", leave=False, disable=not show) as bar:
        def step(what: str) -> None:
            bar.set_postfix_str(what, refresh=False)
            bar.update(1)

        episodes = episodes_of(tab)
        step("episodes")
        stats = field_stats(tab, progress=lambda name, done, total: step(f"statistics of {name}"))
        findings = health(tab, stats, episodes)
        step("health")
        info = store.info() if store is not None else None
        commits, history = commit_records(tab, store, info["commits"] if info is not None else None)
        parts["summary"] = summary.summary_html(store if store is not None else tab, tab.name, episodes=episodes,
                                                commits=commits, info=info, cap=False)
        step("summary")
        parts["streams"] = streams_html(stream_summaries(tab, episodes))
        step("streams")
        parts["episodes"] = episodes_html(episodes)
        step("episode plots")
        parts["fields"] = fields_html(stats)
        step("fields")
        parts["health"] = health_html(findings)
        step("health")
        kinds = {n: str(getattr(s, "kind", "")) for n, s in stats.items()}
        parts["frames"] = frames.frames_html(tab, episodes, frames.image_fields(tab.schema, kinds))
        step("frames")
        parts["samplers"] = (samplers.samplers_html(store) if store is not None else
                             note("A Table was given: sampler state lives in the store (Store.report)."))
        step("samplers")
        parts["commits"] = commits_html(commits, tab.name, history)
        step("commits")
        name = _name(store if store is not None else tab)
        when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        nav = "".join(f'<a href="#{s}">{TITLES[s]}</a>' for s in SECTIONS)
        body = "".join(f'<section id="{s}"><h2>{TITLES[s]}</h2>{parts[s]}</section>' for s in SECTIONS)
        seconds = time.perf_counter() - started
        page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>replaystore report: {esc(name)}</title>{STYLE}</head><body>"
                f"<header><h1>replaystore report: {esc(name)}</h1><p>table {esc(tab.name)} · {num(len(tab))} records"
                f" · generated {esc(when)} by replaystore {esc(__version__)}</p></header>"
                f"<nav>{nav}</nav><main>{body}</main>"
                f"<footer>Built in {esc(duration(seconds))}. Self-contained: no script, no network; plots are SVG, "
                f"frames PNG.</footer></body></html>\n")
        data = page.encode("utf-8")
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError as exc:  # name the file asked for, not the temporary one
            raise type(exc)(exc.errno, exc.strerror, str(target)) from None
        finally:
            tmp.unlink(missing_ok=True)
        step("written")
    return ReportSummary(str(target), len(data), time.perf_counter() - started, SECTIONS)
