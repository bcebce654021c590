"""Open segments (format 2, local storage): a writer's arrays created once, filled in place.

A segment is a Zarr group like a fragment's, but its arrays are created at a fixed
capacity when the segment opens (chunk files of full size that read as zeros) and its
writer adds records at their place as they are appended. Each commit makes the bytes
added since the last one durable (``fdatasync``) and describes them as a segment-backed
fragment (docs/FORMAT.md, "Segments"); committed bytes are never written again. A commit
therefore costs one ``fdatasync`` per array instead of a new directory tree per fragment,
and a segment never needs compaction. Appends start the write-back of what they wrote
(Linux ``sync_file_range``) so that a commit mostly waits for its last append's bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import stat
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence

import google_crc32c
import numpy as np

from replaystore.errors import CorruptObjectError, StoreError
from replaystore.schemas import Columns, Schema
from replaystore.schemas.fields import OFFSETS_DTYPE
from replaystore.store.format import layout
from replaystore.store.format.fragment import INDEX_DTYPES, RESET, STEP, STREAM_CODE, Fragment, SegmentRef
from replaystore.store.format.streamkeys import StreamKey, StreamKeys
from replaystore.store.format.zarrio import array_object, chunk_path, group_object, raw_bytes
from replaystore.store.storage import Storage

MAX_STREAMS = 4096
"""Stream keys one segment may hold: every commit record repeats the segment's key list."""
WRITEBACK_BYTES = 1 << 18
"""Written bytes of an array after which an append starts their write-back."""
VALUES_PER_ROW = 8
"""The least values capacity of a new segment per row, per CSR group (grown from what is appended)."""
SEGMENT_FLOOR_BYTES = 64 << 20
"""In a store with a capacity, a new segment holds at least this many bytes of fixed-size columns
(if the capacity holds that many): a segment costs the same to create and to reclaim whatever
its size, and a small replay would otherwise spend more time on that than on its appends."""
Mark = tuple[int, dict[str, int], int, dict[str, int]]

_sync_file_range: Callable[[int, int, int, int], int] | None = None
if sys.platform == "linux":
    _libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(_libc, "sync_file_range"):
        _sync_file_range = _libc.sync_file_range
        _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_SYNC_FILE_RANGE_WRITE = 2
_LITTLE = sys.byteorder == "little"


class _Writeback:
    """Starts write-back (Linux ``sync_file_range``) on a daemon thread of this process.

    So an append never waits for the device's queue; durability still comes only from
    the commit's ``fdatasync``. A request for a descriptor closed meanwhile fails or
    starts the write-back of another file's pages: either is harmless.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._requests: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def start(self, fd: int, offset: int, nbytes: int) -> None:
        """Ask for ``[offset, offset + nbytes)`` of ``fd`` to be written back soon, without waiting."""
        if _sync_file_range is None:
            return
        if self._pid != os.getpid():  # first use in this process (a forked child has no thread)
            with self._lock:
                if self._pid != os.getpid():
                    self._requests = queue.SimpleQueue()
                    threading.Thread(target=self._run, args=(self._requests,), name="replaystore-writeback",
                                     daemon=True).start()
                    self._pid = os.getpid()
        self._requests.put((fd, offset, nbytes))

    @staticmethod
    def _run(requests: queue.SimpleQueue[tuple[int, int, int]]) -> None:
        assert _sync_file_range is not None
        while True:
            fd, offset, nbytes = requests.get()
            _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


WRITEBACK = _Writeback()


class _Array:
    """One array of an open segment: its file, where the next bytes go, and the pending CRC."""

    def __init__(self, fd: int, first: int) -> None:
        self.fd = fd
        self.end = first  # where the next bytes go
        self.committed = self.end
        self.crc = 0  # of the bytes written since the last commit
        self.written_back = self.end  # write-back started up to here

    def write(self, piece: np.ndarray) -> None:
        # a C-contiguous little-endian array is its own raw bytes (buffer protocol): no view made
        raw = piece if piece.flags.c_contiguous and piece.dtype.byteorder in "<|=" and _LITTLE else raw_bytes(piece)
        pos, nbytes = self.end, raw.nbytes
        # numpy declares ndarray's buffer protocol (__buffer__) only for Python >= 3.12
        n = os.pwrite(self.fd, raw, pos)  # type: ignore[arg-type]
        if n < nbytes:  # a short write (rare): the rest through a byte view
            # numpy declares ndarray's buffer protocol (__buffer__) only for Python >= 3.12
            view = memoryview(raw_bytes(piece))[n:]  # type: ignore[arg-type]
            while view:
                k = os.pwrite(self.fd, view, pos + n)
                view, n = view[k:], n + k
        self.crc = google_crc32c.extend(self.crc, raw)
        pos += nbytes
        self.end = pos
        if pos - self.written_back >= WRITEBACK_BYTES:  # (a call per small write costs more than it saves)
            WRITEBACK.start(self.fd, self.written_back, pos - self.written_back)
            self.written_back = pos


COPY_BYTES = 8 << 20
"""The buffer of a copy where the system has no ``copy_file_range``."""


def copy_prefix(local: str, path: str, dst: int, nbytes: int) -> None:
    """Copy the first ``nbytes`` of the file ``local`` to the start of descriptor ``dst``.

    The source is opened without following a final link and without blocking, and must be a
    regular file of at least ``nbytes``.

    Parameters
    ----------
    local : str
        The source file (filesystem path).
    path : str
        Its store path (named in errors).
    dst : int
        The destination, open for writing.
    nbytes : int
        Bytes to copy.

    Raises
    ------
    FileNotFoundError
        The source is gone.
    CorruptObjectError
        The source is not a regular file, or shorter than ``nbytes``.
    OSError
        Reading or writing failed.
    """
    fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptObjectError(path, "not a regular file")
        if st.st_size < nbytes:
            raise CorruptObjectError(path, f"{st.st_size} bytes, expected at least {nbytes} (its segment's "
                                     "committed records)")
        done = 0
        fast = hasattr(os, "copy_file_range")
        while done < nbytes:
            n = 0
            if fast:
                try:
                    n = os.copy_file_range(fd, dst, nbytes - done, done, done)
                except OSError as exc:  # not between these filesystems, or not on this kernel: copy by hand
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                        raise
                    fast = False
            if not fast:
                piece = os.pread(fd, min(COPY_BYTES, nbytes - done), done)
                n = os.pwrite(dst, piece, done) if piece else 0
            if n <= 0:
                raise CorruptObjectError(path, f"ended at byte {done}, expected at least {nbytes}")
            done += n
    finally:
        os.close(fd)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def segment_shapes(schema: Schema, capacity: int,
                   value_capacity: Mapping[str, int]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The dtype and shape of each array of a segment of this capacity (docs/FORMAT.md, "Segments").

    Parameters
    ----------
    capacity : int
        The segment's rows.
    value_capacity : mapping of str to int
        Its values per CSR group (offsets array name).

    Returns
    -------
    dict of str to tuple of (numpy.dtype, tuple of int)
        Per array (the schema's, then the index arrays), its dtype and shape.
    """
    shapes: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for spec in schema.zarr_layout():
        dtype = np.dtype(spec.dtype)
        if spec.role == "dense":
            shapes[spec.name] = dtype, (capacity, *spec.trailing_shape)
        elif spec.role == "offsets":
            shapes[spec.name] = dtype, (capacity + 1,)
        else:
            shapes[spec.name] = dtype, (value_capacity[schema.field(spec.name).offsets],)  # type: ignore[union-attr]
    for name_, dtype in INDEX_DTYPES.items():
        shapes[name_] = dtype, (capacity,)
    return shapes


def segment_bytes(schema: Schema, capacity: int, value_capacity: Mapping[str, int]) -> int:
    """The bytes of a segment's chunk files (their sizes) at this capacity (as :func:`segment_shapes`).

    Returns
    -------
    int
        Bytes.
    """
    return sum(int(np.prod(shape)) * dtype.itemsize
               for dtype, shape in segment_shapes(schema, capacity, value_capacity).values())


def fixed_row_bytes(schema: Schema) -> int:
    """Bytes one record takes in a segment's dense, offsets and index arrays (CSR values not counted).

    Returns
    -------
    int
        Bytes per record.
    """
    index = sum(np.dtype(d).itemsize for d in INDEX_DTYPES.values())
    return index + sum(spec.row_bytes for spec in schema.zarr_layout() if spec.role != "values")


class Segment:
    """Writer ``writer``'s open segment ``name`` of one table.

    ``row_start``, the writer's local row of segment row 0, is set when the
    segment starts taking records (it may be created ahead). Construction
    creates the group and every array at full size (files that read as zeros)
    and keeps a descriptor open per array; a failure deletes what it created.

    Parameters
    ----------
    storage : Storage
        The store's local storage.
    name : str
        The segment's name.
    capacity : int
        Rows it holds.
    value_capacity : dict of str to int
        Values it holds per CSR group (offsets array name).
    may_delete : callable, optional
        Asked before a failure deletes what it created (False: the path may be another
        store's now, after a replace; nothing is deleted).

    Raises
    ------
    OSError
        Creating the files failed (a full disk, for instance); nothing is left.
    """

    def __init__(self, storage: Storage, schema: Schema, writer: int, table: str, name: str,
                 capacity: int, value_capacity: dict[str, int], may_delete: Callable[[], bool] | None = None) -> None:
        self.storage, self.schema = storage, schema
        self.writer, self.table, self.name = writer, table, name
        self.row_start = 0
        self.capacity, self.value_capacity = capacity, dict(value_capacity)
        self.path = layout.fragment_dir(writer, table, name)
        self.rows = 0  # added, committed or not
        self.committed = 0
        self.nnz = dict.fromkeys(schema.offsets_groups, 0)  # values added per CSR group
        self.committed_nnz = dict(self.nnz)
        self._committed_streams = 0
        self.streams = StreamKeys()
        self.sealed = False  # no more records go here
        self._specs = schema.zarr_layout()
        self._arrays: dict[str, _Array] = {}
        shapes = segment_shapes(schema, capacity, value_capacity)
        objects = group_object(self.path, {"replaystore": {"segment": name, "writer": writer, "table": table}})
        for array, (dtype, shape) in shapes.items():
            objects.update(array_object(f"{self.path}/{array}", dtype, shape, checksum=False))
        chunks = {array: chunk_path(f"{self.path}/{array}", len(shape)) for array, (_, shape) in shapes.items()}
        self._chunks = {a: (chunks[a], int(np.prod(shape)) * dtype.itemsize) for a, (dtype, shape) in shapes.items()}
        self._closer: weakref.finalize | None = None
        try:
            fds = storage.create_sized(dict(self._chunks.values()))
            # the descriptors close with the segment, or when it is collected unclosed (a writer
            # dropped without close(): like a crash, but the process lives on)
            self._closer = weakref.finalize(self, _close_all, list(fds.values()))
            for array, cpath in chunks.items():
                # an offsets array's entry 0 is the zero it was created with: appends write entries 1, 2, ...
                first = shapes[array][0].itemsize if array in schema.offsets_groups else 0
                self._arrays[array] = _Array(fds[cpath], first)
            storage.write_objects(objects, created=fds)
        except BaseException:
            self.close()
            if may_delete is None or may_delete():  # (not where the path may be another store's now)
                storage.delete(self.path)
            raise

    def fits(self, rows: int, nnz: dict[str, int], streams: Sequence[StreamKey]) -> bool:
        """Whether records of these sizes and stream keys can be added.

        Parameters
        ----------
        rows : int
            Records to add.
        nnz : dict of str to int
            Values to add per CSR group.
        streams : sequence of StreamKey
            Their stream keys.

        Returns
        -------
        bool
            False when sealed, or over capacity, values capacity or
            :data:`MAX_STREAMS` keys.
        """
        if self.sealed or self.rows + rows > self.capacity:
            return False
        if any(self.nnz[k] + v > self.value_capacity[k] for k, v in nnz.items()):
            return False
        return len(self.streams) + sum(k not in self.streams for k in set(streams)) <= MAX_STREAMS

    def add(self, cols: Columns, codes: np.ndarray, streams: Sequence[StreamKey], steps: np.ndarray,
            resets: np.ndarray) -> None:
        """Write ``cols``' records at their place (the caller checked :meth:`fits`).

        The arguments are those of ``StagedFragment.add`` (store/format/staging.py). All or
        nothing: a failure forgets the partial add (nothing committed is ever touched).
        Cost: one ``pwrite`` and a CRC32C extension per array; write-back starts in the
        background.

        Raises
        ------
        OSError
            A write failed (a full disk, for instance); the add is forgotten.
        """
        mark = self.mark()
        try:
            self._add(cols, codes, streams, steps, resets)
        except BaseException:
            self.rollback(mark)
            raise

    def _add(self, cols: Columns, codes: np.ndarray, streams: Sequence[StreamKey], steps: np.ndarray,
             resets: np.ndarray) -> None:
        remap = self.streams.codes(streams)
        for spec in self._specs:
            arr = self._arrays[spec.name]
            if spec.role == "offsets":
                off = cols.arrays[spec.name]
                arr.write((off[1:] - (int(off[0]) - self.nnz[spec.name])).astype(OFFSETS_DTYPE, copy=False))
                self.nnz[spec.name] += int(off[-1]) - int(off[0])
            elif cols.arrays[spec.name].size:
                arr.write(cols.arrays[spec.name])
        self._arrays["_stream"].write(remap[codes] if len(remap) else codes.astype(STREAM_CODE))
        self._arrays["_step"].write(steps.astype(STEP, copy=False))
        self._arrays["_reset"].write(resets.astype(RESET, copy=False))
        self.rows += cols.num_records

    def mark(self) -> Mark:
        """The state to :meth:`rollback` to.

        Returns
        -------
        Mark
            Rows, values, stream-key count and array ends.
        """
        return self.rows, dict(self.nnz), len(self.streams), {n: a.end for n, a in self._arrays.items()}

    def rollback(self, mark: Mark) -> None:
        """Forget the records added after ``mark`` (their bytes stay, beyond what any commit names).

        Cost: re-reading the pending bytes of each array rolled back, for its CRC32C.

        Parameters
        ----------
        mark : Mark
            A :meth:`mark`.
        """
        rows, nnz, streams, ends = mark
        self.rows, self.nnz = rows, nnz
        self.streams.truncate(streams)
        for name, arr in self._arrays.items():
            if arr.end != ends[name]:
                arr.end = ends[name]
                arr.written_back = min(arr.written_back, arr.end)
                arr.crc = 0 if arr.end == arr.committed else self._crc_of(arr, arr.committed, arr.end)

    def discard(self) -> None:
        """Forget every record added since the last commit."""
        self.rollback((self.committed, dict(self.committed_nnz), self._committed_streams,
                       {n: a.committed for n, a in self._arrays.items()}))

    @staticmethod
    def _crc_of(arr: _Array, start: int, end: int) -> int:
        return google_crc32c.value(os.pread(arr.fd, end - start, start))

    @property
    def pending(self) -> int:
        """Records added since the last commit."""
        return self.rows - self.committed

    def present(self) -> bool:
        """Whether none of the segment's files was deleted (by a vacuum) since it was created.

        Returns
        -------
        bool
            True when every file still has a link.
        """
        return all(os.fstat(a.fd).st_nlink for a in self._arrays.values())

    def check_present(self) -> None:
        """Refuse to commit a segment whose files were deleted while open.

        A vacuum whose threshold is shorter than the time since this writer's
        appends (docs/FORMAT.md, "Vacuum") may delete them: committing would
        reference data that is gone.

        Raises
        ------
        StoreError
            The segment's files were deleted.
        """
        if not self.present():
            raise StoreError(f"{self.path}: deleted while this writer had appends pending (by a vacuum with "
                             "a threshold shorter than the writer's pause?); discard() them")

    def dirty_fds(self) -> list[int]:
        """The files written since the last commit: ``fdatasync`` them to make the pending records durable.

        Returns
        -------
        list of int
            File descriptors.
        """
        return [a.fd for a in self._arrays.values() if a.end != a.committed]

    def fragment(self, name: str, parts: list[tuple[int, int, int]]) -> Fragment:
        """The pending records as the fragment ``name``.

        Sync its :meth:`dirty_fds` first; call :meth:`advance` once committed.

        Parameters
        ----------
        name : str
            The fragment's name.
        parts : list of tuple of int
            ``(seq, time_ns, rows)`` of the commit that will hold it.

        Returns
        -------
        Fragment
            A segment-backed fragment.
        """
        ref = SegmentRef(self.name, self.committed, dict(self.committed_nnz), self.capacity,
                         dict(self.value_capacity), {n: [a.crc] for n, a in self._arrays.items()})
        nnz = {k: self.nnz[k] - self.committed_nnz[k] for k in self.nnz}
        return Fragment(self.writer, self.table, name, self.row_start + self.committed, self.pending, nnz,
                        list(self.streams.keys), parts, ref)

    def advance(self) -> None:
        """Mark the pending records committed."""
        self.committed, self.committed_nnz = self.rows, dict(self.nnz)
        self._committed_streams = len(self.streams)
        for arr in self._arrays.values():
            arr.committed, arr.crc, arr.written_back = arr.end, 0, arr.end

    def copy_from(self, source: str) -> None:
        """Fill this new segment with the first bytes of each array of segment ``source``, durably.

        Each chunk file gets as many bytes as it holds, from the start of the same array's
        chunk file in ``source`` (a segment of this table with at least this capacity): the
        committed prefix of a larger segment, rows and values at the same places. In-kernel
        copies (``copy_file_range``) where the system has them, else through a bounded buffer;
        then ``fdatasync``. ``source``'s files are only read.

        Parameters
        ----------
        source : str
            The other segment's directory (store path).

        Raises
        ------
        FileNotFoundError
            A file of ``source`` is gone (deleted by a reclaim meanwhile).
        CorruptObjectError
            A file of ``source`` is not a regular file, or shorter than what is copied.
        OSError
            Reading or writing failed (a full disk, for instance).
        """
        for name, (cpath, nbytes) in self._chunks.items():
            src = source + cpath[len(self.path):]
            local = self.storage.local_path(src)
            assert local is not None  # (local storage)
            copy_prefix(local, src, self._arrays[name].fd, nbytes)
        for arr in self._arrays.values():
            os.fdatasync(arr.fd)

    def close(self) -> None:
        """Close the segment's files (later calls do nothing)."""
        for arr in self._arrays.values():
            arr.fd = -1
        if self._closer is not None:
            self._closer()  # (once: later calls do nothing)
