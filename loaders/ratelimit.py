"""Sample-to-insert rate limiting (Reverb's ``SampleToInsertRatio``) with the counts kept in the store.

:class:`RateLimiter` is the policy: pure admission rules over three counts. Inserts are the
records ever committed to the table (``Table.total_committed``, evicted ones included);
samples are the items drawn under the limiter by every sampler that uses it, each sampler
publishing its own count in a state slot of the store (:class:`SampleGate`), so that several
processes and a resumed run share one limiter.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from replaystore.errors import RateLimitTimeout, SamplerParameterError
from replaystore.store import Store, Table, check_slot_name, state_slot_names

if TYPE_CHECKING:
    from replaystore.loaders.base import StoreSampler

SLOT_PREFIX = "ratelimit."
"""State slots ``ratelimit.<limiter name>.<sampler name>`` hold each sampler's sample count."""
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_BACKOFF_S = 0.2
"""The longest pause between two checks of a waiting minibatch."""


MAX_SLOT_SAMPLES = 2**53
"""No slot's sample count is taken above this (float arithmetic is exact below it)."""
SLOT_SLACK = 2**20
"""Samples a slot may hold beyond what the limiter could have admitted (see :meth:`RateLimiter.sample_limit`)."""


class SlotCountWarning(RuntimeWarning):
    """A rate-limiter state slot holds no sample count a sampler could have published: it is ignored.

    Issued (once per slot and value) when a slot of the limiter's table holds something
    other than an int in ``[0, RateLimiter.sample_limit(inserts)]``: a forged or damaged
    slot, which the limiter counts as 0 samples rather than let it stall or crash every
    learner (docs/GUIDE.md, "Rate limiting", "Slots that cannot be right").
    """


def _show(value: Any) -> str:
    """``value`` for a message, huge ints by their size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_count(value: Any) -> bool:
    """An int (not a bool) in ``[0, MAX_SLOT_SAMPLES]``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SLOT_SAMPLES


def slot_values(store: Store, name: str, table: str, skip: str | None = None) -> dict[str, Any]:
    """What each slot of limiter ``name`` for ``table`` holds as its sample count, unchecked.

    Parameters
    ----------
    store : Store
        The store holding the slots.
    name : str
        The limiter's name.
    table : str
        The table counted (slots of another table are left out).
    skip : str, optional
        A slot left out (the caller's own).

    Returns
    -------
    dict of str to Any
        Slot name to the document's ``samples`` value (None where it has none). Cost: a
        listing of ``state/`` and one small record per matching slot.
    """
    prefix, out = f"{SLOT_PREFIX}{name}.", {}
    for slot in state_slot_names(store):
        if slot.startswith(prefix) and slot != skip:
            saved = store.load_state(slot)
            if saved is not None and saved[0].get("table") == table:
                out[slot] = saved[0].get("samples")
    return out


def checked_count(slot: str, value: Any, limit: int, warned: dict[str, Any] | None = None) -> int:
    """``value`` as a slot's sample count: itself if an int in ``[0, limit]``, else 0 with a warning.

    Parameters
    ----------
    slot : str
        The slot, named in the warning.
    value : Any
        What it holds.
    limit : int
        The largest count taken (:meth:`RateLimiter.sample_limit`).
    warned : dict, optional
        Slot to the value last warned about: a value is warned about once (updated here).

    Returns
    -------
    int
        The count. Cost: O(1).

    Warns
    -----
    SlotCountWarning
        The value is not a count, or above ``limit``.
    """
    if _is_count(value) and value <= limit:
        return int(value)
    if warned is None or slot not in warned or warned[slot] != value:
        why = f"above {limit}, more than the limiter could have admitted" if _is_count(value) else \
            f"not an int in [0, {MAX_SLOT_SAMPLES}]"
        warnings.warn(SlotCountWarning(f"rate-limiter state slot {slot!r}: sample count {_show(value)} is {why}; "
                                       "ignored (counted as 0): a forged or damaged slot? delete it or save "
                                       "from its sampler"), stacklevel=3)
        if warned is not None:
            warned[slot] = value
    return 0


def published_samples(store: Store, name: str, table: str, skip: str | None = None,
                      limit: int = MAX_SLOT_SAMPLES) -> int:
    """The sum of the sample counts the samplers of limiter ``name`` published for ``table``.

    Parameters
    ----------
    store : Store
        The store holding the slots.
    name : str
        The limiter's name.
    table : str
        The table counted.
    skip : str, optional
        A slot left out (the caller's own).
    limit : int, optional
        The largest count a slot may hold; a slot holding anything else counts 0, with a
        :class:`SlotCountWarning` (see :func:`checked_count`).

    Returns
    -------
    int
        The sum. Cost: a listing of ``state/`` and one small record per matching slot.
    """
    return sum(checked_count(slot, value, limit) for slot, value in slot_values(store, name, table, skip).items())


def slot_count(doc: dict[str, Any], table: str) -> int:
    """The sample count of a slot document for ``table`` (0 for another table's, or a malformed one).

    Parameters
    ----------
    doc : dict
        The slot's document.
    table : str
        The table counted.

    Returns
    -------
    int
        The count (0 unless an int in ``[0, MAX_SLOT_SAMPLES]``). Cost: O(1).
    """
    n = doc.get("samples")
    if doc.get("table") != table or not _is_count(n):
        return 0
    assert isinstance(n, int)
    return n


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class RateLimiter:
    """Keep the learner's samples per inserted record near ``samples_per_insert`` (Reverb's ``SampleToInsertRatio``).

    The admission rules are Reverb's, over the counts ``inserts`` (records ever committed
    to the table), ``samples`` (items drawn under this limiter, by all its samplers) and
    ``size`` (records the table holds now):

    - a draw of ``n`` items is admitted when ``size >= min_size_to_sample`` and
      ``inserts * samples_per_insert - samples - n >= min_diff``
      (a minibatch of ``batch_size`` records or windows is ``n = batch_size`` items,
      admitted whole exactly when Reverb would admit its items one after another);
    - an insert of ``n`` records is admitted when ``size + n <= min_size_to_sample``, or
      ``(inserts + n) * samples_per_insert - samples <= max_diff``.

    ``error_buffer`` sets ``(min_diff, max_diff)``: a number ``e`` gives
    ``min_size_to_sample * samples_per_insert -/+ e`` (the error counted from the end of the
    warm-up); a pair is taken as it is. Give the limiter to a sampler (``rate_limiter=``):
    drawing a minibatch then waits (refreshing the store, backing off up to
    :data:`MAX_BACKOFF_S`) until admitted, and raises :class:`~replaystore.errors.RateLimitTimeout`
    after ``timeout`` seconds. With ``batch_size`` above ``max_diff - min_diff`` a learner
    needs collectors that are not throttled (by :meth:`can_insert`) to make progress.

    Parameters
    ----------
    samples_per_insert : float
        Target samples per inserted record over its lifetime; positive.
    min_size_to_sample : int
        Records the table must hold before any draw; a positive int.
    error_buffer : float or tuple of (float, float)
        Allowed deviation: a non-negative number, or ``(min_diff, max_diff)``.
    timeout : float, optional
        Seconds a draw (or a throttled commit) may wait before
        :class:`~replaystore.errors.RateLimitTimeout`; None (default, as in Reverb) waits for
        ever. The limiter's rather than each sampler's, so that every sampler and writer using
        it, in every process, fails the same way.
    name : str, optional
        Which samplers share counts: every sampler over the same table whose limiter has the
        same name (letters, digits, ``_``, ``-``; default: the table's name).
    sync_every_s : float, optional
        A sampler publishes its sample count, and reads the other samplers' counts, after a
        minibatch once this many seconds passed since its last sync (and whenever it waits,
        and at ``save()``); 0: after every minibatch. Default 0.1 (a sync costs a few
        milliseconds; docs/PERFORMANCE.md, "Rate limiter overhead"). See :class:`SampleGate` for the error this
        staleness allows.

    Raises
    ------
    SamplerParameterError
        A bad parameter; an ``error_buffer`` range narrower than
        ``2 * max(1, samples_per_insert)`` (draws or inserts could block for ever), or with
        ``min_diff`` above ``min_size_to_sample * samples_per_insert`` (deadlock once the
        table is warm). A ``max_diff`` below that product only warns, as in Reverb: throttled
        collectors then rely on a learner drawing concurrently.

    Notes
    -----
    Cost: construction and each rule, O(1).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float], *, timeout: float | None = None,
                 name: str | None = None, sync_every_s: float = 0.1) -> None:
        if not _number(samples_per_insert) or samples_per_insert <= 0:
            raise SamplerParameterError("samples_per_insert", "a positive finite number", repr(samples_per_insert))
        if not isinstance(min_size_to_sample, int) or isinstance(min_size_to_sample, bool) or min_size_to_sample < 1:
            raise SamplerParameterError("min_size_to_sample", "a positive int", repr(min_size_to_sample))
        offset = samples_per_insert * min_size_to_sample
        if _number(error_buffer):
            assert isinstance(error_buffer, (int, float))
            if error_buffer < 0:
                raise SamplerParameterError("error_buffer", "a non-negative number or a (min, max) pair",
                                            repr(error_buffer))
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        elif (isinstance(error_buffer, (tuple, list)) and len(error_buffer) == 2
              and all(_number(v) for v in error_buffer) and error_buffer[0] <= error_buffer[1]):
            min_diff, max_diff = float(error_buffer[0]), float(error_buffer[1])
        else:
            raise SamplerParameterError("error_buffer", "a non-negative number or a (min, max) pair of finite "
                                        "numbers, min <= max", repr(error_buffer))
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise SamplerParameterError("error_buffer", f"a range of at least 2 * max(1, samples_per_insert) = "
                                        f"{2 * max(1.0, samples_per_insert):g} (narrower ranges can block draws "
                                        "or inserts for ever)", repr(error_buffer))
        if min_diff > offset:
            raise SamplerParameterError("error_buffer", f"a range whose minimum is at most min_size_to_sample * "
                                        f"samples_per_insert = {offset:g} (else no draw is ever admitted)",
                                        repr(error_buffer))
        if max_diff < offset:
            warnings.warn(f"RateLimiter: max_diff {max_diff:g} is below min_size_to_sample * samples_per_insert "
                          f"= {offset:g}: throttled inserts stop once the table is warm unless a learner draws "
                          "concurrently", stacklevel=2)
        if timeout is not None and (not _number(timeout) or timeout < 0):
            raise SamplerParameterError("timeout", "None or a non-negative finite number of seconds", repr(timeout))
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise SamplerParameterError("name", "None or 1 to 64 letters, digits, '_' or '-'", repr(name))
        if not _number(sync_every_s) or sync_every_s < 0:
            raise SamplerParameterError("sync_every_s", "a non-negative finite number of seconds", repr(sync_every_s))
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = error_buffer
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.timeout = None if timeout is None else float(timeout)
        self.name = name
        self.sync_every_s = float(sync_every_s)

    def __repr__(self) -> str:
        """The parameters, as the constructor takes them."""
        return (f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, min_size_to_sample="
                f"{self.min_size_to_sample}, error_buffer={self.error_buffer!r}, timeout={self.timeout!r}, "
                f"name={self.name!r})")

    # -- the rules (pure) -------------------------------------------------------------------
    def can_sample(self, inserts: int, samples: int, size: int, n: int = 1) -> bool:
        """Whether ``n`` more sampled items are admitted (Reverb's ``CanSample``).

        Parameters
        ----------
        inserts : int
            Records ever committed to the table.
        samples : int
            Items sampled under the limiter so far.
        size : int
            Records the table holds.
        n : int, optional
            Items to draw (a minibatch's ``batch_size``).

        Returns
        -------
        bool
            Admitted. Cost: O(1).
        """
        if size < self.min_size_to_sample:
            return False
        return inserts * self.samples_per_insert - samples - n >= self.min_diff

    def can_insert(self, inserts: int, samples: int, size: int, n: int = 1) -> bool:
        """Whether ``n`` more inserted records are admitted (Reverb's ``CanInsert``).

        Parameters
        ----------
        inserts, samples, size : int
            As for :meth:`can_sample`.
        n : int, optional
            Records to insert.

        Returns
        -------
        bool
            Admitted. Cost: O(1).
        """
        if size + n <= self.min_size_to_sample:
            return True
        return (inserts + n) * self.samples_per_insert - samples <= self.max_diff

    def inserts_needed(self, samples: int, n: int) -> int:
        """The fewest inserts at which ``n`` more items are admitted (once the table is warm).

        Parameters
        ----------
        samples : int
            Items sampled so far.
        n : int
            Items to draw.

        Returns
        -------
        int
            ``ceil((min_diff + samples + n) / samples_per_insert)``. Cost: O(1).
        """
        return max(0, math.ceil((self.min_diff + samples + n) / self.samples_per_insert - 1e-9))

    def sample_limit(self, inserts: int) -> int:
        """The largest sample count a state slot of this limiter is taken to hold, for ``inserts`` inserts.

        Four times what the rule could have admitted, plus :data:`SLOT_SLACK`:
        ``4 * (inserts * max(1, samples_per_insert) + |min_diff| + |max_diff|) + SLOT_SLACK``,
        at most :data:`MAX_SLOT_SAMPLES`. A larger count (forged, or from a limiter with
        a much larger ``samples_per_insert`` under the same name) is ignored with a
        :class:`SlotCountWarning`, so no slot can stall a learner for longer than about
        ``3 * inserts + SLOT_SLACK / samples_per_insert`` more inserts.

        Parameters
        ----------
        inserts : int
            Records ever committed to the table.

        Returns
        -------
        int
            The limit. Cost: O(1).
        """
        bound = 4 * (inserts * max(1.0, self.samples_per_insert) + abs(self.min_diff) + abs(self.max_diff))
        return int(min(bound + SLOT_SLACK, MAX_SLOT_SAMPLES))

    def admit_inserts(self, store: Store, counts: Mapping[str, int]) -> None:
        """Return once ``counts`` records may be committed to each table; what ``Writer(rate_limiter=)`` calls.

        Per table (``samples``: the counts every sampler of this limiter published for it),
        checks :meth:`can_insert` after a ``store.refresh()``; while it fails, waits with the
        samplers' backoff, refreshing and reading the counts again. A commit is admitted
        whole: one of more than ``(max_diff - min_diff) / samples_per_insert - batch_size``
        records can wait for a learner that cannot draw.

        Parameters
        ----------
        store : Store
            The writer's store handle.
        counts : mapping of str to int
            Records the commit adds, per table.

        Raises
        ------
        RateLimitTimeout
            Not admitted within ``timeout``; the commit then writes nothing.

        Notes
        -----
        Cost: per table, a refresh and :func:`published_samples`; then the same per check
        while waiting.
        """
        for table, n in counts.items():
            t = store.table(table)
            name = self.name or table

            def check(t: Table = t, n: int = n, name: str = name) -> tuple[bool, int, int, int]:
                store.refresh()
                inserts, size = t.total_committed(), len(t)
                samples = published_samples(store, name, t.name, limit=self.sample_limit(inserts))
                return self.can_insert(inserts, samples, size, n), inserts, samples, size

            def what(inserts: int, samples: int, size: int, t: Table = t, n: int = n) -> tuple[str, str]:
                return (f"{self!r} on table {t.name!r} (a writer)",
                        f"samples to admit a commit of {n} records (max_diff={self.max_diff:g})")

            _wait(check, self.timeout, what)

    def bind(self, sampler: StoreSampler) -> SampleGate:
        """The gate through which ``sampler`` draws (what ``rate_limiter=`` sets up).

        Parameters
        ----------
        sampler : StoreSampler
            A sampler whose ``name`` is set.

        Returns
        -------
        SampleGate
            The gate. Cost: see :class:`SampleGate`.
        """
        return SampleGate(self, sampler)


def _wait(check: Callable[[], tuple[bool, int, int, int]], timeout: float | None,
          what: Callable[[int, int, int], tuple[str, str]]) -> None:
    """Call ``check`` until it admits, pausing 1 ms doubling up to :data:`MAX_BACKOFF_S` between calls.

    ``check`` returns ``(admitted, inserts, samples, size)``; ``what(inserts, samples, size)``
    describes the limiter and what it waits for, for the :class:`RateLimitTimeout` raised once
    ``timeout`` seconds passed (None: never).
    """
    start = time.monotonic()
    delay = 0.001
    while True:
        ok, inserts, samples, size = check()
        if ok:
            return
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            limiter, need = what(inserts, samples, size)
            raise RateLimitTimeout(limiter, need, inserts, samples, size, timeout)
        time.sleep(max(delay if timeout is None else min(delay, timeout - waited), 0.0))
        delay = min(2 * delay, MAX_BACKOFF_S)


class SampleGate:
    """One sampler's use of a :class:`RateLimiter`: its sample count, the other samplers', the wait.

    The sampler's count lives in state slot ``ratelimit.<limiter name>.<sampler name>`` (one
    small JSON record, the newest version only), written by that sampler only: give each
    concurrent learner its own sampler ``name=``. A sampler starts from the count its slot
    holds (a restarted learner continues, ``resume`` or not; its ``save()`` also keeps the
    count with the sampler state, and a restore takes the larger). The limiter's ``samples``
    are this sampler's exact count plus the counts the others last published, read at this
    sampler's last sync.

    Error bound: with one sampler the rule holds exactly. With several, a sampler publishes
    at its first minibatch ``sync_every_s`` after its last sync, so another sampler's view of
    it misses at most what it drew since its last publication, plus what it drew since the
    other's last read: the items it draws in about ``2 * sync_every_s`` seconds, plus a
    minibatch. The samples can run ahead of the rule by at most the sum of that over the
    other samplers: about ``2 * (P - 1) * B`` items for ``P`` learners of batch ``B`` with
    ``sync_every_s=0``. A process killed between syncs loses the count of what it drew in
    the last ``sync_every_s`` seconds.

    Parameters
    ----------
    limiter : RateLimiter
        The policy.
    sampler : StoreSampler
        The sampler it gates.

    Raises
    ------
    SamplerParameterError
        The store was opened read-only (the count could not be published).

    Notes
    -----
    Cost: construction and each sync read every slot of the limiter (a listing of ``state/``
    and one small record per sampler sharing it) and write this sampler's (one record,
    deleting the previous): a few milliseconds on a local disk. A minibatch costs two counter
    reads, a clock read and the rule, plus a sync every ``sync_every_s`` seconds.
    """

    def __init__(self, limiter: RateLimiter, sampler: StoreSampler) -> None:
        store: Store = sampler.store
        if store.mode == "r":
            raise SamplerParameterError("rate_limiter", "a store opened for writing (mode 'a'): the sampler "
                                        "publishes its sample count in a state slot", f"mode {store.mode!r}")
        self.limiter = limiter
        self.sampler = sampler
        self.store = store
        self.table: Table = sampler.table
        self.name = limiter.name or self.table.name
        self.prefix = f"{SLOT_PREFIX}{self.name}."
        self.slot = check_slot_name(self.prefix + sampler.name, "rate-limiter slot")
        self._warned: dict[str, Any] = {}  # slot -> the bad value last warned about
        saved = store.load_state(self.slot)
        own = saved[0].get("samples") if saved is not None and saved[0].get("table") == self.table.name else 0
        self.own = self.check(self.slot, own)
        self.published = self.own if own == self.own else -1  # a bad slot is overwritten at the next sync
        self.others = 0
        self._synced = time.monotonic()
        self.read_others()

    # -- counts -----------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        """Items sampled under the limiter as this gate knows: its own exactly, the others' as last read."""
        return self.own + self.others

    def counts(self) -> tuple[int, int, int]:
        """``(inserts, samples, size)`` as of the store's last refresh and this gate's last sync.

        Returns
        -------
        tuple of int
            Records ever committed, items sampled, records the table holds. Cost: O(writers).
        """
        return self.table.total_committed(), self.samples, len(self.table)

    def publish(self) -> None:
        """Write this sampler's count into its slot (if it changed since the last write). Cost: one record."""
        if self.own != self.published:
            self.store.save_state(self.slot, {"limiter": self.name, "table": self.table.name,
                                              "sampler": self.sampler.name, "samples": self.own}, keep_last=1)
            self.published = self.own

    def check(self, slot: str, value: Any) -> int:
        """``value``, read from ``slot``, as a sample count (:func:`checked_count`).

        A count above :meth:`RateLimiter.sample_limit` of this handle's inserts may only
        mean that this handle's view lags the sampler that published it: the store is
        refreshed once and the count checked again before it is ignored (once per slot
        and value).

        Parameters
        ----------
        slot : str
            The slot read.
        value : Any
            What it holds.

        Returns
        -------
        int
            The count, 0 for an invalid one. Cost: O(1); a refresh for a count over the limit.

        Warns
        -----
        SlotCountWarning
            ``value`` is not a count, or is one over the limit after the refresh.
        """
        limit = self.limiter.sample_limit(self.table.total_committed())
        if _is_count(value) and value > limit and self._warned.get(slot, -1) != value:
            self.store.refresh()
            limit = self.limiter.sample_limit(self.table.total_committed())
        return checked_count(slot, value, limit, self._warned)

    def read_others(self) -> None:
        """Read the counts the other samplers of this limiter and table published. Cost: see the class."""
        values = slot_values(self.store, self.name, self.table.name, skip=self.slot)
        self.others = sum(self.check(slot, value) for slot, value in values.items())

    def sync(self) -> None:
        """Publish this sampler's count and read the others'. Cost: see the class."""
        self.publish()
        self.read_others()
        self._synced = time.monotonic()

    def restore(self, samples: int) -> None:
        """Continue from a count saved with the sampler state: the larger of it and the slot's.

        Parameters
        ----------
        samples : int
            The count the sampler state holds (checked as a slot's count is, :meth:`check`).
        """
        self.own = max(self.own, self.check(self.sampler.name, samples))

    # -- drawing ----------------------------------------------------------------------------
    def admit(self, n: int) -> None:
        """Return once ``n`` items may be drawn: at once if the counts admit them, else wait.

        While waiting: refresh the store, sync the counts and check again, sleeping between
        checks with a backoff from 1 ms doubling up to :data:`MAX_BACKOFF_S`.

        Parameters
        ----------
        n : int
            Items to draw.

        Raises
        ------
        RateLimitTimeout
            Not admitted within the limiter's ``timeout``.
        """
        lim = self.limiter
        if lim.can_sample(*self.counts(), n):
            return

        def check() -> tuple[bool, int, int, int]:
            self.store.refresh()
            self.sync()
            inserts, samples, size = self.counts()
            return lim.can_sample(inserts, samples, size, n), inserts, samples, size

        def what(inserts: int, samples: int, size: int) -> tuple[str, str]:
            if size < lim.min_size_to_sample:
                need = f"the table to hold min_size_to_sample={lim.min_size_to_sample} records"
            else:
                need = (f"{lim.inserts_needed(samples, n)} inserts to admit a minibatch of {n} "
                        f"(samples_per_insert={lim.samples_per_insert:g}, min_diff={lim.min_diff:g})")
            return f"{lim!r} on table {self.table.name!r} (sampler {self.sampler.name!r})", need

        _wait(check, lim.timeout, what)

    def drawn(self, n: int) -> None:
        """Count ``n`` drawn items; sync once ``sync_every_s`` seconds passed since the last sync.

        Parameters
        ----------
        n : int
            Items drawn.
        """
        self.own += n
        if time.monotonic() - self._synced >= self.limiter.sync_every_s:
            self.sync()
