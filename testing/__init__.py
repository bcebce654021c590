"""Test suites a third-party backend can run: ``replaystore.testing`` (needs pytest).

:class:`StorageTests` is the storage conformance suite, in the shape of zarr-python's
``zarr.testing.store.StoreTests``: subclass it in a test module, give it a ``storage``
fixture returning a fresh, empty backend, and pytest runs every check of the
:class:`~replaystore.store.storage.Storage` protocol on it, guided by the backend's
``supports_*`` flags, plus a store round trip on it. The backends replaystore ships
(local files, ``memory://``, S3) pass it.

Importing this package imports pytest (the ``test`` extra); ``import replaystore``
never does.
"""

from __future__ import annotations

from replaystore.testing.storage import StorageTests

__all__ = ["StorageTests"]
