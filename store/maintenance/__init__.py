"""Maintenance of a whole store, and the maintenance API the tools use.

Maintenance: integrity verification, vacuum, replacing a store and the compaction rewrite.
Depends on :mod:`replaystore.store.read`, :mod:`replaystore.store.format` and
:mod:`replaystore.store.storage`; it never imports ``store.py`` (verification and vacuum take
any object with a ``Store``'s ``storage``, ``log``, ... : :class:`OpenStore`).

The names below (``__all__``) are a public module, as ``replaystore.store`` is: the small,
documented maintenance API that tools (``replaystore verify``, ``info``, ``copy``) and
operators call. The other modules of this package are internals.
"""

from replaystore.store.maintenance.base import OpenStore
from replaystore.store.maintenance.live import MANIFEST, live_objects, read_state_record
from replaystore.store.maintenance.vacuum import Unit, VacuumReport
from replaystore.store.maintenance.verify import Problem
from replaystore.store.maintenance.verify import verify as verify_store

__all__ = [
    "MANIFEST",
    "OpenStore",
    "Problem",
    "Unit",
    "VacuumReport",
    "live_objects",
    "read_state_record",
    "verify_store",
]
