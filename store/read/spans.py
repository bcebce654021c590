"""A table's visible fragments side by side, per array: rows of any fragment are rows of one ndarray.

Arrays that count the same rows share a layout (a :class:`Layout`): the record arrays
(dense fields and CSR offsets), and the values arrays of each CSR group. A layout gives
each fragment a base row, a multiple of a unit chosen so that ``base * row_bytes`` is
page-aligned for every array in it; each array's chunk file is mapped at its fragment's
base inside one reserved address range (store/read/vmap.py). A fragment's local row ``r``
is then row ``base + r`` of the array's view, whatever the fragment count.

Layouts follow the visible fragments: departed fragments are unmapped, new ones are
placed after the last and mapped on first use, and everything is laid out afresh when
the reserved space runs out. Parts of a range where nothing is mapped read as zeros, so
a wrong index (damaged offsets; a read racing the reader's ``sync``, which is not
supported) can return wrong rows but never kill the process.
"""

from __future__ import annotations

import collections
import errno
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from replaystore.errors import CorruptObjectError
from replaystore.schemas import Schema
from replaystore.schemas.layout import ArraySpec
from replaystore.store.format.fragment import Fragment, shape_of
from replaystore.store.format.zarrio import CRC_BYTES, check_chunk_size, chunk_path, missing_chunk, open_cached
from replaystore.store.read.vmap import PAGE, AddressRange
from replaystore.store.storage import Storage

UnitKey = tuple[int, str]
"""A mapped unit: ``(writer, name)`` of a fragment's own group, or of the segment holding it
(:attr:`Fragment.group`)."""


class Layout:
    """Arrays of one table that count the same rows, laid out over the visible fragments.

    The unit placed and mapped is a fragment's group or, for segment-backed
    fragments (docs/FORMAT.md, "Segments"), their segment, mapped whole: a
    segment's chunk files have their full size from the start, so records
    committed to it later need no new mapping. On object storage (``lazy``)
    units are mapped as reads need them (mapping is a download).

    Parameters
    ----------
    storage : Storage
        The store's storage (local files, or a chunk cache).
    schema : Schema
        The table's schema.
    specs : list of ArraySpec
        The arrays that count the same rows (record arrays, or one CSR group's
        values arrays).
    """

    def __init__(self, storage: Storage, schema: Schema, specs: list[ArraySpec]) -> None:
        self.storage = storage
        self.schema = schema
        self.specs = {s.name: s for s in specs}
        ragged = {f.name: f.offsets for f in schema.ragged_fields}
        self.values_of = next((ragged[s.name] for s in specs if s.role == "values"), None)
        self.unit = math.lcm(1, *(PAGE // math.gcd(PAGE, s.row_bytes) for s in specs))
        self._units: dict[UnitKey, Fragment] = {}  # a fragment of each placed unit
        self._base: dict[UnitKey, int] = {}
        self._count: collections.Counter[UnitKey] = collections.Counter()  # visible fragments per unit
        self._top = 0
        self._cap = 0
        self._ranges: dict[str, AddressRange] = {}
        self._views: dict[str, np.ndarray] = {}
        self._mapped: dict[str, set[UnitKey]] = {}
        # object storage: map units as reads need them (mapping is a download), not all at first use
        self.lazy = not storage.supports_local_paths

    def _rows(self, frag: Fragment, name: str) -> int:
        """Rows of array ``name`` in ``frag``'s unit."""
        seg = frag.segment
        if seg is None:
            return shape_of(frag, self.schema, self.specs[name])[0]
        if self.values_of is not None:
            return seg.value_capacity[self.values_of]
        return seg.capacity + (self.specs[name].role == "offsets")

    def _slot(self, frag: Fragment) -> int:
        rows = max([1, *(self._rows(frag, n) for n in self.specs)])
        return -(-rows // self.unit) * self.unit

    def place(self, frags: list[Fragment]) -> np.ndarray:
        """Lay out ``frags`` (the visible fragments, in the reader's order).

        Units already placed keep their base; departed ones are unmapped; when the
        reserved space runs out everything is laid out afresh in new ranges.
        Cost: the fragments.

        Parameters
        ----------
        frags : list of Fragment
            The visible fragments.

        Returns
        -------
        numpy.ndarray
            int64 base row of each fragment.
        """
        keys = [f.group for f in frags]
        units = dict(zip(keys, frags, strict=True))  # any fragment of a unit describes it
        new = [(k, f) for k, f in units.items() if k not in self._base]
        if self._top + sum(self._slot(f) for _, f in new) > self._cap:
            # start afresh in new ranges; the old ones stay whole until their last view is gone
            self._units, self._base, self._top = {}, {}, 0
            self._ranges, self._views, self._mapped = {}, {}, {}
            self._cap = max(2 * sum(self._slot(f) for f in units.values()), 16 * self.unit)
            new = list(units.items())
        for k in [k for k in self._base if k not in units]:
            self._drop(k)
        for k, f in new:
            self._units[k] = f
            self._base[k] = self._top
            self._top += self._slot(f)
        if new:
            self._views = {}  # views are (re)built with their pending mappings on first use
        self._count = collections.Counter(keys)
        return self._bases_of(frags, keys)

    def follow(self, removed: list[Fragment], added: list[Fragment]) -> np.ndarray | None:
        """Follow a change of the visible fragments: ``removed`` left and ``added`` came.

        The rest kept their places. Cost: the change.

        Parameters
        ----------
        removed : list of Fragment
            Fragments that left.
        added : list of Fragment
            Fragments that came.

        Returns
        -------
        numpy.ndarray or None
            The base rows of ``added``; None where the reserved space runs out (the
            layout is then in no defined state until :meth:`place`).
        """
        count = self._count
        for f in removed:
            count[f.group] -= 1
        new: dict[UnitKey, Fragment] = {}
        for f in added:
            if f.group not in self._base:
                new.setdefault(f.group, f)
            count[f.group] += 1
        if self._top + sum(self._slot(f) for f in new.values()) > self._cap:
            return None
        for k in {f.group for f in removed}:
            if count[k] <= 0:
                del count[k]
                self._drop(k)
        for k, f in new.items():
            self._units[k] = f
            self._base[k] = self._top
            self._top += self._slot(f)
        if new:
            self._views = {}
        return self._bases_of(added, [f.group for f in added])

    def _bases_of(self, frags: list[Fragment], keys: list[UnitKey]) -> np.ndarray:
        base = np.array([self._base[k] for k in keys], dtype=np.int64)
        if self.values_of is None:  # segment-backed fragments start at their row of the segment
            base += np.array([f.segment.row if f.segment is not None else 0 for f in frags], dtype=np.int64)
        return base

    def _drop(self, k: UnitKey) -> None:
        frag, base = self._units.pop(k), self._base.pop(k)
        for name, mapped in self._mapped.items():
            if k in mapped:
                rb = self.specs[name].row_bytes
                self._ranges[name].release(base * rb, self._rows(frag, name) * rb)
                mapped.discard(k)

    def array(self, name: str) -> np.ndarray:
        """The view of array ``name``.

        Every placed unit's rows are mapped at their base, except in a ``lazy``
        layout, where :meth:`map_units` maps them. Cost: the first call after a
        change maps the new units (one ``mmap`` each).

        Parameters
        ----------
        name : str
            An array of this layout.

        Returns
        -------
        numpy.ndarray
            Rows of every fragment (rows not mapped read as zeros).

        Raises
        ------
        StaleReadError
            A chunk is gone (reclaimed since the view was taken).
        CorruptObjectError
            A chunk is shorter than declared.
        """
        view = self._views.get(name)
        if view is not None:
            return view
        if not self.lazy:
            for k in self._units:
                self._map(name, k)
        spec = self.specs[name]
        view = self._views[name] = self._range(name).view(np.dtype(spec.dtype), spec.trailing_shape)
        return view

    def map_units(self, frags: list[Fragment]) -> None:
        """Map every array of the placed units of ``frags`` (those of a lazy layout a read needs).

        Parameters
        ----------
        frags : list of Fragment
            Placed fragments.

        Raises
        ------
        StaleReadError
            A chunk is gone (reclaimed since the view was taken).
        CorruptObjectError
            A chunk is shorter than declared, or a download fails its check.
        OSError
            The chunk cache cannot keep a chunk.
        """
        for frag in frags:
            for name in self.specs:
                self._map(name, frag.group)

    def _range(self, name: str) -> AddressRange:
        rng = self._ranges.get(name)
        if rng is None:
            rng = self._ranges[name] = AddressRange(self._cap * self.specs[name].row_bytes)
        return rng

    def _map(self, name: str, k: UnitKey) -> None:
        """Map unit ``k``'s chunk of array ``name`` at its base (if not already)."""
        mapped = self._mapped.setdefault(name, set())
        frag = self._units[k]
        spec = self.specs[name]
        rb = spec.row_bytes
        nbytes = self._rows(frag, name) * rb
        if k in mapped or not nbytes:
            return
        cpath = chunk_path(f"{frag.path}/{name}", 1 + len(spec.trailing_shape))
        offset = self._base[k] * rb
        try:
            check_chunk_size(self.storage, cpath, nbytes + (CRC_BYTES if frag.segment is None else 0))
            fd = self.storage.open_local(cpath)  # (a regular file, or refused: never a FIFO waited on)
            if fd is not None:
                try:
                    self._range(name).map_file(offset, fd, nbytes)
                finally:
                    os.close(fd)
            else:  # object storage: the chunk cache's file (layouts need local files or a cache)
                shape = (nbytes // rb, *spec.trailing_shape)
                got = open_cached(self.storage, cpath, np.dtype(spec.dtype), shape, checksum=frag.segment is None)
                if isinstance(got, bytes):
                    raise OSError(errno.ENOSPC, f"the chunk cache cannot keep {cpath}")
                with got:
                    self._range(name).map_file(offset, got.fileno(), nbytes)
        except FileNotFoundError:
            raise missing_chunk(cpath) from None
        except EOFError as exc:
            raise CorruptObjectError(cpath, str(exc)) from None
        mapped.add(k)


def map_touched(layouts: Mapping[str, Layout], unmapped: np.ndarray, frag_i: np.ndarray,
                frags: Sequence[Fragment]) -> None:
    """Map, in every layout, the fragments of ``frag_i`` no read has mapped since the last sync.

    On object storage each is a download into the chunk cache, on first use only.

    Parameters
    ----------
    layouts : mapping of str to Layout
        A table's (lazy) layouts.
    unmapped : numpy.ndarray
        Per visible fragment, whether it is still to map (updated).
    frag_i : numpy.ndarray
        The visible fragment index of each record a read gathers.
    frags : sequence of Fragment
        The view's visible fragments.
    """
    need = frag_i[unmapped.take(frag_i)]
    if not need.size:
        return
    touched = np.unique(need)
    mapped = [frags[i] for i in touched.tolist()]
    for lay in layouts.values():
        lay.map_units(mapped)
    unmapped[touched] = False
