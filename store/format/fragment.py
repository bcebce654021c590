"""Fragments: runs of one writer's records of one table.

Each in its own immutable Zarr group or (format 2, local storage) in rows of a
segment's arrays (docs/FORMAT.md, "Segments").
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.schemas import Columns, Schema
from replaystore.schemas.layout import ArraySpec
from replaystore.store.format import layout
from replaystore.store.format.codecs import encoding_of
from replaystore.store.format.streamkeys import STREAM_CODE, StreamKey
from replaystore.store.format.zarrio import CRC_BYTES, check_chunk_size, chunk_path, read_array
from replaystore.store.storage import Storage

STEP = np.dtype(np.int64)
RESET = np.dtype(np.bool_)
INDEX_DTYPES: dict[str, np.dtype] = {"_stream": STREAM_CODE, "_step": STEP, "_reset": RESET}
"""The dtypes of the index arrays every fragment and segment holds beside the schema's."""


@dataclass(frozen=True)
class SegmentRef:
    """Where a segment-backed fragment's records lie in its segment (docs/FORMAT.md, "Segments").

    Its records are rows ``[row, row + rows)`` of the segment's record arrays;
    CSR offsets are the segment's (absolute in its values arrays), its values
    start at ``values[offsets]``.

    Attributes
    ----------
    name : str
        The segment's name.
    row : int
        The fragment's first row in the segment.
    values : dict of str to int
        Per offsets array, where the fragment's values start.
    capacity : int
        The segment arrays' rows.
    value_capacity : dict of str to int
        The segment's values arrays' lengths, per offsets array.
    crc32c : dict of str to list of int
        Per array, the CRC32C of the bytes each part of the fragment wrote.
    """

    name: str
    row: int
    values: dict[str, int]
    capacity: int  # the segment arrays' rows
    value_capacity: dict[str, int]  # the segment's values arrays' lengths, per offsets array
    crc32c: dict[str, list[int]]

    def to_dict(self) -> dict[str, Any]:
        """The reference as it goes into a commit record.

        Returns
        -------
        dict of str to Any
            ``name``, ``row``, ``values``, ``capacity`` and ``crc32c``.
        """
        return {"name": self.name, "row": self.row, "values": self.values,
                "capacity": {"rows": self.capacity, "values": self.value_capacity}, "crc32c": self.crc32c}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SegmentRef:
        """The reference a commit record's ``segment`` describes (checked by store/format/bodies.py first).

        Parameters
        ----------
        d : dict of str to Any
            As :meth:`to_dict` writes it.

        Returns
        -------
        SegmentRef
            The reference.
        """
        cap = d["capacity"]
        return cls(d["name"], d["row"], dict(d["values"]), cap["rows"], dict(cap["values"]),
                   {k: list(v) for k, v in d["crc32c"].items()})


@dataclass(frozen=True)
class Fragment:
    """A committed fragment, as its commit record describes it.

    Attributes
    ----------
    writer : int
        The writer that committed it (whose rows and objects it holds).
    table : str
        Its table.
    name : str
        Its object name, ``f`` and a number (:func:`~replaystore.store.format.layout.fragment_name`).
    row_start : int
        The writer's local row of its first record.
    rows : int
        Its number of records.
    nnz : dict of str to int
        Per offsets array, its number of ragged values.
    streams : list of StreamKey
        The stream keys its ``_stream`` codes index.
    parts : list of tuple of int
        ``(seq, time_ns, rows)`` of the commits whose records it holds, in row
        order; compaction concatenates them, so eviction order survives it.
    segment : SegmentRef, optional
        Set when the records lie in a segment's arrays, not in arrays of their own.
    first_id : int
        The row id of the first record (``writer << 40 | row_start``).
    group : tuple of (int, str)
        ``(writer, name)`` of the Zarr group holding the records: the segment's,
        if segment-backed.
    """

    writer: int
    table: str
    name: str
    row_start: int
    rows: int
    nnz: dict[str, int]
    streams: list[StreamKey]
    parts: list[tuple[int, int, int]]
    segment: SegmentRef | None = None
    first_id: int = field(init=False, repr=False, compare=False)
    """The row id of the first record (``writer << 40 | row_start``)."""
    group: tuple[int, str] = field(init=False, repr=False, compare=False)
    """``(writer, name)`` of the Zarr group holding the records: the segment's, if segment-backed."""

    def __post_init__(self) -> None:
        """Compute ``first_id`` and ``group`` once (asked for every fragment on every reader sync)."""
        # asked for every fragment on every reader sync: computed once
        object.__setattr__(self, "first_id", layout.row_id(self.writer, self.row_start))
        object.__setattr__(self, "group", (self.writer, self.segment.name if self.segment else self.name))

    @functools.cached_property
    def part_table(self) -> np.ndarray:
        """``parts`` as an int64 array, a row per part: ``(time_ns, seq, rows, offset)``.

        ``offset`` is the local row of the part's first record. Computed once.
        """
        table = np.zeros((len(self.parts), 4), dtype=np.int64)
        if self.parts:
            table[:, [1, 0, 2]] = np.array(self.parts, dtype=np.int64)
            np.cumsum(table[:-1, 2], out=table[1:, 3])
        return table

    @property
    def path(self) -> str:
        """The directory of the Zarr group holding the records (the segment's, if segment-backed)."""
        return layout.fragment_dir(self.writer, self.table, self.group[1])

    def value_end(self, offsets: str) -> int:
        """The end of this fragment's values in its values arrays (CSR group ``offsets``).

        Parameters
        ----------
        offsets : str
            Names the CSR group by its offsets array.

        Returns
        -------
        int
            The position after its last value (in the segment's arrays, if segment-backed).
        """
        return self.nnz[offsets] + (self.segment.values[offsets] if self.segment else 0)

    def to_dict(self) -> dict[str, Any]:
        """The fragment as it goes into a commit record.

        Returns
        -------
        dict of str to Any
            ``name``, ``row_start``, ``rows``, ``nnz``, ``streams``, ``parts`` and,
            if segment-backed, ``segment``.
        """
        d = {"name": self.name, "row_start": self.row_start, "rows": self.rows, "nnz": self.nnz,
             "streams": self.streams, "parts": [list(p) for p in self.parts]}
        if self.segment is not None:
            d["segment"] = self.segment.to_dict()
        return d

    @classmethod
    def from_dict(cls, writer: int, table: str, d: dict[str, Any]) -> Fragment:
        """The fragment a commit record describes (checked by store/format/bodies.py first).

        ``d`` is as :meth:`to_dict` writes it.

        Returns
        -------
        Fragment
            The fragment.
        """
        seg = SegmentRef.from_dict(d["segment"]) if "segment" in d else None
        return cls(writer, table, d["name"], d["row_start"], d["rows"], dict(d["nnz"]), list(d["streams"]),
                   [tuple(p) for p in d["parts"]], seg)


def coalesce(run: list[Fragment], name: str) -> Fragment | None:
    """One fragment ``name`` describing the adjacent segment-backed fragments ``run`` of one segment.

    No data moves: a metadata-only merge. Cost: the run's parts and checksums.

    Parameters
    ----------
    run : list of Fragment
        Fragments in row order.
    name : str
        The new fragment's name.

    Returns
    -------
    Fragment or None
        The fragment, or None if they are not such a run.
    """
    first, last = run[0], run[-1]
    if any(f.segment is None or f.segment.name != first.segment.name for f in run):  # type: ignore[union-attr]
        return None
    if any(a.row_start + a.rows != b.row_start for a, b in itertools.pairwise(run)):
        return None
    seg = first.segment
    assert seg is not None
    crc = {k: [c for f in run for c in f.segment.crc32c[k]] for k in seg.crc32c}  # type: ignore[union-attr]
    ref = SegmentRef(seg.name, seg.row, dict(seg.values), seg.capacity, dict(seg.value_capacity), crc)
    nnz = {k: sum(f.nnz[k] for f in run) for k in first.nnz}
    # a segment's stream codes are the segment's: the last fragment's key list holds every earlier one
    return Fragment(first.writer, first.table, name, first.row_start, sum(f.rows for f in run), nnz,
                    list(last.streams), [p for f in run for p in f.parts], ref)


def shape_of(frag: Fragment, schema: Schema, spec: ArraySpec) -> tuple[int, ...]:
    """The stored shape of one of ``frag``'s arrays.

    Parameters
    ----------
    frag : Fragment
        The fragment.
    schema : Schema
        Its table's schema.
    spec : ArraySpec
        The array.

    Returns
    -------
    tuple of int
        ``(rows, *trailing)`` for dense arrays, ``(rows + 1,)`` for offsets, the
        value count for values.
    """
    if spec.role == "dense":
        return (frag.rows, *spec.trailing_shape)
    if spec.role == "offsets":
        return (frag.rows + 1,)
    return (frag.nnz[schema.field(spec.name).offsets],)  # type: ignore[union-attr]


class FragmentData:
    """Lazy, cached access to one fragment's arrays.

    Memory maps on local storage; on object storage through its chunk cache, if
    it has one, unless not ``cached``. Nothing is read until an array is asked for.

    Parameters
    ----------
    frag : Fragment
        The fragment.
    cached : bool, optional
        Read through the storage's chunk cache (when it has one).
    """

    def __init__(self, storage: Storage, schema: Schema, frag: Fragment, *, cached: bool = True) -> None:
        self.storage = storage
        self.cached = cached
        self.schema = schema
        self.frag = frag
        self._specs = {s.name: s for s in schema.zarr_layout()}
        self._values = {n: off for off, names in schema.offsets_groups.items() for n in names}
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        """The fragment's array ``name`` (a schema array or an index array), read on first use.

        Cost: the first call maps (local) or fetches (object storage) the chunk;
        later calls are a dict lookup.

        Parameters
        ----------
        name : str
            A name of the schema's Zarr layout, or ``_stream``, ``_step``, ``_reset``.

        Returns
        -------
        numpy.ndarray
            The fragment's rows of the array (read-only).

        Raises
        ------
        StaleReadError
            The chunk is gone: reclaimed after this view was taken.
        CorruptObjectError
            The chunk is shorter than the commit record declares, or (downloaded)
            fails its checksum.
        """
        arr = self._arrays.get(name)
        if arr is None:
            if name in layout.INDEX_ARRAYS:
                dtype = INDEX_DTYPES[name]
                shape: tuple[int, ...] = (self.frag.rows,)
            else:
                spec = self._specs[name]
                dtype, shape = spec.dtype, shape_of(self.frag, self.schema, spec)
            # A plain ndarray view of the np.memmap (it keeps the map alive through ``.base``):
            # np.memmap's Python-level __getitem__/__array_finalize__ cost several microseconds
            # per gather, which dominated the random-row read path (docs/PERFORMANCE.md).
            seg = self.frag.segment
            if seg is None:  # raw chunk or shard of compressed blocks (decoded as rows are read), size-checked
                arr = encoding_of(self.schema, name).read(self.storage, f"{self.frag.path}/{name}", dtype, shape,
                                                          cached=self.cached)
                self._arrays[name] = arr
                return arr
            # a segment's (raw: compressed tables use none), the exact size its descriptor implies
            check_chunk_size(self.storage, chunk_path(f"{self.frag.path}/{name}", len(shape)),
                             self.chunk_bytes(name, dtype, shape))
            if name in self._values:  # values: the segment's, up to this fragment's end
                shape = (self.frag.value_end(self._values[name]),)
                arr = np.asarray(read_array(self.storage, f"{self.frag.path}/{name}", dtype, shape, checksum=False))
            else:  # rows [row, row + rows) of the segment's array (offsets: one more)
                arr = np.asarray(read_array(self.storage, f"{self.frag.path}/{name}", dtype, shape, seg.row,
                                            checksum=False))
            self._arrays[name] = arr
        return arr

    def chunk_bytes(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> int:
        """The size of array ``name``'s chunk object, as the fragment's descriptor implies.

        A fragment's own chunk holds its ``shape`` and a CRC32C; a segment's holds the
        segment's capacity of rows (one more for offsets) or of values, without one.

        Parameters
        ----------
        name : str
            The array.
        dtype : numpy.dtype
            Its dtype.
        shape : tuple of int
            The fragment's shape of it (``shape_of``; index arrays ``(rows,)``).

        Returns
        -------
        int
            Bytes.
        """
        seg = self.frag.segment
        item = int(np.prod(shape[1:])) * dtype.itemsize
        if seg is None:
            return shape[0] * item + CRC_BYTES
        if name in self._values:
            return seg.value_capacity[self._values[name]] * item
        spec = self._specs.get(name)
        return (seg.capacity + (spec is not None and spec.role == "offsets")) * item

    def columns(self, start: int = 0, stop: int | None = None) -> Columns:
        """Records ``[start, stop)`` as Columns (ragged values sliced, offsets rebased).

        Parameters
        ----------
        start : int, optional
            First local row.
        stop : int, optional
            End local row (default: the fragment's rows).

        Returns
        -------
        Columns
            Views of the arrays (offsets copied, rebased to 0).

        Raises
        ------
        StaleReadError
            A chunk is gone (see :meth:`array`).
        CorruptObjectError
            A chunk is damaged (see :meth:`array`).
        """
        stop = self.frag.rows if stop is None else stop
        arrays: dict[str, np.ndarray] = {}
        for f in self.schema.dense_fields:
            arrays[f.name] = self.array(f.name)[start:stop]
        for off_name, names in self.schema.offsets_groups.items():
            offsets = self.array(off_name)[start:stop + 1]
            lo, hi = int(offsets[0]), int(offsets[-1])
            arrays[off_name] = offsets - lo
            for n in names:
                arrays[n] = self.array(n)[lo:hi]
        return Columns(self.schema, stop - start, arrays)
