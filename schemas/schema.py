"""The :class:`Schema`: an ordered set of fields with a name, a version and metadata."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from replaystore.errors import SchemaError
from replaystore.schemas.fields import OFFSETS_DTYPE, BatchMeta, Dense, Field, Ragged, shown_name
from replaystore.schemas.nesting import NESTED_NODES_LIMIT, Nested, Nesting, expand

if TYPE_CHECKING:
    import pyarrow as pa

    from replaystore.schemas.columns import Columns
    from replaystore.schemas.layout import ArraySpec

JSON_FORMAT = "replaystore.schema/1"

FIELDS_LIMIT = 10_000
"""The most fields of a schema, each leaf of a nested field counted as one (docs/FORMAT.md, "Schema limits")."""


def _json_safe(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise SchemaError(f"schema metadata: expected a mapping, got {type(metadata).__name__}")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"schema metadata: expected JSON-serialisable values ({exc})") from exc
    return plain


class Schema:
    """An ordered set of fields describing the records of one table.

    Build one from :class:`Dense`, :class:`Ragged` and :class:`BatchMeta` fields::

        Schema("pong", [Dense("obs", np.float32, (84, 84)), Dense("action", np.int64)])

    Construction is linear in the number of fields and nested nodes. A schema is
    compared by value (``==``) and is not hashable. Limits (docs/FORMAT.md, "Schema
    limits"): at most ``FIELDS_LIMIT`` (10,000) fields, nested leaves counted one each;
    field and offsets names of at most ``FIELD_NAME_BYTES`` (200) bytes in UTF-8; nested
    fields at most ``NESTING_DEPTH_LIMIT`` (32) keys deep with at most
    ``NESTED_NODES_LIMIT`` (10,000) inner nodes in all.

    Parameters
    ----------
    name : str
        A non-empty name.
    fields : iterable of Field or Nested
        The fields, in order; at least one must be dense or ragged. A :class:`Nested`
        field (see :func:`~replaystore.schemas.nested`) adds one field per leaf.
    version : int, optional
        A positive schema version (default 1).
    metadata : mapping, optional
        A free-form JSON mapping (action count and frame, environment id,
        observation description, producer version, ...) that survives JSON, Arrow
        and Parquet round trips.
    nested : mapping of str to str, optional
        More nested nodes (flat prefix to ``"dict"`` or ``"tuple"``), as :meth:`to_dict`
        writes them; :class:`Nested` fields bring their own.

    Attributes
    ----------
    name : str
        As given.
    version : int
        As given.
    fields : tuple of Field
        The fields, in order.
    metadata : dict
        A JSON-normalised copy of ``metadata``.
    offsets_groups : dict of str to tuple of str
        Each CSR offsets name mapped to the ragged fields that share it.
    nesting : Nesting or None
        How leaf columns nest into Dict/Tuple values; None for a flat schema.

    Raises
    ------
    SchemaError
        An empty name, a version that is not a positive int, metadata that is not a
        JSON-serialisable mapping, an object that is not a field, a field defined
        twice, an offsets name that clashes with a field, no dense or ragged field, or
        a limit passed (more fields or nested nodes, a longer name or a deeper nested
        field than the limits above; the error names the field and the limit).

    Examples
    --------
    >>> import numpy as np
    >>> from replaystore.schemas import Dense, Schema
    >>> schema = Schema("pong", [Dense("obs", np.float32, (4,)), Dense("action", np.int64)])
    >>> schema.names
    ('obs', 'action')
    >>> columns = schema.validate({"obs": np.zeros((2, 4), np.float32), "action": np.array([0, 1])})
    >>> columns.num_records
    2
    """

    def __init__(
        self,
        name: str,
        fields: Iterable[Field | Nested],
        *,
        version: int = 1,
        metadata: Mapping[str, Any] | None = None,
        nested: Mapping[str, str] | None = None,
    ) -> None:
        fields, nodes = expand(fields)
        if len(fields) > FIELDS_LIMIT:
            raise SchemaError(f"schema {shown_name(name)}: {len(fields)} fields, over the limit of {FIELDS_LIMIT}")
        if nested is not None and not isinstance(nested, Mapping):
            raise SchemaError(f"schema {shown_name(name)}: nested nodes: expected a mapping, got "
                              f"{type(nested).__name__}")
        nodes.update(nested or {})
        if not isinstance(name, str) or not name:
            raise SchemaError(f"schema name: expected a non-empty string, got {name!r}")
        if not isinstance(version, int) or version < 1:
            raise SchemaError(f"schema version: expected a positive int, got {version!r}")
        self.name = name
        self.version = version
        self.fields: tuple[Field, ...] = tuple(fields)
        self.metadata = _json_safe(metadata)
        self._by_name: dict[str, Field] = {}
        for f in self.fields:
            if not isinstance(f, (Dense, Ragged, BatchMeta, Nested)):
                raise SchemaError(f"schema {name!r}: {f!r} is not a Dense, Ragged or BatchMeta field")
            if f.name in self._by_name:
                raise SchemaError(f"schema {name!r}: field {f.name!r} defined twice")
            self._by_name[f.name] = f
        groups: dict[str, list[str]] = {}
        for f in self.ragged_fields:
            if f.offsets in self._by_name:
                raise SchemaError(f"schema {name!r}: offsets {f.offsets!r} clashes with a field name")
            groups.setdefault(f.offsets, []).append(f.name)
        self.offsets_groups: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in groups.items()}
        if not self.dense_fields and not self.ragged_fields:
            raise SchemaError(f"schema {name!r}: needs at least one dense or ragged field")
        self.nesting: Nesting | None = Nesting(self.input_names, nodes) if nodes else None

    # -- structure -----------------------------------------------------------------
    @property
    def dense_fields(self) -> tuple[Dense, ...]:
        """The dense fields, in order."""
        return tuple(f for f in self.fields if isinstance(f, Dense))

    @property
    def compressed(self) -> dict[str, str]:
        """The compressed dense fields: name to normalised codec (``"zstd:3"``); empty when none."""
        return {f.name: f.codec for f in self.fields if isinstance(f, Dense) and f.codec is not None}

    @property
    def ragged_fields(self) -> tuple[Ragged, ...]:
        """The ragged (CSR) fields, in order."""
        return tuple(f for f in self.fields if isinstance(f, Ragged))

    @property
    def meta_fields(self) -> tuple[BatchMeta, ...]:
        """The batch-metadata fields, in order."""
        return tuple(f for f in self.fields if isinstance(f, BatchMeta))

    @property
    def names(self) -> tuple[str, ...]:
        """Field names, in order."""
        return tuple(f.name for f in self.fields)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Every name a batch for this schema carries: fields, then CSR offsets arrays."""
        return self.names + tuple(self.offsets_groups)

    @property
    def record_names(self) -> tuple[str, ...]:
        """Names of the per-record arrays (dense and ragged values), without offsets and metadata."""
        return tuple(f.name for f in self.fields if not isinstance(f, BatchMeta))

    def field(self, name: str) -> Field:
        """The field called ``name``.

        Parameters
        ----------
        name : str
            A field name.

        Returns
        -------
        Field
            The :class:`Dense`, :class:`Ragged` or :class:`BatchMeta` field.

        Raises
        ------
        SchemaError
            The schema has no field ``name``.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(f"schema {self.name!r} has no field {name!r}") from None

    def __contains__(self, name: object) -> bool:
        """Whether the schema has a field called ``name``."""
        return name in self._by_name

    def __eq__(self, other: object) -> bool:
        """Schemas are equal when their JSON descriptions are."""
        if not isinstance(other, Schema):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """``Schema(name, version=..., fields=[...])``."""
        return f"Schema({self.name!r}, version={self.version}, fields={list(self.names)})"

    def describe(self) -> str:
        """A human-readable multi-line listing of the fields.

        Returns
        -------
        str
            One line for the schema, one per field, and one for the metadata if any.
        """
        lines = [f"{self.name} (version {self.version})"]
        for f in self.fields:
            if isinstance(f, Dense):
                shape = ", ".join(["records", *map(str, f.shape)])
                lines.append(f"  {f.name:<24} dense   {f.dtype.name:<8} ({shape})")
            elif isinstance(f, Ragged):
                lines.append(f"  {f.name:<24} ragged  {f.dtype.name:<8} CSR, offsets {f.offsets!r}")
            else:
                lines.append(f"  {f.name:<24} meta    json     one document per append")
        if self.metadata:
            lines.append(f"  metadata: {json.dumps(self.metadata, sort_keys=True)}")
        return "\n".join(lines)

    # -- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the on-disk form; never pickled).

        Returns
        -------
        dict
            ``{"format", "name", "version", "fields", "metadata"}``; each field as a
            dict of its kind, dtype, shape or offsets, bounds and description; plus
            ``"nested"`` (node prefix to kind) when the schema has nested fields.
        """
        fields: list[dict[str, Any]] = []
        for f in self.fields:
            d: dict[str, Any] = {"name": f.name, "kind": f.kind}
            if isinstance(f, (Dense, Ragged)):
                d["dtype"] = f.dtype.str
                d["finite"] = f.finite
                d["id_bound"] = f.id_bound
            if isinstance(f, Dense):
                d["shape"] = list(f.shape)
                if f.codec is not None:  # (absent when raw: documents of raw schemas are unchanged)
                    d["codec"] = f.codec
            if isinstance(f, Ragged):
                d["offsets"] = f.offsets
            d["description"] = f.description
            fields.append(d)
        doc = {
            "format": JSON_FORMAT,
            "name": self.name,
            "version": self.version,
            "fields": fields,
            "metadata": self.metadata,
        }
        if self.nesting is not None:
            doc["nested"] = dict(self.nesting.nodes)
        return doc

    def to_json(self, indent: int | None = None) -> str:
        """The schema as JSON text (:meth:`to_dict`, serialised).

        Parameters
        ----------
        indent : int, optional
            Pretty-print with this indent and sorted keys; compact and in field order
            when None.

        Returns
        -------
        str
            The JSON document.
        """
        return json.dumps(self.to_dict(), indent=indent, sort_keys=indent is not None)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        """The schema a :meth:`to_dict` document describes.

        Parameters
        ----------
        d : mapping
            A document with ``format`` equal to ``"replaystore.schema/1"``.

        Returns
        -------
        Schema
            The schema it describes.

        Raises
        ------
        SchemaError
            ``d`` is not a replaystore schema document, is missing keys, names an
            unknown field kind, describes an invalid schema or field, or passes a
            limit (see :class:`Schema`; checked before the fields are built).
        """
        if not isinstance(d, Mapping) or d.get("format") != JSON_FORMAT:
            raise SchemaError(f"not a replaystore schema document (expected format {JSON_FORMAT!r})")
        try:
            docs, nodes = d["fields"], d.get("nested")
            if not isinstance(docs, (list, tuple)):
                raise SchemaError(f"schema document: 'fields' must be a list, got {type(docs).__name__}")
            if len(docs) > FIELDS_LIMIT:
                raise SchemaError(f"schema document: {len(docs)} fields, over the limit of {FIELDS_LIMIT}")
            if nodes is not None and not isinstance(nodes, Mapping):
                raise SchemaError(f"schema document: 'nested' must be a mapping, got {type(nodes).__name__}")
            if nodes is not None and len(nodes) > NESTED_NODES_LIMIT:
                raise SchemaError(f"schema document: {len(nodes)} nested nodes, over the limit of "
                                  f"{NESTED_NODES_LIMIT}")
            fields: list[Field] = []
            for fd in docs:
                kind = fd["kind"]
                if kind == "dense":
                    fields.append(Dense(fd["name"], np.dtype(fd["dtype"]), tuple(fd["shape"]),
                                        fd["finite"], fd["id_bound"], fd.get("description", ""),
                                        fd.get("codec")))
                elif kind == "ragged":
                    fields.append(Ragged(fd["name"], np.dtype(fd["dtype"]), fd["offsets"],
                                         fd["finite"], fd["id_bound"], fd.get("description", "")))
                elif kind == "meta":
                    fields.append(BatchMeta(fd["name"], fd.get("description", "")))
                else:
                    raise SchemaError(f"field {fd.get('name')!r}: unknown kind {kind!r}")
            return cls(d["name"], fields, version=d["version"], metadata=d.get("metadata"), nested=nodes)
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"malformed schema document: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> Schema:
        """The schema a :meth:`to_json` document describes.

        Parameters
        ----------
        text : str or bytes
            JSON text.

        Returns
        -------
        Schema
            The schema it describes.

        Raises
        ------
        SchemaError
            The text does not parse as JSON, or is not a valid schema document
            (see :meth:`from_dict`).
        """
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise SchemaError(f"schema JSON does not parse: {exc}") from exc
        return cls.from_dict(d)

    # -- Arrow, Zarr layout, validation (implemented in sibling modules) ---------------
    def to_arrow(self) -> pa.Schema:
        """The Arrow schema of this table (see :mod:`replaystore.schemas.arrow`).

        Returns
        -------
        pyarrow.Schema
            One Arrow field per record field (ragged fields as lists), with the
            schema document in the metadata.
        """
        from replaystore.schemas.arrow import schema_to_arrow

        return schema_to_arrow(self)

    @classmethod
    def from_arrow(cls, arrow_schema: pa.Schema, name: str | None = None) -> Schema:
        """The schema an Arrow schema describes (see :mod:`replaystore.schemas.arrow`).

        Parameters
        ----------
        arrow_schema : pyarrow.Schema
            An Arrow schema, with or without replaystore's schema metadata.
        name : str, optional
            Schema name to use when the Arrow schema carries none.

        Returns
        -------
        Schema
            The replaystore schema.

        Raises
        ------
        SchemaError
            A column type has no replaystore equivalent, or the embedded schema
            document is malformed.
        """
        from replaystore.schemas.arrow import schema_from_arrow

        return schema_from_arrow(arrow_schema, name)

    def zarr_layout(self) -> tuple[ArraySpec, ...]:
        """The Zarr arrays a table of this schema is stored as.

        Returns
        -------
        tuple of ArraySpec
            One spec per stored array (see :func:`replaystore.schemas.layout.zarr_layout`).
        """
        from replaystore.schemas.layout import zarr_layout

        return zarr_layout(self)

    def validate(self, batch: Any) -> Columns:
        """Check ``batch`` against this schema and return the columns ready to write.

        Never casts. Cost: one pass over each array (finiteness, id bounds, CSR
        offsets); arrays that are already contiguous numpy arrays of the right dtype
        are not copied.

        Parameters
        ----------
        batch : Any
            A mapping or any object with named attributes (dataclass, namedtuple, an
            engine's batch object) holding numpy arrays or CPU torch tensors. A nested
            field's value in a mapping may be given nested (a mapping or tuple of arrays).

        Returns
        -------
        Columns
            The checked, contiguous arrays.

        Raises
        ------
        ValidationError
            A subclass naming the field: ``MissingFieldError``, ``UnknownFieldError``,
            ``DTypeError``, ``ShapeError``, ``RecordCountError``, ``OffsetsError``,
            ``RaggedAlignmentError``, ``IdRangeError``, ``NonFiniteError``,
            ``DeviceError`` or ``MetadataError``.
        """
        from replaystore.schemas.validate import validate

        if self.nesting is not None and isinstance(batch, Mapping):
            batch = self.nesting.unnest(batch)
        return validate(self, batch)


__all__ = ["Schema", "OFFSETS_DTYPE", "FIELDS_LIMIT"]
