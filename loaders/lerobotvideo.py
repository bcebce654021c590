"""Frames of an imported LeRobot video feature, decoded from its stored packets where a minibatch is gathered.

An import keeps each video frame's compressed packet (a ragged uint8 field, in decode order,
one per record of the episode) with its ``__pts``, ``__dts`` and ``__key`` fields. The frame of
record position ``i`` of an episode is the episode's ``i``-th frame in display order; it is
decoded from the keyframe at or before position ``i`` in its own episode to the group's end
(the next keyframe or the episode's end). Every group of pictures a minibatch needs is decoded
once, however many of its frames (windows, several samples) the minibatch takes. Decoders are
made in the process that decodes (a DataLoader worker), never carried across fork or spawn.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from replaystore.errors import MissingDependencyError, StoreError
from replaystore.store import Table

PTS, DTS, KEY = "__pts", "__dts", "__key"
"""Suffixes of a video feature's packet companion fields (as the LeRobot import names them)."""


def need_av(field: str) -> Any:
    """The ``av`` module (PyAV), or a typed error naming the video field that needs it.

    Parameters
    ----------
    field : str
        The video field (or LeRobot key) to decode.

    Returns
    -------
    module
        ``av``.

    Raises
    ------
    MissingDependencyError
        PyAV is not installed.
    """
    try:
        import av
    except ImportError:
        raise MissingDependencyError(f"field {field!r}: decoding an imported LeRobot video needs PyAV "
                                     '(the av package): pip install "replaystore[video]"') from None
    return av


class VideoFrames:
    """Decodes one imported video field's frames, a group of pictures at a time (one per process).

    Parameters
    ----------
    field : str
        The packet field (``observation__images__top``).
    params : dict
        The stream parameters the import kept (``codec``, ``width``, ``height``, ``extradata``).
    """

    def __init__(self, field: str, params: dict[str, Any]) -> None:
        self.field = field
        self.params = dict(params)
        self.shape = (int(params["height"]), int(params["width"]), 3)
        self._pid: int | None = None
        self._ctx: Any = None
        self._rgb: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the decoder: each process makes its own."""
        return {**self.__dict__, "_pid": None, "_ctx": None, "_rgb": None}

    def _decoder(self) -> Any:
        if self._ctx is None or self._pid != os.getpid():
            av = need_av(self.field)
            ctx = av.CodecContext.create(self.params["codec"], "r")
            if self.params.get("extradata"):
                ctx.extradata = bytes.fromhex(self.params["extradata"])
            ctx.width, ctx.height = self.shape[1], self.shape[0]
            from av.video.reformatter import VideoReformatter

            self._ctx, self._pid = ctx, os.getpid()
            self._rgb = VideoReformatter()  # (one for all frames: ``to_ndarray(format=)`` makes one per frame)
        return self._ctx

    def frames(self, table: Table, dense_rows: np.ndarray, pos: np.ndarray, first: np.ndarray,
               end: np.ndarray, key: np.ndarray) -> np.ndarray:
        """The frames at dense stream positions ``pos`` (-1: zeros), uint8 ``(*pos.shape, H, W, 3)``.

        Parameters
        ----------
        table : Table
            This process's handle.
        dense_rows : numpy.ndarray
            Row id of each dense stream position (``StreamIndex.rows``).
        pos : numpy.ndarray
            int64 dense positions, -1 for none.
        first, end : numpy.ndarray
            Per dense position, its episode's first position and the position after its last.
        key : numpy.ndarray
            Per dense position, the position of the last keyframe at or before it (-1: none).

        Returns
        -------
        numpy.ndarray
            The frames, RGB. Cost: one decode of each distinct group of pictures needed.

        Raises
        ------
        StoreError
            A needed frame has no keyframe before it in its episode, or its group decodes to
            fewer frames than it has packets.
        """
        out = np.zeros((*pos.shape, *self.shape), np.uint8)
        flat = pos.reshape(-1)
        real = np.flatnonzero(flat >= 0)
        if not real.size:
            return out
        view = out.reshape(-1, *self.shape)
        p = flat[real]
        k = key[p]
        bad = k < first[p]
        if bad.any():
            raise StoreError(f"field {self.field!r}: row {int(dense_rows[p[bad][0]])} has no keyframe before it "
                             "in its episode")
        groups = []
        for g in np.unique(k).tolist():
            stop = int(end[g])
            nxt = np.flatnonzero(key[g + 1:stop] != g)  # the next keyframe ends the group
            groups.append((g, g + 1 + int(nxt[0]) if nxt.size else stop))
        # every group's packets in one read, each group's slice decoded once
        name = self.field
        data = table.read(np.concatenate([dense_rows[g:stop] for g, stop in groups]),
                          columns=[name, name + PTS, name + DTS])
        offsets = data[name + "__offsets"]
        at0 = 0
        for g, stop in groups:
            at = real[k == g]
            want = flat[at] - g
            n = stop - g
            sl = slice(at0, at0 + n)
            decoded = self._group(data[name], offsets[at0:at0 + n + 1], data[name + PTS][sl], data[name + DTS][sl],
                                  int(want.max()), int(dense_rows[g]))
            at0 += n
            for i, w in zip(at.tolist(), want.tolist(), strict=True):
                view[i] = decoded[w]
        return out

    def _group(self, packets: np.ndarray, offsets: np.ndarray, pts: np.ndarray, dts: np.ndarray, last: int,
               row: int) -> list[np.ndarray]:
        """One group's frames (packets in decode order) in display order, at least up to ``last``."""
        if len(pts) < 2 or bool((np.diff(pts) > 0).all()):
            n = last + 1  # display order is decode order: the packets up to the last frame needed
        else:
            n = len(pts)
        ctx = self._decoder()
        av = need_av(self.field)
        got = []
        for i in range(n):
            pkt = av.Packet(bytes(packets[offsets[i]:offsets[i + 1]]))
            pkt.pts, pkt.dts = int(pts[i]), int(dts[i])
            got.extend(ctx.decode(pkt))
        got.extend(ctx.decode(None))
        ctx.flush_buffers()
        got.sort(key=lambda f: f.pts if f.pts is not None else 0)
        if len(got) < n:
            raise StoreError(f"field {self.field!r}: the group of pictures at row {row} decoded to {len(got)} "
                             f"frames, not {n}")
        return [self._rgb.reformat(f, format="rgb24").to_ndarray() for f in got[:last + 1]]
