"""Concurrency: writer processes append to one store at once while reader processes refresh and
read; at the end every record of every writer is there exactly once, with the right
(stream, step) and content. Local disk and S3 (a moto server on loopback).

Each record carries ``(writer, stream, step)`` in ``obs[:, :3]`` and is otherwise a pure
function of them (support.procs.stream_batch), so readers check every record they read
against the index (``index_of``) and against its regenerated content, while writers are
still committing and compacting.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.store import open_store
from support.procs import (
    Child,
    batch_size,
    same_records,
    schema,
    stream_batch,
    stream_key,
    stream_totals,
    take_rows,
)

START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 240.0


def expected_total(writers: int, streams: int, commits: int) -> int:
    return sum(batch_size(i, j) * n for i in range(writers) for j, n in stream_totals(i, streams, commits).items())


def run_concurrently(url: str, storage_options: dict[str, Any] | None, *, seed: int, writers: int, streams: int,
                     commits: int, readers: int, read_batch: int) -> None:
    open_store(url, schema(), mode="w", storage_options=storage_options)
    total = expected_total(writers, streams, commits)
    with ExitStack() as stack:
        rs = [stack.enter_context(Child("reader", stdin=True, url=url, storage_options=storage_options, seed=seed,
                                        expected_total=total, batch=read_batch)) for _ in range(readers)]
        for r in rs:  # readers are up and have seen the empty store before any writer starts
            line = r.readline(START_TIMEOUT_S)
            assert line == "ready 0", f"reader did not start ({line!r}):\n{r.stderr()}"
        ws = [stack.enter_context(Child("stream-writer", url=url, storage_options=storage_options, seed=seed, i=i,
                                        streams=streams, commits=commits)) for i in range(writers)]
        summaries = []
        for i, w in enumerate(ws):
            lines = w.finish(RUN_TIMEOUT_S)
            summary = json.loads(lines[-1])
            assert summary["batches"] == {str(j): n for j, n in stream_totals(i, streams, commits).items()}
            summaries.append(summary)
        for r in rs:
            r.close_stdin()  # tells the reader the writers are done: it checks the final state and exits
        reads = [json.loads(r.finish(RUN_TIMEOUT_S)[-1]) for r in rs]
    print({"writers": summaries, "readers": reads})

    assert len({s["writer"] for s in summaries}) == writers, "two writer processes got one writer number"
    for r in reads:
        assert r["iterations"] > 0 and r["checked"] >= total
        assert r["lengths"] >= 2  # saw the store grow (at least empty and complete)
    assert sum(r["intermediate"] for r in reads) > 0, "no reader ever saw the store mid-write"
    check_final(url, storage_options, seed=seed, writers=writers, streams=streams, commits=commits, total=total)


def check_final(url: str, storage_options: dict[str, Any] | None, *, seed: int, writers: int, streams: int,
                commits: int, total: int) -> None:
    st = open_store(url, mode="r", storage_options=storage_options)
    assert len(st) == total
    table = st.table("records")
    keys = {stream_key(i, j) for i in range(writers) for j in range(streams)}
    assert set(st.streams()) == keys
    all_rows = []
    for i in range(writers):
        for j, batches in stream_totals(i, streams, commits).items():
            key = stream_key(i, j)
            rows, steps = st.rows(key)
            size = batch_size(i, j)
            assert np.array_equal(steps, np.arange(batches * size)), f"{key}: steps {steps}"
            got_keys, got_steps, _ = table.index_of(rows)
            assert set(got_keys.tolist()) == {key} and np.array_equal(got_steps, steps)
            got = st.read(rows)
            for b in range(batches):
                one = take_rows(st.schema, got, np.arange(b * size, (b + 1) * size))
                bad = same_records(one, stream_batch(seed, i, j, b))
                assert not bad, f"{key} batch {b}: fields {bad} differ"
            all_rows.append(rows)
    rows = np.concatenate(all_rows)
    # exactly once: the streams' rows partition the visible rows
    assert len(rows) == total and np.array_equal(np.sort(rows), st.row_ids())
    per_writer: dict[int, int] = {}
    compactions = 0
    for body in st.commits():
        if body["kind"] == "compact":
            compactions += 1
        elif body["metadata"]:
            per_writer[body["metadata"]["writer"]] = per_writer.get(body["metadata"]["writer"], 0) + 1
    assert per_writer == dict.fromkeys(range(writers), commits)
    assert compactions >= writers, "every writer compacted its small fragments while the readers read"


def test_four_writers_two_readers_local(tmp_path: Path) -> None:
    run_concurrently(str(tmp_path / "store"), None, seed=11, writers=4, streams=3, commits=40, readers=2,
                     read_batch=48)


def test_three_writers_one_reader_s3(s3_server: Any) -> None:
    """Each process its own s3fs client; commit records race through conditional PUTs."""
    run_concurrently(s3_server.url("concurrent"), s3_server.storage_options, seed=12, writers=3, streams=2,
                     commits=10, readers=1, read_batch=16)
