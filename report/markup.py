"""Small HTML helpers the report's sections share: escaping, numbers, sizes, times and tables."""

from __future__ import annotations

import datetime as _dt
import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def esc(value: Any) -> str:
    """``value`` as text escaped for HTML (quotes included).

    Parameters
    ----------
    value : Any
        Anything; ``str()`` of it is escaped.

    Returns
    -------
    str
        The escaped text.
    """
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    """A number for a table cell: integers as they are, floats with ``digits`` significant digits.

    Parameters
    ----------
    value : Any
        An int, a float, a numpy scalar, or None; None and NaN are shown as an en dash.
    digits : int, optional
        Significant digits of floats.

    Returns
    -------
    str
        The text (not escaped: it holds no markup characters).
    """
    if value is None:
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    try:
        f = float(value)
    except (TypeError, ValueError):
        return esc(value)
    if math.isnan(f):  # (statistics of nothing: no whole episode, no finite value)
        return "–"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:.{digits}g}"


_DIGITS = re.compile(r"(\d+)")


def stream_key(key: Any) -> tuple[Any, ...]:
    """A sort key that orders stream keys as people read them: ints numerically, strings naturally.

    ``2 < 10``; ``"env2" < "env10"``, ``"collector0/game1" < "collector1/game0"``; ints before
    strings, anything else (tuples, bytes) after them by its text.

    Parameters
    ----------
    key : Any
        A stream key.

    Returns
    -------
    tuple
        The key to sort by.
    """
    if isinstance(key, (bool, np.bool_)):
        return (2, str(key))
    if isinstance(key, (int, np.integer)):
        return (0, int(key))
    if isinstance(key, str):  # split into text and numbers: text at even places, numbers at odd ones
        parts = _DIGITS.split(key)
        return (1, tuple(int(p) if i % 2 else p for i, p in enumerate(parts)))
    return (2, str(key))


def size(nbytes: int) -> str:
    """A byte count in binary units (``1.5 MiB``), as ``du -h`` would round it.

    Parameters
    ----------
    nbytes : int
        Bytes.

    Returns
    -------
    str
        The size.
    """
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"  # (never reached)


def utc(seconds: float) -> str:
    """A Unix time as an ISO 8601 UTC time to the second (``2026-12-07 15:04:08 UTC``).

    Parameters
    ----------
    seconds : float
        Seconds since the Unix epoch.

    Returns
    -------
    str
        The time.
    """
    return _dt.datetime.fromtimestamp(seconds, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """A duration in the largest fitting unit (``42 s``, ``3.5 min``, ``2.0 h``, ``1.2 days``).

    Parameters
    ----------
    seconds : float
        The duration.

    Returns
    -------
    str
        The duration.
    """
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "", caption: str = "",
          numeric_from: int = 1, text_from: int | None = None) -> str:
    """An HTML table; cells are given as markup (escape text with :func:`esc` first).

    Parameters
    ----------
    header : sequence of str
        Column names (plain text: escaped here).
    rows : iterable of sequence of str
        Each row's cells, as markup.
    cls : str, optional
        The table's class.
    caption : str, optional
        A caption (plain text).
    numeric_from : int, optional
        Columns from this index on are right-aligned (numbers).
    text_from : int, optional
        Columns from this index on are left-aligned again (text after the numbers).

    Returns
    -------
    str
        The table.
    """
    stop = len(header) if text_from is None else text_from

    def cls_of(i: int) -> str:
        return " class=num" if numeric_from <= i < stop else ""

    head = "".join(f"<th{cls_of(i)}>{esc(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls_of(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (f'<table class="{esc(cls)}">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def note(text: str) -> str:
    """A paragraph of explanatory text (plain text: escaped here).

    Parameters
    ----------
    text : str
        The note.

    Returns
    -------
    str
        ``<p class="note">...</p>``.
    """
    return f'<p class="note">{esc(text)}</p>'
