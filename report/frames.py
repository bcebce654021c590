"""Frame strips: the first, middle and last frame of a few episodes of each image field, as inline PNG.

An image field is a dense field whose records are pictures: 2-D ``(H, W)`` (grayscale: the
``frame`` field of a ``frames`` store, each ``frame_<key>`` image leaf of a recorded Dict
observation), 3-D with a channel axis of 1, 3 or 4 first or last (``(H, W, 3)``,
``(3, H, W)``), or a stack of 2-D frames (``(k, H, W)``: the newest frame is shown); nested
leaves (``obs__image``) count like any field. ``next_obs`` and other ``next_<name>`` fields
whose ``<name>`` is an image field are left out (the same pictures one step later).

Frames of other dtypes than uint8 are scaled from their minimum and maximum to 0-255. PNGs are
encoded by pillow at the frame's own size (at most :data:`MAX_SIDE` pixels a side) and scaled up
in the page (``image-rendering: pixelated``), so a strip of 84x84 Atari frames costs a few KB.
In a ``frames`` store (schema metadata ``frame_stack``) an ended episode's last frame is its
closing frame-only record, which holds the final observation.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from replaystore.report.markup import esc, note, num
from replaystore.schemas import Dense, Schema
from replaystore.store import Table

EPISODES_SHOWN = 3
"""Episodes per image field in the strips (the first, one in the middle, the last)."""
MAX_IMAGE_FIELDS = 8
"""Image fields shown at most (a Dict observation of many image leaves: the first ones)."""
FRAMES_BYTES = 3 << 20
"""The most the frame strips add to the page (their PNGs in base64): past it, further strips are left out
(each field keeps its first, scaled down to fit if need be), so a report of large or noisy pictures stays
under 5 MB."""
MAX_SIDE = 256
"""Frames larger than this (either side, pixels) are scaled down to it, keeping their aspect."""
MIN_SIDE = 32
"""A field's first strip is scaled down, halving, as far as this to fit :data:`FRAMES_BYTES`."""


def _is_picture(shape: tuple[int, ...]) -> bool:
    if len(shape) == 2:
        return min(shape) >= 2
    if len(shape) == 3:
        return shape[-1] in (1, 3, 4) or shape[0] in (1, 3, 4) or (shape[0] <= 16 and min(shape[1:]) >= 8)
    return False


def image_fields(schema: Schema, kinds: Mapping[str, str] | None = None) -> list[str]:
    """The image fields of a schema, in schema order, without the ``next_`` twins of others.

    Parameters
    ----------
    schema : Schema
        The table's schema.
    kinds : mapping of str to str, optional
        Field name to the kind the statistics gave it (``FieldStats.kind``); a field of kind
        ``"image"`` there is an image field too.

    Returns
    -------
    list of str
        Field (column) names.
    """
    kinds = kinds or {}
    found = [f.name for f in schema.fields if isinstance(f, Dense) and (
        kinds.get(f.name) == "image" or (f.dtype == np.uint8 and _is_picture(f.shape)))]
    return [n for n in found if not (n.startswith("next_") and n[len("next_"):] in found)]


def picture(frame: np.ndarray) -> np.ndarray:
    """One record of an image field as a ``uint8`` picture pillow can encode: ``(H, W)``, ``(H, W, 3|4)``.

    Parameters
    ----------
    frame : numpy.ndarray
        The record (2-D, 3-D with channels first or last, or a stack of frames).

    Returns
    -------
    numpy.ndarray
        The picture.
    """
    a = np.asarray(frame)
    if a.ndim == 3:
        if a.shape[-1] in (1, 3, 4):
            a = a[..., 0] if a.shape[-1] == 1 else a
        elif a.shape[0] in (1, 3, 4) and a.shape[0] != 4:
            a = a[0] if a.shape[0] == 1 else np.moveaxis(a, 0, -1)
        else:  # a stack of frames: the newest
            a = a[-1]
    if a.dtype != np.uint8:
        f = a.astype(np.float64)
        lo, hi = float(np.nanmin(f)) if f.size else 0.0, float(np.nanmax(f)) if f.size else 0.0
        a = np.nan_to_num((f - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(f)).astype(np.uint8)
    return np.ascontiguousarray(a)


def png_data_uri(frame: np.ndarray, max_side: int = MAX_SIDE) -> str:
    """A frame as a ``data:image/png;base64,...`` URI (scaled down to ``max_side`` pixels a side if larger).

    Parameters
    ----------
    frame : numpy.ndarray
        One record of an image field.
    max_side : int, optional
        The largest side kept (default :data:`MAX_SIDE`).

    Returns
    -------
    str
        The URI.
    """
    buf = io.BytesIO()
    image = Image.fromarray(picture(frame))
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side), Image.Resampling.BILINEAR)
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _pick(n: int, k: int) -> list[int]:
    """``k`` indices of ``range(n)`` spread evenly: the first, the last and between."""
    if n <= k:
        return list(range(n))
    return sorted({int(round(i * (n - 1) / (k - 1))) for i in range(k)})


def _spans(table: Table, episodes: Any) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Up to :data:`EPISODES_SHOWN` ``(label, row ids, steps)`` of episodes (or streams, without any)."""
    out = []
    ends = np.asarray(episodes.end) if episodes is not None else np.zeros(0, object)
    frames_layout = "frame_stack" in table.schema.metadata
    if len(ends):
        complete = np.flatnonzero(ends != "open")
        chosen = complete if len(complete) else np.arange(len(ends))
        for i in (chosen[j] for j in _pick(len(chosen), EPISODES_SHOWN)):
            stream = episodes.stream[i]
            rows, steps = table.rows(stream)
            first, last = int(episodes.first_row[i]), int(episodes.last_row[i])
            a, b = np.flatnonzero(rows == first), np.flatnonzero(rows == last)
            if not len(a) or not len(b):
                continue
            hi = int(b[0]) + 1
            if (frames_layout and ends[i] != "open" and hi < len(rows) and steps[hi] == steps[hi - 1] + 1):
                hi += 1  # a frames store's episode closes with a frame-only record: its final observation
            sel = slice(int(a[0]), hi)
            label = (f"stream {stream} · episode from step {num(int(steps[sel][0]))} · {num(int(episodes.length[i]))}"
                     f" steps · return {num(float(episodes.ret[i]))} · {ends[i]}")
            out.append((label, rows[sel], steps[sel]))
        return out
    for stream in (s for j, s in enumerate(table.streams()) if j < EPISODES_SHOWN):
        rows, steps = table.rows(stream)
        out.append((f"stream {stream} (no episodes): its first, middle and last records", rows, steps))
    return out


def frames_html(table: Table, episodes: Any, fields: Sequence[str]) -> str:
    """The frame strips of the image fields: first, middle and last frame of a few episodes.

    Parameters
    ----------
    table : Table
        The table read.
    episodes : Episodes or None
        Its episodes (``episodes_of``); without any, the first, middle and last records of a
        few streams are shown.
    fields : sequence of str
        The image fields (:func:`image_fields`).

    Returns
    -------
    str
        One ``<div class="strip">`` per field and episode, each with three ``<figure>`` elements of an
        ``<img>`` (inline PNG) captioned with its step; a note when there is no image field.

    Notes
    -----
    Cost: one read of at most 3 x :data:`EPISODES_SHOWN` records per field.
    """
    if not fields:
        return note("No image fields: this table has no dense uint8 field shaped like a picture "
                    "(H x W, H x W x C or C x H x W).")
    spans = _spans(table, episodes)
    if not spans:
        return note("No records to show frames of.")
    shown = list(fields)[:MAX_IMAGE_FIELDS]
    out = []
    if len(fields) > len(shown):
        out.append(note(f"{len(fields) - len(shown)} more image fields not shown."))
    picks = [[int(i) for i in _pick(len(rows), 3)] for _, rows, _ in spans]
    wanted = np.concatenate([rows[p] for (_, rows, _), p in zip(spans, picks, strict=True)])
    data = table.read(wanted, columns=shown)
    strips: dict[str, list[str]] = {name: [] for name in shown}
    used = left = 0
    start = np.r_[0, np.cumsum([len(p) for p in picks])]
    for k, ((label, _rows, steps), p) in enumerate(zip(spans, picks, strict=True)):
        for name in shown:  # every field's first strip before any field's second: the budget is shared fairly
            side = MAX_SIDE
            while True:
                uris = [png_data_uri(data[name][start[k] + j], side) for j in range(len(p))]
                cost = sum(len(u) for u in uris)
                if used + cost <= FRAMES_BYTES or (k and side == MAX_SIDE) or side <= MIN_SIDE:
                    break
                side //= 2  # a field's first strip is kept: smaller, if that is what fits
            if used + cost > FRAMES_BYTES and k:
                left += 1
                continue
            used += cost
            cells = "".join(f'<figure class="frame"><img alt="{esc(name)} step {int(steps[i])}" src="{u}">'
                            f"<figcaption>step {num(int(steps[i]))}</figcaption></figure>"
                            for i, u in zip(p, uris, strict=True))
            strips[name].append(f'<div class="strip" data-field="{esc(name)}"><p class="strip-label">'
                                f"{esc(label)}</p>{cells}</div>")
    for name in shown:
        out.append(f'<h3 class="field">{esc(name)}</h3>{"".join(strips[name])}')
    if left:
        out.append(note(f"{left} more strips left out: the frames shown take {used / 2**20:.1f} MiB, the most a "
                        "report spends on them."))
    return "".join(out)
