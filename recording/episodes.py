"""Reading back the per-episode metadata recorders keep in commit metadata."""

from __future__ import annotations

from typing import Any

from replaystore.errors import StoreError
from replaystore.store import Store

EPISODE_KEYS = ("stream", "first_step", "length", "return", "seed", "terminated", "truncated")
"""The columns of the ``episodes`` document a recorder adds to each commit's metadata."""


def recorded_episodes(store: Store) -> list[dict[str, Any]]:
    """The episodes recorded into ``store``, in commit order, one dict each.

    Each holds ``writer``, ``stream`` (the stream key), ``first_step`` (the step of its first
    record), ``length`` (records stored), ``return`` (the sum of its stored rewards, in float64),
    ``seed`` (given to ``reset``, else None), ``terminated`` and
    ``truncated`` (both false: left unfinished by a reset, a failed step or ``close``). An
    episode is listed by the commit holding its last record; one without records is not listed.

    Parameters
    ----------
    store
        An open store (any mode).

    Returns
    -------
    list of dict
        One per episode.

    Raises
    ------
    StoreError
        A commit's ``episodes`` metadata is malformed.

    Cost: reads the commit history once (``Store.commits``).
    """
    out: list[dict[str, Any]] = []
    for body in store.commits():
        doc = (body.get("metadata") or {}).get("episodes")
        if doc is None:
            continue
        columns = [doc.get(k) if isinstance(doc, dict) else None for k in EPISODE_KEYS]
        if any(not isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1:  # type: ignore[arg-type]
            raise StoreError(f"commit {body.get('writer')}/{body.get('seq')}: malformed 'episodes' metadata "
                             f"(expected lists {list(EPISODE_KEYS)} of one length)")
        for values in zip(*columns, strict=True):
            out.append({"writer": body.get("writer"), **dict(zip(EPISODE_KEYS, values, strict=True))})
    return out
