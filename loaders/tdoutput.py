"""``make_loader(..., output="tensordict")``: minibatches as TensorDicts (``tensordict`` imported lazily)."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from replaystore.errors import LoaderOutputError, MissingDependencyError
from replaystore.schemas import Schema

OUTPUTS = ("dict", "tensordict")
"""The values ``make_loader``'s ``output`` accepts."""


def check_output(output: str) -> None:
    """Check ``output`` is known and, for ``"tensordict"``, that tensordict imports.

    Parameters
    ----------
    output : str
        ``"dict"`` or ``"tensordict"``.

    Raises
    ------
    LoaderOutputError
        Another value.
    MissingDependencyError
        ``"tensordict"`` without the ``tensordict`` package installed.
    """
    if output not in OUTPUTS:
        raise LoaderOutputError(f"make_loader: output must be one of {OUTPUTS}, got {output!r}")
    if output == "tensordict":
        try:
            importlib.import_module("tensordict")
        except ImportError as exc:
            raise MissingDependencyError("make_loader(output='tensordict') needs the tensordict package: "
                                         "pip install 'replaystore[torchrl]'") from exc


def _dicts(value: Any) -> Any:
    """Tuple nodes as dicts keyed ``"0"``, ``"1"``... (a TensorDict holds no tuples)."""
    if isinstance(value, tuple):
        return {str(i): _dicts(v) for i, v in enumerate(value)}
    if isinstance(value, dict):
        return {k: _dicts(v) for k, v in value.items()}
    return value


def to_tensordict(batch: dict[str, Any], schema: Schema) -> Any:
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

    Returns
    -------
    tensordict.TensorDict
        The same tensors (no copy), nested by key.

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
    return td
