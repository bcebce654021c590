"""The per-record episode ledger that the store-backed HER and n-step buffers keep in RAM.

``replaystore.integrations.sb3_her`` and ``replaystore.integrations.sb3_nstep`` need, for a
sampled transition, the transitions after it in its env's episode (n-step windows) and its
episode's bounds (hindsight goals). SB3's own buffers find them by arithmetic on their arrays;
the store-backed twins keep the same facts per record in a few small arrays (about 30 bytes a
record), rebuilt from the store's stream index when the store is opened (so a process killed
and restarted finds them again) and extended by every ``add``.

Needs the optional dependency stable-baselines3 (through ``replaystore.integrations.sb3``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.errors import SchemaMismatchError
from replaystore.integrations.sb3 import _StoreBufferMixin
from replaystore.loaders.her import episode_bounds

__all__: list[str] = []


class _Ledger:
    """Per record, by its global number ``g`` (records ever known to the buffer, oldest first).

    ``sid`` (the stream's number), ``stride`` per stream (the distance in ``g`` between
    consecutive records of a stream: ``n_envs`` of the writer that wrote it), ``start`` (``g``
    of the record's episode's first record), ``length`` (the episode's length once it ended
    with a terminated or truncated flag and began at a known start; 0 otherwise),
    ``reward``, ``terminated`` and ``truncated``. Entries older than ``base`` were dropped.
    """

    def __init__(self) -> None:
        self.base = 0  # g of entry 0 of the arrays
        self.n = 0  # records known: g in [0, n)
        self.sid = np.zeros(0, np.int64)
        self.start = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.int64)
        self.reward = np.zeros(0, np.float32)
        self.terminated = np.zeros(0, bool)
        self.truncated = np.zeros(0, bool)
        self.stride: list[int] = []

    _FIELDS = ("sid", "start", "length", "reward", "terminated", "truncated")

    def reserve(self, extra: int, keep_from: int) -> None:
        """Room for ``extra`` more records; entries before ``keep_from`` may be dropped."""
        used = self.n - self.base
        if used + extra <= len(self.sid):
            return
        drop = max(0, min(keep_from, self.n) - self.base)
        size = max(2 * (used - drop + extra), 1024)
        for name in self._FIELDS:
            old = getattr(self, name)
            new = np.zeros(size, old.dtype)
            new[:used - drop] = old[drop:used]
            setattr(self, name, new)
        self.base += drop

    def at(self, name: str, g: np.ndarray) -> np.ndarray:
        """Field ``name`` of records ``g`` (each in ``[base, n)``)."""
        return getattr(self, name)[g - self.base]

    def strides(self, g: np.ndarray) -> np.ndarray:
        """The stride of each record's stream."""
        return np.asarray(self.stride, dtype=np.int64)[self.at("sid", g)]

    def end_episode(self, g_last: int, length: int) -> None:
        """Mark the episode ending at ``g_last`` complete: ``length`` on each of its records."""
        stride = self.stride[int(self.sid[g_last - self.base])]
        g = g_last - stride * np.arange(length, dtype=np.int64)
        self.length[g[g >= self.base] - self.base] = length


class _EpisodeLedgerMixin(_StoreBufferMixin):
    """The store buffer plus its episode ledger (rebuilt when opened, extended by each ``add``)."""

    _ledger: _Ledger
    _env_sid: np.ndarray
    _open_start: np.ndarray
    _open_length: np.ndarray

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
            order = np.lexsort((np.arange(total), np.asarray(steps), sid))
            s_sorted = sid[order]
            same = np.zeros(total, bool)
            same[1:] = s_sorted[1:] == s_sorted[:-1]
            gaps = np.diff(order)[same[1:]]
            n_streams = int(sid.max()) + 1
            stride = np.full(n_streams, max(self.n_envs, 1), dtype=np.int64)
            if len(gaps):
                sg = s_sorted[1:][same[1:]]
                stride[sg] = gaps
                if (gaps != stride[sg]).any() or (gaps <= 0).any():
                    raise SchemaMismatchError(
                        f"{self.url}: the store's streams are not laid out one record per env per step (as SB3's "
                        "store buffers and the recorders write them); HER and n-step buffers need that layout")
            ends = (np.asarray(flags["terminated"], bool) | np.asarray(flags["truncated"], bool)).reshape(-1)
            lo, hi, complete = episode_bounds(s_sorted, np.asarray(steps)[order], np.asarray(resets)[order],
                                              ends[order])
            led.reserve(total, 0)
            led.n = total
            led.sid[:total] = sid
            led.start[order] = order[lo]
            led.length[order] = np.where(complete, hi - lo, 0)
            led.reward[:total] = np.asarray(flags["reward"], np.float32).reshape(-1)
            led.terminated[:total] = np.asarray(flags["terminated"], bool).reshape(-1)
            led.truncated[:total] = np.asarray(flags["truncated"], bool).reshape(-1)
            led.stride = stride.tolist()
        n = self.n_envs
        self._env_sid = np.arange(len(led.stride), len(led.stride) + n, dtype=np.int64)
        led.stride.extend([n] * n)
        self._ledger = led
        self._open_start = np.full(n, -1, dtype=np.int64)  # g of each env's episode in progress (-1: none)
        self._open_length = np.zeros(n, dtype=np.int64)

    def _ledger_add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
                    infos: list[dict[str, Any]]) -> np.ndarray:
        """``_add`` the step, then extend the ledger by its ``n_envs`` records; returns their ``g``."""
        log, n = self._log, self.n_envs
        i = 0 if log.n + n > log.rows else log.n  # (_add commits a left-over first, then writes at 0)
        keep = self._oldest()
        self._add(obs, next_obs, action, reward, done, infos)
        rows = slice(i, i + n)
        begin = log.reset[rows].copy()
        term = log.arrays["terminated"][rows].copy()
        trunc = log.arrays["truncated"][rows].copy()
        led = self._ledger
        led.reserve(n, keep)
        g = led.n + np.arange(n, dtype=np.int64)
        k = g - led.base
        led.n += n
        led.sid[k] = self._env_sid
        led.reward[k] = log.arrays["reward"][rows]
        led.terminated[k], led.truncated[k] = term, trunc
        led.length[k] = 0
        fresh = begin | (self._open_start < 0)
        self._open_start[fresh] = g[fresh]
        self._open_length[fresh] = 0
        self._open_length += 1
        led.start[k] = self._open_start
        for j in np.flatnonzero(term | trunc).tolist():
            led.end_episode(int(g[j]), int(self._open_length[j]))
            self._open_start[j] = -1
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
