"""Which records a capped store keeps (store/read/retention.py), against the format's rule taken
record by record (docs/FORMAT.md, "Reading a store"): fragments of four writers (a writer's
fragments in row order, its commit times increasing; a commit may go on in the writer's next
fragment), parts of other writers sharing commit times (ties broken by writer), parts without
records. Readers and writers apply it in test_reader_follow.py, test_capacity.py and
test_writer_liveness.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.store.format.fragment import Fragment, SegmentRef
from replaystore.store.read.retention import reclaimable, retained_parts, visible_from


def _visible_from(frags: list[Fragment], capacity: int) -> list[int]:
    """docs/FORMAT.md, "Reading a store", step 5, record by record: every part of every fragment,
    newest first by ``(time_ns, writer, seq)``; records taken until ``capacity`` are."""
    parts = []
    for i, f in enumerate(frags):
        offset = 0
        for seq, time_ns, rows in f.parts:
            parts.append((time_ns, f.writer, seq, i, offset, rows))
            offset += rows
    vis_from = [f.rows for f in frags]
    budget = capacity
    for _, _, _, i, offset, rows in sorted(parts, reverse=True):
        for r in reversed(range(offset, offset + rows)):  # newer records: higher rows
            if budget == 0:
                return vis_from
            vis_from[i] = r
            budget -= 1
    return vis_from


def _retained(frags: list[Fragment], budget: int) -> set[tuple[int, int]]:
    """``(writer, seq)`` of the parts holding one of the newest ``budget`` records, record by
    record, and of the empty parts with fewer than ``budget`` records in newer commits."""
    records = sorted(((t, f.writer, seq) for f in frags for seq, t, rows in f.parts for _ in range(rows)),
                     reverse=True)
    kept = {(writer, seq) for _, writer, seq in records[:budget]}
    for f in frags:
        for seq, t, rows in f.parts:
            if rows == 0 and sum(r > (t, f.writer, seq) for r in records) < budget:
                kept.add((f.writer, seq))
    return kept


PARTS = st.lists(st.tuples(st.integers(0, 3), st.booleans(),
                          st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=5)),
                max_size=8)


@settings(max_examples=300, deadline=None)
@given(spec=PARTS, capacity=st.integers(1, 40))
def test_eviction_keeps_the_newest_records(spec: list[tuple[int, bool, list[tuple[int, int]]]],
                                           capacity: int) -> None:
    """The vectorised eviction (``visible_from``) and the parts a reclaim keeps
    (``retained_parts``) against the rule taken record by record."""
    frags, seqs, clock = [], dict.fromkeys(range(4), 0), dict.fromkeys(range(4), 0)
    for writer, spills, parts in spec:
        described = []
        if spills and seqs[writer]:  # the writer's last commit went on in this fragment (a new segment)
            described.append((seqs[writer] - 1, clock[writer], parts[0][1]))
            parts = parts[1:]
        for step, rows in parts:  # a writer's commit times increase; other writers' may tie with them
            clock[writer] += 1 + step
            described.append((seqs[writer], clock[writer], rows))
            seqs[writer] += 1
        n = sum(r for _, _, r in described)
        frags.append(Fragment(writer, "records", f"f{len(frags)}", 0, n, {}, [], described))
    assert visible_from(frags, capacity).tolist() == _visible_from(frags, capacity)
    assert retained_parts(frags, capacity) == _retained(frags, capacity)


# a live fragment: (writer 0-2, segment 0-2 of that writer or None, rows 1-4, rows evicted 0-4)
FRAG = st.tuples(st.integers(0, 2), st.sampled_from([None, 0, 1, 2]), st.integers(1, 4), st.integers(0, 4))


@given(frags=st.lists(FRAG, max_size=12), writing=st.sets(st.sampled_from(["s0", "s1", "s2"])),
       gone=st.sets(st.integers(0, 2)), capacity=st.integers(1, 10))
def test_reclaimable_follows_the_format_rule(frags: list[tuple[int, int | None, int, int]], writing: set[str],
                                             gone: set[int], capacity: int) -> None:
    """docs/FORMAT.md, "Capacity and reclamation": writer 0 may delete a fragment of its own
    once wholly evicted, and a segment once every fragment it backs is and nobody adds to it:
    it is full, or writer 0's and not being written, or its writer is gone. Whether another
    writer is gone is asked only about such a segment that is not full."""
    counts, filled = [], {}
    for i, (writer, seg, rows, evicted) in enumerate(frags):
        ref = None
        if seg is not None:
            at = filled.get((writer, seg), 0)
            ref = SegmentRef(f"s{seg}", at, {}, capacity, {}, {})
            filled[(writer, seg)] = at + rows
        counts.append((Fragment(writer, "records", f"f{i}", i * 10, rows, {}, [0], [(i, i, rows)], ref),
                       min(evicted, rows)))
    asked: list[int] = []

    def is_gone(writer: int) -> bool:
        asked.append(writer)
        return writer in gone

    got = reclaimable(counts, 0, writing, is_gone)
    want, segments = set(), {}
    for f, v in counts:
        if f.segment is None:
            if v == f.rows:
                want.add(f.path)
        else:
            segments.setdefault(f.path, []).append((f, v))
    should_ask = set()
    for path, backed in segments.items():
        owner, name = backed[0][0].writer, backed[0][0].segment.name
        if all(v == f.rows for f, v in backed):
            full = sum(f.rows for f, _ in backed) == capacity
            if not full and owner != 0:
                should_ask.add(owner)
            if full or (name not in writing if owner == 0 else owner in gone):
                want.add(path)
    assert got == want
    assert set(asked) == should_ask
