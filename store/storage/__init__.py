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


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """A backend for a local path, ``file://`` URL or any supported fsspec URL.

    Opening touches nothing in storage (S3: no request).

    Parameters
    ----------
    url : str or os.PathLike
        A local path, a ``file://`` URL, ``memory://...`` or ``s3://...``.
    storage_options : mapping, optional
        Passed to fsspec (e.g. S3 credentials or ``endpoint_url``).

    Returns
    -------
    Storage
        :class:`LocalStorage` or :class:`FsspecStorage`.

    Raises
    ------
    StorageError
        ``url`` is not a string or path, or names a filesystem without a known
        create-if-absent primitive.
    StorageURLError
        The filesystem's package is not installed, or the options are not accepted.
    """
    if not isinstance(url, (str, os.PathLike)):
        raise StorageError(f"url: expected a path or URL string, got {type(url).__name__}")
    url = os.fspath(url)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" not in url:
        return LocalStorage(url)
    return FsspecStorage(url, storage_options)


__all__ = ["Buffer", "FsspecStorage", "LocalStorage", "ObjectInfo", "ObjectStream", "Storage", "StorageError",
           "StorageUnavailableError", "StorageURLError", "open_storage"]
