"""Writing: the writer and its parts.

Writing: the writer and its parts (step bookkeeping, segment pool, committer, reclaimer,
compactor, I/O threads), batch validation, sizing and writer liveness.

Depends on :mod:`replaystore.store.maintenance`, :mod:`replaystore.store.read`,
:mod:`replaystore.store.format` and :mod:`replaystore.store.storage`.
"""
