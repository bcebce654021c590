"""Dict and Tuple observations in Minari datasets: spaces, Arrow/HDF5 encodings, tree helpers.

The Minari export and import use these; a flat observation passes through each helper unchanged.
Minari stores a Dict observation as an Arrow struct named by its keys (HDF5: a group of datasets),
a Tuple as a struct named ``0``, ``1``, ... (HDF5: ``_index_0``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from replaystore.errors import DTypeError, ImportSourceError, ShapeError, StoreError
from replaystore.schemas import Dense, Schema, map_tree
from replaystore.schemas.nesting import SEP

NESTED_TYPES = ("Dict", "Tuple")
INT_TYPES = ("Discrete", "MultiDiscrete", "MultiBinary")
LEAF_TYPES = ("Box", *INT_TYPES)
"""The leaf spaces a Minari export writes and an import reads (Minari's Arrow layout: Discrete as a plain
int64 column, the others as fixed-size lists of their dtype)."""


def leaf_layout(space: dict[str, Any]) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and per-step shape of one value of leaf space document ``space`` (as gymnasium makes it).

    Raises StoreError for a space that is not one of :data:`LEAF_TYPES` or a malformed document.
    """
    kind = space.get("type") if isinstance(space, dict) else None
    try:
        if kind == "Box":
            return _numeric(np.dtype(space["dtype"]), space), tuple(int(d) for d in space["shape"])
        if kind == "Discrete":
            return np.dtype(np.int64), ()
        if kind == "MultiDiscrete":
            dtype = _numeric(np.dtype(space.get("dtype", "int64")), space)
            return dtype, tuple(int(d) for d in np.shape(space["nvec"]))
        if kind == "MultiBinary":
            n = space["n"]
            return np.dtype(np.int8), ((int(n),) if isinstance(n, int) else tuple(int(d) for d in n))
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"Minari {kind} space document {str(space)[:200]} is malformed ({exc})") from None
    raise StoreError(f"Minari space of type {kind!r}: expected one of {', '.join(LEAF_TYPES)}")


def _numeric(dtype: np.dtype, space: dict[str, Any]) -> np.dtype:
    if dtype.kind not in "biuf" or dtype.fields is not None:  # complex values would lose their imaginary part
        raise ImportSourceError(f"{space.get('type')} space", "a bool, integer or float dtype", str(dtype))
    return dtype


def leaf_bounds(space: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(low, high)``: the integer values of leaf space ``space`` lie in ``[low, high)``; None for Box."""
    kind = space["type"]
    if kind == "Discrete":
        start = int(space.get("start", 0))
        return start, start + int(space["n"])
    if kind == "MultiDiscrete":
        nvec = np.asarray(space["nvec"], dtype=np.int64)
        low = np.asarray(space.get("start", np.zeros_like(nvec)), dtype=np.int64)
        return low, low + nvec
    if kind == "MultiBinary":
        return 0, 2
    return None


def space_fits(space: Any, schema: Schema, name: str) -> bool:
    """Whether space document ``space`` describes field ``name`` of ``schema`` (nesting, dtypes and shapes).

    Cost: O(leaves). A malformed document does not fit.
    """
    if not isinstance(space, dict):
        return False
    nesting = schema.nesting
    kind = space.get("type")
    if nesting is not None and name in nesting.nodes:
        kids = nesting.children[name]
        subs = space.get("subspaces")
        if nesting.nodes[name] == "tuple":
            return (kind == "Tuple" and isinstance(subs, list) and len(subs) == len(kids)
                    and all(space_fits(s, schema, k) for s, k in zip(subs, kids, strict=True)))
        keys = [k.rpartition(SEP)[2] for k in kids]
        return (kind == "Dict" and isinstance(subs, dict) and list(subs) == keys
                and all(space_fits(subs[key], schema, k) for key, k in zip(keys, kids, strict=True)))
    if name not in schema or kind not in LEAF_TYPES:
        return False
    f = schema.field(name)
    if not isinstance(f, Dense):
        return False
    try:
        if leaf_layout(space) != (f.dtype, f.shape):
            return False
        if kind == "Box":
            return bool(np.shape(space["low"]) == f.shape and np.shape(space["high"]) == f.shape)
        bounds = leaf_bounds(space)
        return bounds is None or bool(np.all(np.asarray(bounds[0]) < np.asarray(bounds[1])))
    except (KeyError, TypeError, ValueError, StoreError):
        return False


def check_in_space(space: dict[str, Any], value: Any, name: str, label: str, where: str) -> None:
    """StoreError naming the column unless every integer leaf of ``value`` lies in its ``space``.

    ``label`` names the value in the message (``"action"``), ``where`` says where it is (``"in stream 0"``).
    """
    if space["type"] == "Dict":
        keys = list(space["subspaces"])
        if not isinstance(value, dict) or sorted(value) != sorted(keys):
            found = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ImportSourceError(name, f"a Dict of {keys}", found)
        for k, sub in space["subspaces"].items():
            check_in_space(sub, value[k], f"{name}{SEP}{k}", label, where)
        return
    if space["type"] == "Tuple":
        subs = space["subspaces"]
        if not isinstance(value, tuple) or len(value) != len(subs):
            found = f"{len(value)} items" if isinstance(value, tuple) else type(value).__name__
            raise ImportSourceError(name, f"a Tuple of {len(subs)} items", found)
        for i, sub in enumerate(subs):
            check_in_space(sub, value[i], f"{name}{SEP}{i}", label, where)
        return
    if isinstance(value, (dict, tuple)):
        raise ImportSourceError(name, f"the values of a {space['type']} space", f"a {type(value).__name__}")
    bounds = leaf_bounds(space)
    if bounds is None or not len(value):
        return
    bad = (value < bounds[0]) | (value >= bounds[1])
    if np.any(bad):
        shown = np.broadcast_to(value, bad.shape)[bad][0].item()
        if space["type"] == "Discrete":
            start = int(space.get("start", 0))
            desc = f"Discrete({int(space['n'])}{f', start={start}' if start else ''})"
        else:
            desc = f"{space['type']} [{np.asarray(bounds[0]).tolist()}, {np.asarray(bounds[1]).tolist()})"
        raise StoreError(f"field {name!r}: {label} {shown!r} {where} is outside the space {desc}")


def obs_space(schema: Schema, name: str, leaf_space: Callable[[Dense], dict[str, Any]]) -> dict[str, Any]:
    """The space document of field ``name``.

    ``leaf_space(field)`` for a dense field, a Dict/Tuple document for a nested one (its leaves'
    spaces from ``leaf_space``). Cost: O(leaves).
    """
    nesting = schema.nesting
    if nesting is None or name not in nesting.nodes:
        f = schema.field(name)
        assert isinstance(f, Dense)
        return leaf_space(f)
    kids = nesting.children[name]
    if nesting.nodes[name] == "tuple":
        return {"type": "Tuple", "subspaces": [obs_space(schema, k, leaf_space) for k in kids]}
    return {"type": "Dict", "subspaces": {k.rpartition(SEP)[2]: obs_space(schema, k, leaf_space) for k in kids}}


def leaves_of(value: Any) -> list[np.ndarray]:
    """The leaf arrays of a nested value, depth first."""
    if isinstance(value, dict):
        return [a for v in value.values() for a in leaves_of(v)]
    if isinstance(value, tuple):
        return [a for v in value for a in leaves_of(v)]
    return [value]


def tree_same_bits(a: Any, b: Any, same: Callable[[np.ndarray, np.ndarray], bool]) -> bool:
    """Whether every leaf of ``a`` and ``b`` is ``same``."""
    return all(same(x, y) for x, y in zip(leaves_of(a), leaves_of(b), strict=True))


def tree_flat(prefix: str, value: Any) -> dict[str, np.ndarray]:
    """A nested value's leaves keyed by their column names (``prefix__key``)."""
    if isinstance(value, dict):
        return {n: a for k, v in value.items() for n, a in tree_flat(f"{prefix}{SEP}{k}", v).items()}
    if isinstance(value, tuple):
        return {n: a for i, v in enumerate(value) for n, a in tree_flat(f"{prefix}{SEP}{i}", v).items()}
    return {prefix: value}


def encode_arrow(space: dict[str, Any], value: Any, fixed: Callable[[np.ndarray], pa.Array]) -> pa.Array:
    """Values of ``space`` as Minari's Arrow column.

    Structs for Dict/Tuple, a plain array for a Discrete leaf, ``fixed(leaf)`` (a fixed-size list) for
    Box, MultiDiscrete and MultiBinary leaves: what Minari's ``ArrowStorage`` writes.
    """
    if space["type"] == "Dict":
        keys = list(space["subspaces"])
        return pa.StructArray.from_arrays([encode_arrow(space["subspaces"][k], value[k], fixed) for k in keys],
                                          names=keys)
    if space["type"] == "Tuple":
        subs = space["subspaces"]
        return pa.StructArray.from_arrays([encode_arrow(sub, value[i], fixed) for i, sub in enumerate(subs)],
                                          names=[str(i) for i in range(len(subs))])
    if space["type"] == "Discrete":
        return pa.array(np.ascontiguousarray(value).reshape(-1))
    return fixed(value)


def decode_arrow(space: dict[str, Any], col: pa.Array, decode: Callable[[dict[str, Any], pa.Array, str], np.ndarray],
                 column: str = "observations") -> Any:
    """Minari's Arrow observation column as arrays (dicts/tuples for Dict/Tuple spaces).

    Raises ImportSourceError naming the column where a Dict/Tuple node is not a struct of its keys.
    """
    if space["type"] in NESTED_TYPES:
        keys = list(space["subspaces"]) if space["type"] == "Dict" else [
            str(i) for i in range(len(space["subspaces"]))]
        found = [f.name for f in col.type] if pa.types.is_struct(col.type) else None
        if found is None or sorted(found) != sorted(keys):
            raise ImportSourceError(column, f"a struct of {keys} (a {space['type']} space)", str(col.type))
        subs = space["subspaces"].values() if space["type"] == "Dict" else space["subspaces"]
        out = [decode_arrow(sub, col.field(k), decode, f"{column}{SEP}{k}") for k, sub in zip(keys, subs, strict=True)]
        return dict(zip(keys, out, strict=True)) if space["type"] == "Dict" else tuple(out)
    return decode(space, col, column)


def write_hdf5(group: Any, name: str, value: Any) -> None:
    """Observations into HDF5 as Minari lays them out (a group per Dict/Tuple node)."""
    if isinstance(value, dict):
        g = group.create_group(name)
        for k, v in value.items():
            write_hdf5(g, k, v)
    elif isinstance(value, tuple):
        g = group.create_group(name)
        for i, v in enumerate(value):
            write_hdf5(g, f"_index_{i}", v)
    else:
        group.create_dataset(name, data=value)


def read_hdf5(ref: Any) -> Any:
    """An HDF5 dataset, or a Minari Dict/Tuple group (``_index_<i>`` keys: a tuple), as arrays."""
    if not hasattr(ref, "keys"):
        return ref[()]
    keys = list(ref.keys())
    if keys and all(k.startswith("_index_") and k[7:].isdigit() for k in keys):
        return tuple(read_hdf5(ref[f"_index_{i}"]) for i in range(len(keys)))
    return {k: read_hdf5(ref[k]) for k in keys}


def leaf_spaces(space: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf space documents of a space document (itself, unless Dict/Tuple)."""
    if space.get("type") == "Dict":
        return [leaf for sub in space["subspaces"].values() for leaf in leaf_spaces(sub)]
    if space.get("type") == "Tuple":
        return [leaf for sub in space["subspaces"] for leaf in leaf_spaces(sub)]
    return [space]


def check_space(space: Any, what: str) -> None:
    """StoreError unless ``space`` is a leaf of :data:`LEAF_TYPES`, or Dict/Tuple of them (any depth)."""
    kind = space.get("type") if isinstance(space, dict) else type(space).__name__
    if kind in LEAF_TYPES:
        leaf_layout(space)  # a malformed leaf document is a StoreError
        return
    if kind == "Dict" and isinstance(space.get("subspaces"), dict) and space["subspaces"]:
        for k, sub in space["subspaces"].items():
            if not isinstance(k, str) or not k.isidentifier() or SEP in k or k.startswith("_"):
                raise StoreError(f"Minari {what}: Dict key {k!r} is not an identifier without '__'")
            check_space(sub, what)
        return
    if kind == "Tuple" and isinstance(space.get("subspaces"), list) and space["subspaces"]:
        for sub in space["subspaces"]:
            check_space(sub, what)
        return
    raise StoreError(f"Minari {what} of type {kind!r}: only {', '.join(LEAF_TYPES)} spaces (and Dict/Tuple "
                     f"observations of them) can be imported")


def structure(space: dict[str, Any]) -> Any:
    """The nested field structure of a Dict/Tuple space document (leaves as :func:`leaf_layout` lays them out)."""
    if space["type"] == "Dict":
        return {k: structure(sub) for k, sub in space["subspaces"].items()}
    if space["type"] == "Tuple":
        return tuple(structure(sub) for sub in space["subspaces"])
    dtype, shape = leaf_layout(space)
    return Dense("leaf", dtype, shape)


def typed(schema: Schema, name: str, value: Any) -> Any:
    """``value`` (an array, or a nested value for a nested field) in field ``name``'s dtypes.

    Only safe casts (the values unchanged): DTypeError naming the column otherwise (a complex or
    float value into a float32 or int field), ShapeError for another per-step shape.
    """
    if isinstance(value, (dict, tuple)):
        return _typed_tree(schema, name, value)
    if name not in schema:
        raise ImportSourceError(name, "a leaf of the space", "an unknown key")
    f = schema.field(name)
    assert isinstance(f, Dense)
    arr = np.asarray(value)
    if arr.dtype != f.dtype and not np.can_cast(arr.dtype, f.dtype, "safe"):
        raise DTypeError(name, f"values {f.dtype} holds unchanged", f"{arr.dtype} values",
                         "the source's values do not fit the space's dtype; nothing is cast")
    if arr.shape[1:] != f.shape:
        raise ShapeError(name, f"per-step shape {f.shape}", f"shape {arr.shape[1:]}")
    return np.ascontiguousarray(arr, dtype=f.dtype)


def _typed_tree(schema: Schema, prefix: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _typed_tree(schema, f"{prefix}{SEP}{k}", v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_typed_tree(schema, f"{prefix}{SEP}{i}", v) for i, v in enumerate(value))
    return typed(schema, prefix, value)


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to each leaf (see :func:`replaystore.schemas.map_tree`)."""
    return map_tree(fn, value)


def tree_nbytes(value: Any) -> int:
    """Bytes held by the leaves of a nested value."""
    return sum(a.nbytes for a in leaves_of(value))
