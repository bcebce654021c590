"""Storage through fsspec: ``s3://`` (create-if-absent by conditional PUT) and ``memory://``."""

from __future__ import annotations

import builtins
import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from replaystore.errors import ReplayStoreError
from replaystore.store.storage.base import ObjectInfo, Storage, StorageError, StorageUnavailableError, StorageURLError

_MEMORY_LOCK = threading.RLock()


def _new_memory_lock() -> None:
    """In a forked child (a DataLoader worker, say) no thread holds the lock.

    A parent thread inside a ``memory://`` call at the fork would otherwise leave the child's
    copy held forever.
    """
    global _MEMORY_LOCK
    _MEMORY_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_memory_lock)

CONFLICT_RETRIES = 12
CONFLICT_BACKOFF_S = 0.02
CONFLICT_BACKOFF_MAX_S = 2.0
_CONDITIONAL_PUT_CHECKED: set[tuple[str, str]] = set()  # (endpoint options, bucket) that honoured it
_CHECK_LOCK = threading.Lock()
PROBE_PREFIX = ".tmp-create-probe-"


class _Wrapped:
    """An fsspec filesystem whose method calls all go through :meth:`_call`; other attributes read through."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(attr, args, kwargs)
        return call

    def _call(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


class _Serialized(_Wrapped):
    """An fsspec filesystem whose every call runs under one lock.

    The ``memory://`` of fsspec keeps all files in one process-wide dict and walks it unlocked
    (``find``, ``rm``, ``ls``); a thread writing meanwhile (a writer's I/O threads, a
    DataLoader's) can make that walk raise "dictionary changed size during iteration".
    """

    def _call(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with _MEMORY_LOCK:
            return method(*args, **kwargs)


_CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3")


def _is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the S3 client stack untranslated.

    s3fs turns S3's own error responses into ``OSError`` subclasses, but not missing
    credentials or connection failures.
    """
    return not isinstance(exc, (OSError, ReplayStoreError)) and type(exc).__module__.startswith(_CLIENT_MODULES)


class _Translated(_Wrapped):
    """An s3fs filesystem whose calls raise :class:`StorageUnavailableError` for client-side failures.

    An ``OSError``, for the failures that s3fs lets through as botocore or aiohttp
    exceptions.
    """

    def __init__(self, fs: Any, url: str) -> None:
        super().__init__(fs)
        self._url = url

    def _call(self, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return method(*args, **kwargs)
        except TypeError as exc:
            if "keyword argument" in str(exc):  # s3fs passes unknown options on to its session lazily
                raise StorageURLError(f"{self._url}: a storage option is not accepted ({exc})") from None
            raise
        except Exception as exc:
            if _is_client_error(exc):
                raise StorageUnavailableError(f"{self._url}: {type(exc).__name__}: {exc}") from exc
            raise


class FsspecStorage(Storage):
    """``s3://`` and ``memory://`` through fsspec.

    Create-if-absent: S3 conditional PUT (``If-None-Match: *``, checked to be
    honoured before the first create through an endpoint); ``memory://`` checks
    and writes under the process lock that every ``memory://`` call takes (it is
    process-local anyway). Any other fsspec filesystem is refused. S3 listings
    are never cached (the format trusts no listing that may be stale), and S3
    client errors are raised as :class:`StorageUnavailableError`.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix`` or ``memory://...``.
    storage_options : mapping, optional
        Passed to fsspec (e.g. ``key``, ``secret``, ``endpoint_url``).

    Raises
    ------
    StorageURLError
        The filesystem's package is not installed, or the options are not accepted.
    StorageError
        The fsspec filesystem offers no known create-if-absent primitive.
    """

    supports_atomic_create = True  # (a filesystem without create-if-absent is refused at construction)
    supports_consistent_listing = True  # (S3 listings are never cached)

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **_fresh_listings(self.url, self.storage_options))
        except ImportError as exc:
            raise StorageURLError(f"{url}: the filesystem's package is not installed ({exc}); for s3:// "
                               "install replaystore[s3]") from None
        except (ValueError, TypeError) as exc:
            raise StorageURLError(f"{url}: cannot open this URL with the storage options given ({exc})") from None
        self.root = root.rstrip("/")
        self.conflict_retries = CONFLICT_RETRIES  # attempts of a conditional PUT answered 409 (see _conditional_put)
        self.conflict_backoff_s = CONFLICT_BACKOFF_S
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if "memory" in protocols:
            self._create_mode = "lock"
            self.fs = _Serialized(self.fs)
        elif {"s3", "s3a"} & set(protocols):
            self._create_mode = "conditional-put"
            self.remote = True
            self.fs = _Translated(self.fs, self.url)
        else:
            raise StorageError(
                f"{url}: fsspec filesystem {protocols[0]!r} offers no known create-if-absent primitive; "
                "replaystore refuses it rather than risk lost commits (local paths, memory:// and s3:// work)")

    def _p(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def read(self, path: str) -> bytes:
        # docstring inherited:
        # The whole object ``path``.
        return self.fs.cat_file(self._p(path))

    def download(self, path: str, local: str) -> None:
        # docstring inherited:
        # Write the object to the local file ``local``.
        self.fs.get_file(self._p(path), local)  # s3fs: one GET, the body copied in 64 KiB pieces

    def read_many(self, paths: Sequence[str]) -> list[bytes | None]:
        # docstring inherited:
        # Each object whole, None where absent; read concurrently.
        if len(paths) < 2:
            return super().read_many(paths)
        full = [self._p(p) for p in paths]
        got = self.fs.cat(full, on_error="return")  # s3fs: concurrent GETs on its event loop
        out: list[bytes | None] = []
        for f in full:
            value = got[f]
            if isinstance(value, FileNotFoundError):
                out.append(None)
            elif isinstance(value, BaseException):
                if _is_client_error(value):  # (cat returns what s3fs let through untranslated)
                    raise StorageUnavailableError(f"{self.url}: {type(value).__name__}: {value}") from value
                raise value
            else:
                out.append(value)
        return out

    def sizes(self, paths: Sequence[str]) -> list[int | None]:
        # docstring inherited:
        # Each object's size in bytes, None where absent; asked concurrently.
        if len(paths) < 2:
            return super().sizes(paths)
        try:
            return [int(n) for n in self.fs.sizes([self._p(p) for p in paths])]  # s3fs: concurrent HEADs
        except FileNotFoundError:  # one is gone (reclaimed meanwhile): ask each
            return super().sizes(paths)

    def write(self, path: str, data: bytes | memoryview) -> None:
        # docstring inherited
        self.fs.pipe_file(self._p(path), bytes(data))

    def create(self, path: str, data: bytes) -> bool:
        # docstring inherited:
        # Create ``path`` atomically and durably if absent.
        full = self._p(path)
        if self._create_mode == "lock":
            with _MEMORY_LOCK:
                if self.fs.exists(full):
                    return False
                self.fs.pipe_file(full, data)
                return True
        self.check_create()
        return self._conditional_put(full, data)

    def check_create(self) -> None:
        # docstring inherited:
        # Refuse an S3-API endpoint that ignores ``If-None-Match: *``.
        #
        # Checked once per endpoint and bucket: before the first create-if-absent
        # through an endpoint, create a fresh probe object twice: the second create
        # must fail. A server that overwrites instead would let two writers both take
        # one commit number (one commit lost), so the store is refused before anything
        # else is created.
        if self._create_mode != "conditional-put":
            return
        key = (repr(sorted(self.storage_options.items())), self.root.split("/", 1)[0])
        with _CHECK_LOCK:
            if key in _CONDITIONAL_PUT_CHECKED:
                return
            probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"  # a temporary name: readers ignore it (FORMAT.md)
            try:
                honoured = self._conditional_put(self._p(probe), b"1") and not self._conditional_put(
                    self._p(probe), b"2")
            finally:
                self.delete(probe)
            if not honoured:
                raise StorageError(
                    f"{self.url}: the S3 endpoint ignores conditional writes (PUT If-None-Match: * overwrote an "
                    "existing object); replaystore refuses it rather than risk lost commits. Use an S3 service "
                    "that supports conditional writes (AWS S3 does)")
            _CONDITIONAL_PUT_CHECKED.add(key)

    def _conditional_put(self, full: str, data: bytes) -> bool:
        """``PUT If-None-Match: *``: True on 200, False on 412; 409 is retried with backoff.

        S3 answers 409 ConditionalRequestConflict while another conditional write to the
        same key is in flight; that attempt wrote nothing, so it is repeated (exponential
        backoff with jitter, ``conflict_retries`` attempts in all) until the answer is
        definitive. A 412 is checked by reading the object back: if it holds our bytes, an
        earlier attempt of ours landed but its answer was lost (s3fs and botocore repeat a
        request after a 5xx or a dropped connection), and the create is ours.
        """
        delay = self.conflict_backoff_s
        for attempt in range(self.conflict_retries):
            if attempt:
                time.sleep(delay * (0.5 + random.random()))  # backoff between attempts, not synchronisation
                delay = min(delay * 2, CONFLICT_BACKOFF_MAX_S)
            try:
                self.fs.pipe_file(full, data, mode="create")
                return True
            except FileExistsError:
                return self._holds(full, data)
            except OSError as exc:
                code, status = _s3_error(exc)
                if code == "PreconditionFailed" or status == 412:
                    return self._holds(full, data)
                if code != "ConditionalRequestConflict" and status != 409:
                    raise
        raise StorageError(f"{full}: conditional create still answered 409 ConditionalRequestConflict after "
                           f"{self.conflict_retries} attempts; the key is contended or the endpoint is stuck")

    def _holds(self, full: str, data: bytes) -> bool:
        """Whether the object at ``full`` (which a 412 said exists) holds exactly ``data``."""
        try:
            return bool(self.fs.cat_file(full) == data)
        except FileNotFoundError:  # deleted in between: not ours to claim
            return False

    def exists(self, path: str) -> bool:
        # docstring inherited
        return self.fs.exists(self._p(path))

    def list(self, prefix: str) -> list[str]:
        # docstring inherited
        full = self._p(prefix)
        try:
            entries = self.fs.ls(full, detail=False, refresh=True) if self._create_mode != "lock" \
                else self.fs.ls(full, detail=False)
        except FileNotFoundError:
            return []
        names = {e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != full.lstrip("/")
                 and e.rstrip("/") != full}
        return sorted(n for n in names if not n.startswith(".tmp-"))

    def delete(self, path: str) -> None:
        # docstring inherited
        full = self._p(path)
        try:
            if self.fs.isdir(full):
                self.fs.rm(full, recursive=True)
            else:
                self.fs.rm_file(full)
        except FileNotFoundError:
            pass

    def size(self, path: str) -> int:
        # docstring inherited
        return int(self.fs.size(self._p(path)))

    def is_dir(self, path: str) -> bool:
        # docstring inherited
        return bool(self.fs.isdir(self._p(path)))

    def delete_objects(self, paths: builtins.list[str]) -> None:
        # docstring inherited:
        # One bulk request per 1000 objects on S3 (s3fs ``rm`` of a list).
        if paths:
            try:
                self.fs.rm([self._p(p) for p in paths])
            except FileNotFoundError:  # memory:// stops at the first absent path: the rest one by one
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(self._p(path))

    def total_size(self, prefix: str = "") -> int:
        # docstring inherited:
        # Bytes stored under ``prefix``: the sizes one recursive listing reports.
        #
        # S3: one ``LIST`` per 1000 objects, so an object deleted meanwhile (a
        # compaction's originals) is no error.
        return sum(o.size for o in self.walk(prefix))

    def walk(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        # docstring inherited:
        # Every object under ``prefix`` with its size and modification time (S3: LastModified).
        full = self._p(prefix)
        if self._create_mode != "lock":
            self.fs.invalidate_cache(full)
        try:
            found = self.fs.find(full, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        base = self.fs._strip_protocol(self.root).rstrip("/")
        out = []
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = name.lstrip("/")[len(base.lstrip("/")):].lstrip("/")
            out.append(ObjectInfo(rel, int(info.get("size") or 0), _mtime_ns(info)))
        return sorted(out, key=lambda o: o.path)


def _fresh_listings(url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for an S3 URL with s3fs's listings cache (its ``dircache``) turned off.

    s3fs keeps every listing it made (``ls``, ``find``) per filesystem instance, and fsspec
    shares one instance among all calls with equal options in a process. With the cache on,
    ``info``/``exists``/``size``, and ``cat_file`` (which asks for the size first), answer
    "absent" for any object created after its directory was listed, without asking the
    server: a commit record created by another process after a listing (vacuum's, ``info``'s,
    ``verify``'s) would read as absent and a refresh would miss it. The format trusts no
    listing that may be stale (docs/FORMAT.md, "Object storage"), so the cache is off here
    whatever the caller passed; it costs nothing the format relies on (every listing it
    makes is a fresh ``LIST``). Other URLs are returned unchanged.
    """
    if url.split("://", 1)[0] in ("s3", "s3a"):
        return {**options, "use_listings_cache": False}
    return dict(options)


def _s3_error(exc: BaseException) -> tuple[str, int | None]:
    """The S3 error code and HTTP status behind an s3fs exception (its cause is botocore's ClientError)."""
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return (str(response.get("Error", {}).get("Code", "")),
                    response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
    text = repr(exc)  # some s3fs versions keep only the message
    for code, status in (("PreconditionFailed", 412), ("ConditionalRequestConflict", 409)):
        if code in text:
            return code, status
    return "", None


def _mtime_ns(info: Mapping[str, Any]) -> int:
    """An fsspec entry's modification time in ns (s3fs: ``LastModified``; memory: ``created``)."""
    value = info.get("LastModified", info.get("mtime", info.get("created")))
    if value is None:
        raise StorageError(f"{info.get('name')}: the backend reports no modification time")
    if hasattr(value, "timestamp"):
        value = value.timestamp()
    return int(float(value) * 1e9)
