"""What an append's batch becomes: per table, validated columns, stream codes and reset flags.

A batch matching several tables is split between them; an Episode appends as one stream
starting with a reset; a ``[T, B]`` Rollout appends as B streams, each slot's first reset
carried over from the done flag its previous rollout left (:class:`~replaystore.store.write.stepbook.StepBook`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from replaystore.errors import StepOrderError, StoreError, StreamKeyError
from replaystore.schemas import Columns, Schema, episode_columns, rollout_columns, validate_tables
from replaystore.schemas.validate import batch_items, to_numpy
from replaystore.store.format.streamkeys import STREAM_CODE, Coded, StreamKey, per_record_keys, stream_codes
from replaystore.store.write.stepbook import StepBook

Converted = tuple[Columns, Coded, np.ndarray]
"""One table's part of an append: its columns, their stream codes and per-record reset flags."""


def convert(schemas: Mapping[str, Schema], batch: Any, stream: Any, default_stream: bool, reset: Any,
            table: str | None, book: StepBook) -> dict[str, Converted]:
    """Validate ``batch`` and split it into its tables' columns, stream codes and reset flags.

    Parameters
    ----------
    schemas : Mapping[str, Schema]
        The store's tables.
    batch : Any
        A batch object or mapping of field arrays, an Episode or a ``[T, B]`` Rollout.
    stream : Any
        A stream key, or one key per record (per slot for a Rollout).
    default_stream : bool
        Whether the caller gave no stream (a Rollout's slots are then keyed 0..B-1).
    reset : Any
        None/False, True (each stream's first record in the batch) or one bool per record.
    table : str or None
        The table to append to; None: every table the batch matches.
    book : StepBook
        The writer's step bookkeeping, in an append begun: a Rollout reads each slot's carried
        done flag and stages the one it leaves.

    Returns
    -------
    dict[str, Converted]
        Per table: ``(columns, (codes, keys), resets)``.

    Raises
    ------
    StoreError
        If ``table`` is not one of the store's tables.
    FieldError, StreamKeyError, StepOrderError
        If the batch, its stream keys or its reset flags are invalid (nothing is staged).

    Cost: O(records) for validation; a store refresh if a Rollout slot is new to this writer.
    """
    if table is not None:
        if table not in schemas:
            raise StoreError(f"table {table!r}: expected one of {sorted(schemas)}")
        schemas = {table: schemas[table]}
    if len(schemas) > 1:
        split = validate_tables(schemas, batch)
        out = {}
        for name, cols in split.items():
            if isinstance(stream, (Sequence, np.ndarray)) and not isinstance(stream, str):
                raise StreamKeyError("stream", "one stream key for a batch split across tables",
                                     "per-record keys")
            coded = stream_codes(stream, len(cols))
            out[name] = (cols, coded, resets_of(reset, coded))
        return out
    (name, schema), = schemas.items()
    items = batch_items(batch)
    if "final_obs" in items and "truncated" in schema:
        cols = episode_columns(schema, items)
        coded = stream_codes(stream, len(cols))
        resets = np.zeros(len(cols), dtype=bool)
        resets[0] = True
        return {name: (cols, coded, resets)}
    obs_field = schema.field("obs") if "obs" in schema else None
    if ("truncated" in schema and obs_field is not None and "obs" in items
            and to_numpy("obs", items["obs"]).ndim == len(obs_field.shape) + 2):  # type: ignore[union-attr]
        cols, steps_t, slots, resets = rollout_columns(schema, items)
        slot_keys: list[StreamKey] = list(range(slots)) if default_stream else per_record_keys(stream, slots)
        if len(set(slot_keys)) != slots:  # one key for several slots would splice their steps together
            raise StreamKeyError("stream", f"{slots} distinct stream keys, one per environment slot",
                                 f"{stream!r}")
        coded = np.repeat(np.arange(slots, dtype=STREAM_CODE), steps_t), slot_keys
        for b, k in enumerate(slot_keys):
            carried = book.carried_done(name, k)
            # a slot's first step ever starts an episode; later rollouts carry the previous done flag
            resets[b * steps_t] = book.known_last(name, k, staged=False) is None if carried is None else carried
        done = cols.arrays["terminated"] | cols.arrays["truncated"]
        for b, k in enumerate(slot_keys):
            book.note_done(name, k, bool(done[(b + 1) * steps_t - 1]))
        return {name: (cols, coded, resets)}
    cols = schema.validate(items)
    coded = stream_codes(stream, len(cols))
    return {name: (cols, coded, resets_of(reset, coded))}


def resets_of(reset: Any, coded: Coded) -> np.ndarray:
    """Per-record reset flags from an append's ``reset`` argument.

    Parameters
    ----------
    reset : Any
        None/False (none), True (each stream's first record in the batch) or one bool per record.
    coded : Coded
        The records' stream codes and keys.

    Returns
    -------
    numpy.ndarray
        One bool per record (a copy).

    Raises
    ------
    StepOrderError
        If ``reset`` is neither a bool nor one bool per record.

    Cost: O(records).
    """
    codes, uniq = coded
    n = len(codes)
    if reset is None or reset is False:
        return np.zeros(n, dtype=bool)
    if reset is True:  # each stream's first record in the batch
        out = np.zeros(n, dtype=bool)
        out[np.unique(codes, return_index=True)[1] if len(uniq) > 1 else slice(0, 1)] = True
        return out
    arr = to_numpy("reset", reset)
    if arr.dtype != np.bool_ or arr.shape != (n,):
        raise StepOrderError("reset", f"a bool or {n} per-record bools", f"{arr.dtype} of shape {arr.shape}")
    return arr.copy()
