"""Typed errors raised by replaystore.

Every error a user can cause derives from :class:`ReplayStoreError`. Errors about
one field of a batch derive from :class:`FieldError` and carry ``field``,
``expected`` and ``actual`` so callers (and messages) can name what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReplayStoreError(Exception):
    """Base class of every error replaystore raises on purpose.

    Catch it to handle any error a user can cause; its subclasses below say which
    calls raise them. Errors replaystore does not raise on purpose (an ``OSError``
    from the disk, a bug) do not derive from it.
    """


class SchemaError(ReplayStoreError, ValueError):
    """A schema or field definition is invalid, or two schemas disagree.

    Raised when a :class:`~replaystore.schemas.Schema` or a field (``Dense``,
    ``Ragged``) is constructed with bad arguments, when a schema document read back
    (``Schema.from_json``, Arrow metadata) is malformed, and when an Arrow schema
    cannot be mapped to a replaystore schema.
    """


class UnknownCodecError(SchemaError):
    """A field names a codec this process has not registered.

    Raised when a schema is built or a store's schema is read (a store written with a
    codec registered only in the writer's process, see ``replaystore.codecs``).

    Parameters
    ----------
    field : str or None
        The field whose codec it is (None when looked up without a field).
    codec : str
        The codec's name, as given or read.
    known : sequence of str
        The names this process has registered.

    Attributes
    ----------
    field, codec
        As given.
    """

    def __init__(self, field: str | None, codec: str, known: Sequence[str]) -> None:
        self.field = field
        self.codec = codec
        where = f"field {field!r}: " if field is not None else ""
        super().__init__(f"{where}codec {codec!r} is not one of {sorted(known)} registered in this process "
                         "(optionally with a level: 'zstd:3', ('lz4', 1)); a codec defined elsewhere must be "
                         "registered with replaystore.codecs.register_codec before the store is opened")


class CodecRegistrationError(ReplayStoreError, ValueError):
    """A codec class cannot be registered: its name is taken, or the class is malformed.

    Raised by ``replaystore.codecs.register_codec`` for a class that is not a concrete
    ``Codec`` subclass, lacks a valid ``name``, ``default_level`` or ``levels``, or whose
    name another codec class already has; the registry is left as it was.
    """


class ValidationError(ReplayStoreError, ValueError):
    """A batch does not conform to its schema; nothing was written.

    Raised by batch validation (``Schema.validate`` and every append that runs it)
    before anything reaches the store; the subclasses name the offending field.
    """


class FieldError(ValidationError):
    """A named field of a batch is wrong: ``field`` got ``actual``, wanted ``expected``.

    Raised by batch validation and by the table/container builders; the
    subclasses say which check failed.

    Parameters
    ----------
    field : str
        Name of the offending field (for stream keys and steps, ``"stream"`` or
        ``"step"``).
    expected : Any
        What the schema requires (a dtype, a shape, a range, ...).
    actual : Any
        What the batch holds.
    detail : str, optional
        Extra text appended to the message in parentheses.

    Attributes
    ----------
    field : str
        As given.
    expected : Any
        As given.
    actual : Any
        As given.
    """

    def __init__(self, field: str, expected: Any, actual: Any, detail: str = "") -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        message = f"field {field!r}: expected {expected}, got {actual}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class MissingFieldError(FieldError):
    """The schema requires a field the batch does not have.

    Raised by batch validation and by the table/container builders.
    """


class UnknownFieldError(FieldError):
    """The batch has a field the schema does not know.

    Raised by batch validation and by the table/container builders.
    """


class DTypeError(FieldError, TypeError):
    """A field has the wrong dtype (replaystore never casts silently).

    Raised by batch validation and by the container builders. It is also a
    ``TypeError``.
    """


class ShapeError(FieldError):
    """A field has the wrong number of dimensions or trailing shape.

    Raised by batch validation and by the container builders.
    """


class RecordCountError(FieldError):
    """Fields of one batch disagree on the number of records.

    Raised by batch validation.
    """


class OffsetsError(FieldError):
    """A CSR offsets array is malformed (start, monotonicity, end or length).

    Raised by batch validation and when Arrow list offsets are converted.
    """


class RaggedAlignmentError(FieldError):
    """Ragged fields sharing one offsets array have different value counts.

    Raised by batch validation.
    """


class IdRangeError(FieldError):
    """An id lies outside ``[0, bound)`` for a field whose bound the schema knows.

    Raised by batch validation.
    """


class NonFiniteError(FieldError):
    """A field that forbids NaN/inf contains one.

    Raised by batch validation.
    """


class DeviceError(FieldError):
    """A tensor lives on a device replaystore cannot read (e.g. CUDA).

    Raised by batch validation; move the tensor to the CPU first.
    """


class MetadataError(FieldError):
    """Batch metadata is not a JSON-serialisable mapping.

    Raised by batch validation and when a commit record's metadata is encoded.
    """


class StreamKeyError(FieldError):
    """A stream key is not an int or a str, or per-record keys have the wrong length.

    Raised when an append's ``stream`` argument is checked, before anything is
    written.
    """


class StepOrderError(FieldError):
    """Steps of a stream are not strictly increasing (within the batch or after stored steps).

    Raised by appends that carry steps; nothing is written.
    """


class StoreError(ReplayStoreError):
    """A store-level mistake: bad arguments, wrong mode, mismatched schema.

    The base of every error about a store, a table, a sampler or a tool's
    arguments (as opposed to one field of a batch). Raised directly for bad
    arguments throughout ``store``, ``loaders`` and ``tools``.
    """


class UnknownColumnError(UnknownFieldError, StoreError):
    """A read named a column the table does not have.

    Raised by every read method that takes ``columns=`` (``read``, ``read_columns``,
    ``scan``, ``scan_schema``) on a ``Store``, ``Table`` or ``TableView``, at the call and
    before anything is read. It is an :class:`UnknownFieldError` (``field`` is the first
    unknown name, ``expected`` lists the columns there are) and a :class:`StoreError`.

    Parameters
    ----------
    table : str
        The table's name.
    unknown : sequence of str
        The names the table does not have (at least one), in the order asked.
    columns : sequence of str
        The names the read could have asked for.

    Attributes
    ----------
    table : str
        As given.
    unknown : list of str
        As given.
    """

    def __init__(self, table: str, unknown: Sequence[str], columns: Sequence[str]) -> None:
        self.table = table
        self.unknown = [str(u) for u in unknown]
        self._columns = list(columns)
        super().__init__(self.unknown[0], f"a column of table {table!r} ({list(columns)})",
                         "a name the table does not have", f"table {table!r} has no column(s) {self.unknown}")

    def __reduce__(self) -> tuple[Any, ...]:
        # (pickled by its arguments: it crosses from DataLoader workers and Ray tasks)
        return type(self), (self.table, self.unknown, self._columns)


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store exists at the URL (and the mode does not create one).

    Raised by ``open_store`` with mode ``"r"`` or ``"a"``. It is also a
    ``FileNotFoundError``.
    """


class StoreExistsError(StoreError, FileExistsError):
    """A creating mode (``"w"``, ``"w-"``, ``"x"``) found an existing store at the URL.

    Raised by ``open_store`` (and by tools that create a store) when the target
    already holds one. It is also a ``FileExistsError``.
    """


class ReadOnlyError(StoreError):
    """A mutating call on a store opened with mode "r".

    Raised by the store and its writers before anything is written.
    """


class FormatVersionError(StoreError):
    """The store was written in an unknown or newer format version.

    Raised when a manifest or another versioned document is read back.
    """


class SchemaMismatchError(StoreError, SchemaError):
    """The schema given at open differs from the stored one (schemas are fixed at creation).

    Raised by ``open_store`` and when a table is opened with a schema.
    """


class RowError(StoreError, KeyError):
    """A requested row id is not a visible record (never written, or evicted).

    Raised by a table's ``read`` and the other row lookups. It is also a
    ``KeyError``; its message is not quoted.
    """

    def __str__(self) -> str:  # KeyError would repr() the message
        """The message as given, not ``repr()``-quoted as ``KeyError`` would."""
        return str(self.args[0])


class RowIdTypeError(StoreError, TypeError):
    """Row ids (or positions) given to a read are not integers.

    Raised by ``read``, ``read_columns``, ``index_of``, ``locate`` and ``rows_at`` of
    stores, tables and table views for floats (``1.5`` would read row 1), booleans (a
    mask would read rows 0 and 1), strings and other non-integer values, and for
    unsigned ids past the int64 range. Integer arrays of any integer dtype are accepted.
    Nothing was read. It is also a ``TypeError``.

    Parameters
    ----------
    argument : str
        What was given (``"rows"`` or ``"positions"``).
    actual : Any
        A description of what was given (its dtype).

    Attributes
    ----------
    argument : str
        As given.
    """

    def __init__(self, argument: str, actual: Any) -> None:
        self.argument = argument
        super().__init__(f"{argument}: expected integer row ids (an int, a sequence of ints or an integer "
                         f"array), got {actual}")


class StaleReadError(StoreError):
    """Rows this reader still saw were evicted and reclaimed; call ``refresh()``.

    Raised by reads (in a loader worker, Ray Data, a table read) whose snapshot
    names fragments a writer has since reclaimed.
    """


class CorruptObjectError(StoreError):
    """A stored object fails its integrity check; ``path`` names it.

    Raised when a chunk, a commit record, a manifest, a span or a cache entry
    read from a store is truncated, fails its checksum, or is malformed.

    Parameters
    ----------
    path : str
        The object's path (or key) relative to the store root.
    problem : str
        What is wrong with it; becomes the message after ``path``.

    Attributes
    ----------
    path : str
        As given.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}")


class UnsafeNameError(CorruptObjectError):
    """A name read from a store breaks the format's name grammar.

    Raised for ``..``, a separator, an absolute path or a control character in a
    name read from the store, or when a path under the store root leads outside
    it through a symbolic link. Nothing was read, written or deleted through it.
    """


class InvalidNameError(StoreError, ValueError):
    """A name given as an argument breaks the format's name grammar.

    Raised for a table, state slot or state array name that breaks the grammar
    of docs/FORMAT.md, "Object names". It is also a ``ValueError``.
    """


class NotAStoreError(StoreError):
    """``open_store(mode="w+")`` found objects at the URL that are not a replaystore store.

    There is no manifest, or one that is not replaystore's; nothing was deleted.
    """


class StoreReplacedError(StoreError):
    """Another opener is replacing the store (``mode="w+"``) or replaced it after this handle opened it.

    The opener that lost wrote and deleted nothing.
    """


class StepRangeError(StepOrderError):
    """A step lies outside the format's step range ``[0, MAX_STEP]`` (``field`` is ``"step"``).

    Raised by appends that carry steps; nothing is written.
    """


class SamplerParameterError(StoreError, ValueError):
    """A sampler argument is out of its valid range.

    Raised by the samplers' constructors and ``PrioritizedSampler.update`` for
    ``alpha``, ``beta``, ``eps``, ``priorities``, ``refresh_every`` and the
    like: ``field`` got ``actual``, wanted ``expected``. It is also a
    ``ValueError``.

    Parameters
    ----------
    field : str
        Name of the argument.
    expected : Any
        The valid range, in words.
    actual : Any
        The value given.

    Attributes
    ----------
    field : str
        As given.
    expected : Any
        As given.
    actual : Any
        As given.
    """

    def __init__(self, field: str, expected: Any, actual: Any) -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        super().__init__(f"{field}: expected {expected}, got {actual}")


class UnsupportedCombinationError(SamplerParameterError):
    """A sampler was given two parts that do not work together.

    Raised at construction, before anything is read, for a sampler kind with a
    feature it does not take (``ReservoirSampler`` with ``stack=``) or two
    features that do not go together (``stack=`` with ``her=``); the table of
    what works is ``replaystore.loaders.combinations``. The message names both
    sides and why. It is a :class:`SamplerParameterError` whose ``field`` is the
    second side.

    Parameters
    ----------
    first : str
        The sampler class (``"ReservoirSampler"``) or the first feature argument (``"stack="``).
    second : str
        The feature argument refused with it (``"her="``).
    reason : str
        Why, in words.

    Attributes
    ----------
    first : str
        As given.
    second : str
        As given.
    reason : str
        As given.
    """

    def __init__(self, first: str, second: str, reason: str) -> None:
        super().__init__(second, f"not given with {first} ({reason})", "both")
        self.first = first
        self.second = second
        self.reason = reason
        self.args = (f"{first} with {second} is not supported: {reason}",)


class ResumeMismatchError(StoreError):
    """Saved sampler state has hyperparameters that differ from the ones given.

    Raised by a sampler constructed with ``resume=True``. Pass ``override=True``
    to resume with the given ones.

    Parameters
    ----------
    slot : str
        The state slot the saved state was read from.
    parameters : dict of str to tuple
        Each differing name mapped to ``(saved, given)``.
    detail : str, optional
        Replaces the default hint at the end of the message.

    Attributes
    ----------
    slot : str
        As given.
    parameters : dict of str to tuple
        As given.
    """

    def __init__(self, slot: str, parameters: dict[str, tuple[Any, Any]], detail: str = "") -> None:
        self.slot = slot
        self.parameters = parameters
        diff = ", ".join(f"{k}: saved {s!r}, given {g!r}" for k, (s, g) in parameters.items())
        super().__init__(f"state slot {slot!r}: hyperparameters differ from the saved ones ({diff})"
                         + (f"; {detail}" if detail else "; pass override=True to resume with the given ones"))


class ModeError(StoreError, ValueError):
    """``open_store`` got a ``mode`` it does not know.

    Parameters
    ----------
    actual : Any
        The value given for ``mode``.
    expected : tuple of str
        The accepted spellings.

    Attributes
    ----------
    field : str
        Always ``"mode"``.
    """

    def __init__(self, actual: Any, expected: tuple[str, ...]) -> None:
        self.field = "mode"
        self.expected = expected
        self.actual = actual
        super().__init__(f"mode: expected one of {', '.join(repr(m) for m in expected)}, got {actual!r}")


class UnsupportedSpaceError(SchemaError):
    """A Gymnasium space has no column layout.

    Raised by ``replaystore.gym.schema_from_spaces`` for ``Text``, ``Graph`` and ``Sequence``
    spaces (and ``Dict``/``Tuple`` until nested fields exist).

    Parameters
    ----------
    space : str
        The space (and where it sits in the observation), kept as ``.space``.
    supported : str
        The spaces that are supported, listed in the message.
    detail : str, optional
        Why this space is refused.
    """

    def __init__(self, space: str, supported: str, detail: str = "") -> None:
        self.space = space
        super().__init__(f"{space}: not supported{f' ({detail})' if detail else ''}; supported: {supported}")


class UnsafeCastError(DTypeError):
    """A value cannot be cast to its field's dtype without changing it.

    For example 3.7 into an int64 action, 300 into uint8, a float into bool; nothing of the
    step was recorded.
    """


class ImportSourceError(StoreError, ValueError):
    """The source of an import is malformed; nothing was imported and no store was left behind.

    Raised by ``import_store`` and the format importers (Parquet, Minari, D4RL) when a
    source file cannot be read (truncated, garbage, a wrong kind of file), lacks a column
    or dataset, or holds one whose type or shape differs from what the target schema
    needs. The message names the column (or file) and what was expected and found.

    Parameters
    ----------
    column : str
        The source column, dataset or file that is wrong.
    expected : Any
        What the target schema (or the format) needs there.
    found : Any
        What the source holds.
    source : str, optional
        The source file or directory, prefixed to the message.

    Attributes
    ----------
    column : str
        As given.
    expected : Any
        As given.
    found : Any
        As given.
    """

    def __init__(self, column: str, expected: Any, found: Any, source: str = "") -> None:
        self.column, self.expected, self.found = column, expected, found
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{column!r}: expected {expected}, found {found}")


class RecordingError(StoreError):
    """A recording wrapper was used out of order, or the vector environment lacks an autoreset mode.

    Out of order: a step before a reset, a step after the episode ended or after a failed step.
    """


class TransformError(StoreError):
    """A loader ``transform`` cannot be used or failed.

    Raised by ``make_loader`` in the main process, before any worker starts, when
    ``transform`` is not callable or cannot be pickled for ``spawn`` /
    ``forkserver`` workers; and raised (in a worker: re-raised by torch in the main
    process) when ``transform`` itself raised: the message then holds the
    original exception's traceback text, and ``__cause__`` the exception where it
    ran in-process.
    """


class LoaderArgumentError(StoreError, TypeError):
    """A DataLoader argument ``make_loader`` sets itself was given (``collate_fn``, ``batch_sampler``...).

    The message names the argument and what to use instead (``transform=`` for
    a function applied to each minibatch). It is also a ``TypeError``.
    """


class AppendOnlyError(StoreError, ValueError):
    """A write asked to overwrite or remove stored records; a store only appends.

    Raised by ``replaystore.integrations.torchrl.ReplayStoreStorage`` for a TorchRL write at
    explicit indices that is not an append at the writer's cursor (``storage[i] = data``,
    ``write_at``) and for ``empty()``. Nothing was written. It is also a ``ValueError``.
    """


class LoaderOutputError(StoreError, ValueError):
    """``make_loader`` got an ``output`` it does not know.

    The message names the accepted values. It is also a ``ValueError``.
    """


class MissingDependencyError(ReplayStoreError, ImportError):
    """An optional package a call or module needs is not installed.

    Raised by ``make_loader(output="tensordict")`` and by importing
    ``replaystore.integrations.torchrl`` or ``replaystore.integrations.sb3`` without their
    trainer library. The message names the package and the extra that installs it
    (``replaystore[torchrl]``, ``replaystore[sb3]``). It is also an ``ImportError``.
    """


class VideoUnavailableError(UnknownCodecError, MissingDependencyError):
    """A field is video-coded (``codec="video:..."``) and PyAV is not installed.

    Raised where the codec is first needed: building the field (so creating or opening a
    store whose schema has one) and reading it. The message names the field and the extra
    that installs PyAV (``pip install "replaystore[video]"``). It is also an
    :class:`UnknownCodecError` (a codec this process cannot run) and an ``ImportError``.

    Parameters
    ----------
    field : str or None
        The video-coded field (None when looked up without a field).
    codec : str
        The field's codec, as given or read.

    Attributes
    ----------
    field, codec
        As given.
    """

    def __init__(self, field: str | None, codec: str) -> None:
        self.field = field
        self.codec = codec
        where = f"field {field!r}: " if field is not None else ""
        Exception.__init__(self, f"{where}codec {codec!r} needs PyAV (the av package), which is not installed: "
                                 'pip install "replaystore[video]"')


class RateLimitTimeout(StoreError, TimeoutError):
    """A rate limiter kept a minibatch (or a commit) waiting longer than its ``timeout``.

    Raised by a sampler's ``sample`` (and so its iteration and ``make_loader``) when
    ``replaystore.loaders.RateLimiter`` did not admit the minibatch within the limiter's
    ``timeout`` seconds: the learner stayed too far ahead of the collectors, or the table
    held fewer than ``min_size_to_sample`` records. Nothing was drawn or counted. It is
    also a ``TimeoutError``.

    Parameters
    ----------
    limiter : str
        The limiter, described (its parameters and name).
    waited_for : str
        What the wait needed, in words.
    inserts, samples, size : int
        The counts as last seen: records ever committed to the table, samples drawn under
        the limiter (all its samplers), records the table holds.
    timeout : float
        The seconds waited.

    Attributes
    ----------
    limiter, waited_for, inserts, samples, size, timeout
        As given.
    """

    def __init__(self, limiter: str, waited_for: str, inserts: int, samples: int, size: int,
                 timeout: float) -> None:
        self.limiter = limiter
        self.waited_for = waited_for
        self.inserts = inserts
        self.samples = samples
        self.size = size
        self.timeout = timeout
        super().__init__(f"{limiter}: waited {timeout:g} s for {waited_for}; counts: {inserts} inserts, "
                         f"{samples} samples, {size} records in the table")

class BufferArgumentError(StoreError, ValueError):
    """A trainer-facing replay buffer adapter got an argument or a value it cannot use.

    Raised by ``replaystore.integrations.sb3``'s buffers: no ``url``, a
    ``buffer_size`` that differs from the existing store's capacity, an unsupported
    option (``optimize_memory_usage=True``), or an ``add`` whose values do not fit the
    spaces. The message names the argument or field; the store is left as it was.
    It is also a ``ValueError``.
    """
