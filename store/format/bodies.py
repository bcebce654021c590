"""What a reader refuses in a record body.

Key presence, types and ranges of every record kind (docs/FORMAT.md, "What a reader must
refuse").

A record document whose checksum matches may still be malformed (written by a buggy or foreign
writer, or edited and re-checksummed). Each function here checks one kind of body right where it
is decoded and raises :class:`CorruptObjectError` naming the object and the field, before
anything is applied or allocated from it. ``bool`` is never an integer here. Cost: linear in the
body's size, no I/O (except :func:`check_capacity`, which reads a few writer registrations).

Every check of a body takes the object's ``path`` (named in its errors) and the decoded
``body`` (a dict), returns ``body`` unchanged, and raises :class:`CorruptObjectError` where a
field is missing or malformed; each function's docstring lists what it takes and raises
besides.
"""

from __future__ import annotations

import io
import math
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

import numpy as np

from replaystore.errors import (
    CorruptObjectError,
    FormatVersionError,
    ReplayStoreError,
    UnknownCodecError,
    UnsafeNameError,
)
from replaystore.schemas import Schema
from replaystore.store.format import layout, records

ROW_LIMIT = 1 << layout.ROW_BITS
"""Local rows of a writer's table lie in ``[0, 2**40)`` (row ids: ``writer << 40 | local``)."""
FRAGMENT_ROWS_LIMIT = 1 << 32
"""The most records one fragment (or segment) may hold."""
COUNT_LIMIT = 1 << 48
"""Bound of sequence numbers, value counts and other counters."""
WRITER_LIMIT = 1 << 23
"""Writer numbers lie in ``[0, 2**23)``: a row id ``writer << 40 | local`` fits an int64."""
RECORD_BYTES_LIMIT = 1 << 32
"""The most bytes one record of a dense field may take (its trailing shape times its item size)."""
TIME_LIMIT = 1 << 63
CRC_LIMIT = 1 << 32
COMMIT_KINDS = ("append", "compact", "close")


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


class _Body:
    """Checks of one body, each failure naming ``path`` and the dotted field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, expected: str, got: Any) -> NoReturn:
        raise CorruptObjectError(self.path, f"field {where!r}: expected {expected}, got {_show(got)}")

    def problem(self, text: str) -> NoReturn:
        raise CorruptObjectError(self.path, text)

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, "a JSON object", value)
        return value

    def key(self, d: Mapping[str, Any], key: str, where: str) -> Any:
        """``d[key]``; a missing key is reported as field ``where.key``."""
        if key not in d:
            self.problem(f"field {(where + '.' + key) if where else key!r} missing")
        return d[key]

    def integer(self, value: Any, where: str, lo: int = 0, hi: int = COUNT_LIMIT) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
            self.fail(where, f"an int in [{lo}, {_power(hi)})", value)
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(where, "a non-empty string", value)
        return value

    def name(self, kind: str, value: Any, where: str) -> str:
        """``value`` if it is a valid ``kind`` name of the format (docs/FORMAT.md, "Object names").

        Else :class:`UnsafeNameError`: a name is never used as a path before this check.
        """
        problem = layout.name_problem(kind, value)
        if problem:
            raise UnsafeNameError(self.path, f"field {where!r}: {problem}")
        return value

    def array(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(where, "a JSON array", value)
        return value


def _generation(b: _Body, body: Mapping[str, Any]) -> None:
    """Check the optional ``generation`` of a record (docs/FORMAT.md, "Replacing a store")."""
    if "generation" in body:
        got = body["generation"]
        if not (isinstance(got, str) and layout.GENERATION.fullmatch(got)):
            b.fail("generation", "1 to 64 lower-case hexadecimal digits", got)


def _power(n: int) -> str:
    bits = n.bit_length() - 1
    return f"2**{bits}" if n == 1 << bits and bits > 16 else str(n)


# -- manifest --------------------------------------------------------------------------------
def manifest(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Check a manifest body.

    ``format``/``format_version``, then ``tables`` (a non-empty object of schema
    documents, each parsed), ``capacity`` (null or an int in ``[1, 2**40)``) and
    ``created_ns``.

    Parameters
    ----------
    url : str
        The store's URL, named in a FormatVersionError.

    Raises
    ------
    FormatVersionError
        Not a replaystore manifest, or a format version this replaystore does not read.
    UnsafeNameError
        A table name breaks the name grammar.
    """
    if body.get("format") != layout.FORMAT_NAME:
        raise FormatVersionError(f"{url}: not a replaystore store")
    version = body.get("format_version")
    if type(version) is not int or version not in layout.READ_VERSIONS:  # (not 1.0, not true)
        raise FormatVersionError(f"{url}: format version {version!r}; this replaystore reads versions "
                                 f"{layout.READ_VERSIONS}")
    b = _Body(path)
    tables = b.mapping(b.key(body, "tables", ""), "tables")
    if not tables:
        b.fail("tables", "at least one table", tables)
    for name, doc in tables.items():
        b.name("table", name, f"tables.{name}")
        try:
            schema = Schema.from_dict(b.mapping(doc, f"tables.{name}"))
        except (CorruptObjectError, UnknownCodecError):  # (a codec this process lacks: not damage)
            raise
        except (ReplayStoreError, KeyError, TypeError, ValueError, AttributeError) as exc:
            b.problem(f"field 'tables.{name}': not a valid schema document ({exc})")
        for f in schema.dense_fields:
            size = math.prod(f.shape) * np.dtype(f.dtype).itemsize  # (Python ints: no overflow)
            if size > RECORD_BYTES_LIMIT:
                b.problem(f"field 'tables.{name}': field {f.name!r} of shape {list(f.shape)} takes {size} bytes "
                          f"per record (at most {_power(RECORD_BYTES_LIMIT)})")
    capacity = b.key(body, "capacity", "")
    if capacity is not None:
        b.integer(capacity, "capacity", 1, ROW_LIMIT)
    b.integer(b.key(body, "created_ns", ""), "created_ns", 0, TIME_LIMIT)
    _generation(b, body)
    return body


# -- writer registration -----------------------------------------------------------------------
def registration(path: str, body: dict[str, Any], writer: int) -> dict[str, Any]:
    """Check writer ``writer``'s registration.

    ``writer`` equals the directory's number (a copied writer directory is
    refused), ``capacity`` (where recorded) is null or a valid capacity, and the
    optional ``host``, ``pid``, ``time_ns``, ``lock`` have their types.

    Parameters
    ----------
    writer : int
        The writer whose directory holds it.
    """
    b = _Body(path)
    got = b.key(body, "writer", "")
    if b.integer(got, "writer", 0, WRITER_LIMIT) != writer:
        b.problem(f"field 'writer': says writer {got}, but the record lies in writer {writer}'s directory "
                  "(a copied writer directory?)")
    if body.get("capacity") is not None:
        b.integer(body["capacity"], "capacity", 1, ROW_LIMIT)
    for key in ("host", "lock"):
        if key in body and not isinstance(body[key], str):
            b.fail(key, "a string", body[key])
    for key in ("pid", "time_ns"):
        if key in body:
            b.integer(body[key], key, 0, TIME_LIMIT)
    _generation(b, body)
    return body


# -- commit records -----------------------------------------------------------------------------
def commit(path: str, body: dict[str, Any], writer: int, seq: int,
           offsets: Mapping[str, Collection[str]] | Collection[str] | None = None) -> dict[str, Any]:
    """Check commit record ``seq`` of writer ``writer``.

    ``writer`` and ``seq`` equal the record's place, ``time_ns``, ``kind``
    (append, compact, close), ``metadata`` and ``tables``; every fragment
    descriptor added (:func:`fragment`); a ``close`` record changes no table.

    Parameters
    ----------
    writer : int
        The writer whose directory holds it.
    seq : int
        Its sequence number.
    offsets : mapping or collection of str, optional
        The known tables (with their CSR offsets array names, where a mapping).

    Raises
    ------
    UnsafeNameError
        A table or fragment name breaks the name grammar.
    """
    b = _Body(path)
    got = b.key(body, "writer", "")
    if b.integer(got, "writer", 0, WRITER_LIMIT) != writer:
        b.problem(f"field 'writer': says writer {got}, but the record lies in writer {writer}'s directory "
                  "(a copied writer directory?)")
    got = b.key(body, "seq", "")
    if b.integer(got, "seq") != seq:
        b.problem(f"field 'seq': says {got}, but the record is commit {seq} of its writer")
    b.integer(b.key(body, "time_ns", ""), "time_ns", 0, TIME_LIMIT)
    kind = b.key(body, "kind", "")
    if kind not in COMMIT_KINDS:
        b.fail("kind", f"one of {COMMIT_KINDS}", kind)
    if "metadata" in body:
        b.mapping(body["metadata"], "metadata")
    _generation(b, body)
    tables = b.mapping(body.get("tables", {}), "tables")
    if kind == "close" and tables:
        b.problem("a close record changes no table, but this one lists tables")
    for table, change in tables.items():
        b.name("table", table, f"tables.{table}")
        where = f"tables.{table}"
        if offsets is not None and table not in offsets:
            b.problem(f"field {where!r}: no such table in the manifest")
        change = b.mapping(change, where)
        names = offsets.get(table) if isinstance(offsets, Mapping) else None
        for i, name in enumerate(b.array(change.get("remove", []), f"{where}.remove")):
            b.name("fragment", name, f"{where}.remove[{i}]")
        for i, d in enumerate(b.array(change.get("add", []), f"{where}.add")):
            _fragment(b, d, f"{where}.add[{i}]", seq + 1, names)
        for i, a in enumerate(b.array(change.get("appends", []), f"{where}.appends")):
            a = b.mapping(a, f"{where}.appends[{i}]")
            rows = b.array(b.key(a, "rows", f"{where}.appends[{i}]"), f"{where}.appends[{i}].rows")
            if len(rows) != 2:
                b.fail(f"{where}.appends[{i}].rows", "[lo, hi]", rows)
            lo = b.integer(rows[0], f"{where}.appends[{i}].rows[0]", 0, ROW_LIMIT)
            b.integer(rows[1], f"{where}.appends[{i}].rows[1]", lo, ROW_LIMIT + 1)
            if "meta" in a:
                b.mapping(a["meta"], f"{where}.appends[{i}].meta")
    return body


def fragment(path: str, d: Any, where: str, seq_limit: int = COUNT_LIMIT,
             offsets: Collection[str] | None = None) -> dict[str, Any]:
    """Check one fragment descriptor.

    ``name``, ``row_start`` and ``rows`` within a writer's rows, ``nnz`` (per CSR
    offsets array: exactly ``offsets`` where given), ``streams`` (ints or
    strings), ``parts`` (``[seq < seq_limit, time_ns, rows]`` whose rows sum to
    ``rows``) and, if present, ``segment`` consistent with them.

    Parameters
    ----------
    d : Any
        The descriptor, as decoded from the commit record at ``path``.
    where : str
        Names the descriptor in ``path``.
    seq_limit : int, optional
        Parts must name commits before this one.
    offsets : collection of str, optional
        The table's CSR offsets array names.

    Returns
    -------
    dict of str to Any
        ``d``.

    Raises
    ------
    UnsafeNameError
        The fragment or segment name breaks the name grammar.
    """
    return _fragment(_Body(path), d, where, seq_limit, offsets)


def _fragment(b: _Body, d: Any, where: str, seq_limit: int, offsets: Collection[str] | None) -> dict[str, Any]:
    d = b.mapping(d, where)
    b.name("fragment", b.key(d, "name", where), f"{where}.name")
    start = b.integer(b.key(d, "row_start", where), f"{where}.row_start", 0, ROW_LIMIT)
    rows = b.integer(b.key(d, "rows", where), f"{where}.rows", 0, FRAGMENT_ROWS_LIMIT + 1)
    if start + rows > ROW_LIMIT:
        b.problem(f"field {where!r}: rows [{start}, {start + rows}) pass a writer's last row id 2**40")
    nnz = b.mapping(b.key(d, "nnz", where), f"{where}.nnz")
    for k, v in nnz.items():
        b.integer(v, f"{where}.nnz.{k}")
    if offsets is not None and set(nnz) != set(offsets):
        b.fail(f"{where}.nnz", f"a count for each CSR offsets array {sorted(offsets)}", sorted(nnz))
    for i, key in enumerate(b.array(b.key(d, "streams", where), f"{where}.streams")):
        if isinstance(key, bool) or not isinstance(key, (int, str)) or (
                isinstance(key, int) and not -(1 << 63) <= key < 1 << 63):
            b.fail(f"{where}.streams[{i}]", "an int64 or a string stream key", key)
    parts = b.array(b.key(d, "parts", where), f"{where}.parts")
    if _parts_ok(parts, seq_limit, rows):  # (the common case, at a few builtin passes over the parts)
        total = rows
    else:
        total = _check_parts(b, parts, where, seq_limit)
    if total != rows:
        b.problem(f"field '{where}.parts': its rows sum to {total}, but 'rows' is {rows}")
    if "segment" in d:
        _segment(b, d["segment"], f"{where}.segment", rows, len(parts), nnz)
    return d


def _parts_ok(parts: list[Any], seq_limit: int, rows: int) -> bool:
    """Whether ``parts`` are ``[seq, time_ns, rows]`` ints in range whose rows sum to ``rows``."""
    if not all(type(p) is list and len(p) == 3 and type(p[0]) is int and type(p[1]) is int  # noqa: E721
               and type(p[2]) is int for p in parts):  # noqa: E721 - (bool is no int here)
        return False
    if not parts:
        return rows == 0
    seqs, times, counts = zip(*parts, strict=True)
    return (min(seqs) >= 0 and max(seqs) < seq_limit and min(times) >= 0 and max(times) < TIME_LIMIT
            and min(counts) >= 0 and sum(counts) == rows)


def _check_parts(b: _Body, parts: list[Any], where: str, seq_limit: int) -> int:
    """Check ``parts`` one by one (naming the first bad one); the sum of their rows."""
    total = 0
    for i, p in enumerate(parts):
        if not isinstance(p, list) or len(p) != 3:
            b.fail(f"{where}.parts[{i}]", "[seq, time_ns, rows]", p)
        b.integer(p[0], f"{where}.parts[{i}][0]", 0, seq_limit)
        b.integer(p[1], f"{where}.parts[{i}][1]", 0, TIME_LIMIT)
        total += b.integer(p[2], f"{where}.parts[{i}][2]", 0, FRAGMENT_ROWS_LIMIT + 1)
    return total


def _segment(b: _Body, s: Any, where: str, rows: int, parts: int, nnz: Mapping[str, int]) -> None:
    s = b.mapping(s, where)
    b.name("segment", b.key(s, "name", where), f"{where}.name")
    row = b.integer(b.key(s, "row", where), f"{where}.row", 0, FRAGMENT_ROWS_LIMIT + 1)
    values = b.mapping(b.key(s, "values", where), f"{where}.values")
    cap = b.mapping(b.key(s, "capacity", where), f"{where}.capacity")
    b.integer(b.key(cap, "rows", f"{where}.capacity"), f"{where}.capacity.rows", row + rows, FRAGMENT_ROWS_LIMIT + 1)
    value_cap = b.mapping(b.key(cap, "values", f"{where}.capacity"), f"{where}.capacity.values")
    if set(values) != set(nnz) or set(value_cap) != set(nnz):
        b.fail(f"{where}.values", f"a count for each CSR offsets array {sorted(nnz)}", sorted(values))
    for k in nnz:
        lo = b.integer(values[k], f"{where}.values.{k}")
        b.integer(value_cap[k], f"{where}.capacity.values.{k}", lo + nnz[k])
    for name, crcs in b.mapping(b.key(s, "crc32c", where), f"{where}.crc32c").items():
        crcs = b.array(crcs, f"{where}.crc32c.{name}")
        if len(crcs) != parts:
            b.fail(f"{where}.crc32c.{name}", f"one CRC32C per part ({parts})", crcs)
        if not all(type(c) is int and 0 <= c < CRC_LIMIT for c in crcs):  # noqa: E721
            for i, c in enumerate(crcs):
                b.integer(c, f"{where}.crc32c.{name}[{i}]", 0, CRC_LIMIT)


# -- log checkpoints -----------------------------------------------------------------------------
def checkpoint(path: str, body: dict[str, Any], number: int | None = None,
               offsets: Mapping[str, Collection[str]] | Collection[str] | None = None) -> dict[str, Any]:
    """Check a log checkpoint.

    ``kind``, ``number`` (equal to its place, where given), ``time_ns``, and per
    writer ``next_seq``, ``closed`` and its live fragment descriptors (unique
    names per table, parts of records before ``next_seq``).

    Parameters
    ----------
    number : int, optional
        The number it must carry.
    offsets : mapping or collection of str, optional
        The known tables (with their CSR offsets array names, where a mapping).

    Raises
    ------
    CorruptObjectError
        Not a checkpoint, or a field is missing or malformed.
    UnsafeNameError
        A name breaks the name grammar.
    """
    b = _Body(path)
    if body.get("kind") != "checkpoint":
        b.problem(f"not a log checkpoint (kind {body.get('kind')!r})")
    got = b.integer(b.key(body, "number", ""), "number")
    if number is not None and got != number:
        b.problem(f"field 'number': says {got}, but the checkpoint is number {number}")
    b.integer(b.key(body, "time_ns", ""), "time_ns", 0, TIME_LIMIT)
    _generation(b, body)
    for key, doc in b.mapping(b.key(body, "writers", ""), "writers").items():
        where = f"writers.{key}"
        if not key.isdigit() or int(key) >= WRITER_LIMIT:
            b.fail("writers", f"writer numbers in [0, {_power(WRITER_LIMIT)}) as keys", key)
        doc = b.mapping(doc, where)
        next_seq = b.integer(b.key(doc, "next_seq", where), f"{where}.next_seq")
        if not isinstance(b.key(doc, "closed", where), bool):
            b.fail(f"{where}.closed", "true or false", doc["closed"])
        for table, ds in b.mapping(b.key(doc, "tables", where), f"{where}.tables").items():
            b.name("table", table, f"{where}.tables.{table}")
            if offsets is not None and table not in offsets:
                b.problem(f"field '{where}.tables.{table}': no such table in the manifest")
            names = offsets.get(table) if isinstance(offsets, Mapping) else None
            seen: set[str] = set()
            for i, d in enumerate(b.array(ds, f"{where}.tables.{table}")):
                _fragment(b, d, f"{where}.tables.{table}[{i}]", next_seq, names)
                if d["name"] in seen:
                    b.problem(f"field '{where}.tables.{table}': fragment {d['name']!r} listed twice")
                seen.add(d["name"])
        for table, n in b.mapping(doc.get("committed", {}), f"{where}.committed").items():
            b.name("table", table, f"{where}.committed.{table}")
            b.integer(n, f"{where}.committed.{table}")
    return body


# -- state records ----------------------------------------------------------------------------
def state(path: str, body: dict[str, Any], slot: str, version: int) -> dict[str, Any]:
    """Check state record ``version`` of ``slot``.

    Those two, ``time_ns``, ``doc`` (an object) and ``arrays`` (name -> the path
    of that array's payload in this slot).

    Parameters
    ----------
    slot : str
        The slot whose directory holds it.
    version : int
        Its version.

    Raises
    ------
    UnsafeNameError
        An array name or payload path is not this slot's.
    """
    b = _Body(path)
    if b.key(body, "slot", "") != slot:
        b.fail("slot", repr(slot), body["slot"])
    if b.integer(b.key(body, "version", ""), "version") != version:
        b.problem(f"field 'version': says {body['version']}, but the record is version {version}")
    b.integer(b.key(body, "time_ns", ""), "time_ns", 0, TIME_LIMIT)
    b.mapping(b.key(body, "doc", ""), "doc")
    _generation(b, body)
    for name, p in b.mapping(b.key(body, "arrays", ""), "arrays").items():
        b.name("state array", name, f"arrays.{name}")
        layout.state_payload_of(slot, name, p, path)  # exactly this slot's payload of this array
    return body


# -- capacity witnesses ---------------------------------------------------------------------------
CAPACITY_WITNESSES = 4
"""Registrations a new writer reads from each end of the writer numbers (:func:`check_capacity`)."""


def check_capacity(storage: Any, capacity: int | None, names: list[str], generation: str | None = None) -> None:
    """Refuse to write to a store whose manifest's ``capacity`` was changed.

    The capacity must equal the one an earlier writer registered under
    (``capacity`` in its registration): the manifest never changes, so it was
    edited, and a writer trusting a lowered capacity would reclaim records it
    must keep. Reads the registrations of the ``CAPACITY_WITNESSES`` lowest and
    highest writer numbers among ``names`` (one ``read_many``); damaged or
    absent ones, and those written before registrations recorded a capacity,
    witness nothing.

    Parameters
    ----------
    capacity : int or None
        The manifest's capacity.
    names : list of str
        The listing of ``writers/``.
    generation : str or None, optional
        The store's generation: a registration of another one (a replaced store's writer
        registered after the replace began) witnesses nothing.

    Raises
    ------
    CorruptObjectError
        A registration witnesses another capacity (names the manifest).
    """
    numbers = sorted(int(n) for n in names if n.isdigit() and len(n) == 6)
    chosen = sorted(set(numbers[:CAPACITY_WITNESSES] + numbers[-CAPACITY_WITNESSES:]))
    paths = [layout.writer_record(w) for w in chosen]
    try:
        datas = storage.read_many(paths)
    except CorruptObjectError:  # (one of them is no regular file: read them one by one)
        datas = []
        for path in paths:
            try:
                datas.append(records.read(storage, path))
            except (FileNotFoundError, CorruptObjectError):
                datas.append(None)
    for w, path, data in zip(chosen, paths, datas, strict=True):
        if data is None:
            continue
        try:
            body = registration(path, records.decode(path, data), w)
        except CorruptObjectError:
            continue  # (replaystore verify reports it)
        got = body.get("generation")
        if generation is not None and got is not None and got != generation:
            continue  # (another store's, replaced at this location)
        if "capacity" in body and body["capacity"] != capacity:
            raise CorruptObjectError(layout.MANIFEST, f"capacity {capacity!r}, but writer {w} registered under "
                                     f"capacity {body['capacity']!r} ({path}): the manifest changed after the "
                                     "store was created; no writer writes or reclaims until it is restored "
                                     "(run replaystore verify)")


def load_npy(path: str, data: bytes) -> np.ndarray:
    """The array a state payload ``.npy`` object holds, checked before anything is allocated from it.

    The header's shape and dtype must describe exactly the bytes that follow it: a header that
    claims more (or fewer) is damage, never an allocation of its claimed size; object dtypes
    (pickles) are refused. Cost: one copy of the data.

    Parameters
    ----------
    data : bytes
        Its bytes.

    Returns
    -------
    numpy.ndarray
        A new, writable array.

    Raises
    ------
    CorruptObjectError
        Not a ``.npy`` document, an object dtype, or a header whose shape and dtype do not
        match the data's size.
    """
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    try:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f, max_header_size=1 << 16)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy.read_array_header_2_0(f, max_header_size=1 << 16)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, TypeError, SyntaxError, EOFError) as exc:
        raise CorruptObjectError(path, f"not a .npy array ({exc})") from None
    if dtype.hasobject:
        raise CorruptObjectError(path, f"dtype {dtype}: holds Python objects (a pickle), refused")
    count = 1
    for n in shape:
        count *= int(n)
    nbytes = count * dtype.itemsize
    if nbytes != len(data) - f.tell():
        raise CorruptObjectError(path, f"its header claims shape {tuple(shape)} of {dtype} ({nbytes} bytes), but "
                                       f"{len(data) - f.tell()} bytes follow it")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=f.tell())
    return arr.reshape(shape, order="F" if fortran else "C").copy()
