"""How two views of a table differ.

Which fragments stayed, came and left between two syncs of a reader, which rows appeared and
left, and how the stream index's key order grows. Pure functions of fragment lists; the reader
(store/read/table.py) follows a change with them.
"""

from __future__ import annotations

import bisect
import operator

import numpy as np

from replaystore.store.format.fragment import Fragment
from replaystore.store.format.streamkeys import StreamKey

_PLACE = operator.itemgetter(1)


def pair(a: np.ndarray, vis_was: np.ndarray, b: np.ndarray, vis_now: np.ndarray,
          ) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Match two views of fragments ``was`` and ``now``, each visible from a local row.

    The first ``head`` and last ``tail`` fragments of both are the same objects
    visible from the same rows. Cost: array operations over both views.

    Parameters
    ----------
    a : numpy.ndarray
        :func:`identities` of ``was``.
    vis_was : numpy.ndarray
        Per fragment of ``was``, its first visible local row.
    b : numpy.ndarray
        :func:`identities` of ``now``.
    vis_now : numpy.ndarray
        Per fragment of ``now``, its first visible local row.

    Returns
    -------
    head, tail : int
        Lengths of the common prefix and suffix.
    src : numpy.ndarray
        ``src[i]`` is the index in ``was[head:len(was) - tail]`` of the same
        object as ``now[head + i]`` (-1: none).
    kept : numpy.ndarray
        ``kept[i]``: whether it is also visible from the same row.
    stays : numpy.ndarray
        ``stays[j]``: whether ``was[head + j]`` is kept so.
    """
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]) | (vis_was[:n] != vis_now[:n])
    head = int(differ.argmax()) if differ.any() else n
    m = n - head  # the suffix after the prefix
    differ = (a[len(a) - m:] != b[len(b) - m:]) | (vis_was[len(a) - m:] != vis_now[len(b) - m:])
    tail = m - 1 - int(np.flatnonzero(differ)[-1]) if differ.any() else m
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    src = np.full(len(mid_b), -1, dtype=np.int64)
    if len(mid_a) and len(mid_b):
        order = np.argsort(mid_a, kind="stable")
        at = order[np.searchsorted(mid_a, mid_b, sorter=order).clip(max=len(mid_a) - 1)]
        same = mid_a[at] == mid_b
        src[same] = at[same]
    kept = src >= 0
    kept[kept] = vis_was[head:len(a) - tail][src[kept]] == vis_now[head:len(b) - tail][kept]
    stays = np.zeros(len(mid_a), dtype=bool)
    stays[src[kept]] = True
    return head, tail, src, kept, stays


def identities(frags: list[Fragment]) -> np.ndarray:
    """``id`` of each fragment (object identity, as an array).

    Parameters
    ----------
    frags : list of Fragment
        The fragments.

    Returns
    -------
    numpy.ndarray
        uint64 per fragment.
    """
    return np.fromiter(map(id, frags), dtype=np.uint64, count=len(frags))


def first_listings(frags: list[Fragment]) -> dict[StreamKey, tuple[int, int]]:
    """Per stream key listed by ``frags``, ``(first_id, position)`` of its first listing.

    In order of first listing (the stream index's key order). Cost: the
    fragments' stream lists.

    Parameters
    ----------
    frags : list of Fragment
        A view, ordered by row id.

    Returns
    -------
    dict of StreamKey to tuple of int
        The first listings.
    """
    out: dict[StreamKey, tuple[int, int]] = {}
    for f in frags:
        for j, k in enumerate(f.streams):
            if k not in out:
                out[k] = (f.first_id, j)
    return out


def grown_order(key_at: dict[StreamKey, tuple[int, int]], keys: list[StreamKey], gone: list[Fragment],
                 came: list[Fragment]) -> list[StreamKey] | None:
    """The keys a change of view appends to the stream order ``keys``.

    A view's fragments are ordered by their disjoint row ids, so a key's place
    is its first listing's ``(first_id, position)``: only the keys the changed
    fragments list can move, and each keeps its place where its first listing
    stays or a fragment that came lists it at the same place (a fragment growing
    or compacted from its start), and the order only grows where the keys new to
    it come after every old one. Cost: the changed fragments' stream lists.

    Parameters
    ----------
    key_at : dict of StreamKey to tuple of int
        The first listings of the old view; updated with the new keys.
    keys : list of StreamKey
        The current stream order.
    gone : list of Fragment
        Fragments that left the view.
    came : list of Fragment
        Fragments that came (the rest are kept).

    Returns
    -------
    list of StreamKey or None
        The keys appended, or None where the order may change otherwise.
    """
    came_at: dict[StreamKey, tuple[int, int]] = {}
    for f in came:
        for j, k in enumerate(f.streams):
            if k not in came_at or (f.first_id, j) < came_at[k]:
                came_at[k] = (f.first_id, j)
    gone_ids = {f.first_id for f in gone}
    for f in gone:
        for k in f.streams:
            at = key_at[k]
            if at[0] in gone_ids and came_at.get(k) != at:
                return None  # its first listing left: the next one may be anywhere
    if any(at < key_at[k] for k, at in came_at.items() if k in key_at):
        return None  # listed before its old place
    new = sorted(((k, at) for k, at in came_at.items() if k not in key_at), key=_PLACE)
    if new and keys and new[0][1] < key_at[keys[-1]]:
        return None  # a new key before an old one
    key_at.update(new)
    return [k for k, _ in new]


def intervals(frags: list[Fragment], vis_from: np.ndarray) -> list[tuple[int, int, Fragment]]:
    """Visible row ids ``[lo, hi)`` per fragment, sorted.

    Parameters
    ----------
    frags : list of Fragment
        The fragments.
    vis_from : numpy.ndarray
        Per fragment, its first visible local row.

    Returns
    -------
    list of tuple of (int, int, Fragment)
        ``(lo, hi, fragment)``, sorted by ``lo``.
    """
    return sorted(((f.first_id + int(v), f.first_id + f.rows, f) for f, v in zip(frags, vis_from, strict=True)),
                  key=lambda t: t[0])


def subtract(a: list[tuple[int, int, Fragment]], b: list[tuple[int, int, Fragment]],
              ) -> list[tuple[Fragment, int, int]]:
    """Rows of ``a``'s intervals in none of ``b``'s, as ``(fragment, local lo, local hi)``.

    Cost: the intervals, plus a binary search per interval of ``a``.

    Parameters
    ----------
    a, b : list of tuple of (int, int, Fragment)
        Sorted intervals, as :func:`intervals` returns them.

    Returns
    -------
    list of tuple of (Fragment, int, int)
        The rows, per fragment.
    """
    out = []
    starts = [lo for lo, _, _ in b]
    for lo, hi, frag in a:
        j = max(bisect.bisect_right(starts, lo) - 1, 0)
        cur = lo
        while cur < hi and j < len(b):
            blo, bhi, _ = b[j]
            if blo > cur:
                out.append((frag, cur - frag.first_id, min(blo, hi) - frag.first_id))
            cur = max(cur, bhi)
            j += 1
        if cur < hi:
            out.append((frag, cur - frag.first_id, hi - frag.first_id))
    return out
