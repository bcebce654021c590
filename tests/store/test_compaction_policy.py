"""Which fragments compaction merges (store/maintenance/compaction.py), as properties over generated
fragment lists: runs are adjacent, of one kind, within the size cap, and as long as the
policy allows. The merges themselves run through real writers in test_write_path.py,
test_segments.py and test_vacuum.py."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given
from hypothesis import strategies as st

from replaystore.store.format.fragment import Fragment, SegmentRef
from replaystore.store.maintenance.compaction import COMPACT_FANIN, due_run, full_runs, segment_run, tiered_run

MAX_ROWS = 64

# one fragment: (rows, mostly small enough for a tiered merge; segment name or None; gap of
# rows before it; visible)
SPEC = st.tuples(st.integers(1, 10) | st.integers(1, 80), st.sampled_from([None, None, "s0", "s1"]),
                 st.sampled_from([0, 0, 0, 3]), st.booleans())
# the tail a tiered merge looks at: mostly small fragments of their own
SMALL = st.tuples(st.integers(1, 12), st.sampled_from([None] * 5 + ["s0"]), st.just(0), st.just(True))


def _fragments(specs: list[tuple[int, str | None, int, bool]]) -> tuple[list[Fragment], set[str]]:
    frags, visible, row = [], set(), 0
    for i, (rows, seg, gap, vis) in enumerate(specs):
        row += gap
        ref = None if seg is None else SegmentRef(seg, row, {}, 1 << 20, {}, {})
        frags.append(Fragment(0, "records", f"f{i}", row, rows, {}, [0], [(i, i, rows)], ref))
        if vis:
            visible.add(f"f{i}")
        row += rows
    return frags, visible


def _kind(f: Fragment) -> str | None:
    return None if f.segment is None else f.segment.name


def _may_join(a: Fragment, b: Fragment) -> bool:
    """Whether ``b`` may follow ``a`` in one run, size aside: adjacent rows, one kind."""
    return a.row_start + a.rows == b.row_start and _kind(a) == _kind(b)


@given(st.lists(SPEC, max_size=30))
def test_full_runs_are_adjacent_visible_runs_of_one_kind_within_the_cap(specs: list) -> None:
    frags, visible = _fragments(specs)
    runs = full_runs(frags, visible, MAX_ROWS)
    position = {f.name: i for i, f in enumerate(frags)}
    seen: list[int] = []
    for run in runs:
        assert len(run) >= 2
        at = [position[f.name] for f in run]
        assert at == list(range(at[0], at[0] + len(run)))  # consecutive in row order
        seen += at
        assert all(f.name in visible for f in run)
        assert all(_may_join(a, b) for a, b in pairwise(run))
        if run[0].segment is None:  # rewritten: the merged fragment stays within the cap
            assert sum(f.rows for f in run) <= MAX_ROWS
    assert seen == sorted(set(seen))  # disjoint, in order


@given(st.lists(SPEC, max_size=30))
def test_full_runs_leave_no_two_mergeable_neighbours_apart(specs: list) -> None:
    """Two neighbours that may join (both visible, adjacent rows, one kind) and fit together
    under the cap end up in one run."""
    frags, visible = _fragments(specs)
    runs = full_runs(frags, visible, MAX_ROWS)
    run_of = {f.name: k for k, run in enumerate(runs) for f in run}
    for a, b in pairwise(frags):
        if not (a.name in visible and b.name in visible and _may_join(a, b)):
            continue
        k = run_of.get(a.name)
        if k is not None and k == run_of.get(b.name):
            continue
        assert a.segment is None  # one segment's neighbours: no size cap, always one run
        before = runs[k] if k is not None else [a]  # (a run that ends with a)
        assert a.rows >= MAX_ROWS or b.rows >= MAX_ROWS or sum(f.rows for f in before) + b.rows > MAX_ROWS


@given(st.lists(SPEC, min_size=1, max_size=30))
def test_segment_run_is_the_longest_suffix_in_the_last_fragments_segment(specs: list) -> None:
    frags, _ = _fragments(specs)
    if frags[-1].segment is None:
        return
    run = segment_run(frags)
    assert run == frags[-len(run):]
    assert {_kind(f) for f in run} == {_kind(frags[-1])}
    if len(run) < len(frags):
        assert _kind(frags[-len(run) - 1]) != _kind(frags[-1])


@given(st.lists(SPEC, max_size=30) | st.lists(SMALL, max_size=30))
@example([(5, None, 0, True), (1, None, 0, True)])  # an older fragment larger than the newer ones
@example([(8, None, 0, True)] * 9)  # small enough and tiered, but together past the cap
def test_tiered_run_is_a_size_tiered_suffix_of_small_own_fragments(specs: list) -> None:
    frags, _ = _fragments(specs)
    run = tiered_run(frags, MAX_ROWS)
    assert run == frags[len(frags) - len(run):]
    assert all(f.segment is None and f.rows * COMPACT_FANIN <= MAX_ROWS for f in run)
    assert sum(f.rows for f in run) <= MAX_ROWS
    for i, f in enumerate(run[:-1]):  # each older fragment at most what the newer ones add up to
        assert f.rows <= sum(g.rows for g in run[i + 1:])
    if len(run) < len(frags):  # the fragment before the run could not join it
        f, total = frags[len(frags) - len(run) - 1], sum(g.rows for g in run)
        assert (f.segment is not None or f.rows * COMPACT_FANIN > MAX_ROWS or total + f.rows > MAX_ROWS
                or (bool(run) and f.rows > total))


@given(st.lists(SPEC, max_size=30) | st.lists(SMALL, max_size=30))
def test_due_run_waits_for_the_fan_in(specs: list) -> None:
    frags, _ = _fragments(specs)
    run = due_run(frags, MAX_ROWS)
    if not frags:
        assert run == []
        return
    suffix = segment_run(frags) if frags[-1].segment is not None else tiered_run(frags, MAX_ROWS)
    assert run == (suffix if len(suffix) >= COMPACT_FANIN else [])
