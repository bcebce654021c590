"""Self-checking JSON documents: the manifest, commit records, state-slot records.

Every document is ``{"body": {...}, "crc32c": N}`` where N is the CRC32C of the
canonical JSON encoding of ``body`` (sorted keys, no spaces). A truncated or
damaged document is detected and reported, never trusted.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import google_crc32c

from replaystore.errors import CorruptObjectError

if TYPE_CHECKING:
    from replaystore.store.storage.base import Storage


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


_HEAD, _TAIL = b'{"body":', b',"crc32c":'


def encode(body: dict[str, Any]) -> bytes:
    """The self-checking document of ``body``: ``{"body": body, "crc32c": N}``.

    Canonical JSON (sorted keys, no spaces); N is the CRC32C of the body's
    encoding. Cost: one JSON encoding.

    Parameters
    ----------
    body : dict
        A JSON object (no NaN or infinity).

    Returns
    -------
    bytes
        The document, ASCII JSON (what :func:`decode` takes back).

    Raises
    ------
    ValueError
        The body holds NaN or infinity.
    TypeError
        The body holds a value JSON cannot encode.
    """
    raw = _canonical(body)
    # the document's canonical encoding ("body" sorts before "crc32c"), built around the body's
    return b"".join((_HEAD, raw, _TAIL, str(google_crc32c.value(raw)).encode(), b"}"))


MAX_BYTES = 64 << 20
"""The largest record document a reader accepts (the reference writer's are kilobytes)."""


def decode(path: str, data: bytes) -> dict[str, Any]:
    """The body of the record document ``data`` read from ``path``.

    What the body holds is checked by store/format/bodies.py. Cost: one parse (two
    where the layout is not :func:`encode`'s).

    Parameters
    ----------
    data : bytes
        The document.

    Returns
    -------
    dict
        The body.

    Raises
    ------
    CorruptObjectError
        The document is over :data:`MAX_BYTES`, does not parse, fails its
        checksum or its body is not a JSON object.
    """
    if len(data) > MAX_BYTES:
        raise CorruptObjectError(path, f"{len(data)} bytes: larger than any record ({MAX_BYTES} bytes at most)")
    body = _decode_canonical(data)
    if body is None:
        try:
            doc = json.loads(data)
            body, crc = doc["body"], doc["crc32c"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise CorruptObjectError(path, "not a replaystore record (truncated or garbage)") from None
        if google_crc32c.value(_canonical(body)) != crc:
            raise CorruptObjectError(path, "record checksum mismatch")
    if not isinstance(body, dict):
        raise CorruptObjectError(path, f"record body is a JSON {type(body).__name__}, not an object")
    return body


def read(storage: Storage, path: str) -> bytes:
    """The bytes of record document ``path`` of ``storage``.

    Parameters
    ----------
    path : str
        A manifest, writer, commit, state or checkpoint record.

    Returns
    -------
    bytes
        Its bytes, for :func:`decode`.

    Raises
    ------
    CorruptObjectError
        Larger than :data:`MAX_BYTES` or (local storage) not a regular file.
    FileNotFoundError
        The document is absent.
    """
    return storage.read_capped(path, MAX_BYTES)


def _decode_canonical(data: bytes) -> Any:
    """The body of a document laid out as :func:`encode` writes it, if its checksum matches.

    Matches the body's bytes as stored (one parse, no re-encoding); None for any other
    input, which :func:`decode` then parses and checks in full.
    """
    cut = data.rfind(_TAIL)
    if cut < 0 or not data.startswith(_HEAD) or not data.endswith(b"}"):
        return None
    digits, raw = data[cut + len(_TAIL):-1], data[len(_HEAD):cut]
    if not digits.isdigit() or google_crc32c.value(raw) != int(digits):
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def json_document(name: str, doc: Any) -> dict[str, Any]:
    """``doc`` (a mapping or None) as plain JSON.

    Parameters
    ----------
    name : str
        The field named in errors.
    doc : Any
        A JSON mapping, or None (an empty one).

    Returns
    -------
    dict
        A JSON-normalised copy.

    Raises
    ------
    MetadataError
        ``doc`` is not a mapping, or not JSON-serialisable.
    """
    from replaystore.errors import MetadataError

    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise MetadataError(name, "a JSON mapping", type(doc).__name__)
    try:
        plain: dict[str, Any] = json.loads(json.dumps(doc, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise MetadataError(name, "JSON-serialisable values", str(exc)) from exc
    return plain
