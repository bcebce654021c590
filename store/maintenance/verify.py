"""Full integrity check of a store: every record document, every live data object, every checksum."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from replaystore.errors import CorruptObjectError, ReplayStoreError, StaleReadError
from replaystore.schemas.fields import Ragged
from replaystore.store.format import bodies, layout, records
from replaystore.store.format.bodies import load_npy
from replaystore.store.format.codecs import encoding_of
from replaystore.store.format.fragment import RESET, STEP, STREAM_CODE, Fragment, shape_of
from replaystore.store.format.generations import foreign
from replaystore.store.format.zarrio import chunk_path
from replaystore.store.maintenance.base import OpenStore
from replaystore.store.read.log import CLOSE, CommitLog, decode_checkpoint
from replaystore.store.read.table import TableReader


@dataclass(frozen=True)
class Problem:
    """One damaged or missing object.

    Attributes
    ----------
    path : str
        The damaged or missing object; a writer's commits directory where its sequence is broken.
    problem : str
        What is wrong with it.
    """

    path: str
    problem: str

    def __str__(self) -> str:
        """``"<path>: <problem>"``."""
        return f"{self.path}: {self.problem}"


def _state_check(path: str, slot: str, version: int, arrays: dict[str, str]) -> Callable[[dict[str, Any]], object]:
    """The body check of state record ``version`` of ``slot``, stored at ``path``.

    Once the body passes, ``arrays`` holds its payload paths by array name.
    """
    def check(b: dict[str, Any]) -> None:
        arrays.update(bodies.state(path, b, slot, version)["arrays"])
    return check


def _check_payloads(store: OpenStore, arrays: dict[str, str]) -> list[Problem]:
    """Each payload a state record names reads back as the ``.npy`` array its header describes."""
    problems = []
    for p in arrays.values():
        try:
            load_npy(p, store.storage.read(p))
        except FileNotFoundError:
            problems.append(Problem(p, "missing"))
        except CorruptObjectError as exc:
            problems.append(Problem(exc.path, str(exc).split(": ", 1)[-1]))
    return problems


def _check_record(store: OpenStore, path: str,
                  check: Callable[[dict[str, Any]], object] | None = None) -> Problem | None:
    """A record document reads back whole and its body passes ``check`` (store/format/bodies.py)."""
    try:
        body = records.decode(path, records.read(store.storage, path))
        if check is not None:
            check(body)
    except FileNotFoundError:
        return Problem(path, "missing")
    except CorruptObjectError as exc:
        return Problem(exc.path, str(exc).split(": ", 1)[-1])
    return None


def _check_commits(store: OpenStore, writer: int) -> tuple[list[Problem], int, int]:
    """Writer ``writer``'s commit records.

    Each well-formed and in its place, numbered densely from 0, none after a close record
    (readers stop at a gap or a close, so records beyond either never show). Records of another
    store generation (left by a replaced store's writer) are no record of this store: not
    counted, not damage. Also the number of this store's records listed, and of the others.
    """
    problems: list[Problem] = []
    directory = layout.commits_dir(writer)
    listed = sorted(int(n[:-5]) for n in store.storage.list(directory) if n.endswith(".json") and n[:-5].isdigit())
    seqs: list[int] = []
    closed_at = None
    for seq in listed:
        path = layout.commit_record(writer, seq)
        kind: list[str] = []

        def check_commit(b: dict[str, Any], s: int = seq, at: str = path, kinds: list[str] = kind) -> None:
            body = bodies.commit(at, b, writer, s, store.log.offsets)
            kinds.append("" if foreign(body, store.generation) else body["kind"])

        p = _check_record(store, path, check_commit)
        if p:
            problems.append(p)
        elif not kind[0]:
            continue  # another generation's
        elif kind[0] == CLOSE and closed_at is None:
            closed_at = seq
        seqs.append(seq)
    if seqs and seqs[-1] != len(seqs) - 1:
        gap = next(i for i, s in enumerate(seqs) if s != i)
        problems.append(Problem(directory, f"commit {gap} is missing: readers stop there and never show the "
                                           f"{len(seqs) - gap} record(s) after it"))
    if closed_at is not None and seqs[-1] > closed_at:
        problems.append(Problem(directory, f"{seqs[-1] - closed_at} commit record(s) after the close record "
                                           f"(commit {closed_at}): readers stop at a close and never show them"))
    return problems, len(seqs), len(listed) - len(seqs)


def _check_checkpoint(store: OpenStore, number: int, listed: dict[int, int]) -> list[Problem]:
    """A log checkpoint reads back whole and holds exactly what its commit records say.

    Each writer's next seq, closed flag and live fragments; ``listed``: the number of
    commit records listed per writer.
    """
    path = layout.checkpoint(number)
    try:
        writers, _ = decode_checkpoint(path, records.read(store.storage, path), number, store.log.offsets,
                                       store.generation)
    except FileNotFoundError:
        return []  # superseded and deleted since the listing
    except CorruptObjectError as exc:
        return [Problem(path, str(exc).split(": ", 1)[-1])]
    if writers is None:
        return []  # another store generation's: a replaced store's writer left it, readers skip it
    beyond = [w for w, wlog in sorted(writers.items()) if wlog.next_seq > listed.get(w, 0)]
    if beyond:
        w = beyond[0]
        return [Problem(path, f"its commit records cannot be read back: it summarises writer {w}'s records "
                              f"0..{writers[w].next_seq - 1}, but {listed.get(w, 0)} are listed")]
    try:
        replayed = store.log.state_at({w: wlog.next_seq for w, wlog in writers.items()})
    except ReplayStoreError as exc:
        return [Problem(path, f"its commit records cannot be read back: {exc}")]
    problems = []
    for w, wlog in sorted(writers.items()):
        if wlog.state() != replayed[w].state() or (wlog.counted and wlog.committed != replayed[w].committed):
            problems.append(Problem(path, f"differs from writer {w}'s commit records 0..{wlog.next_seq - 1}"))
    return problems


def _fragment_arrays(store: OpenStore, frag: Fragment) -> Iterator[tuple[str, np.dtype, tuple[int, ...]]]:
    schema = store.schemas[frag.table]
    for spec in schema.zarr_layout():
        yield spec.name, spec.dtype, shape_of(frag, schema, spec)
    yield "_stream", STREAM_CODE, (frag.rows,)
    yield "_step", STEP, (frag.rows,)
    yield "_reset", RESET, (frag.rows,)


def _segment_arrays(store: OpenStore, frag: Fragment) -> Iterator[tuple[str, np.dtype, tuple[int, ...], str]]:
    """Each array of ``frag``'s segment: name, dtype, stored shape and role."""
    schema = store.schemas[frag.table]
    seg = frag.segment
    assert seg is not None
    for spec in schema.zarr_layout():
        if spec.role == "dense":
            yield spec.name, np.dtype(spec.dtype), (seg.capacity, *spec.trailing_shape), "dense"
        elif spec.role == "offsets":
            yield spec.name, np.dtype(spec.dtype), (seg.capacity + 1,), "offsets"
        else:
            f = schema.field(spec.name)
            assert isinstance(f, Ragged)  # a "values" array holds a ragged field
            yield spec.name, np.dtype(spec.dtype), (seg.value_capacity[f.offsets],), f.offsets
    for name, dtype in (("_stream", STREAM_CODE), ("_step", STEP), ("_reset", RESET)):
        yield name, dtype, (seg.capacity,), "dense"


def _check_segment_fragment(store: OpenStore, frag: Fragment) -> list[Problem]:
    """A segment-backed fragment.

    Its segment's arrays have their declared shapes, the bytes each of its parts wrote match
    their CRC32C, its CSR offsets are consistent.
    """
    problems: list[Problem] = []
    storage = store.storage
    seg = frag.segment
    assert seg is not None
    bounds: dict[str, np.ndarray] = {}  # per offsets array: the value index at each part boundary
    arrays = list(_segment_arrays(store, frag))
    arrays.sort(key=lambda a: a[3] not in ("dense", "offsets"))  # offsets before the values they bound
    for name, dtype, shape, role in arrays:
        base = f"{frag.path}/{name}"
        cpath = chunk_path(base, len(shape))
        item = int(np.prod(shape[1:])) * dtype.itemsize
        try:
            meta = json.loads(storage.read(f"{base}/zarr.json"))
        except FileNotFoundError:
            problems.append(Problem(f"{base}/zarr.json", "missing"))
            continue
        except ValueError:
            problems.append(Problem(f"{base}/zarr.json", "not valid JSON"))
            continue
        if meta.get("shape") != list(shape):
            problems.append(Problem(f"{base}/zarr.json", f"shape {meta.get('shape')}, expected {list(shape)}"))
            continue
        try:
            size = storage.size(cpath)
        except FileNotFoundError:
            problems.append(Problem(cpath, "missing"))
            continue
        if size != shape[0] * item:
            problems.append(Problem(cpath, f"size {size} bytes, expected {shape[0] * item}"))
            continue
        rows = np.cumsum([0] + [p[2] for p in frag.parts])
        if role == "dense":
            cuts = (seg.row + rows) * item
        elif role == "offsets":
            offsets = storage.read_array(cpath, dtype, (frag.rows + 1,), seg.row * item)
            lo, hi = seg.values[name], seg.values[name] + frag.nnz[name]
            if offsets[0] != lo or np.any(np.diff(offsets) < 0) or offsets[-1] != hi:
                problems.append(Problem(cpath, f"CSR offsets of rows [{seg.row}, {seg.row + frag.rows}) are not "
                                               f"non-decreasing from {lo} to {hi}"))
                continue
            bounds[name] = np.asarray(offsets[rows])
            cuts = (seg.row + 1 + rows) * item  # a fragment writes the entries after its rows' first
        elif role in bounds:
            cuts = bounds[role] * item
        else:
            continue  # its offsets are damaged (reported above)
        data = storage.read_array(cpath, np.dtype(np.uint8), (int(cuts[-1] - cuts[0]),), int(cuts[0])) \
            if cuts[-1] > cuts[0] else np.zeros(0, np.uint8)
        for k, crc in enumerate(seg.crc32c.get(name, [])):
            piece = data[int(cuts[k] - cuts[0]):int(cuts[k + 1] - cuts[0])]
            if google_crc32c.value(piece.tobytes()) != crc:
                problems.append(Problem(cpath, f"crc32c checksum mismatch in the bytes [{cuts[k]}, {cuts[k + 1]}) "
                                               f"written by commit {frag.parts[k][0]} (fragment {frag.name})"))
    return problems


def _check_fragment(store: OpenStore, frag: Fragment) -> list[Problem]:
    if frag.segment is not None:
        return _check_segment_fragment(store, frag)
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
            # size-checked first; a raw chunk read whole (mapped where local), a shard block by block
            issue, data = encoding_of(schema, name).check(storage, base, dtype, shape)
        except (FileNotFoundError, StaleReadError):
            problems.append(Problem(cpath, "missing"))
            continue
        except CorruptObjectError as exc:  # not a regular file, say
            problems.append(Problem(exc.path, str(exc).split(": ", 1)[-1]))
            continue
        if issue:
            problems.append(Problem(cpath, issue))
        elif data is not None and name in schema.offsets_groups:
            offsets = np.frombuffer(data, dtype=np.int64, count=shape[0])
            if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != frag.nnz[name]:
                problems.append(Problem(cpath, "CSR offsets are not 0-based, non-decreasing and ending at nnz"))
    return problems


def _replay(store: OpenStore) -> dict[str, list[Fragment]]:
    """Apply every commit record from the first, as a reader opening without a checkpoint does.

    Then view each table as a new reader would, whatever ``store`` has applied already:
    raises on a log that no reader can apply (records of another writer, overlapping
    live fragments, row counts the data does not hold). Cost: every commit record read once
    more, a ``stat`` per live fragment.

    Returns the visible fragments of each table.
    """
    log = CommitLog(store.storage, store.schemas, checkpoints=False, generation=store.generation)
    log.refresh()
    return {table: list(TableReader(store.storage, log, table, store.schemas[table], store.capacity,
                                    contiguous=False).fragments) for table in store.tables}


def verify(store: OpenStore, progress: Callable[[int], None] | None = None) -> list[Problem]:
    """Every problem found; empty means everything reads back and every checksum matches.

    Checks the manifest, writer records, commit records, checkpoints (against
    the records they summarise), state records and every live fragment's
    arrays. Cost: reading every record and every live object once.

    Parameters
    ----------
    store : OpenStore
        The opened store.
    progress : callable, optional
        Called with the number of fragments checked so far.

    Returns
    -------
    list of Problem
        The problems found (problems are reported, not raised).

    Raises
    ------
    OSError
        The storage failed (an object that cannot be read for another reason
        than damage).
    """
    problems: list[Problem] = []
    storage = store.storage
    # a writer directory with neither its record nor a commit is a registration killed before its
    # record was created: a crash leftover, not damage (its commits would need the record first)
    listed = {int(n) for n in storage.list(layout.WRITERS) if n.isdigit()} | set(store.log.writers)
    registered = sorted(w for w in listed
                        if storage.exists(layout.writer_record(w)) or storage.list(layout.commits_dir(w)))
    p = _check_record(store, layout.MANIFEST, lambda b: bodies.manifest(store.url, layout.MANIFEST, b))
    if p:
        problems.append(p)
    capacities: dict[int, Any] = {}
    counts: dict[int, int] = {}
    for w in registered:
        def check_registration(b: dict[str, Any], w: int = w) -> None:
            body = bodies.registration(layout.writer_record(w), b, w)
            if not foreign(body, store.generation):  # (a replaced store's writer registered under its own)
                capacities[w] = body.get("capacity", store.capacity)

        found, counts[w], others = _check_commits(store, w)
        p = _check_record(store, layout.writer_record(w), check_registration)
        if p and not (p.problem == "missing" and counts[w] == 0 and others):
            problems.append(p)  # (commits of a replaced store only, its registration deleted: its leftovers)
        problems += found
    for w, cap in capacities.items():
        if cap != store.capacity:
            problems.append(Problem(layout.MANIFEST, f"capacity {store.capacity!r}, but writer {w} registered "
                                                     f"under capacity {cap!r}: the manifest was changed"))
    for number in store.log.checkpoint_numbers():
        problems += _check_checkpoint(store, number, counts)
    try:
        store.refresh()
        replayed = _replay(store)
    except ReplayStoreError as exc:
        problems.append(Problem(getattr(exc, "path", store.url), str(exc).split(": ", 1)[-1]))
        return problems
    for slot in store.storage.list(layout.STATE):
        problem = layout.name_problem("state slot", slot)
        if problem:
            problems.append(Problem(f"{layout.STATE}/{slot}", problem))
            continue
        for name in store.storage.list(layout.state_dir(slot)):
            if name.endswith(".json"):
                path = f"{layout.state_dir(slot)}/{name}"
                arrays: dict[str, str] = {}
                check = _state_check(path, slot, int(name[:-5]), arrays) if name[:-5].isdigit() else None
                p = _check_record(store, path, check)
                if p:
                    problems.append(p)
                problems += _check_payloads(store, arrays)
    checked = 0
    for table in store.tables:
        for frag in replayed[table]:  # the visible ones; wholly evicted fragments may be reclaimed
            try:
                problems += _check_fragment(store, frag)
            except CorruptObjectError as exc:  # a name that is no path (layout.stored_name), say
                problems.append(Problem(exc.path, str(exc).split(": ", 1)[-1]))
            checked += 1
            if progress:
                progress(checked)
    return problems
