"""Store generations: the identity a store's records carry, and the replace claim's name.

See docs/FORMAT.md, "Store generations" and "Replacing a store".

A record whose generation is not the manifest's belongs to a store that was replaced
(:func:`foreign`); readers and writers leave it alone.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from replaystore.store.format import records

CLAIM_PREFIX = "replace-"


def new_generation() -> str:
    """A fresh store generation for a manifest being created: 32 random hexadecimal digits.

    Returns
    -------
    str
        The generation.
    """
    return secrets.token_hex(16)


def store_generation(manifest: dict[str, Any]) -> str:
    """The generation of the store whose manifest body is ``manifest``.

    The manifest's ``generation``; a manifest without one (stores created before
    generations) has the first 32 hexadecimal digits of the SHA-256 of its body's canonical
    encoding, which its ``created_ns`` makes distinct per creation.

    Parameters
    ----------
    manifest : dict
        The manifest body, checked.

    Returns
    -------
    str
        The generation.
    """
    given = manifest.get("generation")
    if isinstance(given, str):
        return given
    return hashlib.sha256(records.encode(manifest)).hexdigest()[:32]


def foreign(body: dict[str, Any], generation: str | None) -> bool:
    """Whether the record document ``body`` belongs to another store generation than ``generation``.

    A record without ``generation`` (written before generations) belongs to every
    generation; so does every record where ``generation`` is None (no generation checked).

    Parameters
    ----------
    body : dict
        A checked record body (commit record, registration, checkpoint, state record).
    generation : str or None
        The store's generation.

    Returns
    -------
    bool
        True when the record carries a generation and it differs.
    """
    got = body.get("generation")
    return generation is not None and got is not None and got != generation


def claim_name(manifest: bytes) -> str:
    """The replace claim of a store whose manifest is ``manifest`` (its bytes as stored).

    Parameters
    ----------
    manifest : bytes
        The manifest document.

    Returns
    -------
    str
        ``replace-<hash>.json``.
    """
    return f"{CLAIM_PREFIX}{hashlib.sha256(manifest).hexdigest()[:32]}.json"


def is_claim(name: str) -> bool:
    """Whether the name ``name`` is a replace claim.

    Parameters
    ----------
    name : str
        A top-level object name.

    Returns
    -------
    bool
        True for ``replace-*.json``.
    """
    return name.startswith(CLAIM_PREFIX) and name.endswith(".json")
