"""``replaystore copy SRC DST``: a store's committed state into a new location, sparse files kept sparse.

A segment's chunk files are created at their full capacity and read as zeros past what was
written (docs/FORMAT.md, "Segments"): on a local filesystem they occupy only the blocks written,
but tools that do not know about holes (``cp`` without ``--sparse``, ``rsync`` without ``-S``,
``tar`` without ``-S``, uploads) write them out at full size. This copy takes the source's log as
one refresh shows it and copies exactly what that state references: the manifest, the
registrations and commit records of its writers, the data units its live fragments name (on
local filesystems, data ranges only: holes stay holes), and each state slot's records with the
arrays they name. Crash leftovers, compacted-away data and vacuum's other garbage are not
copied. The manifest is written last, so an interrupted copy leaves no store at DST, and the
result is verified before the copy returns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import CorruptObjectError, StoreError, StoreExistsError
from replaystore.store import open_store
from replaystore.store.maintenance import MANIFEST, live_objects, verify_store
from replaystore.store.storage import Storage, open_storage
from replaystore.tools.progress import progress_bar


@dataclass
class CopyReport:
    """What :func:`copy_store` copied: objects, their bytes (apparent sizes) and the data bytes written.

    Attributes
    ----------
    objects : int
        Objects copied.
    bytes : int
        Their apparent sizes, summed.
    written : int
        Data bytes written (holes of local sparse files excluded).
    """

    objects: int = 0
    bytes: int = 0
    written: int = 0


def _copy_sparse(src: int, dst: str) -> int:
    """Copy the open local file ``src`` (a descriptor, closed here) to new file ``dst`` with the same size.

    Writes only its data: ranges by ``SEEK_DATA`` / ``SEEK_HOLE``; where those are not
    supported the whole file is data. Returns the bytes written. The file is fsynced.
    """
    written = 0
    with open(src, "rb", closefd=True) as fin, open(dst, "xb") as fout:
        size = os.fstat(fin.fileno()).st_size
        os.ftruncate(fout.fileno(), size)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past pos
                break
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            while start < end:
                chunk = os.pread(fin.fileno(), min(end - start, 16 << 20), start)
                if not chunk:
                    break
                os.pwrite(fout.fileno(), chunk, start)
                start += len(chunk)
                written += len(chunk)
            pos = end
        os.fsync(fout.fileno())
    return written


def _copy_object(src: Storage, dst: Storage, path: str, report: CopyReport) -> None:
    local_dst = dst.local_path(path)
    # a regular file, or refused (CorruptObjectError naming the object): never a FIFO waited on
    fd = src.open_local(path) if local_dst is not None else None
    if fd is not None and local_dst is not None:
        try:
            os.makedirs(os.path.dirname(local_dst), exist_ok=True)
        except BaseException:
            os.close(fd)
            raise
        report.written += _copy_sparse(fd, local_dst)
        report.bytes += os.path.getsize(local_dst)
    else:
        data = src.read(path)
        dst.write(path, data)
        report.written += len(data)
        report.bytes += len(data)
    report.objects += 1


def copy_store(src_url: str, dst_url: str, *, src_options: Mapping[str, Any] | None = None,
               dst_options: Mapping[str, Any] | None = None, progress: bool = False) -> CopyReport:
    """Copy the store at ``src_url`` into a new store at ``dst_url`` and verify it.

    Copies exactly what one refresh of the source references (see the module
    docstring); the manifest goes last. Cost: reading and writing what is copied
    (holes of local sparse files excluded), then a ``verify`` of the copy.

    Parameters
    ----------
    src_url : str
        The source store (a local path or fsspec URL).
    dst_url : str
        The destination (a new or empty location).
    src_options : mapping, optional
        Storage options of the source.
    dst_options : mapping, optional
        Storage options of the destination.
    progress : bool, optional
        Show progress bars on stderr when it is a terminal: one per object copied, then one
        per fragment of the copy verified.

    Returns
    -------
    CopyReport
        What was copied.

    Raises
    ------
    StoreNotFoundError
        No store at ``src_url``.
    StoreExistsError
        ``dst_url`` holds anything, or a store was created there during the copy.
    StoreError
        The copy does not verify: a writer or vacuum of the source deleted data
        while it was copied (copy again, or stop them). Its manifest is removed
        again: no store is left at ``dst_url``.
    CorruptObjectError
        A damaged source object: not a regular file (a FIFO, a directory: refused
        unread, nothing waits on it), damaged as ``verify`` finds it when the copy
        does not verify, or (UnsafeNameError) a name that is not the format's. The
        destination then holds no store (no manifest), only the objects copied before.
    """
    src = open_store(src_url, mode="r", storage_options=src_options)
    dst = open_storage(dst_url, dst_options)
    if dst.list(""):
        raise StoreExistsError(f"{dst.url}: not empty; copy needs a new (or empty) destination")
    src.refresh()
    snapshot = {t: src.table(t).row_ids() for t in src.tables}
    paths = live_objects(src)
    report = CopyReport()
    with progress_bar(len(paths), "copy", progress, unit="obj", scale=False) as bar:
        for path in paths:
            try:
                _copy_object(src.storage, dst, path, report)
            except FileNotFoundError:  # (a reclaimed unit, or gone since: the verification below decides)
                pass
            bar.update(1)
    dst.sync_dirs(paths)
    manifest = src.storage.read(MANIFEST)
    if not dst.create(MANIFEST, manifest):
        raise StoreExistsError(f"{dst.url}: a store was created here during the copy")
    report.objects += 1
    report.bytes += len(manifest)
    report.written += len(manifest)
    copied = open_store(dst_url, mode="r", storage_options=dst_options)
    total = sum(len(copied.table(t).view().fragments) for t in copied.tables)
    with progress_bar(total, "verify copy", progress, unit="fragment", scale=False) as bar:

        def advance(n: int) -> None:
            bar.update(n - bar.n)

        problems = verify_store(copied, progress=advance)
    if problems:
        dst.delete(MANIFEST)  # a copy that does not verify is no store
        damaged = verify_store(src)  # (only when the copy fails: a damaged source is named as such)
        if damaged:
            raise CorruptObjectError(damaged[0].path, f"the source store is damaged: {damaged[0].problem} "
                                                      f"({len(damaged)} problem(s); run replaystore verify)")
        raise StoreError(f"{dst.url}: the copy does not verify ({len(problems)} problem(s), e.g. {problems[0]}); "
                         "the source changed while it was copied? stop its writers and vacuum, and copy again")
    for table, rows in snapshot.items():
        if not np.array_equal(copied.table(table).row_ids(), rows):
            raise StoreError(f"{dst.url}: table {table!r} of the copy shows other records than the source did")
    return report

