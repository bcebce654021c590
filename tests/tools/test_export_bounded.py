"""Exports and imports run in bounded chunks (memory does not grow with the table); progress only on a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import duckdb
import h5py
import minari
import numpy as np
import pytest

from replaystore.errors import StoreError
from replaystore.schemas import deep_cfr_advantage, deep_cfr_strategy, episode
from replaystore.store import open_store
from replaystore.tools.export import export_store
from replaystore.tools.formats.common import chunk_rows
from replaystore.tools.formats.parquet import export_parquet
from support.batches import deep_cfr_batch

OBS = 64
EPISODE = 100
RECORDS = 24_000  # 240 episodes on 4 streams; obs + next_obs alone are ~12 MB
DATA_BYTES = RECORDS * OBS * 4 * 2
ROWS = 1000  # the chunk the memory tests export and import in
CHUNK_BYTES = ROWS * OBS * 4 * 2


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(30)
    st = open_store(str(tmp_path_factory.mktemp("big") / "store"), episode(OBS, actions=6), mode="w")
    with st.writer() as w:
        for e in range(RECORDS // EPISODE):
            obs = rng.standard_normal((EPISODE + 1, OBS), dtype=np.float32)
            term = np.zeros(EPISODE, bool)
            term[-1] = e % 3 != 0
            trunc = ~term & (np.arange(EPISODE) == EPISODE - 1)
            w.append({"obs": obs[:-1], "action": rng.integers(0, 6, EPISODE), "reward": np.ones(EPISODE, np.float32),
                      "next_obs": obs[1:], "terminated": term, "truncated": trunc}, stream=e % 4, reset=True)
            if e % 60 == 59:
                w.commit()
    st.streams()  # the stream index is built once, outside the measurement
    return st


def peak_bytes(store_url: str, call: str) -> int:
    """Peak bytes held while ``call`` ran on the store: Python's (numpy's included) plus Arrow's pool.

    Measured in a fresh interpreter whose tracing starts with it and is never stopped: CPython
    3.11's ``tracemalloc.stop()`` races threads that exit meanwhile (python/cpython#128679, fixed
    in 3.12+) and crashed this suite once; a fresh process also keeps the other tests' threads and
    garbage out of the figure. Arrow allocates outside tracemalloc's view, hence its pool's peak.
    """
    script = textwrap.dedent(f"""
        import os, tracemalloc
        import h5py, minari, pyarrow as pa, pyarrow.dataset, pyarrow.parquet  # imported first: not the figure
        from replaystore.store import open_store
        from replaystore.tools.formats.d4rl import export_d4rl, import_d4rl
        from replaystore.tools.formats.minari import export_minari, import_minari
        from replaystore.tools.formats.parquet import export_parquet, import_parquet
        st = open_store({store_url!r}, mode="r")
        st.streams()
        before, arrow_before = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
        tracemalloc.reset_peak()
        {call}
        python_peak = tracemalloc.get_traced_memory()[1] - before
        arrow_peak = pa.default_memory_pool().max_memory() - arrow_before
        print(python_peak, arrow_peak, flush=True)
        os._exit(0)  # no interpreter shutdown: tracing is never stopped
    """)
    proc = subprocess.run([sys.executable, "-X", "tracemalloc", "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    python_peak, arrow_peak = map(int, proc.stdout.split())
    return python_peak + arrow_peak


@pytest.mark.parametrize("fmt", ["parquet", "minari", "d4rl"])
def test_export_memory_is_bounded_by_the_chunk_not_the_table(big_store, fmt: str, tmp_path: Path) -> None:
    rows = ROWS
    out, url = tmp_path / "out", str(big_store.url)
    if fmt == "parquet":
        peak = peak_bytes(url, f"export_parquet(st, {str(out)!r}, batch_rows={rows})")
        n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/**/*.parquet', hive_partitioning=true)").fetchall()
        assert n == [(RECORDS,)]
    elif fmt == "minari":
        peak = peak_bytes(url, f"export_minari(st, {str(out)!r}, dataset_id='big-v0', batch_rows={rows})")
        ds = minari.MinariDataset(out / "big-v0" / "data")
        assert ds.total_steps == RECORDS and ds.total_episodes == RECORDS // EPISODE
    else:
        peak = peak_bytes(url, f"export_d4rl(st, {str(out)!r}, batch_rows={rows})")
        with h5py.File(out, "r") as f:
            assert f["observations"].shape == (RECORDS, OBS)
            assert int(f["terminals"][()].sum() + f["timeouts"][()].sum()) == RECORDS // EPISODE
    # a few chunks' worth (read + converted + written), far below the table
    assert peak < 6 * CHUNK_BYTES < DATA_BYTES / 2, (peak, CHUNK_BYTES, DATA_BYTES)


@pytest.mark.parametrize("fmt", ["parquet", "minari", "d4rl"])
def test_import_memory_is_bounded_by_the_chunk_not_the_file(big_store, fmt: str, tmp_path: Path) -> None:
    rows = ROWS
    src, back, url = tmp_path / "src", tmp_path / "back", str(big_store.url)
    if fmt == "parquet":
        export_parquet(big_store, str(src), batch_rows=rows)  # row groups of a chunk
        peak = peak_bytes(url, f"import_parquet({str(src)!r}, {str(back)!r}, batch_rows={rows})")
    elif fmt == "minari":
        export_store(big_store, str(src), "minari", dataset_id="big-v0")
        peak = peak_bytes(url, f"import_minari({str(src / 'big-v0')!r}, {str(back)!r})")
    else:
        export_store(big_store, str(src), "d4rl")
        peak = peak_bytes(url, f"import_d4rl({str(src)!r}, {str(back)!r}, batch_rows={rows})")
    assert len(open_store(str(back), mode="r")) == RECORDS
    # a few chunks (minari: an episode of 100 records is its unit) while each source file holds far more
    assert peak < 6 * CHUNK_BYTES < DATA_BYTES / 2, (peak, CHUNK_BYTES, DATA_BYTES)


def test_default_chunk_is_sized_in_bytes() -> None:
    wide, narrow = episode(4096), episode(4)
    assert chunk_rows(wide) * 4096 * 4 * 2 <= 16 << 20
    assert chunk_rows(narrow) == 65536
    assert chunk_rows(narrow, 10) == 10
    with pytest.raises(StoreError, match="batch_rows"):
        chunk_rows(narrow, 0)


def test_progress_bar_only_on_a_terminal(big_store, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    export_store(big_store, str(tmp_path / "quiet"), "parquet", progress=True)
    assert capfd.readouterr().err == ""  # stderr is not a terminal here
    script = textwrap.dedent(f"""
        from replaystore.store import open_store
        from replaystore.tools.export import export_store
        st = open_store({str(big_store.url)!r}, mode="r")
        print(export_store(st, {str(tmp_path / "loud")!r}, "d4rl", progress=True)["records"])
    """)
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=sub, timeout=120,
                          check=False)
    os.close(sub)
    err = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(main)
    assert proc.returncode == 0 and proc.stdout.decode().strip() == str(RECORDS)
    text = err.decode(errors="replace")
    assert "export d4rl:   0%|" in text and f"0.00/{RECORDS / 1000:.1f}k" in text


def test_episode_formats_need_one_table(tmp_path: Path) -> None:
    rng = np.random.default_rng(31)
    st = open_store(str(tmp_path / "cfr"), {"advantage": deep_cfr_advantage(4), "strategy": deep_cfr_strategy(4)},
                    mode="w")
    with st.writer() as w:
        w.append(deep_cfr_batch(rng, 5, 5, observation_size=4), stream=0)
    for fmt in ("minari", "minari-hdf5", "d4rl"):
        with pytest.raises(StoreError, match=r"tables \['advantage', 'strategy'\]: choose one with table=NAME"):
            export_store(st, str(tmp_path / fmt), fmt)
        with pytest.raises(StoreError, match="schema 'deep_cfr_advantage' lacks obs, next_obs"):
            export_store(st, str(tmp_path / fmt), fmt, table="advantage")
    assert not any(p.name in ("minari", "minari-hdf5", "d4rl") for p in tmp_path.iterdir())
