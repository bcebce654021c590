"""The report's plots: matplotlib figures rendered to inline SVG (text kept as text, ids made unique).

Figures are drawn on matplotlib's object API (``Figure`` with an Agg canvas), never through
``pyplot``, so building a report leaves the caller's backend and open figures alone. Each
plot keeps its SVG small: lines are binned to at most :data:`MAX_POINTS` points and
histograms have at most :data:`BINS` bins, so a figure stays in the tens of KB whatever the
store's size.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

MAX_POINTS = 300
"""A line of a plot has at most this many points (binned means past it)."""
BINS = 40
"""Histograms have at most this many bins (fewer for fewer than 160 values: a quarter as many, at least 10)."""
MAX_LINES = 8
"""Learning curves and commit plots draw one line per stream or writer up to this many; past it,
the few largest and the mean (learning curve) or the total (commits)."""

_IDS = itertools.count()
_ID_RE = re.compile(r'id="([^"]+)"')


def new_figure(width: float = 6.4, height: float = 3.2) -> Figure:
    """A figure on an Agg canvas (not registered with pyplot).

    Parameters
    ----------
    width, height : float, optional
        Inches.

    Returns
    -------
    matplotlib.figure.Figure
        The figure.
    """
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def svg(fig: Figure) -> str:
    """``fig`` as an inline ``<svg>`` element: text as text, no metadata, ids unique in the page.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.

    Returns
    -------
    str
        The ``<svg ...>...</svg>`` element (no XML declaration or doctype), its ids prefixed
        so that several plots share one page.
    """
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "replaystore"}):
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    prefix = f"f{next(_IDS)}-"
    for old in set(_ID_RE.findall(text)):
        new = prefix + old
        text = (text.replace(f'id="{old}"', f'id="{new}"').replace(f"url(#{old})", f"url(#{new})")
                .replace(f'href="#{old}"', f'href="#{new}"'))
    return text


def binned(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` sorted by x and reduced to at most ``points`` points: the mean of each of equal x-bins.

    Parameters
    ----------
    x, y : numpy.ndarray
        The points.
    points : int, optional
        How many points at most.

    Returns
    -------
    tuple of numpy.ndarray
        The points (the input, sorted, when there are few enough).
    """
    order = np.argsort(x, kind="stable")
    x, y = np.asarray(x, np.float64)[order], np.asarray(y, np.float64)[order]
    if len(x) <= points:
        return x, y
    edges = np.linspace(x[0], x[-1], points + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, points - 1)
    counts = np.bincount(which, minlength=points)
    keep = counts > 0
    xs = np.bincount(which, weights=x, minlength=points)[keep] / counts[keep]
    ys = np.bincount(which, weights=y, minlength=points)[keep] / counts[keep]
    return xs, ys


def thinned(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` of the points of a step line, evenly spaced, the first and last kept.

    Parameters
    ----------
    x, y : numpy.ndarray
        The points, in order.
    points : int, optional
        How many points at most.

    Returns
    -------
    tuple of numpy.ndarray
        The points kept.
    """
    x, y = np.asarray(x), np.asarray(y)
    if len(x) <= points:
        return x, y
    idx = np.unique(np.linspace(0, len(x) - 1, points).round().astype(np.int64))
    return x[idx], y[idx]


def histogram(values: np.ndarray, title: str, xlabel: str, *, integer: bool = False, log: bool = False) -> str:
    """A histogram as inline SVG.

    Parameters
    ----------
    values : numpy.ndarray
        The values (finite ones are counted).
    title, xlabel : str
        Labels.
    integer : bool, optional
        Integer values: bins of whole numbers when there are few distinct ones.
    log : bool, optional
        A logarithmic count axis.

    Returns
    -------
    str
        The ``<svg>`` element.
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    fig = new_figure()
    ax = fig.add_subplot()
    if len(v):
        lo, hi = float(v.min()), float(v.max())
        bins = min(BINS, max(10, len(v) // 4))  # few values: fewer, wider bins
        if integer and hi - lo < bins:
            edges = np.arange(lo - 0.5, hi + 1.5)
        else:
            edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
        counts, edges = np.histogram(v, edges)
        ax.stairs(counts, edges, fill=True, color="#4c72b0", alpha=0.85)
        if log:
            ax.set_yscale("symlog", linthresh=1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.grid(alpha=0.3)
    return svg(fig)


def lines(series: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str, xlabel: str, ylabel: str, *,
          mean: tuple[np.ndarray, np.ndarray] | None = None, steps: bool = False) -> str:
    """Labelled lines (each binned to :data:`MAX_POINTS` points) as inline SVG.

    Parameters
    ----------
    series : sequence of (label, x, y)
        The lines.
    title, xlabel, ylabel : str
        Labels.
    mean : tuple of numpy.ndarray, optional
        One more line, drawn thick and black (the mean over every series, or their total).
    steps : bool, optional
        Draw step lines (cumulative counts), not binned.

    Returns
    -------
    str
        The ``<svg>`` element.
    """
    fig = new_figure()
    ax = fig.add_subplot()
    for label, x, y in series:
        if steps:  # a cumulative count: from 0 at its first x
            tx, ty = thinned(np.r_[x[:1], x], np.r_[0, y])
            ax.step(tx, ty, where="post", label=label, linewidth=1.2, marker="o" if len(tx) <= 30 else None,
                    markersize=3)
        else:
            bx, by = binned(x, y)
            ax.plot(bx, by, label=label, linewidth=1.0, marker="." if len(bx) < 30 else None)
    if mean is not None and steps:
        tx, ty = thinned(np.r_[mean[0][:1], mean[0]], np.r_[0, mean[1]])
        ax.step(tx, ty, where="post", label="total", color="black", linewidth=2.2)
    elif mean is not None:
        ax.plot(*binned(*mean), label="mean", color="black", linewidth=2.2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series or mean is not None:
        ax.legend(fontsize="small", loc="best")
    return svg(fig)

