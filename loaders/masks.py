"""Dense legality masks built from a minibatch's CSR slices, only for that minibatch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def legal_mask(batch: Mapping[str, Any], actions: int, ids: str = "legal_ids", offsets: str = "legal_offsets",
               ) -> torch.Tensor:
    """A bool ``(records, actions)`` mask: ``mask[i, ids[offsets[i]:offsets[i+1]]] = True``.

    ``records`` is the minibatch size (``batch * window`` for sequence batches:
    reshape as needed). Rows with an empty slice (terminal or value-only records)
    are all False: mask logits with ``torch.finfo(dtype).min`` and never take a
    max over such a row. Built on the ids' device, for this minibatch only.

    Parameters
    ----------
    batch : mapping
        A minibatch holding the CSR ids and offsets as tensors.
    actions : int
        Width of the mask (number of actions).
    ids : str, optional
        Key of the legal action ids.
    offsets : str, optional
        Key of their CSR offsets.

    Returns
    -------
    torch.Tensor
        The bool mask.

    Examples
    --------
    >>> import torch
    >>> batch = {"legal_ids": torch.tensor([0, 2, 1]), "legal_offsets": torch.tensor([0, 2, 3])}
    >>> legal_mask(batch, 3).tolist()
    [[True, False, True], [False, True, False]]
    """
    off = batch[offsets]
    values = batch[ids]
    records = len(off) - 1
    mask = torch.zeros((records, actions), dtype=torch.bool, device=values.device)
    rows = torch.repeat_interleave(torch.arange(records, device=values.device), off[1:] - off[:-1])
    mask[rows, values] = True
    return mask
