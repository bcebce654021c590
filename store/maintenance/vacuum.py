"""Vacuum: delete the objects under a store that no live commit references (docs/FORMAT.md, "Vacuum").

Garbage comes in units, each judged and deleted whole:

- a fragment directory no live commit lists: a crashed writer's uncommitted fragment, or
  one a later commit removed (compacted-away originals, retired evictions);
- a state payload directory no state record names (a saver that died before its record);
- a superseded state version: a state record older than its slot's newest ``state_keep_last``,
  with the payload directories it names (record first, so a crash leaves no record without
  its arrays);
- a temporary object (``.tmp-`` name) left by a create that was killed.

A unit goes only when it is older than ``older_than_s``: its age counts from the newest
modification time of its objects and, for a removed fragment, of the commit record that
removed it (storage clock: S3 LastModified, file mtimes). The listing is taken before the
commit log is read, so anything committed before the listing counts as referenced; the log
is read again right before deleting, and a unit a commit made since references is kept.
Everything else (manifest, writer records, commit and state records, unknown names) is
never touched.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replaystore.errors import CorruptObjectError, StoreError
from replaystore.store.format import layout, records
from replaystore.store.storage import ObjectInfo

if TYPE_CHECKING:
    from replaystore.store.maintenance.base import OpenStore

DEFAULT_OLDER_THAN_S = 3600.0
DEFAULT_STATE_KEEP_LAST = 2  # (store.STATE_KEEP_LAST: this module is imported by store.py lazily)


@dataclass(frozen=True)
class Unit:
    """One piece of garbage: a directory of objects or a single temporary object.

    Attributes
    ----------
    path : str
        The directory or object path.
    kind : str
        ``"fragment"``, ``"payload"``, ``"state"`` or ``"temporary"``.
    objects : tuple of ObjectInfo
        Its objects.
    since_ns : int
        Unreferenced since (newest of its objects' times and its removing commit's).
    """

    path: str
    kind: str  # "fragment" | "payload" | "state" | "temporary"
    objects: tuple[ObjectInfo, ...]
    since_ns: int  # unreferenced since (newest of its objects' times and its removing commit's)

    @property
    def bytes(self) -> int:
        """Bytes of its objects."""
        return sum(o.size for o in self.objects)


@dataclass
class VacuumReport:
    """What a vacuum deleted (or, with ``dry_run``, would delete), and what it left as too recent.

    Attributes
    ----------
    dry_run : bool
        Whether nothing was deleted.
    older_than_s : float
        The age threshold used.
    deleted : list of Unit
        Units deleted (or that would be).
    recent : list of Unit
        Garbage units left because they are younger than the threshold.
    """

    dry_run: bool
    older_than_s: float
    deleted: list[Unit] = field(default_factory=list)
    recent: list[Unit] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Bytes of the deleted units."""
        return sum(u.bytes for u in self.deleted)

    @property
    def objects(self) -> int:
        """Objects in the deleted units."""
        return sum(len(u.objects) for u in self.deleted)


def _unit_of(path: str) -> tuple[str, str] | None:
    """``(unit path, kind)`` of an object that may be garbage; None for objects vacuum never deletes."""
    parts = path.split("/")
    if parts[-1].startswith(".tmp-"):
        return path, "temporary"
    if len(parts) > 5 and parts[0] == layout.WRITERS and parts[2] == "data":
        return "/".join(parts[:5]), "fragment"  # writers/NNNNNN/data/<table>/<fragment>/...
    if len(parts) > 3 and parts[0] == layout.STATE and parts[2].startswith("payload-"):
        return "/".join(parts[:3]), "payload"  # state/<slot>/payload-<token>/...
    return None


def _live_fragments(store: OpenStore) -> tuple[set[str], dict[str, str]]:
    """Fragment directories the live log lists, and removed ones -> the commit record removing them.

    A segment-backed fragment's directory is its segment's: a segment no longer listed counts
    from the last record that removed a fragment it backed (a right-sized segment's original,
    whose files were last written long before).
    """
    live = {f.path for w in store.log.writers.values() for frags in w.fragments.values() for f in frags.values()}
    removed = {}
    segment_of: dict[tuple[int, str, str], str] = {}  # (writer, table, fragment) -> its segment, if segment-backed
    for c in sorted(store.log.history(), key=lambda c: (c.writer, c.seq)):
        for t, change in c.body.get("tables", {}).items():
            for name in change.get("remove", []):
                record = layout.commit_record(c.writer, c.seq)
                removed[layout.fragment_dir(c.writer, t, name)] = record
                segment = segment_of.get((c.writer, t, name))
                if segment is not None:
                    removed[layout.fragment_dir(c.writer, t, segment)] = record
            for added in change.get("add", []):  # (records the log applied: checked by store/format/bodies.py)
                if "segment" in added:
                    segment_of[(c.writer, t, added["name"])] = added["segment"]["name"]
    return live, removed


def _named_payloads(store: OpenStore, objects: list[ObjectInfo]) -> tuple[set[str], set[str]]:
    """Payload directories named by state records, and slots with a record that cannot be read."""
    named: set[str] = set()
    unreadable: set[str] = set()
    for o in objects:
        parts = o.path.split("/")
        if len(parts) != 3 or parts[0] != layout.STATE or not parts[2].endswith(".json"):
            continue
        try:
            body = records.decode(o.path, store.storage.read(o.path))
            named.update("/".join(p.split("/")[:3]) for p in body["arrays"].values())
        except (CorruptObjectError, FileNotFoundError, KeyError, TypeError, AttributeError):
            unreadable.add(parts[1])  # keep every payload of this slot: we cannot tell which it names
    return named, unreadable


def _superseded_states(store: OpenStore, objects: list[ObjectInfo], keep_last: int,
                       unreadable: set[str]) -> dict[str, list[ObjectInfo]]:
    """State record path -> the record and its payload objects, for superseded records.

    Each record older than its slot's newest ``keep_last`` (slots with an unreadable
    record are left whole).
    """
    versions: dict[str, list[tuple[int, ObjectInfo]]] = {}
    payloads: dict[str, list[ObjectInfo]] = {}
    for o in objects:
        parts = o.path.split("/")
        if parts[0] != layout.STATE or len(parts) < 3 or parts[1] in unreadable:
            continue
        if len(parts) == 3 and parts[2].endswith(".json") and parts[2][:-5].isdigit():
            versions.setdefault(parts[1], []).append((int(parts[2][:-5]), o))
        elif len(parts) > 3 and parts[2].startswith("payload-"):
            payloads.setdefault("/".join(parts[:3]), []).append(o)
    out: dict[str, list[ObjectInfo]] = {}
    for found in versions.values():
        for _, record in sorted(found, key=lambda vo: vo[0])[:-keep_last]:
            try:
                body = records.decode(record.path, store.storage.read(record.path))
            except FileNotFoundError:  # (deleted since the listing: by a save that superseded it)
                continue
            dirs = {"/".join(p.split("/")[:3]) for p in body["arrays"].values()}
            out[record.path] = [record, *(o for d in sorted(dirs) for o in payloads.get(d, []))]
    return out


def find_garbage(store: OpenStore, older_than_s: float = DEFAULT_OLDER_THAN_S,
                 state_keep_last: int = DEFAULT_STATE_KEEP_LAST) -> VacuumReport:
    """Classify the store's unreferenced objects (deletes nothing).

    Cost: one walk of every object under the store, one refresh, and reading
    the state records.

    Parameters
    ----------
    store : OpenStore
        The opened store.
    older_than_s : float, optional
        Units younger than this many seconds go to ``recent``.
    state_keep_last : int, optional
        State versions each slot keeps (older ones are garbage).

    Returns
    -------
    VacuumReport
        ``deleted`` lists what vacuum would delete (``dry_run`` is True).

    Raises
    ------
    StoreError
        ``older_than_s`` is not a number >= 0, or ``state_keep_last`` not an int >= 1.
    CorruptObjectError
        A commit record is damaged.
    """
    if isinstance(older_than_s, bool) or not isinstance(older_than_s, (int, float)) or not older_than_s >= 0:
        raise StoreError(f"older_than_s: expected a number of seconds >= 0, got {older_than_s!r}")
    if isinstance(state_keep_last, bool) or not isinstance(state_keep_last, int) or state_keep_last < 1:
        raise StoreError(f"state_keep_last: expected an int >= 1 (state versions to keep), got {state_keep_last!r}")
    objects = store.storage.walk("")  # first the listing, then the log: what is listed and committed is kept
    store.refresh()
    live, removed = _live_fragments(store)
    named, unreadable = _named_payloads(store, objects)
    superseded = _superseded_states(store, objects, state_keep_last, unreadable)
    in_superseded = {o.path for objs in superseded.values() for o in objs}
    named -= {"/".join(p.split("/")[:3]) for p in in_superseded if p.count("/") > 2}
    objects = [o for o in objects if o.path not in in_superseded]
    mtimes = {o.path: o.mtime_ns for o in objects}
    units: dict[tuple[str, str], list[ObjectInfo]] = {}
    for o in objects:
        unit = _unit_of(o.path)
        if unit is None:
            continue
        path, kind = unit
        if kind == "fragment" and path in live:
            continue
        if kind == "payload" and (path in named or path.split("/")[1] in unreadable):
            continue
        units.setdefault(unit, []).append(o)
    for path, objs in superseded.items():
        units[(path, "state")] = objs
    for path, mtime in _empty_fragment_dirs(store).items():
        if path not in live:
            units[(path, "fragment")] = []
            mtimes[path] = mtime
    for path, mtime in _empty_fragment_dirs(store, layout.STATE, ("*", "payload-*")).items():
        if path not in named and path.split("/")[1] not in unreadable:
            units[(path, "payload")] = []
            mtimes[path] = mtime
    report = VacuumReport(dry_run=True, older_than_s=float(older_than_s))
    now = time.time_ns()
    for (path, kind), objs in sorted(units.items()):
        since = max((o.mtime_ns for o in objs), default=mtimes.get(path, now))
        if path in removed:  # a removing commit created after the listing counts as just now
            since = max(since, mtimes.get(removed[path], now))
        found = Unit(path, kind, tuple(objs), since)
        (report.deleted if now - since >= older_than_s * 1e9 else report.recent).append(found)
    return report


DELETE_BATCH = 1000
"""Objects deleted per request at most (S3's bulk delete takes 1000); progress is reported per batch."""


def vacuum(store: OpenStore, older_than_s: float = DEFAULT_OLDER_THAN_S, dry_run: bool = False,
           state_keep_last: int = DEFAULT_STATE_KEEP_LAST,
           progress: Callable[[int, int], None] | None = None) -> VacuumReport:
    """Delete every garbage unit older than ``older_than_s`` (see the module docstring).

    The log is read again right before deleting, and a unit a commit made since
    references is kept; only the objects judged are deleted, never a whole
    prefix. Cost: :func:`find_garbage`, one more refresh, and the deletes.

    Parameters
    ----------
    store : OpenStore
        The opened store (writable).
    older_than_s : float, optional
        Only units unreferenced for at least this many seconds go.
    dry_run : bool, optional
        Delete nothing; report what would go.
    state_keep_last : int, optional
        State versions each slot keeps.
    progress : callable, optional
        Called as ``progress(done, total)`` with the units deleted so far and the units to
        delete: once before the first delete, then after each batch of deletes.

    Returns
    -------
    VacuumReport
        The units deleted (or that would be) and those left as too recent.

    Raises
    ------
    StoreError
        A bad ``older_than_s`` or ``state_keep_last``.
    CorruptObjectError
        A commit record is damaged.
    """
    report = find_garbage(store, older_than_s, state_keep_last)
    report.dry_run = dry_run
    if dry_run:
        return report
    _keep_referenced(store, report)
    total = len(report.deleted)
    if progress:
        progress(0, total)
    done = 0
    while done < total:
        # units whole, about DELETE_BATCH objects a request; each unit's objects in its order
        end = done + 1
        count = len(report.deleted[done].objects)
        while end < total and count + len(report.deleted[end].objects) <= DELETE_BATCH:
            count += len(report.deleted[end].objects)
            end += 1
        batch = report.deleted[done:end]
        # only the objects judged, never a whole prefix: nothing written since the listing goes
        store.storage.delete_objects([o.path for u in batch for o in u.objects])
        for unit in batch:
            _prune_empty_dirs(store, unit)
        done = end
        if progress:
            progress(done, total)
    return report


def _keep_referenced(store: OpenStore, report: VacuumReport) -> None:
    """Read the log again right before deleting and keep every fragment unit a new commit references.

    A commit created since :func:`find_garbage` read the log (its objects were listed
    before that commit existed). Cost: one refresh (the records created since).
    """
    store.refresh()
    live, _ = _live_fragments(store)
    report.deleted = [u for u in report.deleted if not (u.kind == "fragment" and u.path in live)]


def _empty_fragment_dirs(store: OpenStore, top_name: str = layout.WRITERS,
                         pattern: tuple[str, ...] = ("*", "data", "*", "*")) -> dict[str, int]:
    """Local filesystems: empty fragment directories -> their newest directory mtime.

    Fragment directories holding no file (a writer killed right after creating them);
    with ``top_name=STATE`` and ``pattern=("*", "payload-*")``, the same for state payload
    directories (a saver killed right after creating one). Object stores have no directories.
    """
    if not store.storage.supports_local_paths:
        return {}
    top = store.storage.local_path(top_name)
    root = store.storage.local_path("")
    if top is None or root is None or not os.path.isdir(top):
        return {}
    out: dict[str, int] = {}
    for frag_dir in glob.glob(os.path.join(glob.escape(top), *pattern)):
        newest, empty = 0, True
        for directory, _, files in os.walk(frag_dir):
            empty &= not files
            try:
                newest = max(newest, os.stat(directory).st_mtime_ns)
            except FileNotFoundError:
                pass
        if empty and newest:
            out[os.path.relpath(frag_dir, root).replace(os.sep, "/")] = newest
    return out


def _prune_empty_dirs(store: OpenStore, unit: Unit) -> None:
    """Remove a deleted unit's now-empty directories (local filesystems; object stores have none)."""
    if unit.kind == "state":  # a record and its payload directories
        for path in sorted({"/".join(o.path.split("/")[:3]) for o in unit.objects[1:]}):
            _prune_empty_dirs(store, Unit(path, "payload", (), unit.since_ns))
        return
    top = store.storage.local_path(unit.path)
    if top is None or unit.kind == "temporary" or not os.path.isdir(top):
        return
    for directory, _, _ in sorted(os.walk(top), key=lambda d: -d[0].count(os.sep)):
        try:
            os.rmdir(directory)  # fails (and is left) if something was written there since
        except OSError:
            pass
