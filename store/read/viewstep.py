"""How a table's view moves to a new set of live fragments: :class:`ViewStep`.

The arithmetic of following a commit (store/read/table.py, ``TableReader.sync``): which
fragments changed between a view and the log's new live fragments, and the new view's
per-fragment arrays, spliced from the old view's where a fragment stays. Pure: nothing
changes until the reader applies the step.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import numpy as np

from replaystore.store.format.fragment import Fragment
from replaystore.store.read.view import TableView
from replaystore.store.read.viewdiff import pair

_ROWS = operator.attrgetter("rows")


@dataclass(eq=False)
class ViewStep:
    """One view moved to new live fragments: what changed, and the new view's fragment arrays.

    Attributes
    ----------
    removed, added : list of Fragment
        Live fragments (visible or not) that left, or came.
    gone, came : list of Fragment
        Visible fragments that left, or came.
    visible : list of Fragment
        The new view's visible fragments.
    vis_from, first_ids, ends, shown : numpy.ndarray
        The new view's per visible fragment arrays (``shown``: per live fragment, whether it shows).
    """

    removed: list[Fragment]
    added: list[Fragment]
    gone: list[Fragment]
    came: list[Fragment]
    visible: list[Fragment]
    vis_from: np.ndarray
    first_ids: np.ndarray
    ends: np.ndarray
    shown: np.ndarray
    _lo: int
    _hi: int
    _take: np.ndarray
    _fresh: np.ndarray

    @classmethod
    def between(cls, o: TableView, frags: list[Fragment], ids: np.ndarray, vis_all: np.ndarray,
                follow_min: int) -> ViewStep | None:
        """The step from view ``o`` to the live fragments ``frags``, or None.

        A fragment that is the same object, visible from the same row, in both views keeps
        what was computed for it; the rest is computed for what changed.

        Parameters
        ----------
        o : TableView
            The view followed.
        frags : list of Fragment
            The live fragments now.
        ids : numpy.ndarray
            Their objects (``viewdiff.identities``).
        vis_all : numpy.ndarray
            Each one's first visible local row.
        follow_min : int
            Fragments changed up to which the step is always taken.

        Returns
        -------
        ViewStep or None
            None where more than ``follow_min`` and a quarter of the fragments changed. Cost:
            array operations over both views (``viewdiff.pair``), plus what changed.
        """
        was, shown = o._live, o._shown
        head, tail, src, kept, stays = pair(o._live_ids, o._live_from, ids, vis_all)
        old, new = was[head:len(was) - tail], frags[head:len(frags) - tail]
        vis_new, old_shown = vis_all[head:len(frags) - tail], shown[head:len(shown) - tail]
        removed, added = [old[i] for i in np.flatnonzero(~stays)], [new[i] for i in np.flatnonzero(~kept)]
        if len(removed) + len(added) > max(follow_min, len(frags) // 4):
            return None
        keep = vis_new < np.fromiter(map(_ROWS, new), dtype=np.int64, count=len(new))
        gone = [old[i] for i in np.flatnonzero(old_shown & ~stays)]
        came = [new[i] for i in np.flatnonzero(keep & ~kept)]
        lo = int(np.count_nonzero(shown[:head]))  # the visible fragments between: [lo, hi) of the old view
        hi = lo + int(np.count_nonzero(old_shown))
        # per new visible fragment between: its old visible index if it stays, else -1 (computed now)
        rank = lo + np.cumsum(old_shown) - 1
        take = np.full(len(new), -1, dtype=np.int64)
        take[kept] = rank[src[kept]]
        take = take[keep]
        new_shown = np.concatenate((shown[:head], keep, shown[len(shown) - tail:]))
        visible = [*o._frags[:lo], *itertools.compress(new, keep.tolist()), *o._frags[hi:]]
        vis_from = np.concatenate((o.visible_from[:lo], vis_new[keep], o.visible_from[hi:]))
        step = cls(removed, added, gone, came, visible, vis_from, o.first_ids, o.ends, new_shown, lo, hi, take,
                   take < 0)
        step.first_ids = step.splice(o.first_ids, [f.first_id for f in came])
        step.ends = step.splice(o.ends, [f.first_id + f.rows for f in came])
        return step

    def splice(self, was: np.ndarray, computed: np.ndarray | list[int]) -> np.ndarray:
        """A per visible fragment array of the old view, moved to the new one.

        Parameters
        ----------
        was : numpy.ndarray
            The old view's array.
        computed : numpy.ndarray or list of int
            The values of the fragments that came (:attr:`came`), in order.

        Returns
        -------
        numpy.ndarray
            The new view's array: the old values where a fragment stays.
        """
        take, fresh = self._take, self._fresh
        mid = np.empty(len(take), dtype=was.dtype)
        mid[~fresh] = was[take[~fresh]]
        mid[fresh] = computed
        return np.concatenate((was[:self._lo], mid, was[self._hi:]))
