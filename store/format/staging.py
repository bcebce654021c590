"""Fragments being written.

Records are added in order, ``finish`` makes the fragment complete and durable (docs/FORMAT.md,
"Fragments" and "Durable whole-object writes").

A writer adds each appended batch to its table's staged fragment at ``append``, buffered
(copies: the caller may reuse its buffers; the files are written at the commit). A merge stages
unbuffered: each input's arrays go from their memory maps straight to the files. Nothing
references a staged fragment's objects until a commit record does: a crash leaves unreferenced
objects, which vacuum removes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replaystore.errors import StoreError
from replaystore.schemas import Columns, Schema
from replaystore.schemas.fields import OFFSETS_DTYPE
from replaystore.store.format import layout
from replaystore.store.format.codecs import encoding_of
from replaystore.store.format.fragment import INDEX_DTYPES, RESET, STEP, STREAM_CODE, Fragment, shape_of
from replaystore.store.format.streamkeys import StreamKey, StreamKeys
from replaystore.store.format.zarrio import group_object
from replaystore.store.storage import Buffer, Storage

Mark = tuple[int, dict[str, int], int, dict[str, tuple[int, int]]]


class StagedFragment:
    """One fragment of writer ``writer``'s table, open for adding records in order.

    ``name`` and ``row_start`` are the :class:`Fragment`'s that :meth:`finish` describes.

    Parameters
    ----------
    buffered : bool, optional
        Keep copies of the records until :meth:`finish` (see the module docstring).
    may_delete : callable, optional
        Asked before :meth:`abort` deletes what was written (False: the path may be another
        store's now, after a replace; nothing is deleted).
    """

    def __init__(self, storage: Storage, schema: Schema, writer: int, table: str, name: str, row_start: int,
                 buffered: bool = False, may_delete: Callable[[], bool] | None = None) -> None:
        self.storage = storage
        self._may_delete = may_delete
        self.schema = schema
        self.buffered = buffered
        self.writer, self.table, self.name, self.row_start = writer, table, name, row_start
        self.path = layout.fragment_dir(writer, table, name)
        self.rows = 0
        self.nnz = dict.fromkeys(schema.offsets_groups, 0)
        self.streams = StreamKeys()
        self._specs = schema.zarr_layout()
        ndims = {s.name: 1 + len(s.trailing_shape) for s in self._specs} | dict.fromkeys(INDEX_DTYPES, 1)
        self._encodings = {n: encoding_of(schema, n) for n in ndims}
        self._chunks: dict[str, Any] = {  # ChunkWriter, or ShardWriter for compressed fields
            n: self._encodings[n].writer(storage, f"{self.path}/{n}", d, buffered) for n, d in ndims.items()}
        self.broken = False  # a failed add could not be undone: only abort() is left

    def add(self, cols: Columns, codes: np.ndarray, streams: Sequence[StreamKey], steps: np.ndarray,
            resets: np.ndarray) -> None:
        """Append ``cols``' records; record i belongs to stream ``streams[codes[i]]``.

        All or nothing: a failure undoes the partial add (or, if even that fails,
        marks the fragment broken). Cost: a copy of the records (buffered) or their
        writes.

        Parameters
        ----------
        cols : Columns
            The records.
        codes : numpy.ndarray
            Per record, its index into ``streams``.
        streams : sequence of StreamKey
            The batch's stream keys.
        steps : numpy.ndarray
            Per record, its step.
        resets : numpy.ndarray
            Per record, its reset flag.

        Raises
        ------
        StoreError
            An earlier failed add could not be undone (only :meth:`abort` is left).
        OSError
            A write failed; the add is undone.
        """
        self._check()
        mark = self.mark()
        try:
            remap = self.streams.codes(streams)
            for spec in self._specs:
                chunk = self._chunks[spec.name]
                if spec.role == "offsets":
                    off = cols.arrays[spec.name]
                    if not chunk.size:
                        chunk.append(np.zeros(1, dtype=OFFSETS_DTYPE))
                    chunk.append((off[1:] - (int(off[0]) - self.nnz[spec.name])).astype(OFFSETS_DTYPE, copy=False))
                    self.nnz[spec.name] += int(off[-1]) - int(off[0])
                else:
                    chunk.append(cols.arrays[spec.name])
            self._chunks["_stream"].append(remap[codes] if len(remap) else codes.astype(STREAM_CODE))
            self._chunks["_step"].append(steps.astype(STEP, copy=False))
            self._chunks["_reset"].append(resets.astype(RESET, copy=False))
            self.rows += cols.num_records
        except BaseException:
            self.rollback(mark)
            raise

    def mark(self) -> Mark:
        """The state to :meth:`rollback` to.

        Returns
        -------
        Mark
            Rows, values, stream-key count and each chunk's mark.
        """
        return self.rows, dict(self.nnz), len(self.streams), {n: c.mark() for n, c in self._chunks.items()}

    def rollback(self, mark: Mark) -> None:
        """Forget every record added after ``mark``.

        Parameters
        ----------
        mark : Mark
            A :meth:`mark`.

        Raises
        ------
        OSError
            Truncating a chunk failed; the fragment is then marked broken.
        """
        rows, nnz, streams, chunks = mark
        try:
            for name, chunk in self._chunks.items():
                chunk.rollback(chunks[name])
        except BaseException:
            self.broken = True
            raise
        self.rows, self.nnz = rows, nnz
        self.streams.truncate(streams)

    def finish(self, parts: list[tuple[int, int, int]]) -> Fragment:
        """Write the checksums and metadata and make every object durable.

        May be called again after a failure, with new parts. Cost: writing the
        buffered records (if any) and syncing every object.

        Parameters
        ----------
        parts : list of tuple of int
            ``(seq, time_ns, rows)`` of the commits it holds (its descriptor's).

        Returns
        -------
        Fragment
            The fragment.

        Raises
        ------
        StoreError
            An earlier failed add could not be undone.
        OSError
            A write or sync failed.
        """
        self._check()
        frag = Fragment(self.writer, self.table, self.name, self.row_start, self.rows, dict(self.nnz),
                        list(self.streams.keys), parts)
        objects: dict[str, list[Buffer]] = {}
        arrays = [(s.name, np.dtype(s.dtype), shape_of(frag, self.schema, s)) for s in self._specs]
        for name, dtype, shape in [*arrays, *((n, d, (self.rows,)) for n, d in INDEX_DTYPES.items())]:
            objects.update(self._encodings[name].metadata(f"{self.path}/{name}", dtype, shape))
        objects.update(group_object(self.path, {"replaystore": frag.to_dict()}))
        streams = [s for s in (c.finish() for c in self._chunks.values()) if s is not None]
        self.storage.write_objects(objects, streams)
        return frag

    def close(self) -> None:
        """Release the open objects (after :meth:`finish`)."""
        for chunk in self._chunks.values():
            chunk.close()

    def abort(self) -> None:
        """Release and delete everything written: nothing references it."""
        self.close()
        # (a buffered one wrote nothing before finish(); after a replace the path may be another store's)
        if not self.buffered and (self._may_delete is None or self._may_delete()):
            self.storage.delete(self.path)

    def _check(self) -> None:
        if self.broken:
            raise StoreError(f"{self.path}: a failed append could not be undone; discard() the pending appends")

