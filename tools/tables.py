"""Plain-text rendering of Arrow query results for the terminal."""

from __future__ import annotations

import pyarrow as pa


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        inner = ", ".join(_cell(v) for v in value[:8])
        return f"[{inner}{', ...' if len(value) > 8 else ''}]"
    return "NULL" if value is None else str(value)


def format_table(table: pa.Table, max_rows: int = 50) -> str:
    """``table`` as aligned columns with a header; at most ``max_rows`` rows, then a count."""
    rows = table.slice(0, max_rows).to_pylist()
    names = table.column_names
    cells = [[_cell(r[n]) for n in names] for r in rows]
    widths = [max([len(n)] + [len(c[i]) for c in cells]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if table.num_rows > max_rows:
        lines.append(f"... {table.num_rows - max_rows} more rows")
    lines.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(lines)
