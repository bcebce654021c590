"""Object names of the on-disk format (docs/FORMAT.md, "Layout"), in one place."""

from __future__ import annotations

import functools
import re

from replaystore.errors import InvalidNameError, UnsafeNameError

FORMAT_NAME = "replaystore"
FORMAT_VERSION = 2
"""Written into new stores' manifests (segments, docs/FORMAT.md); readers also read version 1."""
READ_VERSIONS = (1, 2)
MANIFEST = "replaystore.json"
WRITERS = "writers"
STATE = "state"
CHECKPOINTS = "checkpoints"
ROW_BITS = 40
"""A row id is ``writer << ROW_BITS | local row``: stable across refreshes, evictions and compaction."""
INDEX_ARRAYS = ("_stream", "_step", "_reset")


NAME_BYTES = 200
"""The longest table, state slot or state array name, in UTF-8 bytes (one path component each)."""
FRAGMENT_NAME = re.compile(r"f[0-9]{1,20}")
SEGMENT_NAME = re.compile(r"s[0-9]{1,20}")
PAYLOAD_TOKEN = re.compile(r"[0-9a-f]{1,64}")
GENERATION = re.compile(r"[0-9a-f]{1,64}")
"""A store generation (docs/FORMAT.md, "Replacing a store"): 1 to 64 lower-case hexadecimal digits."""
_STATE_NAME = re.compile(r"[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*")


def name_problem(kind: str, name: object) -> str | None:
    """Why ``name`` is not a valid ``kind`` name of the format, or None if it is.

    See docs/FORMAT.md, "Object names". Cost: one regular-expression match.

    Parameters
    ----------
    kind : str
        ``"table"``, ``"fragment"``, ``"segment"``, ``"state slot"``,
        ``"state array"`` or ``"payload token"``.
    name : object
        The name to check.

    Returns
    -------
    str or None
        The problem, in words; None for a valid name.
    """
    if not isinstance(name, str):
        return f"{kind} name {name!r}: expected a string"
    if kind == "table":
        ok = name.isidentifier() and len(name.encode()) <= NAME_BYTES
        expected = f"an identifier of at most {NAME_BYTES} bytes"
    elif kind in ("state slot", "state array"):
        ok = _STATE_NAME.fullmatch(name) is not None and len(name.encode()) <= NAME_BYTES
        expected = (f"1 to {NAME_BYTES} bytes, not starting with '.', without '/', '\\' or control "
                    "characters")
    else:
        pattern = {"fragment": FRAGMENT_NAME, "segment": SEGMENT_NAME, "payload token": PAYLOAD_TOKEN}[kind]
        ok = pattern.fullmatch(name) is not None
        expected = f"the pattern {pattern.pattern}"
    return None if ok else f"{kind} name {name!r}: expected {expected}"


@functools.lru_cache(maxsize=4096)
def _checked(kind: str, name: str) -> str | None:
    return name_problem(kind, name)


def stored_name(kind: str, name: object, where: str) -> str:
    """``name``, read from the store object ``where``, if it is a valid ``kind`` name.

    Cost: a cache lookup once seen.

    Parameters
    ----------
    kind : str
        The kind of name (see :func:`name_problem`).
    name : object
        The name as read.
    where : str
        The object it was read from, named in the error.

    Returns
    -------
    str
        ``name``, now known to be a ``str``.

    Raises
    ------
    UnsafeNameError
        ``name`` breaks the grammar.
    """
    problem = _checked(kind, name) if isinstance(name, str) else name_problem(kind, name)
    if problem:
        raise UnsafeNameError(where, problem)
    return name  # type: ignore[return-value]


def given_name(kind: str, name: object, argument: str) -> str:
    """``name``, given as ``argument``, if it is a valid ``kind`` name.

    The check :func:`stored_name` makes, for a name a caller gives rather than one read from
    the store: the error it raises is the caller's (an ``InvalidNameError``).

    Parameters
    ----------
    kind : str
        As for :func:`stored_name`.
    name : object
        The name given.
    argument : str
        The argument, named in the error.

    Returns
    -------
    str
        As for :func:`stored_name`.

    Raises
    ------
    InvalidNameError
        ``name`` breaks the grammar: the message names ``argument`` and what was expected.
    """
    problem = name_problem(kind, name)
    if problem:
        raise InvalidNameError(f"{argument}: {problem}")
    return name  # type: ignore[return-value]


def writer_dir(writer: int) -> str:
    """The directory of writer ``writer``: ``writers/<writer:06d>``."""
    return f"{WRITERS}/{writer:06d}"


def writer_record(writer: int) -> str:
    """The path of writer ``writer``'s writer record."""
    return f"{writer_dir(writer)}/writer.json"


def commits_dir(writer: int) -> str:
    """The directory of writer ``writer``'s commit records."""
    return f"{writer_dir(writer)}/commits"


def commit_record(writer: int, seq: int) -> str:
    """The path of writer ``writer``'s commit record ``seq``."""
    return f"{commits_dir(writer)}/{seq:010d}.json"


def fragment_dir(writer: int, table: str, name: str) -> str:
    """The directory of fragment or segment ``name`` of ``table``.

    Both names are checked (:func:`stored_name`), as they come from commit records.

    Raises :class:`UnsafeNameError` where a name breaks the grammar.
    """
    where = f"{writer_dir(writer)}/data"
    stored_name("table", table, where)
    if not (isinstance(name, str) and name[:1] == "s"):
        stored_name("fragment", name, f"{where}/{table}")
    else:
        stored_name("segment", name, f"{where}/{table}")
    return f"{where}/{table}/{name}"


def fragment_name(seq: int) -> str:
    """The name of fragment ``seq``: ``f<seq:010d>``."""
    return f"f{seq:010d}"


def segment_name(seq: int) -> str:
    """The name of segment ``seq``: ``s<seq:010d>``."""
    return f"s{seq:010d}"


def checkpoint(number: int) -> str:
    """The path of log checkpoint ``number``."""
    return f"{CHECKPOINTS}/{number:010d}.json"


def state_dir(slot: str) -> str:
    """The directory of state slot ``slot``.

    Raises :class:`UnsafeNameError` where a name breaks the grammar.
    """
    return f"{STATE}/{stored_name('state slot', slot, STATE)}"


def state_record(slot: str, version: int) -> str:
    """The path of version ``version`` of state slot ``slot``'s record.

    Raises :class:`UnsafeNameError` where a name breaks the grammar.
    """
    return f"{state_dir(slot)}/{version:010d}.json"


def state_payload(slot: str, token: str, name: str) -> str:
    """The object of state array ``name`` (``<array>.npy``) saved under ``token``.

    Raises :class:`UnsafeNameError` where a name breaks the grammar.
    """
    stored_name("payload token", token, state_dir(slot))
    stored_name("state array", name, state_dir(slot))
    return f"{state_dir(slot)}/payload-{token}/{name}"


def state_payload_of(slot: str, array: str, path: object, where: str) -> str:
    """``path``, read from state record ``where`` for array ``array``, if it names that array's payload.

    The payload of ``array`` in ``slot`` is ``state/<slot>/payload-<token>/<array>.npy``.

    Parameters
    ----------
    slot : str
        The slot's name.
    array : str
        The array's name.
    path : object
        The path as read.
    where : str
        The state record, named in the error.

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    UnsafeNameError
        ``path`` is not a payload of that array in that slot, or a name breaks
        the grammar.
    """
    stored_name("state array", array, where)
    prefix = f"{state_dir(slot)}/payload-"
    if not (isinstance(path, str) and path.startswith(prefix) and path.endswith(f"/{array}.npy")
            and PAYLOAD_TOKEN.fullmatch(path[len(prefix):-len(array) - 5]) is not None):
        raise UnsafeNameError(where, f"array {array!r}: path {path!r} is not a payload of slot {slot!r}")
    return path


def row_id(writer: int, local: int) -> int:
    """The row id of local row ``local`` of writer ``writer``: ``writer << ROW_BITS | local``.

    Parameters
    ----------
    local : int
        The writer's local row.

    Returns
    -------
    int
        The row id.
    """
    return (writer << ROW_BITS) | local
