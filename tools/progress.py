"""Progress bars of the long commands: on stderr, only on a terminal, never with ``--quiet``.

Every command that can run for seconds (copy, vacuum, export, import, verify, report, stats,
the demo) shows a tqdm bar on stderr when stderr is a terminal and its caller asked for
progress (the Python functions' ``progress=True``; the commands unless ``--quiet``). When
stderr is a pipe or a file nothing is written there, so logs and captured output stay clean.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_shown(enabled: bool) -> bool:
    """Whether a bar asked for with ``enabled`` is shown: asked for, and stderr is a terminal.

    Parameters
    ----------
    enabled : bool
        Whether the caller asked for progress.

    Returns
    -------
    bool
        True when the bar is drawn.
    """
    try:
        return bool(enabled) and sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced by an object without isatty, or closed
        return False


def progress_bar(total: int | None, desc: str, enabled: bool, unit: str = "rec", *, scale: bool = True) -> tqdm:
    """A tqdm bar on stderr, shown only when asked for and stderr is a terminal.

    Parameters
    ----------
    total : int, optional
        Expected count (None: unknown).
    desc : str
        Label.
    enabled : bool
        Whether the caller asked for progress.
    unit : str, optional
        Unit name.
    scale : bool, optional
        Show counts with SI prefixes (``1.2M rec``); False for counts of a few hundred
        (objects, fragments), shown as plain integers.

    Returns
    -------
    tqdm.tqdm
        The bar (disabled when not shown); use it as a context manager. It is
        cleared from the terminal when closed.
    """
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, leave=False, file=sys.stderr,
                disable=not progress_shown(enabled))


__all__ = ["progress_bar", "progress_shown"]
