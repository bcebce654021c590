"""Whole episodes of a stream, for episodic algorithms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from replaystore.episodebounds import end_fields, episode_spans
from replaystore.errors import StoreError
from replaystore.loaders.dataset import to_tensors
from replaystore.schemas import map_tree
from replaystore.store import Table


def _end_flags(table: Table) -> tuple[str, str | None]:
    schema = table.schema
    nodes = schema.nesting.nodes if schema.nesting is not None else {}
    if not all(n in schema or n in nodes for n in ("obs", "next_obs")):
        raise StoreError(f"schema {schema.name!r}: episodes need 'obs' and 'next_obs' fields")
    flags = end_fields(schema)
    if not flags:
        raise StoreError(f"schema {schema.name!r}: episodes need a 'terminated' or 'dones' field")
    return flags[0], flags[1] if len(flags) > 1 else None


def iter_episodes(table: Table, streams: list[Any] | None = None, complete_only: bool = True,
                  ) -> Iterator[dict[str, Any]]:
    """Yield each episode of a table's streams as a mapping of tensors.

    An episode starts at a reset, after an episode end or after a step gap, and
    ends at a step whose terminated/truncated (or ``dones``) flag is set. Only
    whole episodes are yielded unless ``complete_only=False``: not the trailing
    steps of a stream that has not ended yet, and not an episode whose beginning
    is missing (it starts after a gap left by retention, without a reset, and not
    at step 0). Cost: one read of each stream's rows.

    Parameters
    ----------
    table : Table
        A table whose schema has ``obs``, ``next_obs`` and ``terminated`` (with
        optional ``truncated``) or ``dones``.
    streams : list, optional
        Stream keys to read, in this order (default: all of the table's streams).
    complete_only : bool, optional
        Yield only whole episodes (default True).

    Yields
    ------
    dict of str to Any
        The schema's fields over T steps (ragged fields as CSR of the episode's
        steps; nested fields as nested dicts/tuples), plus ``final_obs`` (the last
        ``next_obs``), ``terminated`` and ``truncated`` (bools; one cut off by the end
        of the data is ``truncated``), ``complete``, ``stream``, ``steps`` and ``rows``.

    Raises
    ------
    StoreError
        The schema lacks ``obs``/``next_obs`` or an end flag.
    """
    term_name, trunc_name = _end_flags(table)
    for stream in streams if streams is not None else table.streams():
        rows, steps = table.rows(stream)
        if not len(rows):
            continue
        _, _, resets = table.index_of(rows)
        data = table.read(rows)
        nesting = table.schema.nesting
        if nesting is not None:  # slice leaf columns as for a flat schema, nest each episode at the end
            data = nesting.unnest(data)
        term = data[term_name].astype(bool)
        trunc = data[trunc_name].astype(bool) if trunc_name else np.zeros(len(rows), dtype=bool)
        end = term | trunc
        los, his, begans = episode_spans(steps, resets, end)
        for lo, hi, began in zip(los.tolist(), his.tolist(), begans.tolist(), strict=True):
            # whole if it ends with a flag and starts at a reset, right after an episode end,
            # or at step 0 of its stream (not after a gap left by retention or missing steps)
            ended = bool(end[hi - 1])
            complete = ended and began
            if complete_only and not complete:
                continue
            episode: dict[str, Any] = {f.name: data[f.name][lo:hi] for f in table.schema.dense_fields}
            for off_name, names in table.schema.offsets_groups.items():
                offsets = data[off_name][lo:hi + 1]
                episode[off_name] = offsets - offsets[0]
                for name in names:
                    episode[name] = data[name][offsets[0]:offsets[-1]]
            if nesting is not None:
                episode = nesting.nest(episode)
            last = hi - 1 - lo
            final = map_tree(lambda a: a[last], episode["next_obs"])  # noqa: B023 - used at once
            episode.update(final_obs=final, terminated=bool(term[hi - 1]),
                           truncated=bool(trunc[hi - 1]) or not ended, complete=complete, stream=stream,
                           steps=steps[lo:hi], rows=rows[lo:hi])
            yield to_tensors(episode)
