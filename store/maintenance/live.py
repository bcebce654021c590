"""What a store's state references, as a copy needs it: every live object, named in a stable order.

The objects one refresh of the log shows as the store: its writers' registrations and commit
records, the data units its live fragments name, and each state slot's records with the
payloads they name. Crash leftovers, compacted-away data, temporary objects and vacuum's other
garbage are not listed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replaystore.errors import CorruptObjectError
from replaystore.store.format import bodies, layout, records

if TYPE_CHECKING:
    from replaystore.store.maintenance.base import OpenStore
    from replaystore.store.storage import Storage

MANIFEST = layout.MANIFEST
"""The manifest's object name (docs/FORMAT.md, "Layout"): the one object :func:`live_objects`
leaves out, since a copy writes it last."""


def read_state_record(storage: Storage, slot: str, version: int) -> dict[str, Any]:
    """State record ``version`` of ``slot``, checked as ``Store.load_state`` checks it.

    Parameters
    ----------
    storage : Storage
        The store's storage.
    slot : str
        The state slot (its name checked against the format's grammar).
    version : int
        The version.

    Returns
    -------
    dict
        The record's body: ``slot``, ``version``, ``time_ns``, ``doc`` and ``arrays``
        (array name to its payload's path in this slot).

    Raises
    ------
    CorruptObjectError
        The record is damaged: not a record, a missing or malformed field, a payload
        path that is not this slot's (UnsafeNameError), larger than a record may be,
        or not a regular file.
    FileNotFoundError
        The record is absent.

    Notes
    -----
    Cost: one read of the record.
    """
    path = layout.state_record(slot, version)
    return bodies.state(path, records.decode(path, records.read(storage, path)), slot, version)


def _state_objects(storage: Storage) -> list[str]:
    """Every state record of every slot and the payload objects it names."""
    out = []
    for slot in storage.list(layout.STATE):
        versions = sorted(int(n[:-5]) for n in storage.list(layout.state_dir(slot))
                          if n.endswith(".json") and n[:-5].isdigit())
        for version in versions:
            path = layout.state_record(slot, version)
            try:  # checked as load_state checks it: a damaged record is a CorruptObjectError naming it
                body = read_state_record(storage, slot, version)
            except FileNotFoundError:  # superseded by a save meanwhile
                continue
            arrays = body.get("arrays")
            if not isinstance(arrays, dict):  # (as load_state would: a record whose payloads cannot be named)
                raise CorruptObjectError(path, f"field 'arrays': expected a JSON object, got {type(arrays).__name__}")
            out += [path, *(layout.state_payload_of(slot, name, p, path) for name, p in arrays.items())]
    return out


def live_objects(store: OpenStore) -> list[str]:
    """The objects the store's state references, as its log was last refreshed; the manifest left out.

    In the order a copy writes them: each writer's registration and commit records (by writer,
    then sequence number), the objects of every data unit a live fragment names (a segment once
    for all its fragments; temporary objects left out), then each state slot's records (by slot,
    then version) each followed by the payloads it names. The manifest (:data:`MANIFEST`) is
    not listed: a copy writes it last, so that an interrupted copy leaves no store.

    Parameters
    ----------
    store : Store
        An open store (any object with its ``storage`` and ``log``); refresh it first to list
        its current state.

    Returns
    -------
    list of str
        Object paths under the store's root; an object deleted since (a data unit
        reclaimed, a state version superseded) may be listed and then be absent.

    Raises
    ------
    CorruptObjectError
        A damaged state record (naming it), or (UnsafeNameError) a payload path that is
        not its slot's.

    Notes
    -----
    Cost: one listing of each live data unit, of ``state/`` and of each slot, and one read
    of each state record.
    """
    log, storage = store.log, store.storage
    paths = [layout.writer_record(w) for w in sorted(log.writers)]
    paths += [layout.commit_record(w, seq) for w, wlog in sorted(log.writers.items()) for seq in range(wlog.next_seq)]
    units = sorted({f.path for w in log.writers.values() for frags in w.fragments.values() for f in frags.values()})
    for unit in units:
        paths += [o.path for o in storage.walk(unit) if not o.path.rsplit("/", 1)[-1].startswith(".tmp-")]
    return paths + _state_objects(storage)
