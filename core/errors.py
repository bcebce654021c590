"""Typed errors raised by replaystore.

Every error a user can cause derives from :class:`ReplayStoreError`. Errors about
one field of a batch derive from :class:`FieldError` and carry ``field``,
``expected`` and ``actual`` so callers (and messages) can name what was wrong.
"""

from __future__ import annotations

from typing import Any


class ReplayStoreError(Exception):
    """Base class of every error replaystore raises on purpose."""


class SchemaError(ReplayStoreError, ValueError):
    """A schema or field definition is invalid, or two schemas disagree."""


class ValidationError(ReplayStoreError, ValueError):
    """A batch does not conform to its schema; nothing was written."""


class FieldError(ValidationError):
    """A named field of a batch is wrong: ``field`` got ``actual``, wanted ``expected``."""

    def __init__(self, field: str, expected: Any, actual: Any, detail: str = "") -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        message = f"field {field!r}: expected {expected}, got {actual}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class MissingFieldError(FieldError):
    """The schema requires a field the batch does not have."""


class UnknownFieldError(FieldError):
    """The batch has a field the schema does not know."""


class DTypeError(FieldError, TypeError):
    """A field has the wrong dtype (replaystore never casts silently)."""


class ShapeError(FieldError):
    """A field has the wrong number of dimensions or trailing shape."""


class RecordCountError(FieldError):
    """Fields of one batch disagree on the number of records."""


class OffsetsError(FieldError):
    """A CSR offsets array is malformed (start, monotonicity, end or length)."""


class RaggedAlignmentError(FieldError):
    """Ragged fields sharing one offsets array have different value counts."""


class IdRangeError(FieldError):
    """An id lies outside ``[0, bound)`` for a field whose bound the schema knows."""


class NonFiniteError(FieldError):
    """A field that forbids NaN/inf contains one."""


class DeviceError(FieldError):
    """A tensor lives on a device replaystore cannot read (e.g. CUDA)."""


class MetadataError(FieldError):
    """Batch metadata is not a JSON-serialisable mapping."""


class StreamKeyError(FieldError):
    """A stream key is not an int or a str, or per-record keys have the wrong length."""


class StepOrderError(FieldError):
    """Steps of a stream are not strictly increasing (within the batch or after stored steps)."""


class StoreError(ReplayStoreError):
    """A store-level mistake: bad arguments, wrong mode, mismatched schema."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store exists at the URL (and the mode does not create one)."""


class StoreExistsError(StoreError, FileExistsError):
    """Mode "w" found an existing store."""


class ReadOnlyError(StoreError):
    """A mutating call on a store opened with mode "r"."""


class FormatVersionError(StoreError):
    """The store was written in an unknown or newer format version."""


class SchemaMismatchError(StoreError, SchemaError):
    """The schema given at open differs from the stored one (schemas are fixed at creation)."""


class RowError(StoreError, KeyError):
    """A requested row id is not a visible record (never written, or evicted)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class StaleReadError(StoreError):
    """Rows this reader still saw were evicted and reclaimed; call ``refresh()``."""


class CorruptObjectError(StoreError):
    """A stored object fails its integrity check; ``path`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}")


class UnsafeNameError(CorruptObjectError):
    """A name read from a store is unsafe to use as a path.

    A name read from a store breaks the format's name grammar (``..``, a separator, an absolute path, a control
    character), or a path under the store root leads outside it through a symbolic link. Nothing was read, written or
    deleted through it.
    """


class InvalidNameError(StoreError, ValueError):
    """A name given as an argument breaks the format's name grammar (docs/FORMAT.md, "Object names").

    The name is of a table, state slot or state array.
    """


class NotAStoreError(StoreError):
    """``open_store(mode="w+")`` found objects at the URL that are not a replaystore store; nothing was deleted.

    There is no manifest, or one that is not replaystore's.
    """


class StoreReplacedError(StoreError):
    """Another opener is replacing the store (``mode="w+"``) or replaced it after this handle opened it.

    The opener that lost wrote and deleted nothing.
    """

class StepRangeError(StepOrderError):
    """A step lies outside the format's step range ``[0, MAX_STEP]`` (``field`` is ``"step"``)."""


class SamplerParameterError(StoreError, ValueError):
    """A sampler argument is out of its valid range: ``field`` got ``actual``, wanted ``expected``.

    Such as ``alpha``, ``beta``, ``eps``, ``priorities``, ``refresh_every``.
    """

    def __init__(self, field: str, expected: Any, actual: Any) -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        super().__init__(f"{field}: expected {expected}, got {actual}")


class ResumeMismatchError(StoreError):
    """``resume=True`` found saved sampler state whose hyperparameters differ from the ones given.

    ``parameters`` maps each differing name to ``(saved, given)``. Pass ``override=True`` to resume with the given ones.
    """

    def __init__(self, slot: str, parameters: dict[str, tuple[Any, Any]], detail: str = "") -> None:
        self.slot = slot
        self.parameters = parameters
        diff = ", ".join(f"{k}: saved {s!r}, given {g!r}" for k, (s, g) in parameters.items())
        super().__init__(f"state slot {slot!r}: hyperparameters differ from the saved ones ({diff})"
                         + (f"; {detail}" if detail else "; pass override=True to resume with the given ones"))
