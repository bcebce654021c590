"""The features' indexes followed across store changes equal the same indexes built afresh.

The frame index (``stack=``), the n-step window summary (``n_step=``) and HER's episode
bounds follow the table at the cost of each change. Random histories: three writers
appending to interleaved streams (int and str keys) with step gaps, resets, terminated and
truncated records, committing in any order (a stream's steps may arrive out of order),
compacting, and a capacity evicting the oldest records. After every change each followed
index (never rebuilt) answers exactly as one built from scratch on a store opened at the
same point, and the frame index also as a dense numpy reference of the stacking rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.loaders import HER, GoalFields
from replaystore.loaders.follow import SortedRows
from replaystore.loaders.her import _Episodes
from replaystore.loaders.nstep import WindowIndex
from replaystore.loaders.stacking import FrameIndex, Stacker
from replaystore.schemas import frames
from replaystore.store import StreamIndex, open_store
from support.indexops import fresh_at

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = [0, 1, "a", "b"]
FLAGS = hs.lists(hs.sampled_from([False, False, False, True]), min_size=6, max_size=6)

APPEND = hs.tuples(hs.just("append"), hs.integers(0, 2), hs.sampled_from(KEYS), hs.integers(1, 6),
                   hs.sampled_from([0, 0, 0, 1, 3]), FLAGS, FLAGS, FLAGS)
STEP = hs.tuples(APPEND, hs.sampled_from([None, "commit", "commit", "commit"]))
ops = hs.lists(hs.one_of(STEP, STEP, STEP, hs.tuples(hs.tuples(hs.just("compact"), hs.integers(0, 2)), hs.none())),
               min_size=8, max_size=30).map(lambda steps: [op for step, then in steps
                                                for op in ([step] if then is None else [step, (then, step[1])])])


class Scenario:
    """Three writers on one store of frame records; applies ops, yields after each change reaching the log."""

    def __init__(self, url: str, capacity: int | None) -> None:
        self.url = url
        self.st = open_store(url, frames((2,), actions=2), mode="w", capacity=capacity)
        self.writers = [self.st.writer() for _ in range(3)]
        self.next_step = dict.fromkeys(KEYS, 0)
        self.rng = np.random.default_rng(0)

    def run(self, plan: list[Any]) -> Iterator[None]:
        try:
            for op in plan:
                w = self.writers[op[1]]
                if op[0] == "append":
                    _, _, key, n, gap, resets, term, trunc = op
                    steps = self.next_step[key] + gap + np.arange(n)
                    self.next_step[key] = int(steps[-1]) + 1
                    rec = {"frame": self.rng.integers(0, 255, (n, 2)).astype(np.uint8),
                           "action": np.zeros(n, np.int64), "reward": self.rng.standard_normal(n).astype(np.float32),
                           "terminated": np.array(term[:n]), "truncated": np.array(trunc[:n])}
                    w.append(rec, stream=[key] * n, step=steps, reset=np.array(resets[:n]))
                    continue
                if op[0] == "commit" and w.commit() is None:
                    continue
                if op[0] == "compact" and not w.compact():
                    continue
                yield
        finally:
            for w in self.writers:
                w.close()


def histories(new_url: Callable[[], str], plan: list[Any], capacity: int | None) -> Iterator[tuple[Any, Any]]:
    """``(reader, fresh)`` after every change: the reader followed it, ``fresh`` was opened at the same point."""
    sc = Scenario(new_url(), capacity)
    reader = open_store(sc.url, mode="r")
    yield reader, reader
    for _ in sc.run(plan):
        yield reader, fresh_at(sc.url, reader)


def dense_windows(index: StreamIndex, rows: np.ndarray, stack: int, padding: str) -> np.ndarray:
    """The stacking rules on the stream index's dense arrays: the frame rows of each row's window."""
    r, steps, resets, sids = index.rows, index.steps, index.resets, index.stream_ids
    m = len(r)
    brk = np.ones(m, dtype=bool)
    brk[1:] = (sids[1:] != sids[:-1]) | (steps[1:] - steps[:-1] != 1) | resets[1:]
    out = np.full((len(rows), stack + 1), -1, dtype=np.int64)
    where = {int(row): i for i, row in enumerate(r.tolist())}
    for j, row in enumerate(rows.tolist()):
        p = where[row]
        first = p
        while not brk[first]:
            first -= 1
        for c, q in enumerate(range(p - stack + 1, p + 2)):
            if q == p + 1:
                if q < m and not brk[q]:
                    out[j, c] = r[q]
            elif q >= first:
                out[j, c] = r[q]
            elif padding == "reset":
                out[j, c] = r[first]
    return out


@SETTINGS
@given(plan=ops, capacity=hs.one_of(hs.none(), hs.integers(3, 30)), stack=hs.integers(1, 4))
def test_followed_frame_index_equals_a_fresh_one(new_url: Callable[[], str], plan: list[Any], capacity: int | None,
                                                 stack: int) -> None:
    followed: FrameIndex | None = None
    stacker: Stacker | None = None
    for reader, fresh in histories(new_url, plan, capacity):
        if stacker is None:
            stacker = Stacker(reader.default, stack, "reset", "frame")
        got = stacker.index()
        followed = followed or got
        assert got is followed, "the frame index was rebuilt instead of followed"
        want = FrameIndex(fresh.default.stream_index(), fresh.default)
        rows = fresh.default.row_ids()
        assert np.array_equal(got.valid_rows, want.valid_rows)
        assert np.array_equal(got.invalid_rows, want.invalid_rows)
        still = FrameIndex(fresh.default.stream_index())  # built from the index alone (no following)
        assert np.array_equal(still.valid_rows, want.valid_rows)
        assert np.array_equal(still.windows(rows, stack, "zero"), want.windows(rows, stack, "zero"))
        assert np.array_equal(np.union1d(got.valid_rows, got.invalid_rows), rows)
        probe = np.concatenate((rows, rows[:3] + 10**6, [-1]))
        assert np.array_equal(got.drawable(probe), want.drawable(probe))
        for padding in ("reset", "zero"):
            w = got.windows(rows, stack, padding)
            assert np.array_equal(w, want.windows(rows, stack, padding))
            assert np.array_equal(w, dense_windows(fresh.default.stream_index(), rows, stack, padding))
        assert np.array_equal(got.windows(np.array([-1, *rows[:2]]), stack, "zero")[0], np.full(stack + 1, -1))


@SETTINGS
@given(plan=ops, capacity=hs.one_of(hs.none(), hs.integers(3, 30)), n=hs.integers(1, 4), stacked=hs.booleans(),
       gamma=hs.sampled_from([0.0, 0.5, 0.99, 1.0]))
def test_followed_nstep_windows_equal_fresh_ones(new_url: Callable[[], str], plan: list[Any], capacity: int | None,
                                                 n: int, stacked: bool, gamma: float) -> None:
    index: WindowIndex | None = None
    followed = None
    for reader, fresh in histories(new_url, plan, capacity):
        if index is None:
            index = WindowIndex(reader.default, n, stacked=stacked)
        rows = fresh.default.row_ids()
        got = index.nstep(rows, gamma)
        followed = followed or index._follow
        assert index._follow is followed, "the window summary was rebuilt instead of followed"
        want = WindowIndex(fresh.default, n, stacked=stacked).nstep(rows, gamma)
        for name in ("last", "reward", "k", "terminated", "truncated", "discount"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name


@SETTINGS
@given(plan=ops, capacity=hs.one_of(hs.none(), hs.integers(3, 30)),
       strategy=hs.sampled_from(["future", "final", "episode"]), online=hs.booleans())
def test_followed_episode_bounds_equal_fresh_ones(new_url: Callable[[], str], plan: list[Any], capacity: int | None,
                                                  strategy: str, online: bool) -> None:
    fields = GoalFields(terminated="terminated", truncated="truncated")
    her = HER(strategy, 4, lambda a, d, i: a, online=online, fields=fields)
    followed = None
    for reader, fresh in histories(new_url, plan, capacity):
        rows = fresh.default.row_ids()
        ep = her._index(reader.default)
        followed = followed or ep
        assert ep is followed, "the episode bounds were rebuilt instead of followed"
        want = _Episodes(fresh.default, fields)
        want.sync()
        if not len(rows):
            continue
        a, b = ep.bounds(rows), want.bounds(rows)
        for e, x in ((ep, a), (want, b)):  # positions as row ids (each index numbers its own)
            assert e.index is not None
            buf = e.index.seg.cols["rows"]
            assert np.array_equal(buf[x[4] + x[0]], rows)
        rows_of = [ep.index.seg.cols["rows"], want.index.seg.cols["rows"]]  # type: ignore[union-attr]
        assert np.array_equal(rows_of[0][a[4] + a[1]], rows_of[1][b[4] + b[1]])  # episode's first row
        assert np.array_equal(rows_of[0][a[4] + a[2] - 1], rows_of[1][b[4] + b[2] - 1])  # its last row
        assert np.array_equal(a[2] - a[1], b[2] - b[1])
        assert np.array_equal(a[3], b[3])  # complete
        other = HER(strategy, 4, lambda a, d, i: a, online=online, fields=fields)
        other.rng.bit_generator.state = her.rng.bit_generator.state
        assert np.array_equal(her.goal_rows(reader.default, rows), other.goal_rows(fresh.default, rows))


def test_episode_bounds_match_the_dense_reference_after_evictions(new_url: Callable[[], str]) -> None:
    # an episode whose predecessor's end was evicted is no longer known to have begun: incomplete
    st = open_store(new_url(), frames((2,), actions=2), mode="w", capacity=3)
    fields = GoalFields(terminated="terminated", truncated="truncated")
    ep = _Episodes(st.default, fields)
    with st.writer() as w:
        for lo in (5, 8):
            n = 3
            w.append({"frame": np.zeros((n, 2), np.uint8), "action": np.zeros(n, np.int64),
                      "reward": np.zeros(n, np.float32), "terminated": np.arange(n) == n - 1,
                      "truncated": np.zeros(n, bool)}, stream=0, step=np.arange(lo, lo + n))
            w.commit()
            st.refresh()
            ep.sync()
    want = _Episodes(open_store(st.url, mode="r").default, fields)
    want.sync()
    rows = st.default.row_ids()
    assert rows.tolist() == [3, 4, 5]  # the second episode; the first, and its end, evicted
    assert np.array_equal(ep.bounds(rows)[3], want.bounds(rows)[3])
    assert not ep.bounds(rows)[3].any()


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.tuples(hs.booleans(), hs.lists(hs.integers(0, 60), max_size=8)), max_size=20))
def test_sorted_rows_is_a_sorted_set(steps: list[tuple[bool, list[int]]]) -> None:
    s, ref = SortedRows(), set()
    for add, values in steps:
        v = np.unique(np.array(values, dtype=np.int64))
        if add:
            v = v[~np.isin(v, list(ref))]
            s.add(v)
            ref |= set(v.tolist())
        elif len(v):
            iv = np.stack((v, v + 1), axis=1)
            s.remove_in(iv)
            ref -= {x for lo, hi in iv.tolist() for x in range(lo, hi)}
        assert s.values.tolist() == sorted(ref)
        if ref and add:
            some = np.array(sorted(ref)[::3], dtype=np.int64)
            s.remove(some)
            ref -= set(some.tolist())
            assert s.values.tolist() == sorted(ref)


def test_a_commit_costs_what_it_added_not_the_table(new_url: Callable[[], str]) -> None:
    # 4,000 records in 4 streams; then commits of 8 records (2 per stream) and an eviction:
    # each index recomputes only the new entries and a few before them in each stream
    st = open_store(new_url(), frames((2,), actions=2), mode="w", capacity=4_000)
    fields = GoalFields(terminated="terminated", truncated="truncated")
    rng = np.random.default_rng(0)
    nxt = [0] * 4

    def commit(w: Any, per: int) -> None:
        for s in range(4):
            steps = nxt[s] + np.arange(per)
            nxt[s] += per
            w.append({"frame": np.zeros((per, 2), np.uint8), "action": np.zeros(per, np.int64),
                      "reward": rng.standard_normal(per).astype(np.float32), "terminated": steps % 50 == 49,
                      "truncated": np.zeros(per, bool)}, stream=s, step=steps, reset=steps % 50 == 0)
        w.commit()
        st.refresh()

    with st.writer() as w:
        commit(w, 1_000)
        seen: list[int] = []
        followers = [FrameIndex(st.default.stream_index(), st.default), _Episodes(st.default, fields)]
        nstep = WindowIndex(st.default, 3)
        nstep.nstep(st.default.row_ids()[:1], 0.9)
        assert nstep._follow is not None
        for f in [*followers, nstep._follow]:
            f.sync()
            original = f._compute
            f._compute = lambda *a, original=original: (seen.append(len(a[3])), original(*a))[1]  # type: ignore
        for _ in range(3):
            commit(w, 2)  # 8 records, and as many evicted
            assert len(st.default) == 4_000
            seen.clear()
            for f in followers:
                assert f.sync()
            nstep.nstep(st.default.row_ids()[:1], 0.9)
            assert len(seen) == 3
            assert max(seen) <= 8 + 4 * 3, seen  # the new entries, and up to n before them per stream


def test_followers_catch_up_after_more_changes_than_the_index_remembers(new_url: Callable[[], str]) -> None:
    # the stream index names the streams touched by its last 64 changes; further behind, every
    # stream is compared (still without a rebuild)
    st = open_store(new_url(), frames((2,), actions=2), mode="w", capacity=300)
    fields = GoalFields(terminated="terminated", truncated="truncated")
    fi = FrameIndex(st.default.stream_index(), st.default)
    ep = _Episodes(st.default, fields)
    win = WindowIndex(st.default, 2)
    with st.writer() as w:
        for i in range(70):
            steps = np.arange(3 * i, 3 * i + 3)
            w.append({"frame": np.zeros((3, 2), np.uint8), "action": np.zeros(3, np.int64),
                      "reward": np.full(3, i, np.float32), "terminated": steps % 7 == 6,
                      "truncated": np.zeros(3, bool)}, stream=i % 3, step=steps, reset=steps % 7 == 0)
            w.commit()
            st.refresh()
            if i == 1:
                fi.sync()
                ep.sync()
                win.nstep(st.default.row_ids()[:1], 0.5)
    built = fi.index
    fi.sync()
    assert fi.index is built
    fresh = open_store(st.url, mode="r").default
    rows = fresh.row_ids()
    want = FrameIndex(fresh.stream_index(), fresh)
    assert np.array_equal(fi.valid_rows, want.valid_rows)
    assert np.array_equal(fi.windows(rows, 3, "reset"), want.windows(rows, 3, "reset"))
    ep.sync()
    other = _Episodes(fresh, fields)
    other.sync()
    assert np.array_equal(ep.bounds(rows)[3], other.bounds(rows)[3])
    assert np.array_equal(ep.bounds(rows)[2] - ep.bounds(rows)[1], other.bounds(rows)[2] - other.bounds(rows)[1])
    got, exp = win.nstep(rows, 0.5), WindowIndex(fresh, 2).nstep(rows, 0.5)
    assert np.array_equal(got.reward, exp.reward) and np.array_equal(got.last, exp.last)
