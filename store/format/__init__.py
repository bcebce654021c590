"""The on-disk format, with no I/O policy of its own.

The on-disk format: object names, self-checking records and their bodies, Zarr chunk I/O,
codecs, fragments, open segments and store generations.

Depends only on :mod:`replaystore.store.storage`; everything else in the store builds on it.
"""
