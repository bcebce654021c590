"""A DataLoader over a capped store another writer is appending to: a worker whose view is newer
than the sampler's still reads the rows the sampler drew (evicted since, but within the grace
margin), and reads keep succeeding while a concurrent writer process commits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np

from replaystore.loaders import UniformSampler, make_loader
from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.layout import ROW_BITS

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
