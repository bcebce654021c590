"""Which arrays a gather of some columns reads: :class:`ReadPlans`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from replaystore.errors import UnknownColumnError
from replaystore.schemas import Schema


class ReadPlans:
    """The read plans of one table's column subsets, made once per distinct subset.

    A plan is ``(dense, ragged)``: ``[(name, trailing shape, dtype)]`` per dense field and
    ``[(offsets, [(name, dtype)])]`` per CSR group.

    Parameters
    ----------
    name : str
        The table's name (named by errors).
    schema : Schema
        The table's schema.

    Attributes
    ----------
    dense, ragged : list
        The plan of every field.
    """

    def __init__(self, name: str, schema: Schema) -> None:
        self.name = name
        self.dense = [(f.name, tuple(f.shape), np.dtype(f.dtype)) for f in schema.dense_fields]
        ragged_dtypes = {f.name: np.dtype(f.dtype) for f in schema.ragged_fields}
        self.ragged = [(off, [(n, ragged_dtypes[n]) for n in names]) for off, names in schema.offsets_groups.items()]
        self._plans: dict[tuple[str, ...], tuple[list[Any], list[Any]]] = {}

    def of(self, columns: Sequence[str] | None) -> tuple[list[Any], list[Any]]:
        """The read plan of ``columns``.

        Parameters
        ----------
        columns : sequence of str or None
            Field names (None: every dense and ragged field).

        Returns
        -------
        tuple of list
            ``[(name, trailing shape, dtype)]`` of the dense fields and ``[(offsets, [(name,
            dtype)])]`` of the CSR groups with a named value field. Cost: O(fields), once per
            distinct ``columns`` (then cached).

        Raises
        ------
        UnknownColumnError
            The first name that is not a dense or ragged field.
        """
        if columns is None:
            return self.dense, self.ragged
        if isinstance(columns, str):
            columns = [columns]
        key = tuple(columns)
        plan = self._plans.get(key)
        if plan is None:
            names = set(key)
            known = {n for n, _, _ in self.dense} | {n for _, values in self.ragged for n, _ in values}
            unknown = [n for n in key if n not in known]
            if unknown:
                raise UnknownColumnError(self.name, unknown, sorted(known))
            dense = [d for d in self.dense if d[0] in names]
            ragged = [(off, [(n, dt) for n, dt in values if n in names]) for off, values in self.ragged]
            plan = self._plans[key] = (dense, [(off, values) for off, values in ragged if values])
        return plan
