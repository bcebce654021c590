"""Maintenance of a whole store.

Maintenance: integrity verification, vacuum, replacing a store and the compaction rewrite.

Depends on :mod:`replaystore.store.read`, :mod:`replaystore.store.format` and
:mod:`replaystore.store.storage`.
"""
