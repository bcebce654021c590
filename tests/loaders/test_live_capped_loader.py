"""A DataLoader over a capped store another writer is appending to: a worker whose view is newer
than the sampler's still reads the rows the sampler drew (evicted since, but within the grace
margin), and reads keep succeeding while a concurrent writer process commits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import StaleReadError
from replaystore.loaders import PrioritizedSampler, UniformSampler, make_loader
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.format.layout import ROW_BITS

CAP = 64


def numbered(first: int, n: int) -> dict[str, np.ndarray]:
    """``n`` transitions whose ``obs[:, 0]`` is the writer's local row number."""
    obs = np.zeros((n, 4), dtype=np.float32)
    obs[:, 0] = np.arange(first, first + n)
    return {"obs": obs, "action": np.zeros(n, dtype=np.int64), "reward": np.zeros(n, dtype=np.float32),
            "next_obs": obs.copy(), "terminated": np.zeros(n, dtype=bool)}


def _check(batch: dict[str, Any]) -> None:
    local = batch["indices"].numpy() & ((1 << ROW_BITS) - 1)
    assert np.array_equal(batch["obs"][:, 0].numpy(), local.astype(np.float32))


def _filled(url: str) -> None:
    st = open_store(url, transitions(4), capacity=CAP, mode="w")
    with st.writer() as w:
        w.append(numbered(0, CAP), stream="first")


def test_workers_newer_than_the_sampler_read_the_first_batch(tmp_path: Any) -> None:
    url = str(tmp_path / "st")
    _filled(url)
    st = open_store(url, mode="r")
    sampler = UniformSampler(st, batch_size=256, seed=0, num_batches=3)  # its view: the first 64
    with open_store(url).writer() as w:  # 12 newer records evict the oldest 12 (grace: 16)
        w.append(numbered(0, 12), stream="later")
    loader = make_loader(st, sampler, num_workers=2, multiprocessing_context="fork", timeout=60)
    batches = list(loader)  # workers open the store now: they see the newer commit
    assert len(batches) == 3
    for b in batches:
        _check(b)
    drawn = np.concatenate([b["indices"].numpy() for b in batches])
    assert (drawn & ((1 << ROW_BITS) - 1) < 12).any()  # rows evicted in the workers' view were read


WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = [sys.argv[2]]
    from test_live_capped_loader import numbered
    from replaystore.store import open_store
    st = open_store(sys.argv[1])
    with st.writer() as w:
        n = 0
        for _ in sys.stdin:  # one commit of 2 records per line
            w.append(numbered(n, 2), stream="live")
            w.commit()
            n += 2
            print("c", n, flush=True)
""")


def test_loader_with_workers_over_a_store_a_writer_process_appends_to(tmp_path: Any) -> None:
    url = str(tmp_path / "st")
    _filled(url)
    here = str(__import__("pathlib").Path(__file__).parent)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url, here], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().split() == ["c", "2"]  # committed before the loader starts
        st = open_store(url, mode="r")
        sampler = UniformSampler(st, batch_size=128, seed=1, num_batches=40, refresh_every=1)
        # workers not persistent: forked, they hold the writer's stdin; they must exit before its EOF
        loader = make_loader(st, sampler, num_workers=2, multiprocessing_context="fork", prefetch_factor=2,
                             persistent_workers=False, timeout=60)
        seen_live = 0
        for batch in loader:  # each minibatch consumed lets the writer commit again, concurrently
            writer.stdin.write("go\n")
            writer.stdin.flush()
            _check(batch)
            seen_live = max(seen_live, int(batch["obs"][:, 0].max()))
        del loader
        out, _ = writer.communicate(timeout=60)  # closes its stdin: it exits after the last tick
        assert writer.returncode == 0
        assert len(out.split("\n")) - 1 == 40  # every tick committed
        assert seen_live > 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


# -- a store turned over by another process: before the first batch, and between a draw and its gather --------

TURNOVER = textwrap.dedent("""
    import sys
    sys.path[:0] = [sys.argv[2]]
    from test_live_capped_loader import CAP, numbered
    from replaystore.store import open_store
    st = open_store(sys.argv[1])
    with st.writer() as w:
        for i in range(4):  # 4 * CAP newer records: everything older lies beyond the grace margin, reclaimed
            w.append(numbered(i * CAP, CAP), stream="turnover")
            w.commit()
    print("committed", 4 * CAP, flush=True)
""")


def _turn_over(url: str) -> None:
    """Another process commits 4 * CAP records and exits (returns once they are committed)."""
    here = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", TURNOVER, url, here], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["committed", str(4 * CAP)], out.stderr


SAMPLERS = {"uniform": UniformSampler, "prioritized": PrioritizedSampler}


def _loader(st: Any, sampler: Any, workers: int) -> Any:
    kw = {"multiprocessing_context": "fork", "timeout": 60} if workers else {}
    return make_loader(st, sampler, num_workers=workers, **kw)


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_store_turned_over_before_the_first_batch_reads_from_a_fresh_view(tmp_path: Any, kind: str,
                                                                          workers: int) -> None:
    url = str(tmp_path / "st")
    _filled(url)
    st = open_store(url, mode="r")
    sampler = SAMPLERS[kind](st, batch_size=32, seed=0, num_batches=3)  # its view: the first 64, reclaimed below
    _turn_over(url)
    batches = list(_loader(st, sampler, workers))  # before: StaleReadError at the first batch
    assert len(batches) == 3
    for b in batches:
        _check(b)
    assert sampler.batches_drawn == 3  # every minibatch drawn once: the first from a view refreshed at the start
    first_writer = open_store(url, mode="r").row_ids().min() >> ROW_BITS
    assert all((b["indices"].numpy() >> ROW_BITS == first_writer).all() for b in batches)  # the turnover's rows


def _racing(cls: type, url: str, plan: list[tuple[bool, bool]]) -> type:
    """``cls`` whose ``i``-th draw follows ``plan[i] = (before, after)``: with ``before``, another process turns
    the store over and the sampler refreshes before drawing; with ``after``, another process turns it over
    after the draw, before the rows are gathered (a read that races eviction)."""

    class Racing(cls):  # type: ignore[misc, valid-type]
        calls = 0

        def sample(self) -> Any:
            before, after = plan[self.calls] if self.calls < len(plan) else (False, False)
            self.calls += 1
            if before:
                _turn_over(url)
                self.store.refresh()
            request = super().sample()
            if after:
                _turn_over(url)
            return request

    return Racing


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_read_that_races_eviction_is_drawn_again_once_from_a_fresh_view(tmp_path: Any, kind: str,
                                                                          workers: int) -> None:
    url = str(tmp_path / "st")
    _filled(url)
    st = open_store(url, mode="r")
    sampler = _racing(SAMPLERS[kind], url, [(False, True)])(st, batch_size=32, seed=0, num_batches=3)
    batches = list(_loader(st, sampler, workers))
    assert len(batches) == 3
    for b in batches:
        _check(b)
    assert sampler.batches_drawn > 3  # the minibatches drawn before the turnover were drawn again


def test_a_read_that_races_eviction_twice_raises_stale_read_error(tmp_path: Any) -> None:
    url = str(tmp_path / "st")
    _filled(url)
    st = open_store(url, mode="r")
    # the second draw, from a view newer than the gathering handle's, races eviction too
    sampler = _racing(UniformSampler, url, [(False, True), (True, True)])(st, batch_size=32, seed=0, num_batches=3)
    with pytest.raises(StaleReadError):
        list(_loader(st, sampler, 0))
    assert sampler.batches_drawn == 2  # drawn, and drawn again once: no third try
