"""Which fragments' claimed row counts were checked against their data: :class:`SizeCheck`."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from replaystore.errors import CorruptObjectError, StaleReadError
from replaystore.store.format.fragment import Fragment
from replaystore.store.format.zarrio import CRC_BYTES, chunk_path, chunk_size
from replaystore.store.storage import Storage


class SizeCheck:
    """Checks each fragment's claimed row count against its data's real size, once per fragment.

    Parameters
    ----------
    storage : Storage
        Where the fragments' ``_reset`` chunks are sized.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        # fragments whose claimed rows were checked against their data, and the size of each
        # segment's ``_reset`` chunk
        self._sized: set[tuple[int, str]] = set()
        self._seg_sizes: dict[tuple[int, str], int] = {}

    def check(self, frags: Sequence[Fragment]) -> None:
        """Check the row count each of ``frags`` claims against its data's real size (once per fragment).

        A commit record's ``rows`` (and a segment's ``capacity``) is what ``len``, ``row_ids``,
        samplers and the contiguous views size themselves by; a checksum-valid record claiming
        more rows than the data holds would make them allocate for, and draw, records that do
        not exist. The ``_reset`` index array takes one byte per record, so its chunk's size is
        the fragment's real row count: it must hold exactly ``rows`` bytes and its CRC32C (a
        segment's: exactly ``capacity`` bytes). Cost: one ``stat`` per fragment (per segment)
        not checked before, on local storage and ``memory://``; on object storage one round
        trip of concurrent HEAD requests for all the fragments not checked before.

        Parameters
        ----------
        frags : sequence of Fragment
            Live fragments of the table.

        Raises
        ------
        CorruptObjectError
            A fragment's ``_reset`` chunk is not a regular file of the size its row count
            implies (names the chunk and the fragment).
        UnsafeNameError
            The chunk's path leads outside the store through a symbolic link.
        """
        sized = self._sized
        remote: list[tuple[Fragment, int, int, str]] = []  # (object storage: sizes asked together)
        for frag in frags:
            key = (frag.writer, frag.name)
            if key in sized:
                continue
            seg = frag.segment
            if seg is None:
                claimed, expected = frag.rows, frag.rows + CRC_BYTES
            else:
                claimed, expected = seg.capacity, seg.capacity
            if not claimed:
                sized.add(key)
                continue
            cpath = chunk_path(f"{frag.path}/_reset", 1)
            if self.storage.remote:
                remote.append((frag, claimed, expected, cpath))
                continue
            size = self._seg_sizes.get(frag.group) if seg is not None else None
            if size is None:
                try:
                    size = chunk_size(self.storage, cpath)
                except StaleReadError:  # gone: reclaimed since the log was read (a read raises it again)
                    continue
                if size is None:
                    continue
                if seg is not None:
                    self._seg_sizes[frag.group] = size
            self._check_size(frag, claimed, expected, cpath, size)
        if remote:
            for (frag, claimed, expected, cpath), size in zip(
                    remote, self.storage.sizes([r[3] for r in remote]), strict=True):
                if size is not None:  # (None: gone, reclaimed since the log was read; a read raises it)
                    self._check_size(frag, claimed, expected, cpath, size)

    def _check_size(self, frag: Fragment, claimed: int, expected: int, cpath: str, size: int) -> None:
        """Refuse ``frag`` unless its ``_reset`` chunk ``cpath`` has the ``expected`` size; else remember it checked."""
        if size != expected:
            seg = frag.segment
            what = (f"segment {seg.name!r} of {claimed} rows (commit record of fragment {frag.name!r})"
                    if seg is not None else f"fragment {frag.name!r} of {claimed} rows (its commit record)")
            raise CorruptObjectError(cpath, f"{size} bytes, but {what} needs {expected}: the records it claims "
                                            "do not exist (run replaystore verify)")
        self._sized.add((frag.writer, frag.name))

    def keep(self, frags: Sequence[Fragment]) -> None:
        """Forget every fragment and segment but those of the live fragments ``frags``.

        Parameters
        ----------
        frags : sequence of Fragment
            The table's live fragments.
        """
        self._sized &= {(f.writer, f.name) for f in frags}
        groups = {f.group for f in frags}
        self._seg_sizes = {k: v for k, v in self._seg_sizes.items() if k in groups}

    def drop(self, left: Collection[tuple[int, str]]) -> None:
        """Forget the fragments ``left`` (``(writer, name)``), no longer live.

        Parameters
        ----------
        left : collection of tuple
            ``(writer, name)`` of fragments.
        """
        self._sized -= set(left)
