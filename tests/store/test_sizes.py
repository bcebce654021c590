"""Sizes a user can trust (docs/GUIDE.md, "Size on disk"; docs/FORMAT.md, "Right-sizing a segment").

A segment is created at its full capacity as sparse files; a writer that closes (or ``compact()``
for segments appends have left) copies each under-filled one into a right-sized segment and
publishes it with a ``compact`` record, so that once vacuum has taken the originals a finished
store's apparent size (``du -sb``) is within twice what it allocates (``du -s``). The originals
are never truncated: a reader that mapped them reads on. ``info`` counts sizes as ``du`` does.
Everything here runs on a real local directory, against the real ``du``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.schemas import dqn, transitions
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.maintenance.compaction import segment_runs, underfilled
from replaystore.store.maintenance.verify import verify
from replaystore.store.store import Store
from replaystore.store.write import reclaimer, sizing
from support.batches import dqn_batch, transitions_batch
from support.storecheck import assert_same, columns_of, segments_on_disk, segments_retained, snapshot

CARTPOLE = transitions(4, actions=2)
DQN = dqn(16, 2, actions=9)
SCHEMAS = {"cartpole": (CARTPOLE, lambda rng, n: transitions_batch(rng, n, 4, 2)),
           "ragged": (DQN, lambda rng, n: dqn_batch(rng, n, extra=0))}
HOUR_S = 3600.0
needs_du = pytest.mark.skipif(shutil.which("du") is None, reason="needs du (coreutils)")


def du(path: str | Path, apparent: bool) -> int:
    """What ``du -sb`` (apparent) or ``du -s --block-size=1`` (allocated) reports for ``path``."""
    args = ["du", "-sb"] if apparent else ["du", "-s", "--block-size=1"]
    out = subprocess.run([*args, str(path)], capture_output=True, text=True, check=True, timeout=60).stdout
    return int(out.split()[0])


def _segments(st: Store) -> set[str]:
    st.refresh()
    return {f.segment.name for f in st.default.reader.fragments if f.segment is not None}


def _digest(st: Store) -> str:
    rows = st.row_ids()
    h = hashlib.sha256(rows.tobytes())
    for _, values in sorted(st.read(rows).items()):
        h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


@needs_du
@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_a_finished_3000_step_store_is_within_twice_its_allocated_size(tmp_path: Path, kind: str) -> None:
    schema, make = SCHEMAS[kind]
    url = str(tmp_path / "st")
    rng = np.random.default_rng(1)
    st = open_store(url, schema, mode="w")
    w = st.writer()
    batches = []
    for i in range(30):  # 3,000 steps in 30 commits, as a recorder commits them
        batches.append(make(rng, 100))
        w.append(batches[-1], stream=i % 3)
        w.commit()
    reader = open_store(url, mode="r")
    before = snapshot(reader)
    (original,) = _segments(reader)
    assert du(url, apparent=True) > 50 * du(url, apparent=False)  # a segment of 2**20 rows, sparse
    w.compact()  # (appends may still go to the open segment: left as it is)
    assert _segments(reader) == {original}
    w.close()
    (rightsized,) = _segments(reader)
    assert rightsized != original
    done = open_store(url, mode="a").vacuum(older_than_s=0)
    assert [u.path for u in done.deleted] == [layout.fragment_dir(0, "records", original)]
    after = open_store(url, mode="r")
    assert snapshot(after) == before
    assert_same(after.read(after.row_ids()), columns_of(schema, batches))
    assert verify(after) == []
    apparent, allocated = du(url, apparent=True), du(url, apparent=False)
    assert apparent <= 2 * allocated, (apparent, allocated)
    info = after.info()
    assert (info["bytes"], info["apparent_bytes"]) == (allocated, apparent)


def test_a_reader_that_mapped_the_original_reads_on_through_rightsizing_and_vacuum(tmp_path: Path) -> None:
    """The reader (a subprocess: a truncated mapping would kill it with SIGBUS) maps the sparse
    original, then the writer closes (right-sizing it) and vacuum deletes it; the reader's old view
    reads the same records from its mapping, and after a refresh from the right-sized copy."""
    url = str(tmp_path / "st")
    rng = np.random.default_rng(2)
    st = open_store(url, CARTPOLE, mode="w")
    w = st.writer()
    for i in range(30):
        w.append(transitions_batch(rng, 100, 4, 2), stream=i % 3)
        w.commit()
    want = _digest(open_store(url, mode="r"))
    (original,) = _segments(st)
    files = {p: p.stat().st_size for p in (tmp_path / "st" / layout.fragment_dir(0, "records", original)).rglob("*")
             if p.is_file()}
    script = (
        "import hashlib, sys\n"
        "import numpy as np\n"
        "from replaystore.store import open_store\n"
        "st = open_store(sys.argv[1], mode='r')\n"
        "def digest():\n"
        "    rows = st.row_ids()\n"
        "    h = hashlib.sha256(rows.tobytes())\n"
        "    for name, values in sorted(st.read(rows).items()):\n"
        "        h.update(np.ascontiguousarray(values).tobytes())\n"
        "    return h.hexdigest()\n"
        "print('mapped', digest(), flush=True)\n"
        "sys.stdin.readline()\n"
        "old = digest()\n"
        "st.refresh()\n"
        "print('read', old, digest(), flush=True)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as reader:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline().split() == ["mapped", want]
        w.close()
        assert {p: p.stat().st_size for p in files} == files  # the original is never truncated
        assert original not in _segments(st)
        done = open_store(url, mode="a").vacuum(older_than_s=0)
        assert [u.path for u in done.deleted] == [layout.fragment_dir(0, "records", original)]
        assert not any(p.exists() for p in files)
        out, err = reader.communicate("go\n", timeout=120)
    assert reader.returncode == 0, err  # (-7: SIGBUS)
    assert out.split() == ["read", want, want]


@needs_du
def test_info_counts_sizes_as_du_does(tmp_path: Path) -> None:
    """Allocated blocks and sizes of every file, directory and link (not followed), the root
    included and a file with two links once: ``du -s --block-size=1`` and ``du -sb`` exactly."""
    url = str(tmp_path / "st")
    rng = np.random.default_rng(3)
    st = open_store(url, DQN, mode="w")
    running = st.writer()  # a writer still appending: its segment is sparse
    running.append(dqn_batch(rng, 40, extra=0), stream=0)
    running.commit()
    st.save_state("sampler", {"n": 1}, {"prio": np.arange(1000.0)})
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 100_000)
    os.symlink(outside, tmp_path / "st" / "link-to-outside")  # counted as the link, never followed
    twice = tmp_path / "st" / "stray.bin"
    twice.write_bytes(b"y" * 50_000)
    os.link(twice, tmp_path / "st" / "stray-again.bin")  # one file, two links: counted once
    info = st.info()
    assert info["bytes"] == du(url, apparent=False)
    assert info["apparent_bytes"] == du(url, apparent=True)
    assert info["apparent_bytes"] > 2 * info["bytes"]  # the running writer's segment: sparse
    r = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "info", url], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "allocated" in r.stdout and "apparent" in r.stdout
    running.close()


def test_vacuum_ages_a_rightsized_original_from_the_record_that_replaced_it(tmp_path: Path) -> None:
    """A segment last written two hours ago and right-sized just now was still referenced a
    moment ago: a reader on the older log may still need it, so vacuum's hour keeps it."""
    url = str(tmp_path / "st")
    st = open_store(url, CARTPOLE, mode="w")
    w = st.writer()
    w.append(transitions_batch(np.random.default_rng(4), 50, 4, 2), stream=0)
    w.commit()
    (original,) = _segments(st)
    path = layout.fragment_dir(0, "records", original)
    past = time.time() - 2 * HOUR_S
    for o in st.storage.walk(path):
        os.utime(st.storage.local_path(o.path), (past, past))
    w.close()
    report = open_store(url, mode="a").vacuum(older_than_s=HOUR_S)
    assert report.deleted == [] and [u.path for u in report.recent] == [path]
    assert verify(open_store(url, mode="r")) == []


def test_compact_right_sizes_a_segment_appends_left_and_keeps_the_open_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 64 rows: 10 records, then 60 that do not fit, leave the first segment 10/64
    full (sealed). ``compact()`` copies it into a right-sized one; the open segment takes the next
    appends as before; at close it is 63/64 full, more than half: it stays as it is."""
    monkeypatch.setattr(sizing, "MAX_FRAGMENT_ROWS", 64)
    url = str(tmp_path / "st")
    rng = np.random.default_rng(5)
    st = open_store(url, DQN, mode="w")
    batches = [dqn_batch(rng, 10, extra=0), dqn_batch(rng, 60, extra=0)]
    w = st.writer()
    for b in batches:
        w.append(b, stream=0)
        w.commit()
    sealed, open_ = (f.segment.name for f in st.default.reader.fragments)
    assert w.compact() == 1
    kept = _segments(st)
    assert open_ in kept and sealed not in kept and len(kept) == 2
    assert (tmp_path / "st" / layout.fragment_dir(0, "records", sealed)).is_dir()  # in the trash: readers lag
    batches.append(dqn_batch(rng, 3, extra=0))
    w.append(batches[-1], stream=0)
    w.commit()
    assert open_ in _segments(st)  # the appends went on into the open segment
    w.close()
    assert open_ in _segments(st)  # 63 of 64 rows: more than half full, not worth a copy
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert st.rows(0)[1].tolist() == list(range(73))
    assert verify(st) == []


def test_a_full_disk_at_close_leaves_the_segment_as_it_is_and_closes(tmp_path: Path) -> None:
    """A real failing write (``EFBIG`` past a lowered ``RLIMIT_FSIZE``, in a child process): the
    right-sized copy cannot be created, so close warns, leaves the sparse segment referenced and
    nothing behind, and still writes its close record."""
    url = str(tmp_path / "st")
    script = (
        "import resource, signal, sys, warnings\n"
        "import numpy as np\n"
        "from replaystore.schemas import transitions\n"
        "from replaystore.store import open_store\n"
        "st = open_store(sys.argv[1], transitions(4, actions=2), mode='w')\n"
        "w = st.writer()\n"
        "rng = np.random.default_rng(6)\n"
        "w.append({'obs': rng.standard_normal((3000, 4), dtype=np.float32), 'action': np.zeros(3000, np.int64),\n"
        "          'reward': np.ones(3000, np.float32), 'next_obs': np.zeros((3000, 4), np.float32),\n"
        "          'terminated': np.zeros(3000, bool)}, stream=0)\n"
        "w.commit()\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    w.close()\n"
        "print('\\n'.join(str(c.message) for c in caught))\n"
    )
    r = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "was left at its full size" in r.stdout and "File too large" in r.stdout
    st = open_store(url, mode="r")
    assert st.info()["writers_closed"] == 1 and len(st) == 3000
    assert verify(st) == []
    assert _segments(st) == {"s0000000000"}
    assert st.vacuum(older_than_s=0, dry_run=True).deleted == []  # the failed copy left nothing


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=hs.lists(hs.lists(hs.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=6),
       segment_rows=hs.sampled_from([16, 64, 1 << 20]))
def test_any_closed_store_reads_the_same_and_is_right_sized(tmp_path_factory: Any, commits: list[list[int]],
                                                          segment_rows: int) -> None:
    """Reference model: the concatenated batches. Whatever the appends, commits and segment
    size, once the writer closed and vacuum ran, the store reads them back, verifies, and no
    referenced segment is more than twice the size of its records."""
    url = str(tmp_path_factory.mktemp("prop") / "st")
    rng = np.random.default_rng(len(commits))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sizing, "MAX_FRAGMENT_ROWS", segment_rows)
        st = open_store(url, DQN, mode="w")
        batches = []
        with st.writer() as w:
            for sizes in commits:
                for n in sizes:
                    batches.append(dqn_batch(rng, n, extra=0))
                    w.append(batches[-1], stream=len(batches) % 2)
                w.commit()
    open_store(url, mode="a").vacuum(older_than_s=0)
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), columns_of(DQN, batches))
    assert verify(st) == []
    runs = segment_runs(list(st.default.reader.fragments))
    assert not any(underfilled(DQN, run) for run in runs.values())
    data = Path(url) / layout.writer_dir(0) / "data" / "records"
    assert set(os.listdir(data)) == set(runs)  # nothing else stays once vacuum ran



def test_a_capped_store_right_sizes_at_close_and_reclaims_the_copy_once_evicted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capacity 1,000 (segments of 250 rows): 300 records leave the second segment 50/250 full.
    ``compact()`` keeps it (appends may still go there); close copies it into a right-sized
    segment. A later writer deletes the original once the close is older than the trash grace
    (0 here), and the right-sized copy (full: no append goes there) once its records are evicted;
    a segment the log still needs is never deleted, and what stays backs the newest records."""
    monkeypatch.setattr(reclaimer, "TRASH_GRACE_NS", 0)
    url = str(tmp_path / "st")
    rng = np.random.default_rng(7)
    st = open_store(url, CARTPOLE, mode="w", capacity=1000)
    with st.writer() as w:
        w.append(transitions_batch(rng, 300, 4, 2), stream=0)
        w.commit()
        kept = _segments(st)
        assert w.compact() == 0 and _segments(st) == kept  # (the one appends go to)
    closed = _segments(st)
    (rightsized,) = closed - kept
    (original,) = kept - closed
    assert segments_on_disk(tmp_path / "st") == {(0, n) for n in kept | closed}  # the original stays for now
    batches = [transitions_batch(rng, 10, 4, 2)]
    with st.writer() as w2:  # its commit's reclaim deletes the closed writer's original (done by its close)
        w2.append(batches[-1], stream=1)
    on_disk = segments_on_disk(tmp_path / "st")
    assert (0, original) not in on_disk and (0, rightsized) in on_disk  # the copy is still read
    with st.writer() as w3:
        for _ in range(13):  # 1,300 records more: the first writer's records all beyond capacity + grace
            batches.append(transitions_batch(rng, 100, 4, 2))
            w3.append(batches[-1], stream=2)
            w3.commit()
    on_disk = segments_on_disk(tmp_path / "st")
    assert {n for writer, n in on_disk if writer == 0} == set()  # all its 300 records evicted
    assert segments_retained(st) <= on_disk
    st = open_store(url, mode="r")
    assert_same(st.read(st.row_ids()), {k: v[-1000:] for k, v in columns_of(CARTPOLE, batches).arrays.items()})
    assert verify(st) == []


@needs_du
@pytest.mark.parametrize("capacity", [1_000_000, 10_000])
def test_a_finished_capped_store_is_within_twice_its_allocated_size(tmp_path: Path, capacity: int) -> None:
    """A capped store's segments are sparse too: closing copies the last one into a right-sized
    segment, and vacuum takes the original; 3,000 records read the same and verify clean."""
    url = str(tmp_path / "st")
    rng = np.random.default_rng(8)
    st = open_store(url, CARTPOLE, mode="w", capacity=capacity)
    w = st.writer()
    batches = []
    for i in range(30):
        batches.append(transitions_batch(rng, 100, 4, 2))
        w.append(batches[-1], stream=i % 3)
        w.commit()
    before = snapshot(open_store(url, mode="r"))
    originals = _segments(st)
    w.close()
    assert _segments(st) != originals
    done = open_store(url, mode="a").vacuum(older_than_s=0)
    assert {u.path for u in done.deleted} == {layout.fragment_dir(0, "records", n) for n in originals - _segments(st)}
    after = open_store(url, mode="r")
    assert snapshot(after) == before
    assert_same(after.read(after.row_ids()), columns_of(CARTPOLE, batches))
    assert verify(after) == []
    apparent, allocated = du(url, apparent=True), du(url, apparent=False)
    assert apparent <= 2 * allocated, (apparent, allocated)
