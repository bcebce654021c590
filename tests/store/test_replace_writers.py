"""``open_store(mode="w+")`` while the replaced store's writers are still committing: every record
carries its store's generation, a replaced store's writer fails with ``StoreReplacedError`` at its
next commit having written nothing, and nothing of it ever shows in the new store (docs/FORMAT.md,
"Replacing a store")."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import StoreReplacedError
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.maintenance.verify import verify
from support.procs import Child, racer_schema, replace_batch, same_records, take_rows
from support.s3 import S3Server
from support.s3proxy import conflicting_s3, options_via
from support.storecheck import Backend

TIMEOUT_S = 120.0
SEED = 14
BATCHES = 5


class Driver:
    """A ``replace-writer`` child: one JSON command in, one JSON answer out."""

    def __init__(self) -> None:
        self.child = Child("replace-writer", stdin=True, seed=SEED)

    def send(self, **op: Any) -> None:
        stdin = self.child.proc.stdin
        assert stdin is not None
        stdin.write((json.dumps(op) + "\n").encode())
        stdin.flush()

    def answer(self) -> dict[str, Any]:
        line = self.child.readline(TIMEOUT_S)
        assert line is not None, self.child.stderr()
        out: dict[str, Any] = json.loads(line)
        return out

    def do(self, **op: Any) -> dict[str, Any]:
        self.send(**op)
        return self.answer()

    def close(self) -> None:
        self.child.close_stdin()
        self.child.finish(TIMEOUT_S)
        self.child.close()


@pytest.fixture
def drivers() -> Iterator[tuple[Driver, Driver]]:
    a, b = Driver(), Driver()
    try:
        yield a, b
    finally:
        for d in (a, b):
            d.child.close()


def _check_only(url: str, options: dict[str, Any] | None, i: int, writer: int) -> None:
    """The store at ``url`` is opener ``i``'s, whole: its schema, exactly its records, verified clean."""
    st = open_store(url, mode="r", storage_options=options)
    assert st.schema == racer_schema(i)  # never the other schema's data under this one
    assert verify(st) == []
    assert st.streams() == [f"r{i}"] and len(st) == 5 * BATCHES
    rows, _ = st.rows(f"r{i}")
    for j in range(BATCHES):
        want = take_rows(st.schema, replace_batch(SEED, i, j), np.arange(5))
        assert same_records(st.read(rows[5 * j:5 * j + 5]), want) == [], j
    # its writer's registration is there, of this store's generation
    reg = records.decode(layout.writer_record(writer), st.storage.read(layout.writer_record(writer)))
    assert reg["generation"] == st.generation and writer in st.writers


def _replaced_writer_fails_at_its_next_commit(url: str, options: dict[str, Any] | None,
                                              drivers: tuple[Driver, Driver]) -> None:
    a, b = drivers
    assert a.do(op="open", url=url, options=options, i=0) == {"writer": 0, "error": None}
    for j in range(2):
        assert a.do(op="append", j=j)["error"] is None
        assert a.do(op="commit")["error"] is None
    assert a.do(op="append", j=2)["error"] is None  # pending when the store is replaced
    # B replaces A's store and takes A's writer number: the case where A's objects would land on B's
    assert b.do(op="open", url=url, options=options, i=1) == {"writer": 0, "error": None}
    for j in range(2):
        assert b.do(op="append", j=j)["error"] is None
        assert b.do(op="commit")["error"] is None
    got = a.do(op="commit")
    assert got["error"] == StoreReplacedError.__name__, got
    assert a.do(op="append", j=3)["error"] is None
    assert a.do(op="commit")["error"] == StoreReplacedError.__name__  # and at every commit after it
    for j in range(2, BATCHES):
        assert b.do(op="append", j=j)["error"] is None
        assert b.do(op="commit")["error"] is None
    assert a.do(op="close")["error"] == StoreReplacedError.__name__  # released, nothing written
    assert b.do(op="close")["error"] is None
    a.close()
    b.close()
    _check_only(url, options, 1, 0)


def test_replaced_writer_fails_at_its_next_commit_local(tmp_path: Path, drivers: tuple[Driver, Driver]) -> None:
    _replaced_writer_fails_at_its_next_commit(str(tmp_path / "st"), None, drivers)


def test_replaced_writer_fails_at_its_next_commit_s3(s3_server: S3Server, drivers: tuple[Driver, Driver]) -> None:
    url = s3_server.url(f"wplus-writers-{uuid.uuid4().hex}")
    # moto checks If-None-Match and then stores, unlocked: the proxy makes each conditional PUT of a key
    # exclusive (409 to any other while one is in flight, as S3 answers), so creates are atomic
    with conflicting_s3(s3_server.endpoint_url) as (endpoint, _):
        _replaced_writer_fails_at_its_next_commit(url, options_via(s3_server.storage_options, endpoint), drivers)


ROUNDS = 3  # per backend (S3: 2, moto is slow)


def _race(urls: list[str], options: dict[str, Any] | None, drivers: tuple[Driver, Driver],
          check_options: dict[str, Any] | None) -> None:
    """Per URL: A opens with "w+" and commits BATCHES batches; B does the same 50-200 ms after A opened."""
    a, b = drivers
    rng = random.Random(SEED)
    for url in urls:
        a.send(op="burst", url=url, options=options, i=0, n=BATCHES)
        assert a.answer() == {"opened": True, "writer": 0}
        time.sleep(rng.uniform(0.05, 0.2))  # real timing: where B's replace falls in A's commits varies
        b.send(op="burst", url=url, options=options, i=1, n=BATCHES)
        opened = b.answer()
        assert opened["opened"] is True, opened
        a_done, b_done = a.answer(), b.answer()
        assert b_done == {"committed": BATCHES, "error": None}, b_done
        # A finished before the replace, or failed at its first commit after it: never another error
        assert a_done["error"] in (None, StoreReplacedError.__name__), a_done
        a_done.pop("message", None)
        _check_only(url, check_options, 1, opened["writer"])
    a.close()
    b.close()


def test_w_plus_racing_a_committing_writer_local(tmp_path: Path, drivers: tuple[Driver, Driver]) -> None:
    _race([str(tmp_path / f"st{k}") for k in range(ROUNDS)], None, drivers, None)


def test_w_plus_racing_a_committing_writer_s3(s3_server: S3Server, drivers: tuple[Driver, Driver]) -> None:
    urls = [s3_server.url(f"wplus-race-{uuid.uuid4().hex}") for _ in range(ROUNDS - 1)]
    with conflicting_s3(s3_server.endpoint_url) as (endpoint, _):
        _race(urls, options_via(s3_server.storage_options, endpoint), drivers, s3_server.storage_options)


# -- records of another generation, in one process ------------------------------------------------

def _foreign_copy(data: bytes, path: str, seq: int) -> bytes:
    body = records.decode(path, data)
    return records.encode({**body, "seq": seq, "generation": "0" * 32})


def test_records_of_another_generation_are_not_applied(fast_backend: Backend) -> None:
    url, opts = fast_backend
    st = open_store(url, racer_schema(0), mode="w", storage_options=opts)
    assert len(st.generation) == 32 and st.manifest["generation"] == st.generation
    w = st.writer()
    w.append(replace_batch(SEED, 0, 0), stream="r0")
    w.commit()
    # a replaced store's writer that took this writer number left its next record (and a checkpoint)
    first = layout.commit_record(w.id, 0)
    st.storage.create(layout.commit_record(w.id, 1), _foreign_copy(st.storage.read(first), first, 1))
    st.storage.create(layout.checkpoint(0), records.encode({"kind": "checkpoint", "number": 0, "time_ns": 1,
                                                            "generation": "0" * 32, "writers": {}}))
    reader = open_store(url, mode="r", storage_options=opts)
    assert len(reader) == 5 and reader.log.writers[w.id].next_seq == 1  # stops before it, as if absent
    assert verify(reader) == []  # leftovers, not damage
    w.append(replace_batch(SEED, 0, 1), stream="r0")
    assert w.commit() is not None and w.seq == 2  # its own record replaced the leftover
    w.close()
    assert reader.refresh() and len(reader) == 10
    assert verify(open_store(url, mode="r", storage_options=opts)) == []


def test_a_replaced_handle_writes_and_deletes_nothing(fast_backend: Backend) -> None:
    url, opts = fast_backend
    old = open_store(url, racer_schema(0), mode="w", storage_options=opts)
    w = old.writer()
    w.append(replace_batch(SEED, 0, 0), stream="r0")
    w.commit()
    old.save_state("slot", {"k": 1})
    new = open_store(url, racer_schema(1), mode="w+", storage_options=opts)
    assert new.generation != old.generation and old.replaced() and not new.replaced()
    w2 = new.writer()
    assert w2.id == w.id  # the replaced writer's number is the new store's writer's now
    w2.append(replace_batch(SEED, 1, 0), stream="r1")
    w2.commit()
    before = [(o.path, o.size) for o in new.storage.walk("")]
    w.append(replace_batch(SEED, 0, 1), stream="r0")
    with pytest.raises(StoreReplacedError):
        w.commit()
    with pytest.raises(StoreReplacedError):
        old.save_state("slot", {"k": 2})
    with pytest.raises(StoreReplacedError):
        w.close()
    assert [(o.path, o.size) for o in new.storage.walk("")] == before  # nothing written, nothing deleted
    w2.close()
    st = open_store(url, mode="r", storage_options=opts)
    assert st.schema == racer_schema(1) and len(st) == 5 and st.load_state("slot") is None
    assert verify(st) == []


def test_older_stores_without_a_generation_still_open_and_write(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    st = open_store(url, racer_schema(0), mode="w")
    w = st.writer()
    w.append(replace_batch(SEED, 0, 0), stream="r0")
    w.close()
    # as written before generations: no generation in the manifest, registrations or records
    root = Path(url)
    for path in [root / layout.MANIFEST, *root.glob("writers/*/writer.json"), *root.glob("writers/*/commits/*")]:
        body = records.decode(str(path), path.read_bytes())
        body.pop("generation", None)
        path.chmod(0o644)
        path.write_bytes(records.encode(body))
    old = open_store(url, mode="a")
    assert "generation" not in old.manifest and len(old) == 5
    w = old.writer()
    w.append(replace_batch(SEED, 0, 1), stream="r0")
    w.close()
    assert len(open_store(url, mode="r")) == 10 and verify(open_store(url, mode="r")) == []
    # its writers now record the store's derived generation; replacing it leaves them nothing
    new = open_store(url, racer_schema(1), mode="w+")
    assert new.generation != old.generation and old.replaced()
    with pytest.raises(StoreReplacedError):
        old.writer()


def test_vacuum_deletes_a_replaced_writers_data_and_keeps_the_new_store(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    new = open_store(url, racer_schema(1), mode="w")
    w = new.writer()
    w.append(replace_batch(SEED, 1, 0), stream="r1")
    w.close()
    # what a replaced store's writer 0 left mid-commit: a fragment's data and its record, of its generation
    new.storage.write(f"{layout.writer_dir(0)}/data/records/f0000000099/zarr.json", b"{}")
    first = layout.commit_record(0, 0)
    new.storage.create(layout.commit_record(0, 9), _foreign_copy(new.storage.read(first), first, 9))
    assert verify(open_store(url, mode="r")) == []
    report = open_store(url, mode="a").vacuum(older_than_s=0)
    assert [u for u in report.deleted if "f0000000099" in str(u)]
    st = open_store(url, mode="r")
    assert not (tmp_path / "st" / layout.writer_dir(0) / "data/records/f0000000099").exists()
    assert len(st) == 5 and verify(st) == []
