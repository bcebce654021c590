"""Reading a table's committed records.

Reading: the commit log merged into live fragments, a table's views, spans, the (stream,
step) index, Arrow scans, view diffs and what a capped store keeps.

Depends on :mod:`replaystore.store.format` and :mod:`replaystore.store.storage`.
"""
