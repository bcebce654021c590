"""Full integrity check of a store: every record document, every live data object, every checksum."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from replaystore.errors import CorruptObjectError, ReplayStoreError
from replaystore.store import layout, records
from replaystore.store.fragment import RESET, STEP, STREAM_CODE, Fragment, shape_of
from replaystore.store.store import Store
from replaystore.store.zarrio import chunk_path, verify_chunk


@dataclass(frozen=True)
class Problem:
    """One damaged or missing object."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _check_record(store: Store, path: str) -> Problem | None:
    try:
        records.decode(path, store.storage.read(path))
    except FileNotFoundError:
        return Problem(path, "missing")
    except CorruptObjectError as exc:
        return Problem(path, str(exc).split(": ", 1)[-1])
    return None


def _fragment_arrays(store: Store, frag: Fragment) -> Iterator[tuple[str, np.dtype, tuple[int, ...]]]:
    schema = store.schemas[frag.table]
    for spec in schema.zarr_layout():
        yield spec.name, spec.dtype, shape_of(frag, schema, spec)
    yield "_stream", STREAM_CODE, (frag.rows,)
    yield "_step", STEP, (frag.rows,)
    yield "_reset", RESET, (frag.rows,)


def _check_fragment(store: Store, frag: Fragment) -> list[Problem]:
    problems: list[Problem] = []
    storage = store.storage
    schema = store.schemas[frag.table]
    for name, dtype, shape in _fragment_arrays(store, frag):
        base = f"{frag.path}/{name}"
        try:
            meta = json.loads(storage.read(f"{base}/zarr.json"))
            if meta.get("shape") != list(shape):
                problems.append(Problem(f"{base}/zarr.json", f"shape {meta.get('shape')}, expected {list(shape)}"))
        except FileNotFoundError:
            problems.append(Problem(f"{base}/zarr.json", "missing"))
        except ValueError:
            problems.append(Problem(f"{base}/zarr.json", "not valid JSON"))
        if not shape[0]:
            continue
        cpath = chunk_path(base, len(shape))
        try:
            data = storage.read(cpath)
        except FileNotFoundError:
            problems.append(Problem(cpath, "missing"))
            continue
        issue = verify_chunk(data, dtype, shape)
        if issue:
            problems.append(Problem(cpath, issue))
        elif name in schema.offsets_groups:
            offsets = np.frombuffer(data, dtype=np.int64, count=shape[0])
            if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != frag.nnz[name]:
                problems.append(Problem(cpath, "CSR offsets are not 0-based, non-decreasing and ending at nnz"))
    return problems


def verify(store: Store, progress: Callable[[int], None] | None = None) -> list[Problem]:
    """Every problem found; empty means everything reads back and every checksum matches.

    ``progress`` is called with the number of fragments checked so far.
    """
    problems: list[Problem] = []
    # a writer directory with neither its record nor a commit is a registration killed before its
    # record was created: a crash leftover, not damage (its commits would need the record first)
    registered = [w for w in store.log.writers
                  if store.storage.exists(layout.writer_record(w)) or store.storage.list(layout.commits_dir(w))]
    for path in [layout.MANIFEST] + [layout.writer_record(w) for w in registered]:
        p = _check_record(store, path)
        if p:
            problems.append(p)
    for w in sorted(registered):
        for name in store.storage.list(layout.commits_dir(w)):
            p = _check_record(store, f"{layout.commits_dir(w)}/{name}")
            if p:
                problems.append(p)
    try:
        store.refresh()
    except ReplayStoreError as exc:
        problems.append(Problem(getattr(exc, "path", store.url), str(exc)))
        return problems
    for slot in store.storage.list(layout.STATE):
        for name in store.storage.list(layout.state_dir(slot)):
            if name.endswith(".json"):
                p = _check_record(store, f"{layout.state_dir(slot)}/{name}")
                if p:
                    problems.append(p)
    checked = 0
    for table in store.tables:
        reader = store.table(table).reader
        for frag in reader.fragments:  # the live ones; wholly evicted fragments may be reclaimed
            problems += _check_fragment(store, frag)
            checked += 1
            if progress:
                progress(checked)
    return problems
