"""The storage protocol the format needs (base.py) and its backends.

Local files (local.py), S3 and ``memory://`` through fsspec (objects.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from replaystore.store.storage.base import (
    Buffer,
    ObjectInfo,
    ObjectStream,
    Storage,
    StorageError,
    StorageUnavailableError,
    StorageURLError,
)
from replaystore.store.storage.local import LocalStorage
from replaystore.store.storage.objects import FsspecStorage


def open_storage(url: str | os.PathLike[str] | Storage, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """A backend for a local path, ``file://`` URL or any supported fsspec URL, or a backend given.

    Opening touches nothing in storage (S3: no request). A :class:`Storage`
    instance (a custom backend) is returned as it is, once its flags show the
    guarantees the format needs (``supports_atomic_create``,
    ``supports_consistent_listing``).

    Parameters
    ----------
    url : str, os.PathLike or Storage
        A local path, a ``file://`` URL, ``memory://...`` or ``s3://...``; or a backend.
        A leading ``~`` of a local path (``~/replay``, ``file://~/replay``) is the
        user's home directory; it is never expanded inside other URLs.
    storage_options : mapping, optional
        Passed to fsspec (e.g. S3 credentials or ``endpoint_url``).

    Returns
    -------
    Storage
        :class:`LocalStorage` or :class:`FsspecStorage`, or ``url`` itself.

    Raises
    ------
    StorageError
        ``url`` is not a string, path or Storage; names a filesystem without a known
        create-if-absent primitive; or is a Storage without atomic create-if-absent
        or consistent listings (``storage_options`` given with a Storage too).
    StorageURLError
        The filesystem's package is not installed, or the options are not accepted.
    """
    if isinstance(url, Storage):
        return _checked(url, storage_options)
    if not isinstance(url, (str, os.PathLike)):
        raise StorageError(f"url: expected a path, URL string or Storage, got {type(url).__name__}")
    url = os.fspath(url)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        return LocalStorage(os.path.expanduser(url))
    return FsspecStorage(url, storage_options)


def _checked(storage: Storage, storage_options: Mapping[str, Any] | None) -> Storage:
    """``storage``, refused unless its flags declare what the format needs."""
    name = type(storage).__name__
    if storage_options:
        raise StorageError(f"storage_options: not taken with a Storage ({name}); configure the backend itself")
    for flag in ("supports_atomic_create", "supports_consistent_listing"):
        if not getattr(storage, flag):
            raise StorageError(f"{name}: {flag} is False; the format needs it (docs/FORMAT.md, "
                               "\"Storage guarantees\"), so replaystore refuses this backend")
    return storage


__all__ = ["Buffer", "FsspecStorage", "LocalStorage", "ObjectInfo", "ObjectStream", "Storage", "StorageError",
           "StorageUnavailableError", "StorageURLError", "open_storage"]
