"""Looking at a dataset: statistics, data health, and a self-contained HTML report.

``replaystore.report`` sits above the loaders (it reads episodes the way they do) and below
the tools: ``replaystore report`` and ``replaystore stats`` call it, and so do
``Store.report`` and ``Store._repr_html_``, which load this package by name at their first
call (the store's own modules never import it).

The data layer (episodes, per-field statistics, data health) reads stores through
``replaystore.store``'s public API only and does not import torch (the episode split it
shares with ``replaystore.loaders.iter_episodes`` lives in ``replaystore.episodebounds``).
"""

from replaystore.report.episodes import Episodes, StreamSummary, episodes_of, stream_summaries
from replaystore.report.health import CHECKS, Finding, health
from replaystore.report.stats import QUANTILES, FieldStats, field_stats, lerobot_stats

__all__ = [
    "CHECKS",
    "QUANTILES",
    "Episodes",
    "FieldStats",
    "Finding",
    "StreamSummary",
    "episodes_of",
    "field_stats",
    "health",
    "lerobot_stats",
    "stream_summaries",
    "ReportSummary",
    "build_report",
]


def __getattr__(name: str) -> object:
    """``build_report`` and ``ReportSummary`` from ``replaystore.report.html``, imported at first use.

    The HTML report needs matplotlib and pillow; the data layer above does not, so importing
    this package (``replaystore stats``) does not load them.
    """
    if name in ("build_report", "ReportSummary"):
        from replaystore.report import html

        return getattr(html, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
