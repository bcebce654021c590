"""The loader's ``transform`` hook: checks before workers start, and errors that carry their traceback."""

from __future__ import annotations

import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from replaystore.errors import LoaderArgumentError, TransformError

RESERVED = ("collate_fn", "batch_sampler", "sampler", "batch_size", "shuffle", "drop_last")
"""DataLoader arguments ``make_loader`` sets itself."""


def start_method(context: Any) -> str:
    """The start method of a DataLoader's ``multiprocessing_context`` (None: the process default).

    Parameters
    ----------
    context : str, multiprocessing context or None
        As passed to the DataLoader.

    Returns
    -------
    str
        ``"fork"``, ``"spawn"`` or ``"forkserver"``. Cost: O(1).
    """
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True)
        return str(method or multiprocessing.get_context().get_start_method())
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


def check_loader_args(kwargs: Mapping[str, Any], transform: Any, num_workers: int) -> None:
    """Refuse DataLoader arguments the loader sets, and a transform workers could not receive.

    Parameters
    ----------
    kwargs : mapping
        The extra DataLoader arguments given to ``make_loader``.
    transform : Any
        The ``transform`` argument.
    num_workers : int
        Worker processes.

    Raises
    ------
    LoaderArgumentError
        ``collate_fn`` (use ``transform=``) or another reserved argument was given.
    TransformError
        ``transform`` is not callable, or cannot be pickled while workers start by
        ``spawn`` / ``forkserver`` (cost: one pickling of it).
    """
    if "collate_fn" in kwargs:
        raise LoaderArgumentError("make_loader: collate_fn is set by the loader (its batches are whole minibatches "
                                  "already); pass transform=fn to change a minibatch: fn(dict of numpy arrays) -> "
                                  "dict, run in the workers before tensors are made")
    given = [k for k in RESERVED if k in kwargs]
    if given:
        raise LoaderArgumentError(f"make_loader: {given} are set by the loader from its sampler; "
                                  "set them on the sampler (batch_size=, num_batches=) instead")
    if transform is None:
        return
    if not callable(transform):
        raise TransformError(f"make_loader: transform must be callable (batch) -> batch, got {transform!r}")
    if num_workers and start_method(kwargs.get("multiprocessing_context")) != "fork":
        try:
            pickle.dumps(transform)
        except Exception as exc:  # pickle raises several types (PicklingError, AttributeError, TypeError)
            raise TransformError(f"make_loader: transform {transform!r} cannot be pickled for "
                                 f"{start_method(kwargs.get('multiprocessing_context'))} workers ({exc}); "
                                 "define it at module level (not a lambda or a local function), or use "
                                 "multiprocessing_context='fork'") from exc


def apply_transform(transform: Callable[[dict[str, Any]], Any], batch: dict[str, Any]) -> dict[str, Any]:
    """``transform(batch)``, its exceptions wrapped with their traceback text.

    Parameters
    ----------
    transform : callable
        The loader's transform.
    batch : dict of str to Any
        A gathered minibatch of numpy arrays.

    Returns
    -------
    dict of str to Any
        What ``transform`` returned. Cost: the transform's.

    Raises
    ------
    TransformError
        ``transform`` raised (the message holds its traceback) or returned
        something other than a mapping.
    """
    try:
        out = transform(batch)
    except Exception as exc:
        raise TransformError(f"transform {getattr(transform, '__name__', transform)!r} raised "
                             f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}") from exc
    if not isinstance(out, Mapping):
        raise TransformError(f"transform {getattr(transform, '__name__', transform)!r} returned "
                             f"{type(out).__name__}, expected a mapping of names to arrays")
    return dict(out)
