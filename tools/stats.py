"""``replaystore stats``: a table's per-field statistics as LeRobot's ``meta/stats.json``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from replaystore.errors import StoreError
from replaystore.schemas import Dense, Ragged
from replaystore.store import Store, Table
from replaystore.tools.formats.common import progress_bar


def stats_table(st: Store, table: str | None) -> Table:
    """The table ``replaystore stats`` summarises.

    Parameters
    ----------
    st : Store
        The open store.
    table : str, optional
        Its name; None for a single-table store's only one.

    Returns
    -------
    Table
        The table.

    Raises
    ------
    StoreError
        No ``table`` named on a store with several, or an unknown name.
    """
    if table is not None:
        return st.table(table)
    if len(st.tables) > 1:
        raise StoreError(f"this store has tables {sorted(st.tables)}: choose one with --table")
    return st.default


def stats_document(st: Store, table: str | None = None, *, progress: bool = False) -> dict[str, Any]:
    """The statistics of a store's table in LeRobot's ``meta/stats.json`` layout.

    Parameters
    ----------
    st : Store
        The open store.
    table : str, optional
        Which table (a single-table store's only one by default).
    progress : bool, optional
        Show a progress bar (one step per field) when stderr is a terminal.

    Returns
    -------
    dict
        ``replaystore.report.lerobot_stats`` of ``replaystore.report.field_stats``.

    Raises
    ------
    StoreError
        As :func:`stats_table`.
    """
    from replaystore.report import field_stats, lerobot_stats

    t = stats_table(st, table)
    fields = sum(isinstance(f, (Dense, Ragged)) for f in t.schema.fields)
    with progress_bar(fields, "stats", progress, unit="field") as bar:
        def step(name: str, done: int, total: int) -> None:
            bar.set_postfix_str(name, refresh=False)
            bar.update(1)

        stats = field_stats(t, progress=step)
    return lerobot_stats(stats)


def write_stats(doc: dict[str, Any], out: str | None) -> None:
    """Write ``doc`` as JSON (4-space indents, strict: no NaN) to ``out``, or to stdout when None.

    Parameters
    ----------
    doc : dict
        From :func:`stats_document`.
    out : str, optional
        A local file path (a user's path, never a name read from a store).

    Raises
    ------
    OSError
        ``out`` cannot be written.
    """
    text = json.dumps(doc, indent=4, allow_nan=False) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    with open(os.path.expanduser(out), "w", encoding="utf-8") as f:
        f.write(text)
