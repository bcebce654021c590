"""A store's state slots: versioned JSON documents plus named arrays (docs/FORMAT.md, "State slots").

:class:`StateSlots` is the part of a :class:`~replaystore.store.store.Store` handle that saves,
lists and loads them; the handle forwards ``save_state``, ``state_slots`` and ``load_state``.
"""

from __future__ import annotations

import io
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from replaystore.errors import CorruptObjectError, ReadOnlyError, StoreError
from replaystore.store.format import bodies, layout, records
from replaystore.store.format.bodies import load_npy
from replaystore.store.format.generations import foreign
from replaystore.store.storage import Storage

STATE_KEEP_LAST = 2
"""Versions of a state slot kept by default (``save_state``, ``vacuum``)."""


class StateSlots:
    """Save, list and load the state slots of one store handle.

    Parameters
    ----------
    storage : Storage
        The store's storage.
    generation : str
        The store's generation: new records carry it; records of another are not this store's.
    read_only : bool
        The handle was opened with mode ``"r"``: saving is refused.
    check_current : callable
        Raises ``StoreReplacedError`` once the store was replaced (``Store.check_current``).
    may_delete : callable
        Whether older versions may be deleted (the store is not replaced).
    """

    def __init__(self, storage: Storage, generation: str, read_only: bool, check_current: Callable[[], None],
                 may_delete: Callable[[], bool]) -> None:
        self.storage = storage
        self.generation = generation
        self.read_only = read_only
        self.check_current = check_current
        self.may_delete = may_delete

    def save(self, slot: str, doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None, *,
             keep_last: int = STATE_KEEP_LAST) -> int:
        """Persist a JSON document plus named arrays (``.npy``, no pickle) as the slot's next version.

        Parameters
        ----------
        slot : str
            The slot's name (docs/FORMAT.md, "Object names": no ``/``, not starting with ``.``).
        doc : mapping
            A JSON document (str keys; no NaN or infinity).
        arrays : mapping of str to numpy.ndarray, optional
            Named arrays (names as slot names); never pickled (object arrays are refused).
        keep_last : int, default 2
            How many versions of the slot to keep (>= 1): once the new version's record
            exists, the versions older than the newest ``keep_last`` are deleted, each record
            before its arrays (docs/FORMAT.md, "State slots").

        Returns
        -------
        int
            The new version number.

        Raises
        ------
        ReadOnlyError
            The store was opened with mode ``"r"``.
        InvalidNameError
            ``slot`` or an array name breaks the name grammar.
        MetadataError
            ``doc`` is not a JSON document.
        StoreReplacedError
            The store was replaced (``mode="w+"``) since this handle opened it (nothing saved).
        StoreError
            A bad ``keep_last``.

        Notes
        -----
        Cost: a read of the manifest (see ``Store.check_current``), one object per array and
        one record, plus a listing of the slot and the deletion of what it no longer keeps.
        """
        if self.read_only:
            raise ReadOnlyError("store opened read-only (mode='r'): save_state is not allowed")
        layout.given_name("state slot", slot, "save_state slot")
        for name in arrays or {}:
            layout.given_name("state array", name, "save_state arrays")
        check_keep_last(keep_last)
        doc = records.json_document("state", dict(doc))
        self.check_current()  # (a replaced store's saver writes nothing into the new store)
        token = uuid.uuid4().hex  # payloads of this attempt only: a racing saver never overwrites them
        names = {}
        for name, arr in (arrays or {}).items():
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
            path = layout.state_payload(slot, token, f"{name}.npy")
            self.storage.write(path, buf.getvalue())
            names[name] = path
        self.storage.sync_dirs(list(names.values()))
        version = self.latest(slot) + 1
        while True:
            body = {"slot": slot, "version": version, "time_ns": time.time_ns(), "doc": doc, "arrays": names,
                    "generation": self.generation}
            if self.storage.create(layout.state_record(slot, version), records.encode(body)):
                break
            version += 1
        if self.may_delete():  # (nor deletes the new store's versions)
            self.drop_older(slot, version, keep_last)
        return version

    def drop_older(self, slot: str, saved: int, keep_last: int) -> None:
        """Delete the slot's versions older than the newest ``keep_last`` up to ``saved``.

        ``saved`` was just created, intact. Each record goes first, then its arrays, so that a
        crash at any instant leaves every remaining record whole (arrays of a deleted record
        are vacuum's).
        """
        # (``saved`` counted even if a stale listing misses it: it is the newest of what is kept)
        older = sorted({v for v in self.versions(slot) if v < saved} | {saved})[:-keep_last]
        for version in older:
            path = layout.state_record(slot, version)
            try:
                body = records.decode(path, self.storage.read(path))
                payloads = {"/".join(layout.state_payload_of(slot, name, p, path).split("/")[:3])
                            for name, p in body["arrays"].items()}
            except (CorruptObjectError, FileNotFoundError, KeyError, TypeError, AttributeError):
                payloads = set()  # (damaged or unsafe: its arrays, if any, are left to vacuum)
            self.storage.delete(path)
            for payload in sorted(payloads):
                self.storage.delete(payload)

    def versions(self, slot: str) -> list[int]:
        """The slot's version numbers with a record, ascending (one listing)."""
        return sorted(int(n[:-5]) for n in self.storage.list(layout.state_dir(slot))
                      if n.endswith(".json") and n[:-5].isdigit())

    def latest(self, slot: str) -> int:
        """The slot's newest version number; -1 if it has none."""
        return max(self.versions(slot), default=-1)

    def slots(self) -> dict[str, dict[str, Any]]:
        """Every state slot with its saved versions and size.

        Returns
        -------
        dict
            ``{slot: {"versions": [V, ...], "bytes": n}}``: versions ascending, bytes stored
            under the slot (records and arrays).

        Notes
        -----
        Cost: a listing of ``state/`` and of each slot.
        """
        out = {}
        for slot in self.storage.list(layout.STATE):
            versions = self.versions(slot)
            if versions:
                out[slot] = {"versions": versions, "bytes": self.storage.total_size(layout.state_dir(slot))}
        return out

    def load(self, slot: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """The latest saved ``(doc, arrays)`` of a slot.

        A damaged latest record (or one whose arrays are missing) is skipped with a
        warning naming it, and the newest intact version is returned instead. Versions that
        a concurrent save deleted while this load read them are not damage: the slot is
        listed again.

        Parameters
        ----------
        slot : str
            The slot's name.

        Returns
        -------
        tuple of (dict, dict of str to numpy.ndarray) or None
            The document and the arrays of the newest intact version; None if the slot has
            none (never saved, or every version damaged).

        Raises
        ------
        InvalidNameError
            ``slot`` breaks the name grammar.

        Notes
        -----
        Cost: a listing and the newest intact version's objects.
        """
        layout.given_name("state slot", slot, "load_state slot")
        seen = -1
        while True:
            versions = self.versions(slot)
            if not versions or versions[-1] <= seen:
                return None
            seen = versions[-1]
            for version in reversed(versions):
                path = layout.state_record(slot, version)
                try:
                    body = bodies.state(path, records.decode(path, records.read(self.storage, path)), slot, version)
                    if foreign(body, self.generation):
                        continue  # a replaced store's saver left it: not this store's
                    arrays = {name: load_npy(p, self.storage.read(p)) for name, p in body["arrays"].items()}
                except FileNotFoundError as exc:
                    if version not in self.versions(slot):
                        continue  # superseded and deleted meanwhile by a save (keep_last)
                    warnings.warn(f"state slot {slot!r}: skipping damaged version {version} ({exc})", stacklevel=3)
                    continue
                except (CorruptObjectError, ValueError) as exc:
                    warnings.warn(f"state slot {slot!r}: skipping damaged version {version} ({exc})", stacklevel=3)
                    continue
                return body["doc"], arrays


def check_keep_last(keep_last: int) -> None:
    """Raise :class:`StoreError` unless ``keep_last`` is an int >= 1."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise StoreError(f"keep_last: expected an int >= 1 (state versions to keep), got {keep_last!r}")
