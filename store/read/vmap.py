"""Files mapped side by side into one reserved address range, read as one ndarray.

A table's fragments each hold every column in its own file. Mapping each fragment's
file of one column at an aligned offset inside one reserved range makes the rows of
all fragments rows of a single array, so a gather over many fragments is one
``take`` instead of one per fragment (docs/PERFORMANCE.md, "Read").

POSIX only (Linux, macOS; 64-bit): ``mmap(2)`` with ``MAP_FIXED`` through ctypes,
because Python's :mod:`mmap` cannot place a mapping. :func:`available` says whether
this platform has it; callers fall back to per-fragment reads where it does not.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import weakref

import numpy as np

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10  # the same value on Linux, macOS and the BSDs

_libc: ctypes.CDLL | None = None
if sys.platform in ("linux", "darwin") and ctypes.sizeof(ctypes.c_void_p) == 8:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int64]
    _libc.munmap.restype = ctypes.c_int
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def available() -> bool:
    """Whether this platform can place file mappings in a reserved range.

    Returns
    -------
    bool
        True on 64-bit Linux and macOS.
    """
    return _libc is not None


def _mmap(addr: int | None, length: int, prot: int, flags: int, fd: int) -> int:
    assert _libc is not None
    got = _libc.mmap(addr, length, prot, flags, fd, 0)
    if got in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {length} bytes failed: {os.strerror(err)}")
    return int(got)


def _reserve_at(addr: int | None, length: int) -> int:
    """A read-only anonymous mapping.

    Address space that reads as zeros (no memory is committed; a read faults in the shared zero
    page), so a stray index never kills the process.
    """
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (_MAP_FIXED if addr is not None else 0)
    return _mmap(addr, length, mmap.PROT_READ, flags, -1)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class AddressRange:
    """``length`` bytes of reserved address space in which files are mapped read-only.

    The range is unmapped once neither it nor any array from :meth:`view` is
    referenced, so a view never outlives its memory. Parts not mapped (or
    released by :meth:`release`) read as zeros. Reserving commits no memory.

    Parameters
    ----------
    length : int
        Bytes to reserve (rounded up to whole pages).

    Raises
    ------
    OSError
        The reservation failed.
    """

    def __init__(self, length: int) -> None:
        self.length = _round_up(max(length, PAGE), PAGE)
        self.address = _reserve_at(None, self.length)
        self._buf = (ctypes.c_char * self.length).from_address(self.address)
        # not at interpreter exit: the process unmaps everything then, and an array still in use
        # by a later exit handler must not lose its memory first
        weakref.finalize(self._buf, _unmap, self.address, self.length).atexit = False

    def map_file(self, offset: int, path: str | int, nbytes: int) -> None:
        """Map the first ``nbytes`` of a file at ``offset`` (a multiple of PAGE).

        Parameters
        ----------
        offset : int
            Where in the range, page-aligned.
        path : str or int
            The file's path, or an open file descriptor (duplicated, not consumed).
        nbytes : int
            Bytes to map.

        Raises
        ------
        ValueError
            ``offset`` is not page-aligned, or the mapping leaves the range.
        FileNotFoundError
            The file is gone.
        EOFError
            The file is shorter than ``nbytes`` (reading a mapping past the end of
            its file would kill the process with SIGBUS).
        OSError
            ``mmap`` failed.
        """
        if offset % PAGE or offset < 0 or offset + nbytes > self.length:
            raise ValueError(f"mapping [{offset}, {offset + nbytes}) is not a page-aligned part of the range")
        # (non-blocking: a FIFO in place of the file is found short below, never waited on)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) if isinstance(path, str) else os.dup(path)
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise EOFError(f"{size} bytes, expected at least {nbytes}")
            _mmap(self.address + offset, _round_up(nbytes, PAGE), mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd)
        finally:
            os.close(fd)

    def release(self, offset: int, nbytes: int) -> None:
        """Unmap what was mapped at ``offset`` and reserve the space again.

        Parameters
        ----------
        offset : int
            Where the mapping starts, as given to :meth:`map_file`.
        nbytes : int
            Its length, as given to :meth:`map_file`.
        """
        _reserve_at(self.address + offset, _round_up(nbytes, PAGE))

    def view(self, dtype: np.dtype, trailing: tuple[int, ...]) -> np.ndarray:
        """The whole range as an array of rows of ``trailing`` shape (rows not mapped read as zeros).

        Parameters
        ----------
        dtype : numpy.dtype
            The rows' dtype.
        trailing : tuple of int
            The shape of one row (positive).

        Returns
        -------
        numpy.ndarray
            A read-only view that keeps the range alive.
        """
        row_bytes = dtype.itemsize * int(np.prod(trailing))  # > 0: schema shapes are positive
        # typeshed declares ctypes arrays' buffer protocol (__buffer__) only for Python >= 3.12
        arr = np.frombuffer(self._buf, dtype=np.uint8)[: self.length // row_bytes * row_bytes]  # type: ignore[call-overload]
        return arr.view(dtype).reshape(-1, *trailing)


def _unmap(address: int, length: int) -> None:
    assert _libc is not None
    _libc.munmap(address, length)
