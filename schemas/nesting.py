"""Nested (Dict/Tuple) fields: one stored column per leaf, named by its path joined with ``__``.

A nested field ``obs`` with leaves ``image`` and ``vec`` is stored as the fields
``obs__image`` and ``obs__vec``; a Tuple's leaves are keyed ``0``, ``1``, ... in order
(``obs__0``). The schema records each inner node's kind (``"dict"`` or ``"tuple"``) under
its flat prefix; reads give the leaves back as nested dicts (tuples for Tuple nodes).
See docs/FORMAT.md, "Nested fields".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replaystore.errors import SchemaError
from replaystore.schemas.fields import FIELD_NAME_BYTES, Dense, Field, Ragged, shown_name

SEP = "__"
"""What joins a nested leaf's path into its column name (``obs__image``)."""

NODE_KINDS = ("dict", "tuple")

NESTING_DEPTH_LIMIT = 32
"""The deepest a nested field goes: keys in a leaf's path below its top-level name (``obs__image``
is 1 deep, ``obs__pos__x`` 2) (docs/FORMAT.md, "Schema limits")."""
NESTED_NODES_LIMIT = 10_000
"""The most inner (Dict/Tuple) nodes of a schema's nested fields together (docs/FORMAT.md, "Schema limits")."""


def _depth_problem(node: str, depth: int) -> SchemaError:
    return SchemaError(f"nested node {shown_name(node)}: its keys are {depth} levels deep, over the limit of "
                       f"{NESTING_DEPTH_LIMIT}")


@dataclass(frozen=True)
class Nested:
    """A nested field: its leaves as flat fields, and the kind of each inner node.

    Build one with :func:`nested`; a :class:`~replaystore.schemas.Schema` takes it among
    its fields and stores one column per leaf.

    Parameters
    ----------
    name : str
        The top-level field name.
    leaves : tuple of Dense or Ragged
        The leaf fields, named by their paths (``obs__image``), in order.
    nodes : dict of str to str
        Each inner node's flat prefix (``obs``, ``obs__pos``) mapped to ``"dict"`` or ``"tuple"``.
    """

    name: str
    leaves: tuple[Dense | Ragged, ...]
    nodes: dict[str, str]

    kind = "nested"


def _key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key.isidentifier() or SEP in key or key.startswith("_"):
        raise SchemaError(f"nested field {where!r}: key {key!r} must be an identifier without '__' "
                          "that does not start with '_'")
    return key


def nested(name: str, structure: Mapping[str, Any] | Sequence[Any]) -> Nested:
    """A nested field named ``name`` whose leaves are the fields in ``structure``.

    Cost: linear in the number of leaves.

    Parameters
    ----------
    name : str
        The top-level name (an identifier without ``__``, not starting with ``_``).
    structure : mapping or sequence
        A mapping (a Dict node; keys: identifiers without ``__``) or a tuple/list (a Tuple
        node, keys ``0``, ``1``, ...) whose values are :class:`Dense` or :class:`Ragged`
        fields (their own names are replaced by their paths) or further mappings/sequences.

    Returns
    -------
    Nested
        The leaves (``name__key__...``) and the inner nodes' kinds.

    Raises
    ------
    SchemaError
        A bad name or key, an empty node, a value that is neither a field nor a node, a
        leaf deeper than ``NESTING_DEPTH_LIMIT`` (32) keys, more than ``NESTED_NODES_LIMIT``
        (10,000) inner nodes, or a leaf path longer than ``FIELD_NAME_BYTES`` (200) bytes.

    Examples
    --------
    >>> import numpy as np
    >>> from replaystore.schemas import Dense, Schema, nested
    >>> obs = nested("obs", {"image": Dense("image", np.uint8, (8, 8, 3)), "vec": Dense("vec", np.float32, (3,))})
    >>> Schema("s", [obs, Dense("action", np.int64)]).names
    ('obs__image', 'obs__vec', 'action')
    """
    _key(name, name)
    leaves: list[Dense | Ragged] = []
    nodes: dict[str, str] = {}

    def walk(prefix: str, node: Any, depth: int) -> None:
        if isinstance(node, (Dense, Ragged)):
            leaves.append(dataclasses.replace(node, name=prefix))
            return
        if depth >= NESTING_DEPTH_LIMIT:  # (its children would be deeper than the limit)
            raise _depth_problem(prefix, depth + 1)
        if len(nodes) >= NESTED_NODES_LIMIT:
            raise SchemaError(f"nested field {name!r}: more than {NESTED_NODES_LIMIT} inner nodes (the limit)")
        if isinstance(node, Mapping):
            items = [(_key(k, prefix), v) for k, v in node.items()]
            nodes[prefix] = "dict"
        elif isinstance(node, (tuple, list)):
            items = [(str(i), v) for i, v in enumerate(node)]
            nodes[prefix] = "tuple"
        else:
            raise SchemaError(f"nested field {prefix!r}: expected a Dense or Ragged field, a mapping or a "
                              f"tuple, got {type(node).__name__}")
        if not items:
            raise SchemaError(f"nested field {prefix!r}: an empty {nodes[prefix]} has no column to store")
        for k, v in items:
            walk(f"{prefix}{SEP}{k}", v, depth + 1)

    if isinstance(structure, (Dense, Ragged)) or not isinstance(structure, (Mapping, tuple, list)):
        raise SchemaError(f"nested field {name!r}: expected a mapping or a tuple of fields")
    walk(name, structure, 0)
    return Nested(name, tuple(leaves), nodes)


class Nesting:
    """How a schema's flat leaf columns nest: built once per schema, used by every read.

    Parameters
    ----------
    names : sequence of str
        The schema's field names (and offsets names), in order.
    nodes : mapping of str to str
        Each inner node's flat prefix mapped to ``"dict"`` or ``"tuple"``.

    Raises
    ------
    SchemaError
        More than ``NESTED_NODES_LIMIT`` nodes, a node name that is not a string or is
        longer than ``FIELD_NAME_BYTES``, a node whose children would be deeper than
        ``NESTING_DEPTH_LIMIT``, a node kind that is not ``dict``/``tuple``, a node with no leaf,
        a tuple node whose keys are not ``0..n-1``, or a field named like a node.

    Notes
    -----
    Cost: linear in the number of names and nodes (whatever they hold: the limits are
    checked before anything is built).
    """

    def __init__(self, names: Sequence[str], nodes: Mapping[str, str]) -> None:
        if len(nodes) > NESTED_NODES_LIMIT:
            raise SchemaError(f"nested nodes: {len(nodes)}, over the limit of {NESTED_NODES_LIMIT}")
        self.nodes = dict(nodes)
        fields = set(names)
        for p, kind in self.nodes.items():
            if not isinstance(p, str):
                raise SchemaError(f"nested node {shown_name(p)}: expected a string")
            size = len(p.encode("utf-8", "surrogatepass"))
            if size > FIELD_NAME_BYTES:
                raise SchemaError(f"nested node {shown_name(p)}: {size} bytes in UTF-8, over the limit of "
                                  f"{FIELD_NAME_BYTES} bytes")
            if p.count(SEP) >= NESTING_DEPTH_LIMIT:  # (its children are one level deeper)
                raise _depth_problem(p, p.count(SEP) + 1)
            if kind not in NODE_KINDS:
                raise SchemaError(f"nested node {shown_name(p)}: kind {shown_name(kind)} is not one of {NODE_KINDS}")
            if p in fields:
                raise SchemaError(f"nested node {p!r}: a field has the same name")
            parent = p.rpartition(SEP)[0]
            if SEP in p and parent not in self.nodes:
                raise SchemaError(f"nested node {p!r}: its parent {parent!r} is not a node")
        self.children: dict[str, list[str]] = {p: [] for p in self.nodes}
        self.leaves: dict[str, list[str]] = {}
        seen: set[str] = set()
        for n in names:  # children in the order of their first leaf
            child, parent = n, n.rpartition(SEP)[0]
            while parent in self.nodes and child not in seen:
                seen.add(child)
                self.children[parent].append(child)
                child, parent = parent, parent.rpartition(SEP)[0]
        for p, kids in self.children.items():
            if not kids:
                raise SchemaError(f"nested node {p!r}: has no leaf")
            if self.nodes[p] == "tuple":
                keys = sorted(int(k.rpartition(SEP)[2]) for k in kids if k.rpartition(SEP)[2].isdigit())
                if keys != list(range(len(kids))):
                    raise SchemaError(f"nested node {p!r}: a tuple's keys must be 0..{len(kids) - 1}")
                kids.sort(key=lambda k: int(k.rpartition(SEP)[2]))
        self.roots = [p for p in self.nodes if SEP not in p]
        self.root_of: dict[str, str] = {}
        for r in self.roots:
            self.leaves[r] = self._leaves_of(r)
            self.root_of.update(dict.fromkeys(self.leaves[r], r))

    def _leaves_of(self, p: str) -> list[str]:
        out: list[str] = []
        for k in self.children[p]:
            out.extend(self._leaves_of(k) if k in self.nodes else [k])
        return out

    def columns(self, columns: Iterable[str] | str | None) -> list[str] | None:
        """``columns`` with each nested name replaced by its leaves' names.

        Parameters
        ----------
        columns : iterable of str, str or None
            Names to read (None: every field).

        Returns
        -------
        list of str or None
            Flat names (None when ``columns`` is None). Cost: O(names).
        """
        if columns is None:
            return None
        if isinstance(columns, str):
            columns = [columns]
        out: list[str] = []
        for c in columns:
            out.extend(self.leaves.get(c, [c]))
        return out

    def _build(self, p: str, flat: Mapping[str, Any]) -> Any:
        kids = [self._build(k, flat) if k in self.nodes else flat[k] for k in self.children[p]]
        if self.nodes[p] == "tuple":
            return tuple(kids)
        return {k.rpartition(SEP)[2]: v for k, v in zip(self.children[p], kids, strict=True)}

    def nest(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """The flat columns ``flat`` with each complete nested field's leaves gathered into one value.

        Parameters
        ----------
        flat : mapping of str to Any
            Columns by flat name (other entries pass through, in order).

        Returns
        -------
        dict of str to Any
            A new dict: ``out["obs"]["image"]`` for leaf ``obs__image``, placed where its first
            leaf was; Tuple nodes as tuples. Leaves of a nested field not all present pass
            through under their flat names. Cost: O(columns + leaves).
        """
        out: dict[str, Any] = {}
        for k, v in flat.items():
            r = self.root_of.get(k)
            if r is None:
                out[k] = v
            elif r not in out:
                if all(leaf in flat for leaf in self.leaves[r]):
                    out[r] = self._build(r, flat)
                else:
                    out[k] = v
            elif not isinstance(out[r], (dict, tuple)):
                out[k] = v
        return out

    def unnest(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with each nested value spread into its leaf columns (the inverse of :meth:`nest`).

        Parameters
        ----------
        batch : mapping of str to Any
            Columns; a nested field's value is a mapping (Dict) or tuple/list (Tuple).

        Returns
        -------
        dict of str to Any
            Flat columns. A value given under a flat leaf name passes through. Cost: O(leaves).

        Raises
        ------
        SchemaError
            A nested value whose structure does not match the schema's.
        """
        out: dict[str, Any] = {}
        for k, v in batch.items():
            if k in self.nodes:
                self._spread(k, v, out)
            else:
                out[k] = v
        return out

    def _spread(self, p: str, v: Any, out: dict[str, Any]) -> None:
        kids = self.children[p]
        if self.nodes[p] == "tuple":
            if not isinstance(v, (tuple, list)) or len(v) != len(kids):
                raise SchemaError(f"nested field {p!r}: expected a tuple of {len(kids)} values, got {type(v).__name__}")
            values = list(v)
        else:
            keys = [k.rpartition(SEP)[2] for k in kids]
            if not isinstance(v, Mapping) or set(v) != set(keys):
                got = sorted(v) if isinstance(v, Mapping) else type(v).__name__
                raise SchemaError(f"nested field {p!r}: expected a mapping with keys {sorted(keys)}, got {got}")
            values = [v[k] for k in keys]
        for k, x in zip(kids, values, strict=True):
            if k in self.nodes:
                self._spread(k, x, out)
            else:
                out[k] = x

    def map(self, fn: Callable[[Any], Any], value: Any) -> Any:
        """``fn`` applied to every leaf of a nested value (dicts and tuples rebuilt).

        Parameters
        ----------
        fn : callable
            Applied to each leaf.
        value : Any
            A nested value (or a leaf).

        Returns
        -------
        Any
            The same structure. Cost: O(leaves).
        """
        return map_tree(fn, value)


def map_tree(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to every leaf of ``value``; dicts and tuples are rebuilt around the results.

    Parameters
    ----------
    fn : callable
        Applied to each leaf (anything that is not a dict or tuple).
    value : Any
        A nested value.

    Returns
    -------
    Any
        The same structure with mapped leaves. Cost: O(leaves).
    """
    if isinstance(value, dict):
        return {k: map_tree(fn, v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map_tree(fn, v) for v in value)
    return fn(value)


def expand(fields: Iterable[Field | Nested]) -> tuple[list[Field], dict[str, str]]:
    """Schema fields with each :class:`Nested` replaced by its leaves, and all nested nodes.

    Parameters
    ----------
    fields : iterable of Field or Nested
        As given to :class:`~replaystore.schemas.Schema`.

    Returns
    -------
    tuple
        The flat fields and the nodes' kinds by prefix. Cost: O(fields).
    """
    flat: list[Field] = []
    nodes: dict[str, str] = {}
    for f in fields:
        if isinstance(f, Nested):
            flat.extend(f.leaves)
            nodes.update(f.nodes)
        else:
            flat.append(f)
    return flat, nodes


__all__ = ["SEP", "Nested", "Nesting", "nested", "map_tree", "expand"]
