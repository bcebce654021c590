"""Create-if-absent races on S3: many processes, each with its own s3fs client.

AWS S3 answers a conditional PUT (``If-None-Match: *``) with 412 when the key exists
and with 409 ConditionalRequestConflict while another conditional write to the same key
is in flight; FsspecStorage retries 409 with backoff until the answer is 200 or 412.
moto (the loopback server) never answers 409, and its check-then-write of a conditional
PUT is not atomic: two racing creates of one key can both get 200 there (seen once in a
few hundred races), so races are tested only through ``support.s3proxy.conflicting_s3``,
a loopback proxy in front of moto that answers 409 exactly when S3 would (a conditional
PUT of a key while another is in flight), holding each conditional PUT briefly so that
racing clients overlap.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pytest

from replaystore.store import open_store
from replaystore.store.storage import FsspecStorage, StorageError, open_storage
from support.procs import Child, crash_batch, same_records, schema, take_rows
from support.s3 import S3Server
from support.s3proxy import conflicting_s3, options_via

RACERS = 6
KEYS = 12
TIMEOUT_S = 120.0


def _race(role: str, n: int, **args: Any) -> list[dict[str, Any]]:
    """Start ``n`` children of ``role``; release them together once all are ready; their JSON summaries."""
    children = [Child(role, stdin=True, tag=f"r{i}", **args) for i in range(n)]
    try:
        for c in children:
            line = c.readline(TIMEOUT_S)
            assert line == "ready", f"{role} did not start ({line!r}):\n{c.stderr()}"
        for c in children:
            c.close_stdin()  # the start gate
        return [json.loads(c.finish(TIMEOUT_S)[-1]) for c in children]
    finally:
        for c in children:
            c.close()


def _check_one_winner(url: str, options: dict[str, Any], keys: list[str], results: list[dict[str, Any]]) -> None:
    assert [r["errors"] for r in results] == [[]] * len(results)  # no exception escaped a create
    wins = Counter(k for r in results for k in r["won"])
    assert sorted(wins) == sorted(keys) and set(wins.values()) == {1}, wins  # exactly one winner per key
    storage = open_storage(url, options)
    owner = {k: r["tag"] for r in results for k in r["won"]}
    assert {k: storage.read(k).decode() for k in keys} == owner  # the winner's bytes are what is stored


def test_racing_creates_retry_409_until_one_wins(s3_server: S3Server) -> None:
    url = s3_server.url(f"race409-{uuid.uuid4().hex}")
    keys = [f"k/{i:03d}" for i in range(KEYS)]
    with conflicting_s3(s3_server.endpoint_url, hold_s=0.05) as (endpoint, faults):
        options = options_via(s3_server.storage_options, endpoint)
        results = _race("create-racer", RACERS, url=url, storage_options=options, keys=keys)
    assert faults.conflicts > 0  # the race did hit 409s, and every one was retried to a verdict
    _check_one_winner(url, s3_server.storage_options, keys, results)


def test_concurrent_writer_registration_through_409s(s3_server: S3Server) -> None:
    url = s3_server.url(f"reg409-{uuid.uuid4().hex}")
    open_store(url, schema(), mode="w", storage_options=s3_server.storage_options).close()
    with conflicting_s3(s3_server.endpoint_url, hold_s=0.05) as (endpoint, faults):
        results = _race("register-writer", RACERS, url=url,
                        storage_options=options_via(s3_server.storage_options, endpoint), seed=3)
    assert faults.conflicts > 0  # every racer started at writer number 0: registration collided
    writers = sorted(r["writer"] for r in results)
    assert writers == list(range(RACERS))  # each took its own number, none lost
    st = open_store(url, mode="r", storage_options=s3_server.storage_options)
    assert st.writers == writers
    sch = schema()
    for r in results:
        want = crash_batch(3, r["tag"], 0, 4)
        rows, _ = st.rows(r["tag"])
        assert rows.tolist() == list(range(*r["rows"]))
        n = len(want["obs"])
        assert same_records(st.read(rows), take_rows(sch, want, np.arange(n))) == []


def test_a_conflict_that_never_resolves_is_a_storage_error(s3_server: S3Server) -> None:
    url = s3_server.url(f"stuck-{uuid.uuid4().hex}")
    with conflicting_s3(s3_server.endpoint_url, always=True) as (endpoint, faults):
        storage = open_storage(url, options_via(s3_server.storage_options, endpoint))
        assert isinstance(storage, FsspecStorage)
        storage.conflict_retries = 4
        with pytest.raises(StorageError, match="409 ConditionalRequestConflict after 4 attempts"):
            storage.create("k", b"x")
    assert faults.conflicts == 4  # bounded: exactly the attempts allowed, then the typed error
    assert not open_storage(url, s3_server.storage_options).exists("k")


def test_a_create_whose_reply_was_lost_is_still_ours(s3_server: S3Server) -> None:
    url = s3_server.url(f"lost-{uuid.uuid4().hex}")
    with conflicting_s3(s3_server.endpoint_url, lost_reply=True) as (endpoint, faults):
        ours = open_storage(url, options_via(s3_server.storage_options, endpoint))
        ours.check_create()
        lost_before = faults.lost
        # applied upstream, answered 500; the client repeats the PUT, gets 412 and reads its own bytes back
        assert ours.create("k", b"mine") is True
        assert faults.lost == lost_before + 1
        other = open_storage(url, options_via(s3_server.storage_options, endpoint))
        assert other.create("k", b"theirs") is False
    assert open_storage(url, s3_server.storage_options).read("k") == b"mine"
