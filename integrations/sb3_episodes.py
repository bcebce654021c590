"""The per-record episode ledger that the store-backed HER and n-step buffers keep in RAM.

``replaystore.integrations.sb3_her`` and ``replaystore.integrations.sb3_nstep`` need, for a
sampled transition, the transitions after it in its env's episode (n-step windows) and its
episode's bounds (hindsight goals). SB3's own buffers find them by arithmetic on their arrays;
the store-backed twins keep the same facts per record in a few small arrays (about 70 bytes a
record), rebuilt from the store's stream index when the store is opened (so a process killed
and restarted finds them again) and extended by every ``add``. Streams may interleave in any
way (a recorder's vector env skips its autoreset steps): records are linked to their successor
in their stream, and each episode's records are listed in order.

Needs the optional dependency stable-baselines3 (through ``replaystore.integrations.sb3``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.integrations.sb3 import _StoreBufferMixin
from replaystore.loaders.her import episode_bounds

__all__: list[str] = []


class _Ledger:
    """Per record, by its global number ``g`` (records ever known to the buffer, oldest first).

    ``sid`` (the stream's number), ``succ`` (``g`` of the next record of its stream; -1: none
    yet), ``start`` (``g`` of its episode's first record), ``rank`` (its index in its episode),
    ``length`` (the episode's length once it ended with a terminated or truncated flag and
    began at a known start; 0 otherwise), ``moff`` (where its episode's records are listed in
    ``members``, in order; -1 until listed), ``reward``, ``terminated`` and ``truncated``.
    Entries before ``base`` (and listings before ``mbase``) were dropped.
    """

    _FIELDS = ("sid", "succ", "start", "rank", "length", "moff", "reward", "terminated", "truncated")

    def __init__(self) -> None:
        self.base = 0  # g of entry 0 of the arrays
        self.n = 0  # records known: g in [0, n)
        self.sid = np.zeros(0, np.int64)
        self.succ = np.zeros(0, np.int64)
        self.start = np.zeros(0, np.int64)
        self.rank = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.int64)
        self.moff = np.zeros(0, np.int64)
        self.reward = np.zeros(0, np.float32)
        self.terminated = np.zeros(0, bool)
        self.truncated = np.zeros(0, bool)
        self.members = np.zeros(0, np.int64)  # episodes' records (g), each episode contiguous and in order
        self.mbase = 0  # offset of members[0]
        self.mn = 0  # offsets in [mbase, mn) are used
        self.streams = 0

    def reserve(self, extra: int, keep_from: int) -> None:
        """Room for ``extra`` more records (and listings); those before ``keep_from`` may be dropped."""
        used = self.n - self.base
        if used + extra > len(self.sid):
            drop = max(0, min(keep_from, self.n) - self.base)
            size = max(2 * (used - drop + extra), 1024)
            for name in self._FIELDS:
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[:used - drop] = old[drop:used]
                setattr(self, name, new)
            self.base += drop
        self.reserve_members(extra, keep_from)

    def reserve_members(self, extra: int, keep_from: int) -> None:
        """Room for ``extra`` more listings; a prefix of listings of records before ``keep_from`` may go."""
        mused = self.mn - self.mbase
        if mused + extra > len(self.members):
            live = self.members[:mused]
            mdrop = int(np.argmax(live >= keep_from)) if (live >= keep_from).any() else mused
            new = np.zeros(max(2 * (mused - mdrop + extra), 1024), np.int64)
            new[:mused - mdrop] = live[mdrop:]
            self.members = new
            self.mbase += mdrop

    def at(self, name: str, g: np.ndarray) -> np.ndarray:
        """Field ``name`` of records ``g`` (each in ``[base, n)``)."""
        return getattr(self, name)[np.asarray(g, dtype=np.int64) - self.base]

    def member(self, g: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``g`` of the ``index``-th record of the (listed) episode of each record ``g``."""
        return self.members[self.at("moff", g) + index - self.mbase]

    def list_episode(self, gs: list[int], complete: bool) -> None:
        """List an episode's records ``gs`` (in order); with ``complete``, give them its length."""
        m = len(gs)
        self.reserve_members(m, self.base)
        at = self.mn - self.mbase
        self.members[at:at + m] = gs
        k = np.asarray(gs, dtype=np.int64) - self.base
        ok = k >= 0
        self.moff[k[ok]] = self.mn
        if complete:
            self.length[k[ok]] = m
        self.mn += m


class _EpisodeLedgerMixin(_StoreBufferMixin):
    """The store buffer plus its episode ledger (rebuilt when opened, extended by each ``add``)."""

    _ledger: _Ledger
    _env_sid: np.ndarray
    _episodes_open: list[list[int]]  # per env: the records of its episode in progress (g), in order
    _last: np.ndarray  # per env: g of its stream's newest record (-1: none)

    def _build_ledger(self) -> None:
        """The ledger of the records the store holds, then one new stream per env of this buffer."""
        led = _Ledger()
        view = self._log.table.view()
        total = len(view)
        if total:
            rows = view.row_ids()
            keys, steps, resets = view.index_of(rows)
            flags = view.read(rows, ["reward", "terminated", "truncated"])
            _, sid = np.unique(np.asarray(keys).astype(str), return_inverse=True)
            sid = sid.astype(np.int64).reshape(-1)
            order = np.lexsort((np.arange(total), np.asarray(steps), sid))  # by stream, then step
            s_sorted = sid[order]
            ends = (np.asarray(flags["terminated"], bool) | np.asarray(flags["truncated"], bool)).reshape(-1)
            lo, hi, complete = episode_bounds(s_sorted, np.asarray(steps)[order], np.asarray(resets)[order],
                                              ends[order])
            led.reserve(total, 0)
            led.n = total
            led.sid[:total] = sid
            nxt = np.full(total, -1, dtype=np.int64)
            same = s_sorted[1:] == s_sorted[:-1]
            nxt[:-1] = np.where(same, order[1:], -1)
            led.succ[order] = nxt
            led.start[order] = order[lo]
            led.rank[order] = np.arange(total) - lo
            led.length[order] = np.where(complete, hi - lo, 0)
            led.moff[order] = lo  # every stored episode listed: members = the records in stream order
            led.members[:total] = order
            led.mn = total
            led.reward[:total] = np.asarray(flags["reward"], np.float32).reshape(-1)
            led.terminated[:total] = np.asarray(flags["terminated"], bool).reshape(-1)
            led.truncated[:total] = np.asarray(flags["truncated"], bool).reshape(-1)
            led.streams = int(sid.max()) + 1
        n = self.n_envs
        self._env_sid = np.arange(led.streams, led.streams + n, dtype=np.int64)
        led.streams += n
        self._ledger = led
        self._episodes_open = [[] for _ in range(n)]
        self._last = np.full(n, -1, dtype=np.int64)

    def _ledger_add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
                    infos: list[dict[str, Any]]) -> np.ndarray:
        """``_add`` the step, then extend the ledger by its ``n_envs`` records; returns their ``g``."""
        log, n = self._log, self.n_envs
        i = 0 if log.n + n > log.rows else log.n  # (_add commits a left-over first, then writes at 0)
        keep = self._oldest()
        self._add(obs, next_obs, action, reward, done, infos)
        rows = slice(i, i + n)
        begin = log.reset[rows]
        term = log.arrays["terminated"][rows]
        trunc = log.arrays["truncated"][rows]
        led = self._ledger
        led.reserve(n, keep)
        g = led.n + np.arange(n, dtype=np.int64)
        k = g - led.base
        led.n += n
        led.sid[k] = self._env_sid
        led.succ[k] = -1
        led.reward[k] = log.arrays["reward"][rows]
        led.terminated[k], led.truncated[k] = term, trunc
        led.length[k] = 0
        led.moff[k] = -1
        prev = self._last
        linked = prev >= led.base
        led.succ[prev[linked] - led.base] = g[linked]
        self._last = g
        for j in range(n):
            ep = self._episodes_open[j]
            if begin[j] and ep:
                ep = self._episodes_open[j] = []  # a reset without an end: the episode stays incomplete, unlisted
            led.start[k[j]] = ep[0] if ep else g[j]
            led.rank[k[j]] = len(ep)
            ep.append(int(g[j]))
            if term[j] or trunc[j]:
                led.list_episode(ep, complete=True)
                self._episodes_open[j] = []
        return g

    def _known(self) -> tuple[int, int, int]:
        """``(g of view position 0, committed, total)``: positions ``p`` map to ``g = g0 + p``."""
        committed = len(self._log.table.view())
        total = committed + self._log.n
        return self._ledger.n - total, committed, total

    def _oldest(self) -> int:
        """``g`` of the oldest record that may be sampled (those before it are past the capacity)."""
        g0, _, total = self._known()
        return g0 + max(0, total - self.capacity)

    def _gather(self, g: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        """Columns ``names`` (flat column names) of records ``g``, committed or pending, in order."""
        g0, committed, _ = self._known()
        pos = np.asarray(g, dtype=np.int64) - g0
        log = self._log
        in_store = pos < committed
        if in_store.all():
            view = log.table.view()
            return self._flat(view.read(view.rows_at(pos), names))
        tail = pos[~in_store] - committed
        if not in_store.any():
            return {name: log.arrays[name][tail] for name in names}
        view = log.table.view()
        stored = self._flat(view.read(view.rows_at(pos[in_store]), names))
        out: dict[str, np.ndarray] = {}
        for name in names:
            arr = np.empty((len(pos), *log.arrays[name].shape[1:]), dtype=log.arrays[name].dtype)
            arr[in_store] = stored[name]
            arr[~in_store] = log.arrays[name][tail]
            out[name] = arr
        return out
