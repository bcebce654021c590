"""``replaystore info`` and ``replaystore verify``.

``info`` prints a short summary a person reads (:func:`info_text`), a JSON document for
programs (:func:`info_document`, ``--json``) or, with ``--verbose``, the summary followed by
the store's internals (fragments, column sizes and codecs, state slots, log checkpoint, chunk
cache). See docs/GUIDE.md, "Command line: info".
"""

from __future__ import annotations

import calendar
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaystore.errors import ReplayStoreError
from replaystore.report import episodes_of  # (the report's data layer: its pages count the same episodes)
from replaystore.report.episodes import reward_field
from replaystore.schemas import Dense, Ragged, Schema
from replaystore.store import Store, Table, open_store
from replaystore.store.maintenance import Problem, verify_store
from replaystore.tools.progress import progress_bar

INFO_KEYS = ("url", "format_version", "capacity", "tables_count", "records", "streams", "writers",
             "writers_closed", "commits", "first_commit", "last_commit", "bytes", "apparent_bytes",
             "log_checkpoint", "chunk_cache", "state", "commit_metadata", "tables")
"""The keys of ``replaystore info --json``'s document, in order (docs/GUIDE.md, "Command line: info")."""
TABLE_KEYS = ("schema", "version", "records", "streams", "fragments", "fields", "metadata", "columns",
              "episodes")
"""The keys of each table's entry under ``"tables"``."""
FIELD_KEYS = ("name", "kind", "dtype", "shape", "codec", "offsets")
"""The keys of each field's entry under a table's ``"fields"``."""
EPISODE_KEYS = ("episodes", "ended", "open", "terminated", "truncated", "whole", "return", "length")
"""The keys of a table's ``"episodes"`` (null when its schema has no episode end flag)."""
STAT_KEYS = ("mean", "min", "max")
"""The keys of ``"return"`` and ``"length"`` (over the whole episodes; null when there are none)."""
LIST_ITEMS = 8
"""Items of a list shown in the human summary before it is cut short."""
COMMIT_METADATA_LIMIT = 500
"""Commit metadata is read only from stores with at most this many commits (reading every commit record
costs about a millisecond each); ``--verbose`` reads it from any store."""


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def size_text(n: int) -> str:
    """A byte count as ``replaystore info`` prints it (``"1.3 MiB"``).

    Parameters
    ----------
    n : int
        Bytes.

    Returns
    -------
    str
        The size in B, KiB, MiB or GiB.
    """
    return _size(n)


# -- the document ------------------------------------------------------------------------------
def _fields(schema: Schema) -> list[dict[str, Any]]:
    out = []
    for f in schema.fields:
        if isinstance(f, Dense):
            out.append({"name": f.name, "kind": "dense", "dtype": f.dtype.name, "shape": list(f.shape),
                        "codec": f.codec, "offsets": None})
        elif isinstance(f, Ragged):
            out.append({"name": f.name, "kind": "ragged", "dtype": f.dtype.name, "shape": None, "codec": None,
                        "offsets": f.offsets})
        else:
            out.append({"name": f.name, "kind": "meta", "dtype": None, "shape": None, "codec": None,
                        "offsets": None})
    return out


def _stat(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return dict.fromkeys(STAT_KEYS)
    return {"mean": float(np.mean(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def episode_summary(table: Table) -> dict[str, Any] | None:
    """Episodes of ``table`` and their returns and lengths; None when its schema has no end flag.

    The episodes of ``replaystore.report.episodes_of`` (those of
    ``replaystore.loaders.iter_episodes(table, complete_only=False)``): an episode starts at
    a reset, after an episode end or after a step gap, and ends at a record whose
    ``terminated``, ``truncated`` or ``dones`` flag is set; the steps of a stream after its
    last end are one open episode. A return sums ``reward`` (or ``rewards``) over an episode.

    Parameters
    ----------
    table : Table
        The table.

    Returns
    -------
    dict or None
        ``episodes``, ``ended``, ``open``; ``terminated`` and ``truncated`` (the ended ones by
        how they ended: a ``terminated`` or ``dones`` flag, or only ``truncated``; ``truncated``
        is None when the schema has no such field); ``whole``
        (ended and complete: begun at a reset, at step 0 or right after an end, not cut by
        retention); ``return`` (None without a reward field) and ``length``, each
        ``mean``, ``min``, ``max`` over the whole episodes (None where there are none).

    Notes
    -----
    Cost: the table's stream index and one read of its end flag and reward columns.
    """
    ep = episodes_of(table)
    if not ep.end_flags:
        return None
    whole = ep.whole
    has_reward = reward_field(table.schema) is not None
    return {"episodes": len(ep), "ended": int(np.count_nonzero(ep.ended)),
            "open": int(np.count_nonzero(~ep.ended)),
            "terminated": int(np.count_nonzero(ep.end == "terminated")),
            "truncated": int(np.count_nonzero(ep.end == "truncated")) if "truncated" in ep.end_flags else None,
            "whole": int(np.count_nonzero(whole)),
            "return": _stat(ep.ret[whole]) if has_reward else None,
            "length": _stat(ep.length[whole])}


def _iso(time_ns: int | None) -> str | None:
    if not time_ns:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time_ns / 1e9))


def _commit_times(st: Store) -> list[int]:
    """The commit times (ns) of the visible records: their fragments' parts, no commit record read."""
    return [time_ns for name in st.tables for f in st.table(name).view().fragments
            for _, time_ns, rows in f.parts if rows and time_ns]


def _commit_metadata(st: Store) -> dict[str, Any]:
    """Each writer's newest non-empty commit metadata (key: the writer number as a string)."""
    out: dict[str, Any] = {}
    for c in st.commits():
        if c.get("metadata"):
            out[str(c.get("writer"))] = c["metadata"]
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def info_document(st: Store, *, episodes: bool = True,
                  commit_limit: int | None = COMMIT_METADATA_LIMIT) -> dict[str, Any]:
    """What ``replaystore info --json`` prints: a JSON-ready summary of store ``st``.

    Parameters
    ----------
    st : Store
        The store.
    episodes : bool, optional
        Count episodes and their returns (one read of a few columns of each table whose
        schema has an end flag); False leaves each table's ``episodes`` None.
    commit_limit : int or None, optional
        Read the commit records for ``commit_metadata`` only when the store has at most
        this many commits (None: always); otherwise ``commit_metadata`` is None.

    Returns
    -------
    dict
        The keys of :data:`INFO_KEYS`; each table's entry has :data:`TABLE_KEYS`, each of
        its fields :data:`FIELD_KEYS`, its ``episodes`` :data:`EPISODE_KEYS`. No value is
        NaN or infinite (None instead).

    Notes
    -----
    Cost: one ``Store.info`` (a listing of the store), the episodes' reads and, up to
    ``commit_limit`` commits, one read of each commit record.
    """
    info = st.info()
    times = _commit_times(st)
    tables: dict[str, Any] = {}
    for name, t in info["tables"].items():
        schema = st.schemas[name]
        tables[name] = {
            "schema": schema.name, "version": schema.version, "records": t["records"], "streams": t["streams"],
            "fragments": t["fragments"], "fields": _fields(schema), "metadata": schema.metadata,
            "columns": t.get("columns", {}),
            "episodes": episode_summary(st.table(name)) if episodes else None,
        }
    doc = {
        "url": info["url"], "format_version": info["format_version"], "capacity": info["capacity"],
        "tables_count": len(tables),
        "records": sum(t["records"] for t in tables.values()),
        "streams": sum(t["streams"] for t in tables.values()),
        "writers": info["writers"], "writers_closed": info["writers_closed"], "commits": info["commits"],
        "first_commit": _iso(min(times)) if times else None, "last_commit": _iso(max(times)) if times else None,
        "bytes": info["bytes"], "apparent_bytes": info["apparent_bytes"],
        "log_checkpoint": info["log_checkpoint"], "chunk_cache": info["chunk_cache"], "state": info["state"],
        "commit_metadata": _commit_metadata(st) if commit_limit is None or info["commits"] <= commit_limit else None,
        "tables": tables,
    }
    return _finite(doc)


# -- the human summary -------------------------------------------------------------------------
def _aligned(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = [header, ["-" * w for w in widths], *rows]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))).rstrip() for line in lines]


def _decoded(value: Any) -> Any:
    """A string holding a JSON object or array (a space, an environment spec) as its value."""
    if isinstance(value, str) and value[:1] in "{[" and value[-1:] in "}]":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value if value and value.strip() == value and "\n" not in value else json.dumps(value)
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_scalar(v) for v in value[:LIST_ITEMS])
        more = f", ... ({len(value)} items)" if len(value) > LIST_ITEMS else ""
        return f"[{shown}{more}]"
    if isinstance(value, Mapping) and not value:
        return "{}"
    return str(value)


def pretty_lines(value: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """A JSON mapping as indented ``key: value`` lines (nested mappings indented, long lists cut short).

    Strings that hold a JSON object or array (Gymnasium spaces and environment specs) are
    shown as their content.

    Parameters
    ----------
    value : mapping
        The JSON mapping (schema or commit metadata).
    indent : str, optional
        The first level's indentation; each level adds two spaces.

    Returns
    -------
    list of str
        The lines.
    """
    lines = []
    for key, item in value.items():
        item = _decoded(item)
        if isinstance(item, Mapping) and item:
            lines.append(f"{indent}{key}:")
            lines += pretty_lines(item, indent + "  ")
        elif isinstance(item, list) and any(isinstance(v, Mapping) and v for v in item):
            lines.append(f"{indent}{key}: ({len(item)} items)")
            for i, v in enumerate(item[:LIST_ITEMS]):
                if isinstance(v, Mapping) and v:
                    lines.append(f"{indent}  - [{i}]")
                    lines += pretty_lines(v, indent + "    ")
                else:
                    lines.append(f"{indent}  - {_scalar(v)}")
            if len(item) > LIST_ITEMS:
                lines.append(f"{indent}  ... {len(item) - LIST_ITEMS} more")
        else:
            lines.append(f"{indent}{key}: {_scalar(item)}")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def episode_lines(ep: Mapping[str, Any] | None) -> list[str]:
    """The human summary's lines on a table's episodes (none when it has no end flag).

    Parameters
    ----------
    ep : mapping or None
        A table's ``episodes`` entry of :func:`info_document`.

    Returns
    -------
    list of str
        Lines (without indentation): the episode count, returns and lengths.
    """
    if not ep:
        return []
    how = f" ({ep['terminated']} terminated, {ep['truncated']} truncated)" if ep["truncated"] is not None else ""
    lines = [f"episodes  {ep['episodes']}: {ep['ended']} ended{how}, {ep['open']} open"]
    ret, length = ep["return"], ep["length"]
    over = f"({ep['whole']} whole episode{'s' if ep['whole'] != 1 else ''})"
    if ret is not None and ret["mean"] is not None:
        lines.append(f"returns   mean {_num(ret['mean'])}, min {_num(ret['min'])}, max {_num(ret['max'])} {over}")
    if length["mean"] is not None:
        lines.append(f"lengths   mean {_num(length['mean'])} steps, min {_num(length['min'])}, "
                     f"max {_num(length['max'])}")
    return lines


def _span(doc: Mapping[str, Any]) -> str:
    first, last = doc["first_commit"], doc["last_commit"]
    if first is None:
        return "none"
    t0 = calendar.timegm(time.strptime(first, "%Y-%m-%dT%H:%M:%SZ"))
    t1 = calendar.timegm(time.strptime(last, "%Y-%m-%dT%H:%M:%SZ"))
    return f"{first.replace('T', ' ').rstrip('Z')} .. {last.replace('T', ' ').rstrip('Z')} UTC ({_duration(t1 - t0)})"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def info_text(doc: Mapping[str, Any]) -> str:
    """The short human summary of an :func:`info_document`.

    Parameters
    ----------
    doc : mapping
        What :func:`info_document` returned.

    Returns
    -------
    str
        Lines: the store and its format, records, writers and commits, the time span of the
        commits, the size as ``du`` counts it, the state slots' names; per table its fields as an aligned table
        (field, kind, dtype, shape, codec), its schema metadata pretty-printed and its
        episodes and returns; then each writer's newest commit metadata.
    """
    capacity = doc["capacity"] if doc["capacity"] is not None else "unbounded (a dataset)"
    tables = doc["tables"]
    lines = [
        f"store     {doc['url']}",
        f"format    version {doc['format_version']}, capacity {capacity}",
        f"records   {doc['records']} in {doc['streams']} stream{'s' if doc['streams'] != 1 else ''}"
        + (f", {len(tables)} tables" if len(tables) != 1 else ""),
        f"writers   {doc['writers']} ({doc['writers_closed']} closed), {doc['commits']} commits",
        f"commits   {_span(doc)}",
        f"size      {_size(doc['bytes'])} allocated on disk (as du counts it), {_size(doc['apparent_bytes'])} "
        "apparent",
    ]
    if doc["state"]:
        lines.append(f"state     {len(doc['state'])} slot{'s' if len(doc['state']) != 1 else ''}: "
                     + ", ".join(doc["state"]))
    for name, t in tables.items():
        lines.append("")
        lines.append(f"table {name}: schema {t['schema']} (version {t['version']}), {t['records']} records, "
                     f"{t['streams']} stream{'s' if t['streams'] != 1 else ''}")
        rows = []
        for f in t["fields"]:
            if f["kind"] == "dense":
                shape = ("(" + ", ".join(map(str, f["shape"])) + ("," if len(f["shape"]) == 1 else "") + ")"
                         if f["shape"] else "scalar")
            elif f["kind"] == "ragged":
                shape = f"variable ({f['offsets']})"
            else:
                shape = "one per append"
            rows.append([f["name"], f["kind"], f["dtype"] or "json", shape, f["codec"] or "-"])
        lines += _aligned(["field", "kind", "dtype", "shape", "codec"], rows)
        if t["metadata"]:
            lines.append("  metadata:")
            lines += pretty_lines(t["metadata"], "    ")
        lines += ["  " + line for line in episode_lines(t["episodes"])]
    if doc["commit_metadata"] is None:
        lines.append("")
        lines.append(f"commit metadata: not read ({doc['commits']} commits; --verbose reads them)")
    elif doc["commit_metadata"]:
        lines.append("")
        lines.append("commit metadata (each writer's newest):")
        for writer, meta in doc["commit_metadata"].items():
            lines.append(f"  writer {writer}:")
            lines += pretty_lines(meta, "    ")
    return "\n".join(lines)


def details_text(doc: Mapping[str, Any]) -> str:
    """``--verbose``'s internals: log checkpoint, sizes, chunk cache, state slots, fragments, column sizes.

    Parameters
    ----------
    doc : mapping
        What :func:`info_document` returned.

    Returns
    -------
    str
        The lines, after a ``internals:`` line.
    """
    checkpoint = doc["log_checkpoint"]
    lines = ["internals:",
             f"log checkpoint  {'none' if checkpoint is None else f'#{checkpoint}'}",
             f"size on disk    {_size(doc['bytes'])} allocated, {_size(doc['apparent_bytes'])} apparent"]
    cache = doc["chunk_cache"]
    if cache is not None:  # a store on S3: where this machine keeps its chunk objects
        lines.append(f"chunk cache     {cache['directory']} ({_size(cache['bytes'])} of this store here)")
    slots = doc["state"]
    lines.append(f"state slots     {len(slots) or 'none'}")
    for slot, st_info in slots.items():
        versions = st_info["versions"]
        lines.append(f"  {slot!r}: {len(versions)} version(s) {versions[0]}..{versions[-1]}, "
                     f"{_size(st_info['bytes'])}")
    for name, t in doc["tables"].items():
        lines.append(f"table {name!r}: {t['records']} records, {t['streams']} streams, {t['fragments']} fragments")
        for col, c in t["columns"].items():
            ratio = f"{c['raw'] / c['stored']:.1f}x" if c["stored"] else "-"
            lines.append(f"  {col:24s} {_size(c['stored']):>10s} stored, {_size(c['raw']):>10s} raw ({ratio}) "
                         f"codec {c['codec'] or 'none'}")
    return "\n".join(lines)


def print_info(st: Store, *, verbose: bool = False, as_json: bool = False) -> None:
    """Print ``replaystore info``'s report on store ``st``.

    Parameters
    ----------
    st : Store
        The store.
    verbose : bool, optional
        Add the internals (:func:`details_text`) after the summary.
    as_json : bool, optional
        Print :func:`info_document` as one JSON document instead.

    Notes
    -----
    Cost: :func:`info_document`.
    """
    doc = info_document(st, commit_limit=None if verbose else COMMIT_METADATA_LIMIT)
    if as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
        return
    print(info_text(doc))
    if verbose:
        print()
        print(details_text(doc))


def run_verify(url: str, storage_options: Mapping[str, Any] | None, progress: bool = True) -> int:
    """Verify the store at ``url`` and print each problem found (``replaystore verify``).

    Returns the command's exit status: 0 when the store is intact, 1 when damaged. Cost: a
    read of every live fragment. ``progress``: a bar on stderr when it is a terminal.
    """
    problems: list[Problem]
    try:
        st = open_store(url, mode="r", storage_options=storage_options)
    except ReplayStoreError as exc:
        if not getattr(exc, "path", None):
            raise
        print(f"DAMAGED {exc}")
        return 1
    total = sum(len(st.table(t).view().fragments) for t in st.tables)
    with progress_bar(total, "verify", progress, unit="fragment", scale=False) as bar:

        def advance(n: int) -> None:
            bar.update(n - bar.n)

        problems = verify_store(st, progress=advance)
    for p in problems:
        print(f"DAMAGED {p}")
    if problems:
        print(f"{len(problems)} problem(s) in {st.url}")
        return 1
    print(f"ok: {st.url} verified ({total} fragments)")
    return 0
