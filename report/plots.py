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
from matplotlib.ticker import MaxNLocator

MAX_POINTS = 300
"""A line of a plot has at most this many points (binned means past it)."""
BINS = 40
"""Histograms have at most this many bins (fewer for fewer than 160 values: a quarter as many, at least 10)."""
MAX_LINES = 8
"""Learning curves and commit plots draw one line per stream or writer up to this many; past it,
the few largest and the mean (learning curve) or the total (commits)."""
WIDTH = 6.4
"""A plot's width in inches (two plots side by side fill the page)."""
WIDE = 11.0
"""A wide plot's width in inches (one on its own row: the learning curve)."""

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


def integral(values: np.ndarray) -> bool:
    """Whether every finite value is a whole number (episode lengths, counts, returns of +-1 rewards).

    Parameters
    ----------
    values : numpy.ndarray
        The values.

    Returns
    -------
    bool
        True when there is at least one finite value and each is integral.
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return bool(len(v)) and bool(np.all(v == np.round(v)))


def histogram(values: np.ndarray, title: str, xlabel: str, *, integer: bool = False, log: bool = False) -> str:
    """A histogram as inline SVG.

    Parameters
    ----------
    values : numpy.ndarray
        The values (finite ones are counted).
    title, xlabel : str
        Labels.
    integer : bool, optional
        Integer values. Values that are all whole numbers are taken as integers too: bins of
        whole numbers centred on them when there are few distinct ones, and integer ticks on
        the x axis (a single value, every episode 300 steps long, gets the tick 300, not
        299.6 ... 300.4).
    log : bool, optional
        A logarithmic count axis.

    Returns
    -------
    str
        The ``<svg>`` element. The count axis has integer ticks.
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    integer = integer or integral(v)
    fig = new_figure()
    ax = fig.add_subplot()
    if len(v):
        lo, hi = float(v.min()), float(v.max())
        bins = min(BINS, max(10, len(v) // 4))  # few values: fewer, wider bins
        if integer and hi - lo < bins:
            edges = np.arange(lo - 0.5, hi + 1.5)
        elif integer:  # whole-number bin edges, each bin as wide as the others
            width = int(np.ceil((hi - lo + 1) / bins))
            edges = np.arange(lo - 0.5, hi + width + 0.5, width)
        elif hi > lo:
            edges = np.linspace(lo, hi, bins + 1)
        else:  # one value: a bin centred on it
            half = max(abs(lo) * 0.05, 0.5)
            edges = np.array([lo - half, lo + half])
        counts, edges = np.histogram(v, edges)
        ax.stairs(counts, edges, fill=True, color="#4c72b0", alpha=0.85)
        if integer:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if len(edges) == 2:  # one value: room either side, so that it reads as one bar
                ax.set_xlim(lo - 2, hi + 2)
        if log:
            ax.set_yscale("symlog", linthresh=1)
    if not log:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.grid(alpha=0.3)
    return svg(fig)


def ranges(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS) -> tuple[np.ndarray, ...]:
    """The mean, min and max of ``y`` at each distinct ``x`` (or in each of ``points`` equal x-bins past that many).

    Parameters
    ----------
    x, y : numpy.ndarray
        The points.
    points : int, optional
        How many points at most.

    Returns
    -------
    tuple of numpy.ndarray
        ``(x, mean, min, max)``, sorted by x: at each distinct x its own value, past ``points``
        distinct values the mean x of each bin.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not len(x):
        return x, y, y, y
    ux, which = np.unique(x, return_inverse=True)
    if len(ux) > points:
        edges = np.linspace(ux[0], ux[-1], points + 1)
        which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, points - 1)
    groups = int(which.max()) + 1
    counts = np.bincount(which, minlength=groups)
    keep = counts > 0
    xs = (np.bincount(which, weights=x, minlength=groups)[keep] / counts[keep])
    mean = np.bincount(which, weights=y, minlength=groups)[keep] / counts[keep]
    lo = np.full(groups, np.inf)
    hi = np.full(groups, -np.inf)
    np.minimum.at(lo, which, y)
    np.maximum.at(hi, which, y)
    return xs, mean, lo[keep], hi[keep]


def lines(series: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str, xlabel: str, ylabel: str, *,
          mean: tuple[np.ndarray, np.ndarray] | None = None, steps: bool = False, band: bool = False,
          integer_x: bool = False, wide: bool = False) -> str:
    """Labelled lines (each binned to :data:`MAX_POINTS` points) as inline SVG, the legend right of the axes.

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
    band : bool, optional
        Draw each series as the mean of its y at each x (each bin past :data:`MAX_POINTS`,
        :func:`ranges`), and under the lines one grey band from the least to the greatest y of
        every series (of ``mean``'s points when given) at each x.
    integer_x : bool, optional
        The x values are whole numbers (commit or episode numbers): integer ticks.
    wide : bool, optional
        A plot that takes a row of its own (:data:`WIDE` inches wide).

    Returns
    -------
    str
        The ``<svg>`` element. The legend sits outside the axes, to their right, so it covers
        no line; an x axis whose values are all equal spans one unit either side of them.
    """
    fig = new_figure(WIDE if wide else WIDTH)
    ax = fig.add_subplot()
    xs_all: list[np.ndarray] = []
    for label, x, y in series:
        xs_all.append(np.asarray(x, np.float64))
        if steps:  # a cumulative count: from 0 at its first x (at the one before, counting commits)
            tx, ty = thinned(np.r_[x[:1] - (1 if integer_x else 0), x], np.r_[0, y])
            ax.step(tx, ty, where="post", label=label, linewidth=1.2, marker="o" if len(tx) <= 30 else None,
                    markersize=3)
        elif band:
            bx, by, _, _ = ranges(x, y)
            ax.plot(bx, by, label=label, linewidth=1.2, marker="." if len(bx) < 30 else None)
        else:
            bx, by = binned(x, y)
            ax.plot(bx, by, label=label, linewidth=1.0, marker="." if len(bx) < 30 else None)
    if mean is not None:
        xs_all.append(np.asarray(mean[0], np.float64))
    if mean is not None and steps:
        tx, ty = thinned(np.r_[mean[0][:1] - (1 if integer_x else 0), mean[0]], np.r_[0, mean[1]])
        ax.step(tx, ty, where="post", label="total", color="black", linewidth=2.2)
    elif mean is not None and band:
        ax.plot(*ranges(*mean)[:2], label="mean", color="black", linewidth=2.2)
    elif mean is not None:
        ax.plot(*binned(*mean), label="mean", color="black", linewidth=2.2)
    if band and (series or mean is not None):  # one band under the lines: overlapping bands would hide them
        every_x, every_y = mean if mean is not None else (np.concatenate([np.asarray(x) for _, x, _ in series]),
                                                          np.concatenate([np.asarray(y) for _, _, y in series]))
        bx, _, lo, hi = ranges(every_x, every_y)
        ax.fill_between(bx, lo, hi, color="#888899", alpha=0.22, linewidth=0, zorder=0, label="min–max, all")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if steps:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    every = np.concatenate(xs_all) if xs_all else np.zeros(0)
    every = every[np.isfinite(every)]
    if len(every) and float(every.min()) == float(every.max()):  # one x: not a degenerate +-0.04 axis
        x0 = float(every[0])
        ax.set_xlim(x0 - 1, x0 + 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if series or mean is not None:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  frameon=False)
    return svg(fig)
