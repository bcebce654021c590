"""The summary table of a store: the report's first section and the store's notebook view (``_repr_html_``).

:func:`summary_html` lists what a store is: its schema (fields, kind, dtype, shape, codec),
records, streams, episodes, writers, commits and their time span, size on disk as ``du``
counts it (``Store.info()["bytes"]``), capacity and state slots.

In a notebook (``Store._repr_html_``) it must be cheap: it reads ``Store.info()`` (a walk of the
store's objects), counts episodes only for a table of at most :data:`REPR_EPISODE_RECORDS`
records (their end flags are read; past that the row says so and ``Store.report`` has the
figures) and takes the time span of the commits from the tables' fragments (the commits whose
records they hold: no storage read), never from the commit history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from replaystore.report.markup import duration, esc, num, size, table, utc
from replaystore.schemas import BatchMeta, Dense, Ragged, Schema
from replaystore.store import Store, Table

REPR_EPISODE_RECORDS = 100_000
"""The notebook summary counts episodes only in tables of at most this many records."""
MAX_SCHEMA_ROWS = 300
"""The schema table lists at most this many fields (a note counts the rest)."""
METADATA_CHARS = 4_000
"""Schema metadata longer than this (as indented JSON) is cut, with a note."""

STYLE = """<style>
.replaystore-summary table{border-collapse:collapse;margin:.3em 0 .8em 0;font-size:13px}
.replaystore-summary th,.replaystore-summary td{border:1px solid #ccd;padding:2px 8px;text-align:left}
.replaystore-summary th{background:#eef}
.replaystore-summary td.num,.replaystore-summary th.num{text-align:right}
.replaystore-summary pre{font-size:12px;max-height:20em;overflow:auto;background:#f6f6fa;padding:4px}
</style>"""


def schema_html(schema: Schema) -> str:
    """The schema as a table: one row per field (nested leaves under their column names).

    Parameters
    ----------
    schema : Schema
        The schema.

    Returns
    -------
    str
        A table of field, kind, dtype, shape, codec and description (the first
        :data:`MAX_SCHEMA_ROWS` fields), then the schema's metadata as indented JSON (cut at
        :data:`METADATA_CHARS` characters).
    """
    rows = []
    for f in schema.fields[:MAX_SCHEMA_ROWS]:
        if isinstance(f, Dense):
            shape = "(" + ", ".join(str(d) for d in f.shape) + ("," if len(f.shape) == 1 else "") + ")"
            rows.append([esc(f.name), "dense", esc(f.dtype.name), shape, esc(f.codec or "raw"), esc(f.description)])
        elif isinstance(f, Ragged):
            rows.append([esc(f.name), "ragged", esc(f.dtype.name), f"(var) offsets {esc(f.offsets)}", "raw",
                         esc(f.description)])
        elif isinstance(f, BatchMeta):
            rows.append([esc(f.name), "meta", "json", "one per append", "–", esc(f.description)])
    out = table(["field", "kind", "dtype", "shape", "codec", "description"], rows, cls="schema",
                caption=f"schema {schema.name} (version {schema.version})", numeric_from=99)
    if len(schema.fields) > MAX_SCHEMA_ROWS:
        out += f'<p class="note">{len(schema.fields) - MAX_SCHEMA_ROWS:,} more fields not listed.</p>'
    if schema.metadata:
        text = json.dumps(schema.metadata, indent=2, sort_keys=True, default=str)
        cut = len(text) > METADATA_CHARS
        text = text[:METADATA_CHARS] + (f"\n… ({len(text) - METADATA_CHARS:,} more characters)" if cut else "")
        out += f"<details><summary>schema metadata</summary><pre>{esc(text)}</pre></details>"
    return out


def episode_counts(episodes: Any) -> str:
    """The episodes row of the summary: how many, and how they ended.

    Parameters
    ----------
    episodes : Episodes
        The table's episodes (``replaystore.report.episodes.episodes_of``).

    Returns
    -------
    str
        ``N (T terminated, U truncated, O open)`` as markup.
    """
    end = np.asarray(episodes.end)
    n = len(end)
    parts = [f"{num(int(np.count_nonzero(end == kind)))} {kind}" for kind in ("terminated", "truncated", "open")]
    return f"{num(n)} ({', '.join(parts)})"


def commit_span(commits: Sequence[dict[str, Any]]) -> str:
    """The time span of the appends among commits: first and last append time (UTC) and the time between.

    Compactions (``kind`` ``"compact"``) are left out: they rewrite records, they add none, and
    a writer's close compacts after its last append. So the span is the same whether the commits
    come from the history (``Store.commits()``) or from the fragments (:func:`held_commits`,
    appends only), when the table still holds every append's records.

    Parameters
    ----------
    commits : sequence of dict
        Commits, each with its ``time_ns`` and, from the history, its ``kind``
        (``Store.commits()``, or :func:`held_commits`: appends, without a kind).

    Returns
    -------
    str
        The span as markup; an en dash when there are no appends.
    """
    times = [c["time_ns"] / 1e9 for c in commits if c.get("kind", "append") == "append"]
    if not times:
        return "–"
    first, last = min(times), max(times)
    return f"{esc(utc(first))} → {esc(utc(last))} ({esc(duration(last - first))})"


def held_commits(tables: Sequence[Table]) -> list[dict[str, Any]]:
    """The commits whose records the tables' visible fragments hold, read from the fragments' ``parts``.

    Parameters
    ----------
    tables : sequence of Table
        The tables.

    Returns
    -------
    list of dict
        ``{"writer", "seq", "time_ns"}`` per commit, once each. Cost: O(fragments + parts), no
        storage read.
    """
    seen: dict[tuple[int, int], int] = {}
    for t in tables:
        for frag in t.view().fragments:
            for seq, time_ns, _ in frag.parts:
                seen[(int(frag.writer), int(seq))] = int(time_ns)
    return [{"writer": w, "seq": s, "time_ns": t} for (w, s), t in seen.items()]


def summary_html(store: Store | Table, table_name: str | None = None, *, episodes: Any = None,
                 commits: Sequence[dict[str, Any]] | None = None, info: dict[str, Any] | None = None,
                 cap: bool = True) -> str:
    """The summary of a store (or of one table): schema, records, streams, episodes, writers, size, commits.

    Parameters
    ----------
    store : Store or Table
        What to summarise. A ``Table`` has no size, writers, commits or state slots of its own:
        those rows are left out.
    table_name : str, optional
        The table whose episodes are counted and whose schema is shown (default: every table's
        schema; episodes only for a single-table store).
    episodes : Episodes, optional
        The table's episodes if already computed (``episodes_of``); None: counted here, within
        the cap.
    commits : sequence of dict, optional
        The commits for the time span (each with its ``time_ns``: ``Store.commits()``); None:
        those the tables' fragments hold (:func:`held_commits`).
    info : dict, optional
        ``Store.info()`` if already read.
    cap : bool, optional
        Keep the cost bounded (the notebook view): count episodes only for tables of at most
        :data:`REPR_EPISODE_RECORDS` records. False: always count them.

    Returns
    -------
    str
        A ``<div class="replaystore-summary">`` with a small inline style, the key figures and the
        schema table(s).

    Notes
    -----
    Cost: ``Store.info()`` (a walk of the store's objects), and within the cap one read of the
    end flags (episodes).
    """
    rows: list[tuple[str, str]] = []
    if isinstance(store, Store):
        info = store.info() if info is None else info
        names = [table_name] if table_name is not None else store.tables
        tables = {n: store.table(n) for n in names}
        rows.append(("store", esc(store.url)))
        if len(store.tables) > 1:
            rows.append(("tables", esc(", ".join(store.tables))))
        for n in tables:
            prefix = f"{n}: " if len(store.tables) > 1 else ""
            rows.append((f"{prefix}records", num(info["tables"][n]["records"])))
            rows.append((f"{prefix}streams", num(info["tables"][n]["streams"])))
        one = next(iter(tables.values())) if len(tables) == 1 else None
    else:
        tables = {store.name: store}
        one = store
        rows.append(("table", esc(store.name)))
        rows.append(("records", num(len(store))))
        rows.append(("streams", num(len(store.streams()))))
    if one is not None:
        if episodes is None and (not cap or len(one) <= REPR_EPISODE_RECORDS):
            from replaystore.report.episodes import episodes_of

            episodes = episodes_of(one)
        rows.append(("episodes", episode_counts(episodes) if episodes is not None else
                     esc(f"not counted here (over {REPR_EPISODE_RECORDS:,} records: Store.report counts them)")))
    if commits is None:
        commits = held_commits(list(tables.values()))
    if not isinstance(store, Store):
        rows.append(("commits", f"{num(len(commits))} hold its records; appends {commit_span(commits)}"))
    if isinstance(store, Store):
        assert info is not None
        rows.append(("writers", f"{num(info['writers'])} ({num(info['writers_closed'])} closed)"))
        rows.append(("commits", f"{num(info['commits'])}; appends {commit_span(commits)}"))
        rows.append(("size on disk", f"{esc(size(info['bytes']))} ({num(info['bytes'])} bytes, as du counts; "
                                     f"apparent {esc(size(info['apparent_bytes']))})"))
        rows.append(("capacity", num(info["capacity"]) if info["capacity"] is not None else "none"))
        slots = info["state"]
        rows.append(("state slots", esc(", ".join(f"{s} (v{v['versions'][-1]})" for s, v in slots.items()))
                     if slots else "none"))
        rows.append(("format version", num(info["format_version"])))
    key = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    schemas = "".join(schema_html(t.schema) for t in tables.values())
    return (f'<div class="replaystore-summary">{STYLE}<table class="summary"><tbody>{key}</tbody></table>'
            f"{schemas}</div>")
