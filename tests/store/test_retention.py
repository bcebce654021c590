"""Which records a capped store keeps (store/retention.py), against the format's rule taken
record by record (docs/FORMAT.md, "Reading a store"): fragments of four writers (a writer's
fragments in row order, its commit times increasing; a commit may go on in the writer's next
fragment), parts of other writers sharing commit times (ties broken by writer), parts without
records. Readers and writers apply it in test_reader_follow.py, test_capacity.py and
test_writer_liveness.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from replaystore.store.fragment import Fragment
from replaystore.store.retention import retained_parts, visible_from


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
