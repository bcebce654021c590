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

from replaystore.errors import StoreError
from replaystore.schemas import Dense, Schema, map_tree
from replaystore.schemas.nesting import SEP

NESTED_TYPES = ("Dict", "Tuple")


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


def encode_arrow(value: Any, fixed: Callable[[np.ndarray], pa.Array]) -> pa.Array:
    """Observations as Minari's Arrow column: structs for Dict/Tuple, ``fixed(leaf)`` per leaf."""
    if isinstance(value, dict):
        return pa.StructArray.from_arrays([encode_arrow(v, fixed) for v in value.values()], names=list(value))
    if isinstance(value, tuple):
        return pa.StructArray.from_arrays([encode_arrow(v, fixed) for v in value],
                                          names=[str(i) for i in range(len(value))])
    return fixed(value)


def decode_arrow(space: dict[str, Any], col: pa.Array, decode: Callable[[dict[str, Any], pa.Array], np.ndarray]
                 ) -> Any:
    """Minari's Arrow observation column as arrays (dicts/tuples for Dict/Tuple spaces)."""
    if space["type"] == "Dict":
        return {k: decode_arrow(sub, col.field(k), decode) for k, sub in space["subspaces"].items()}
    if space["type"] == "Tuple":
        return tuple(decode_arrow(sub, col.field(str(i)), decode) for i, sub in enumerate(space["subspaces"]))
    return decode(space, col)


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
    """StoreError unless ``space`` is Box/Discrete, or Dict/Tuple of them (any depth)."""
    kind = space.get("type") if isinstance(space, dict) else type(space).__name__
    if kind in ("Box", "Discrete"):
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
    raise StoreError(f"Minari {what} of type {kind!r}: only Box and Discrete spaces (and Dict/Tuple "
                     f"observations of them) can be imported")


def structure(space: dict[str, Any]) -> Any:
    """The nested field structure of a Dict/Tuple space document (Discrete leaves: int64 scalars)."""
    if space["type"] == "Dict":
        return {k: structure(sub) for k, sub in space["subspaces"].items()}
    if space["type"] == "Tuple":
        return tuple(structure(sub) for sub in space["subspaces"])
    if space["type"] == "Discrete":
        return Dense("leaf", np.dtype(np.int64))
    return Dense("leaf", np.dtype(space["dtype"]), tuple(space["shape"]))


def typed(schema: Schema, name: str, value: Any) -> Any:
    """``value`` (an array, or a nested value for a nested field) in field ``name``'s dtypes."""
    if isinstance(value, (dict, tuple)):
        return _typed_tree(schema, name, value)
    f = schema.field(name)
    assert isinstance(f, Dense)
    return np.ascontiguousarray(value, dtype=f.dtype)


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
