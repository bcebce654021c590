"""``make_loader(..., output="tensordict")`` or ``"torchrl"``: minibatches as TensorDicts (imported lazily)."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from replaystore.errors import LoaderOutputError, MissingDependencyError
from replaystore.schemas import Schema

OUTPUTS = ("dict", "tensordict", "torchrl", "lerobot")
"""The values ``make_loader``'s ``output`` accepts."""

TORCHRL_KEYS: dict[str, tuple[str, ...]] = {
    "obs": ("observation",),
    "action": ("action",),
    "reward": ("next", "reward"),
    "next_obs": ("next", "observation"),
    "terminated": ("next", "terminated"),
    "truncated": ("next", "truncated"),
}
"""Where ``output="torchrl"`` puts the built-in transition fields: field name to TorchRL key."""

_TORCHRL_NEEDS = ("obs", "next_obs", "reward", "terminated")
_FLAGS = ("reward", "terminated", "truncated")  # scalar per record: TorchRL's trailing dim of 1


def check_output(output: str, schema: Schema | None = None) -> None:
    """Check ``output`` is known and, for ``"tensordict"``/``"torchrl"``, that tensordict imports.

    Parameters
    ----------
    output : str
        ``"dict"``, ``"tensordict"`` or ``"torchrl"``.
    schema : Schema, optional
        The sampled table's schema: for ``"torchrl"``, checked by :func:`check_torchrl_schema`.

    Raises
    ------
    LoaderOutputError
        Another value; ``"torchrl"`` for a schema without the transition fields.
    MissingDependencyError
        ``"tensordict"`` or ``"torchrl"`` without the ``tensordict`` package installed.
    """
    if output not in OUTPUTS:
        raise LoaderOutputError(f"make_loader: output must be one of {OUTPUTS}, got {output!r}")
    if output not in ("dict", "lerobot"):
        try:
            importlib.import_module("tensordict")
        except ImportError as exc:
            raise MissingDependencyError(f"make_loader(output={output!r}) needs the tensordict package: "
                                         "pip install 'replaystore[torchrl]'") from exc
    if output == "torchrl" and schema is not None:
        check_torchrl_schema(schema)


def check_torchrl_schema(schema: Schema) -> None:
    """Check ``schema`` has the transition fields ``output="torchrl"`` maps to TorchRL's keys.

    Parameters
    ----------
    schema : Schema
        The sampled table's schema.

    Raises
    ------
    LoaderOutputError
        ``obs``, ``next_obs``, ``reward`` or ``terminated`` is missing (the message names them).
    """
    tops = {n.split("__")[0] for n in schema.names}
    missing = [n for n in _TORCHRL_NEEDS if n not in tops]
    if missing:
        raise LoaderOutputError(f"make_loader(output='torchrl'): table {schema.name!r} lacks the transition "
                                f"fields {missing} that TorchRL's keys are made from (it has {sorted(tops)}); "
                                "use output='tensordict' for the table's own field names")


def to_torchrl(batch: dict[str, Any], schema: Schema) -> Any:
    """A minibatch of transitions as a TensorDict in TorchRL's key layout.

    :func:`to_tensordict`, with the transition fields moved to TorchRL's keys
    (:data:`TORCHRL_KEYS`): ``obs`` -> ``"observation"``, ``action`` -> ``"action"``,
    ``next_obs`` -> ``("next", "observation")``, ``reward``/``terminated``/``truncated`` ->
    ``("next", ...)`` with a trailing dimension of 1 (``(B, 1)``, or ``(B, T, 1)`` for
    sequence windows), and ``("next", "done")`` = terminated | truncated added. A nested
    ``obs`` keeps its sub-keys under ``"observation"``. Other fields, ``indices`` and the
    sampler's outputs (``weights`` ...) keep their names. TorchRL losses (``DQNLoss``,
    ``SACLoss`` ...) take such a batch as it is.

    Parameters
    ----------
    batch : dict of str to Any
        As the loader yields it.
    schema : Schema
        The table's schema; it has ``obs``, ``next_obs``, ``reward`` and ``terminated``.

    Returns
    -------
    tensordict.TensorDict
        Batch size ``[B]``; the same tensors (the flags viewed with a trailing dim of 1).

    Raises
    ------
    LoaderOutputError
        The schema lacks one of those fields.

    Notes
    -----
    Cost: :func:`to_tensordict`, plus a few µs per key.
    """
    return to_tensordict(batch, schema, torchrl=True)


def _torchrl_layout(td: Any, schema: Schema) -> Any:
    """``td`` (of :func:`to_tensordict`) with the transition fields moved to TorchRL's keys, in place."""
    check_torchrl_schema(schema)
    scalar = {f.name for f in schema.dense_fields if f.shape == ()}
    for name, key in TORCHRL_KEYS.items():
        if name not in td.keys():
            continue
        value = td.pop(name)
        if name in _FLAGS and name in scalar:
            value = value.unsqueeze(-1)
        td.set(key, value)
    if ("next", "done") not in td.keys(include_nested=True):
        done = td.get(("next", "terminated"))
        if ("next", "truncated") in td.keys(include_nested=True):
            done = done | td.get(("next", "truncated"))
        td.set(("next", "done"), done)
    return td


def _dicts(value: Any) -> Any:
    """Tuple nodes as dicts keyed ``"0"``, ``"1"``... (a TensorDict holds no tuples)."""
    if isinstance(value, tuple):
        return {str(i): _dicts(v) for i, v in enumerate(value)}
    if isinstance(value, dict):
        return {k: _dicts(v) for k, v in value.items()}
    return value


def to_tensordict(batch: dict[str, Any], schema: Schema, *, torchrl: bool = False) -> Any:
    """A minibatch mapping of tensors as a TensorDict of batch size ``[B]`` (``B = len(batch["indices"])``).

    Nested fields become nested TensorDicts (Tuple nodes keyed ``"0"``, ``"1"``, ...). A
    ragged field becomes a jagged nested tensor ``(B, j)`` (its offsets array is dropped);
    where its rows are not the B records (sequence windows: ``B * window`` slots), it is
    kept as a non-tensor ``(values, offsets)`` pair under its name. Other non-tensor
    values (``stream_keys``) are non-tensor entries.

    Parameters
    ----------
    batch : dict of str to Any
        As the loader yields it (tensors, nested dicts/tuples of tensors).
    schema : Schema
        The table's schema.
    torchrl : bool, optional
        In TorchRL's key layout (:func:`to_torchrl`; ``make_loader(..., output="torchrl")``).

    Returns
    -------
    tensordict.TensorDict
        The same tensors (no copy), nested by key.

    Raises
    ------
    LoaderOutputError
        ``torchrl=True`` for a schema without the transition fields.

    Notes
    -----
    Cost: a few µs per key; no data copied.
    """
    from tensordict import TensorDict  # type: ignore[import-untyped]

    nesting = schema.nesting
    flat = nesting.unnest(batch) if nesting is not None else dict(batch)
    b = int(flat["indices"].shape[0])
    pairs: dict[str, Any] = {}
    for off, names in schema.offsets_groups.items():
        offsets = flat.pop(off, None)
        if offsets is None:
            continue
        for n in names:
            if n not in flat:
                continue
            if offsets.shape[0] - 1 == b:
                flat[n] = torch.nested.nested_tensor_from_jagged(flat[n], offsets)
            else:
                pairs[n] = (flat.pop(n), offsets)
    tree = _dicts(nesting.nest(flat) if nesting is not None else flat)
    other = {k: tree.pop(k) for k in list(tree) if not isinstance(tree[k], (torch.Tensor, dict))}
    td = TensorDict(tree, batch_size=[b])
    for k, v in {**other, **pairs}.items():
        td.set_non_tensor(k, v)
    return _torchrl_layout(td, schema) if torchrl else td
