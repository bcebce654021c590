"""Batch validation: exact field set, dtypes, shapes, record counts, CSR, id ranges, finiteness.

Nothing is ever cast. Torch tensors are read without copying when they are on the
CPU (non-contiguous ones are made contiguous, which copies); any other device is
rejected with :class:`DeviceError`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import (
    DeviceError,
    DTypeError,
    IdRangeError,
    MetadataError,
    MissingFieldError,
    NonFiniteError,
    OffsetsError,
    RaggedAlignmentError,
    RecordCountError,
    ShapeError,
    UnknownFieldError,
)
from replaystore.schemas.columns import Columns
from replaystore.schemas.fields import OFFSETS_DTYPE, Dense, Ragged

if TYPE_CHECKING:
    from replaystore.schemas.schema import Schema


def batch_items(batch: Any) -> dict[str, Any]:
    """The named items of a mapping, dataclass, namedtuple or plain attribute object.

    Cost: one dict of references; no array is copied.

    Parameters
    ----------
    batch : Any
        A mapping, a dataclass instance, a namedtuple, or an object with
        ``__dict__`` or ``__slots__`` (names starting with ``_`` are skipped).

    Returns
    -------
    dict of str to Any
        Item name to value.

    Raises
    ------
    MissingFieldError
        ``batch`` has no named fields (``field`` is ``"<batch>"``).
    """
    if isinstance(batch, Mapping):
        return dict(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return dict(zip(batch._fields, batch, strict=True))
    if hasattr(batch, "__dict__") or hasattr(type(batch), "__slots__"):
        names = set(getattr(batch, "__dict__", {}))
        for klass in type(batch).__mro__:
            names.update(getattr(klass, "__slots__", ()))
        return {n: getattr(batch, n) for n in sorted(names) if not n.startswith("_") and hasattr(batch, n)}
    raise MissingFieldError("<batch>", "a mapping or an object with named fields", type(batch).__name__)


def to_numpy(name: str, value: Any) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor; anything else is a typed error.

    Parameters
    ----------
    name : str
        Field name, for the error.
    value : Any
        A numpy array or a torch tensor.

    Returns
    -------
    numpy.ndarray
        ``value`` itself, or a view of the tensor (conjugate/negative bits resolved).

    Raises
    ------
    DeviceError
        A tensor not on the CPU.
    DTypeError
        A tensor whose dtype numpy cannot represent, or a value that is neither
        a numpy array nor a torch tensor.
    """
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise DeviceError(name, "a CPU tensor", f"a tensor on {value.device}",
                                  "call .cpu() before appending")
            try:
                return value.detach().resolve_conj().resolve_neg().numpy()
            except TypeError as exc:
                raise DTypeError(name, "a dtype numpy can represent", str(value.dtype)) from exc
    raise DTypeError(name, "a numpy array or a CPU torch tensor", type(value).__name__)


def _check_dtype(name: str, arr: np.ndarray, expected: np.dtype) -> None:
    if arr.dtype != expected:
        raise DTypeError(name, f"dtype {expected}", f"dtype {arr.dtype}", "replaystore never casts")


def _check_values(field: Dense | Ragged, arr: np.ndarray) -> None:
    if field.finite and arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        bad = ~np.isfinite(arr)
        first = int(np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1) if arr.ndim > 1 else bad)[0])
        raise NonFiniteError(field.name, "finite values", f"{arr.reshape(len(arr), -1)[first].tolist()[:8]} "
                             f"at index {first}", "this field forbids NaN and inf")
    if field.id_bound is not None and arr.size and _out_of_range(arr, field.id_bound):
        first = int(np.flatnonzero((arr < 0) | (arr >= field.id_bound))[0])
        raise IdRangeError(field.name, f"ids in [0, {field.id_bound})", f"{arr.flat[first]} at index {first}")


def _out_of_range(arr: np.ndarray, bound: int) -> bool:
    """Whether an integer array holds a value outside ``[0, bound)``."""
    if arr.dtype.kind == "i" and bound <= 1 << (8 * arr.dtype.itemsize - 1):
        # one reduction: read as unsigned, a negative id is at least 2^(bits - 1) >= bound
        return bool(np.maximum.reduce(arr.view(arr.dtype.str.replace("i", "u")), axis=None) >= bound)
    return bool(arr.min() < 0 or arr.max() >= bound)


def _check_offsets(name: str, offsets: np.ndarray, records: int | None) -> None:
    _check_dtype(name, offsets, OFFSETS_DTYPE)
    if offsets.ndim != 1 or len(offsets) < 1:
        raise OffsetsError(name, "a 1-D offsets array of length records + 1", f"shape {offsets.shape}")
    if records is not None and len(offsets) != records + 1:
        raise OffsetsError(name, f"length {records + 1} (records + 1)", f"length {len(offsets)}")
    if offsets[0] != 0:
        raise OffsetsError(name, "offsets starting at 0", f"first offset {offsets[0]}")
    if (offsets[1:] < offsets[:-1]).any():
        i = int(np.flatnonzero(offsets[1:] < offsets[:-1])[0])
        raise OffsetsError(name, "non-decreasing offsets", f"offsets[{i + 1}]={offsets[i + 1]} < "
                           f"offsets[{i}]={offsets[i]}")


def validate(schema: Schema, batch: Any, *, allow_extra: bool = False) -> Columns:
    """See :meth:`Schema.validate`.

    Parameters
    ----------
    schema : Schema
        The schema to check against.
    batch : Any
        A mapping or an object with named fields (see :func:`batch_items`).
    allow_extra : bool, optional
        Ignore items the schema does not know instead of raising.

    Returns
    -------
    Columns
        The checked, contiguous arrays and the batch metadata.

    Raises
    ------
    ValidationError
        A subclass naming the field: ``UnknownFieldError``, ``MissingFieldError``,
        ``DTypeError``, ``ShapeError``, ``RecordCountError``, ``OffsetsError``,
        ``RaggedAlignmentError``, ``IdRangeError``, ``NonFiniteError``,
        ``DeviceError`` or ``MetadataError``.
    """
    items = batch_items(batch)
    known = set(schema.input_names)
    if not allow_extra:
        unknown = sorted(set(items) - known)
        if unknown:
            raise UnknownFieldError(unknown[0], f"one of {sorted(known)}", "an unknown field",
                                    f"schema {schema.name!r} has no field(s) {unknown}")
    missing = [n for n in schema.input_names if n not in items and n not in {m.name for m in schema.meta_fields}]
    if missing:
        raise MissingFieldError(missing[0], "present", "missing", f"schema {schema.name!r} also lacks {missing}")

    arrays: dict[str, np.ndarray] = {}
    records: int | None = None
    count_source = ""
    for f in schema.dense_fields:
        arr = to_numpy(f.name, items[f.name])
        _check_dtype(f.name, arr, f.dtype)
        if arr.ndim != 1 + len(f.shape) or arr.shape[1:] != f.shape:
            raise ShapeError(f.name, f"shape (records, {', '.join(map(str, f.shape))})".replace(", )", ")"),
                             f"shape {arr.shape}")
        if records is None:
            records, count_source = len(arr), f.name
        elif len(arr) != records:
            raise RecordCountError(f.name, f"{records} records (as {count_source!r})", f"{len(arr)} records")
        _check_values(f, arr)
        arrays[f.name] = np.ascontiguousarray(arr)

    for off_name, names in schema.offsets_groups.items():
        offsets = to_numpy(off_name, items[off_name])
        _check_offsets(off_name, offsets, records)
        if records is None:
            records, count_source = len(offsets) - 1, off_name
        nnz = int(offsets[-1])
        first_len: tuple[str, int] | None = None
        for name in names:
            rf = schema.field(name)
            assert isinstance(rf, Ragged)
            values = to_numpy(name, items[name])
            _check_dtype(name, values, rf.dtype)
            if values.ndim != 1:
                raise ShapeError(name, "a 1-D values array", f"shape {values.shape}")
            if first_len is not None and len(values) != first_len[1]:
                raise RaggedAlignmentError(name, f"{first_len[1]} values (aligned with {first_len[0]!r})",
                                           f"{len(values)} values")
            if len(values) != nnz:
                raise OffsetsError(off_name, f"a last offset equal to len({name})={len(values)}",
                                   f"last offset {nnz}")
            first_len = (name, len(values))
            _check_values(rf, values)
            arrays[name] = np.ascontiguousarray(values)
        arrays[off_name] = np.ascontiguousarray(offsets)

    meta: dict[str, Any] = {}
    for m in schema.meta_fields:
        doc = items.get(m.name)
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise MetadataError(m.name, "a JSON mapping", type(doc).__name__)
        try:
            meta[m.name] = json.loads(json.dumps(dict(doc), allow_nan=False, default=_json_scalar))
        except (TypeError, ValueError) as exc:
            raise MetadataError(m.name, "JSON-serialisable values", str(exc)) from exc

    assert records is not None  # a schema has at least one dense or ragged field
    return Columns(schema, records, arrays, meta)


def _json_scalar(value: Any) -> Any:
    """Numpy scalars in telemetry become plain JSON numbers; anything else is refused."""
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
