"""The on-disk format, with no I/O policy of its own.

The on-disk format: object names, self-checking records and their bodies, Zarr chunk I/O,
codecs, fragments, open segments and store generations.

Depends only on :mod:`replaystore.store.storage`; everything else in the store builds on it.

Arguments named alike mean the same in every function and class here (and in the modules
that refer to this docstring), and their docstrings list only their other parameters:
``storage`` is the store's storage, ``schema`` the table's schema, ``writer`` the writer's
id, ``table`` the table's name, ``array_path`` an array's directory, ``ndim`` its number
of dimensions, ``cpath`` a chunk's path, and ``path``, where an object's bytes are checked,
that object's path (named in errors).
"""
