"""The sample-to-insert rate limiter (loaders/ratelimit.py): Reverb's admission rules, and samplers
that wait on them with the counts kept in the store, across processes and restarts."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from replaystore.errors import RateLimitTimeout, SamplerParameterError
from replaystore.loaders import (
    EpochSampler,
    PrioritizedSampler,
    RateLimiter,
    ReservoirSampler,
    SequenceSampler,
    StoreSampler,
    UniformSampler,
    make_loader,
)
from replaystore.loaders.ratelimit import SlotCountWarning
from replaystore.store import Store, open_store
from support.ratelimitprocs import Child, batch, schema


class ReverbModel:
    """Reverb's ``SampleToInsertRatio`` limiter, one item at a time (reverb/cc/rate_limiter.cc).

    ``error_buffer`` as reverb/rate_limiters.py reads it; inserts, deletes and samples counted
    per item, each admitted on the counts as they stand before it.
    """

    def __init__(self, spi: float, min_size: int, error_buffer: Any) -> None:
        self.spi, self.min_size = spi, min_size
        if isinstance(error_buffer, (int, float)):
            self.min_diff = spi * min_size - error_buffer
            self.max_diff = spi * min_size + error_buffer
        else:
            self.min_diff, self.max_diff = error_buffer
        self.inserts = self.deletes = self.samples = 0

    def can_sample_one(self) -> bool:
        if self.inserts - self.deletes < self.min_size:
            return False
        return self.inserts * self.spi - self.samples - 1 >= self.min_diff

    def can_insert_one(self) -> bool:
        if self.inserts + 1 - self.deletes <= self.min_size:
            return True
        return (self.inserts + 1) * self.spi - self.samples <= self.max_diff

    def admits(self, op: str, n: int) -> bool:
        """Whether ``n`` items in a row are admitted (the counts restored afterwards)."""
        saved = self.inserts, self.samples
        ok = True
        for _ in range(n):
            if op == "sample" and self.can_sample_one():
                self.samples += 1
            elif op == "insert" and self.can_insert_one():
                self.inserts += 1
            else:
                ok = False
                break
        self.inserts, self.samples = saved
        return ok


_events = hs.lists(hs.tuples(hs.sampled_from(["insert", "sample", "delete"]), hs.integers(1, 12)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(spi=hs.sampled_from([0.25, 0.5, 1.0, 2.0, 3.5, 8.0]), min_size=hs.integers(1, 20),
       buffer=hs.one_of(hs.integers(0, 40).map(float), hs.tuples(hs.integers(-30, 10), hs.integers(0, 60))),
       events=_events)
def test_admission_matches_reverb_item_by_item(spi: float, min_size: int, buffer: Any,
                                               events: list[tuple[str, int]]) -> None:
    ref = ReverbModel(spi, min_size, buffer)
    if ref.max_diff - ref.min_diff < 2 * max(1.0, spi) or ref.min_diff > spi * min_size:
        with pytest.raises(SamplerParameterError, match="error_buffer"):
            RateLimiter(spi, min_size, buffer)
        return
    with pytest.warns(UserWarning) if ref.max_diff < spi * min_size else _nothing():
        lim = RateLimiter(spi, min_size, buffer)
    assert (lim.min_diff, lim.max_diff) == (ref.min_diff, ref.max_diff)
    for op, n in events:
        size = ref.inserts - ref.deletes
        if op == "delete":  # eviction: the table shrinks, inserts stay counted
            ref.deletes += min(n, size)
            continue
        rule = lim.can_sample if op == "sample" else lim.can_insert
        admitted = rule(ref.inserts, ref.samples, size, n)
        assert admitted == ref.admits(op, n), (op, n, ref.inserts, ref.samples, size)
        if op == "sample" and not admitted and size >= min_size:
            needed = lim.inserts_needed(ref.samples, n)
            assert lim.can_sample(needed, ref.samples, size, n) and not lim.can_sample(needed - 1, ref.samples,
                                                                                        size, n)
        if admitted:
            if op == "sample":
                ref.samples += n
            else:
                ref.inserts += n


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.mark.parametrize("bad", [
    {"samples_per_insert": 0}, {"samples_per_insert": float("nan")}, {"min_size_to_sample": 0},
    {"min_size_to_sample": 2.0}, {"error_buffer": -1.0}, {"error_buffer": (5, 1)}, {"error_buffer": "4"},
    {"timeout": -1}, {"name": "a.b"}, {"sync_every_s": -1.0},
])
def test_bad_parameters_are_refused_by_name(bad: dict[str, Any]) -> None:
    args: dict[str, Any] = {"samples_per_insert": 1.0, "min_size_to_sample": 10, "error_buffer": 5.0, **bad}
    with pytest.raises(SamplerParameterError, match=next(iter(bad))):
        RateLimiter(**args)


# -- in one process ------------------------------------------------------------------------------------

def _store(url: str, records: int) -> Store:
    st = open_store(url, schema(), mode="w")
    if records:
        with st.writer() as w:
            w.append(batch(records, 0), stream="s")
            w.commit()
    return st


SAMPLERS: dict[str, Callable[..., StoreSampler]] = {
    "uniform": lambda st, **kw: UniformSampler(st, 4, **kw),
    "prioritized": lambda st, **kw: PrioritizedSampler(st, 4, **kw),
    "epoch": lambda st, **kw: EpochSampler(st, 4, **kw),
    "sequence": lambda st, **kw: SequenceSampler(st, length=2, batch_size=4, **kw),
    "reservoir": lambda st, **kw: ReservoirSampler(st, 8, 4, **kw),
}


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_every_sampler_draws_what_the_rule_admits_then_times_out(kind: str, new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 20)
    lim = RateLimiter(1.0, 10, (0.0, 10.0), timeout=0.0)  # admits while inserts - samples - 4 >= 0
    sampler = SAMPLERS[kind](st, rate_limiter=lim)
    drawn = []
    with pytest.raises(RateLimitTimeout) as info:
        while True:
            drawn.append(sampler.sample())
    assert len(drawn) == 5 and all(len(r.rows) == 4 for r in drawn)
    assert (info.value.inserts, info.value.samples, info.value.size) == (20, 20, 20)
    assert sampler.rate_limit is not None and sampler.rate_limit.own == 20 and sampler.batches_drawn == 5
    doc, _ = st.load_state(f"ratelimit.records.{sampler.name}")  # type: ignore[misc]
    assert doc == {"limiter": "records", "table": "records", "sampler": sampler.name, "samples": 20}


def test_iteration_and_make_loader_wait_on_the_limiter(new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 20)
    lim = RateLimiter(0.5, 10, (0.0, 10.0), timeout=0.0)  # 20 inserts admit 10 samples: 2 minibatches of 4
    sampler = UniformSampler(st, 4, rate_limiter=lim)
    got = []
    with pytest.raises(RateLimitTimeout):
        for minibatch in make_loader(st, sampler):
            got.append(minibatch["indices"])
    assert len(got) == 2
    with st.writer() as w:  # 8 more records admit 4 more samples: the next minibatch, after a refresh
        w.append(batch(8, 1), stream="s2")
        w.commit()
    assert len(sampler.sample().rows) == 4

    # with workers the main process draws ahead (prefetch): minibatches count when drawn, and a
    # timeout met while prefetching is raised before the ones already drawn are delivered
    st2 = _store(new_url(), 20)
    ahead = UniformSampler(st2, 4, rate_limiter=lim)
    got = []
    with pytest.raises(RateLimitTimeout) as info:
        for minibatch in make_loader(st2, ahead, num_workers=1, multiprocessing_context="fork", prefetch_factor=2):
            got.append(minibatch["indices"])
    assert got == [] and info.value.samples == 8 and ahead.batches_drawn == 2


def test_timeout_raises_the_typed_error_naming_the_counts_and_counts_nothing(new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 5)
    lim = RateLimiter(1.0, 10, 4.0, timeout=0.3)
    sampler = UniformSampler(st, 4, rate_limiter=lim)
    start = time.monotonic()
    with pytest.raises(RateLimitTimeout, match="min_size_to_sample=10") as info:
        sampler.sample()
    assert time.monotonic() - start >= 0.3
    err = info.value
    assert isinstance(err, TimeoutError) and (err.inserts, err.samples, err.size, err.timeout) == (5, 0, 5, 0.3)
    assert "5 inserts, 0 samples, 5 records" in str(err) and "uniform-records" in str(err)

    with st.writer() as w:
        w.append(batch(5, 1), stream="s2")
        w.commit()
    st.refresh()
    # min_diff = 10 - 4 = 6: 10 inserts admit samples while 10 - samples - 4 >= 6, i.e. one minibatch
    assert len(sampler.sample().rows) == 4
    with pytest.raises(RateLimitTimeout, match="14 inserts to admit a minibatch of 4") as info:
        sampler.sample()
    assert (info.value.inserts, info.value.samples, info.value.size) == (10, 4, 10)
    assert sampler.rate_limit is not None and sampler.rate_limit.own == 4 and sampler.batches_drawn == 1


def test_a_sampler_continues_the_count_its_slot_holds(new_url: Callable[[], str]) -> None:
    url = new_url()
    st = _store(url, 20)
    lim = RateLimiter(1.0, 10, (0.0, 10.0), timeout=0.0, sync_every_s=3600.0)  # no sync by time
    a = UniformSampler(st, 4, rate_limiter=lim)
    for _ in range(4):
        a.sample()
    a.save()  # a save publishes the count (here between two syncs)
    b = UniformSampler(open_store(url, mode="a"), 4, rate_limiter=lim)  # not resumed: the count still carries
    assert b.rate_limit is not None and b.rate_limit.own == 16
    b.sample()
    with pytest.raises(RateLimitTimeout):
        b.sample()
    with pytest.raises(SamplerParameterError, match="rate_limiter"):
        UniformSampler(open_store(url, mode="r"), 4, rate_limiter=lim)


# -- across processes ----------------------------------------------------------------------------------

def test_learner_and_slower_collector_keep_the_ratio_and_a_restarted_learner_continues(
        new_url: Callable[[], str]) -> None:
    url = new_url()
    _store(url, 0)
    # min_diff = 2 * 20 - 8 = 32: after the warm-up the learner may draw 2 * inserts - 32 samples
    limiter = {"spi": 2.0, "min_size": 20, "error_buffer": 8.0, "timeout": 2.0}
    # the learner ends on the first timeout once all 150 inserts are in; one met before (the
    # collector still starting up or stalled on a loaded machine) is reported and drawn past
    learner = Child("learner", url=url, limiter=limiter, batch_size=4, name="learner", until_inserts=150)
    collector = None
    try:
        assert learner.line(60) == {"ready": 0, "batches_drawn": 0}
        collector = Child("collector", url=url, records=5, commits=30, pace=0.02)
        assert collector.result(60) == {"committed": 150}
        out = learner.summary(60)
    finally:
        for child in (learner, collector):
            if child is not None:
                child.kill()
    # min_size_to_sample: the first minibatch waited for 20 records
    assert out["first"]["size"] >= 20 and out["first"]["inserts"] >= 20
    assert out["worst"] <= 0  # never ahead of the rule
    # it ended blocked on the last inserts: 2 * 150 - 32 = 268 samples admitted, not one minibatch more
    assert out["timed_out"]["inserts"] == 150 and out["own"] == 268 == out["batches"] * 4
    assert 32 <= 2.0 * 150 - out["own"] < 32 + 4  # Reverb's error, inserts * spi - samples, at min_diff

    # a new learner process resuming: the counts it had, and its sampler state
    st = open_store(url, mode="a")
    with st.writer() as w:
        w.append(batch(10, 9), stream="more")
        w.commit()
    again = Child("learner", url=url, limiter=limiter, batch_size=4, name="learner", resume=True)
    try:
        assert again.line(60) == {"ready": 268, "batches_drawn": 67}
        out = again.summary(60)  # all 160 inserts are in before it starts: its only timeout is the end
    finally:
        again.kill()
    assert out["own"] == 2 * 160 - 32 and out["batches"] == 5 and out["batches_drawn"] == 72
    assert out["early_timeouts"] == 0 and out["timed_out"]["inserts"] == 160


def test_two_learners_share_one_limiter(new_url: Callable[[], str]) -> None:
    url = new_url()
    _store(url, 0)
    limiter = {"spi": 1.0, "min_size": 10, "error_buffer": 10.0, "timeout": 1.0, "name": "shared",
               "sync_every_s": 0.0}
    # each learner ends on its first timeout once all 200 inserts are in; earlier ones are drawn past
    learners = [Child("learner", url=url, limiter=limiter, batch_size=4, name=f"l{i}", until_inserts=200)
                for i in range(2)]
    collector = None
    try:
        assert [c.line(60) for c in learners] == [{"ready": 0, "batches_drawn": 0}] * 2
        # the collector starts only once both learners' clocks ran out on an empty table, as when its
        # start-up (imports) outlasts their timeout on a loaded machine: they must wait on, not end
        for c in learners:
            doc = c.line(60)
            assert "early_timeout" in doc, f"the learner ended on an empty table: {doc}"
            early = doc["early_timeout"]
            assert (early["inserts"], early["samples"], early["size"]) == (0, 0, 0)
        collector = Child("collector", url=url, records=5, commits=40, pace=0.02)
        assert collector.result(60) == {"committed": 200}
        outs = [c.summary(60) for c in learners]
    finally:
        for child in [*learners, collector]:
            if child is not None:
                child.kill()
    total = sum(o["own"] for o in outs)
    assert all(o["own"] > 0 and o["early_timeouts"] >= 1 and o["timed_out"]["inserts"] == 200 for o in outs)
    # each ended blocked with the other's final count read (sync_every_s=0): within one minibatch of the
    # rule (inserts - samples >= min_diff = 0), plus the staleness bound 2 * (P - 1) * batch
    assert 200 - 4 < total <= 200 + 2 * 1 * 4
    st = open_store(url, mode="r")
    slots = {s: st.load_state(s)[0]["samples"] for s in st.state_slots() if s.startswith("ratelimit.shared.")}  # type: ignore[index]
    assert slots == {"ratelimit.shared.l0": outs[0]["own"], "ratelimit.shared.l1": outs[1]["own"]}


def test_a_throttled_writer_waits_for_the_learner(new_url: Callable[[], str]) -> None:
    url = new_url()
    st = _store(url, 0)
    # max_diff = 10 + 10 = 20: the collector may run 20 records ahead of the samples, min_diff = 0
    # the writer's timeout is generous: it waits on the learner below, which is not about timing
    limiter = {"spi": 1.0, "min_size": 10, "error_buffer": 10.0, "timeout": 60.0}
    collector = Child("collector", url=url, records=5, commits=30, pace=0, limiter=limiter)
    try:
        # 4 commits of 5 fit (20 inserts, no sample yet), the fifth waits for the learner
        seen = [collector.line(60) for _ in range(4)]
        assert [(c["inserts"], c["samples"]) for c in seen] == [(5, 0), (10, 0), (15, 0), (20, 0)]
        sampler = UniformSampler(st, 4, rate_limiter=RateLimiter(1.0, 10, 10.0, timeout=2.0))
        drawn = 0
        while True:  # until blocked with all 150 inserts in: a timeout before (a slow commit) draws on
            try:
                sampler.sample()
            except RateLimitTimeout as exc:
                if exc.inserts < 150 and collector.proc.poll() is None:  # (a dead one fails below)
                    continue
                break
            drawn += 1
        while True:
            line = collector.line(60)
            if "committed" in line:
                break
            seen.append(line)
        assert collector.proc.wait(60) == 0
    finally:
        collector.kill()
    assert line == {"committed": 150} and len(seen) == 30
    assert seen[4]["samples"] > 0  # the fifth commit was admitted only once the learner drew
    assert all(c["inserts"] - c["samples"] <= 20 for c in seen)  # never more than max_diff ahead
    assert drawn * 4 == 148  # and the learner drew what the 150 inserts admit (min_diff = 0)


def test_a_throttled_commit_that_times_out_writes_nothing_and_keeps_its_appends(new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 0)
    lim = RateLimiter(1.0, 10, 10.0, timeout=0.0)  # max_diff 20
    w = st.writer(rate_limiter=lim)
    for i in range(4):
        w.append(batch(5, i), stream="s")
        w.commit()
    w.append(batch(5, 4), stream="s")
    with pytest.raises(RateLimitTimeout, match="a writer") as info:
        w.commit()
    assert (info.value.inserts, info.value.samples, info.value.size) == (20, 0, 20)
    st.refresh()
    assert len(st) == 20 and st.default.total_committed() == 20
    sampler = UniformSampler(st, 8, rate_limiter=lim)
    sampler.sample()  # 8 samples admit the pending 5 records: 25 - 8 <= 20 (sync_every_s=0.1: save publishes)
    sampler.save()
    result = w.commit()
    assert result is not None and st.default.total_committed() == 25
    w.close()


# -- counts read from other processes' slots ---------------------------------------------------------------

FORGED = [10**400, 10**31, 2**52, -5, 3.5, "many", True, None]


@pytest.mark.parametrize("forged", FORGED, ids=["1e400", "1e31", "2**52", "-5", "3.5", "str", "bool", "None"])
def test_a_forged_slot_is_ignored_with_a_warning_never_an_overflow_or_a_stall(
        forged: Any, new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 20)
    st.save_state("ratelimit.records.evil", {"limiter": "records", "table": "records", "samples": forged})
    lim = RateLimiter(1.0, 10, (0.0, 10.0), timeout=0.0)  # admits while inserts - samples - 4 >= 0
    with pytest.warns(SlotCountWarning, match="'ratelimit.records.evil'") as seen:
        sampler = UniformSampler(st, 4, rate_limiter=lim)
        drawn = [sampler.sample() for _ in range(5)]  # as without the slot: 5 minibatches, then the timeout
    assert len(seen) == 1  # once per slot and value, however often it is read
    assert len(drawn) == 5
    with pytest.raises(RateLimitTimeout) as info:
        sampler.sample()
    assert (info.value.inserts, info.value.samples) == (20, 20)
    # a throttled writer reads the same slots: it counts the forged one as 0 too
    with pytest.warns(SlotCountWarning), st.writer(rate_limiter=RateLimiter(1.0, 10, 10.0, timeout=0.0)) as w:
        w.append(batch(5, 1), stream="s2")
        assert w.commit() is not None  # 25 * 1 - 20 <= max_diff 20


def test_a_count_over_the_limit_is_checked_again_after_a_refresh(new_url: Callable[[], str]) -> None:
    """A count over the limit for this handle's inserts may be a newer view's: refreshed, it is taken."""
    url = new_url()
    st = _store(url, 20)
    lim = RateLimiter(1.0, 10, (0.0, 10.0), timeout=0.0)
    other = open_store(url, mode="a")
    with other.writer() as w:  # committed after st's last refresh: st's view has 20 inserts
        w.append(batch(20_000, 1), stream="big")
        w.commit()
    assert lim.sample_limit(20) < 1_100_000 <= lim.sample_limit(20_020)
    other.save_state("ratelimit.records.busy", {"limiter": "records", "table": "records", "samples": 1_100_000})
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlotCountWarning)
        sampler = UniformSampler(st, 4, rate_limiter=lim)  # no warning: the refresh shows 20,020 inserts
    assert sampler.rate_limit is not None and sampler.rate_limit.others == 1_100_000


def test_a_forged_count_in_the_sampler_state_is_ignored(new_url: Callable[[], str]) -> None:
    st = _store(new_url(), 20)
    lim = RateLimiter(1.0, 10, (0.0, 10.0), timeout=0.0)
    a = UniformSampler(st, 4, name="learner", rate_limiter=lim)
    a.sample()
    a.save()
    doc, arrays = st.load_state("learner")  # type: ignore[misc]
    st.save_state("learner", {**doc, "rate_limit_samples": 10**400}, arrays)
    with pytest.warns(SlotCountWarning, match="'learner'"):
        b = UniformSampler(st, 4, name="learner", rate_limiter=lim, resume=True)
    assert b.rate_limit is not None and b.rate_limit.own == 4  # the slot's count, not the forged one
    assert len(b.sample().rows) == 4


@pytest.mark.parametrize("forged", [10**400, 10**31], ids=["1e400", "1e31"])
def test_a_learner_process_without_timeout_is_not_stalled_by_a_slot_another_process_forged(
        forged: int, new_url: Callable[[], str]) -> None:
    url = new_url()
    _store(url, 40)
    forger = Child("forger", url=url, slot="ratelimit.records.evil", samples=forged)
    try:
        assert forger.result(60) == {"forged": "ratelimit.records.evil"}
    finally:
        forger.kill()
    # timeout=None waits for ever: before, 1e31 stalled it and 1e400 raised OverflowError
    limiter = {"spi": 1.0, "min_size": 10, "error_buffer": (0.0, 10.0), "timeout": None}
    learner = Child("learner", url=url, limiter=limiter, batch_size=4, name="learner", max_batches=5)
    try:
        assert learner.line(60) == {"ready": 0, "batches_drawn": 0}
        out = learner.result(60)
    finally:
        learner.kill()
    assert out["batches"] == 5 and out["own"] == 20 and out["worst"] <= 0
