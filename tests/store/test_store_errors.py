"""open_store modes and arguments, format/schema checks, read-only stores, and rejected
appends that must leave the store exactly as it was. Runs on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from replaystore.errors import (
    CorruptObjectError,
    DTypeError,
    FormatVersionError,
    IdRangeError,
    MetadataError,
    MissingFieldError,
    OffsetsError,
    ReadOnlyError,
    RecordCountError,
    SchemaMismatchError,
    ShapeError,
    StepOrderError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
    StreamKeyError,
    UnknownFieldError,
)
from replaystore.schemas import dqn, ppo
from replaystore.store.format import layout, records
from support.batches import dqn_batch
from support.storecheck import Backend, columns_of, snapshot

SCHEMA = dqn(16, 2, actions=9)


def _filled(backend: Backend, n: int = 12, seed: int = 0):
    st = backend.open(SCHEMA, mode="w")
    batch = dqn_batch(np.random.default_rng(seed), n, extra=0)
    with st.writer() as w:
        w.append(batch, stream="a")
    return st, batch


# -- modes ---------------------------------------------------------------------------------
def test_mode_w_creates_and_refuses_an_existing_store(backend: Backend) -> None:
    st, batch = _filled(backend)
    assert len(st) == 12 and st.schema == SCHEMA
    with pytest.raises(StoreExistsError):
        backend.open(SCHEMA, mode="w")
    with pytest.raises(FileExistsError):  # also the builtin family
        backend.open(mode="w")
    again = backend.open(mode="r")
    assert len(again) == 12  # the refused "w" changed nothing
    assert again.read(np.arange(12))["obs"].tobytes() == batch.obs.tobytes()


def test_mode_a_opens_or_creates(backend: Backend) -> None:
    with pytest.raises(StoreError):  # nothing there and no schema to create it from
        backend.open(mode="a")
    st = backend.open(SCHEMA)  # "a" is the default
    assert len(st) == 0 and st.capacity is None
    with st.writer() as w:
        w.append(dqn_batch(np.random.default_rng(1), 5, extra=0), stream=1)
    again = backend.open(SCHEMA, mode="a")
    assert len(again) == 5
    assert len(backend.open()) == 5  # no schema needed to open an existing store
    assert backend.open().schema == SCHEMA


def test_mode_r_on_a_missing_url(backend: Backend) -> None:
    with pytest.raises(StoreNotFoundError):
        backend.open(mode="r")
    with pytest.raises(FileNotFoundError):
        backend.open(SCHEMA, mode="r")
    assert not backend.storage().exists(layout.MANIFEST)  # "r" never creates


def test_mode_w_plus_replaces(backend: Backend) -> None:
    st, _ = _filled(backend)
    st.save_state("sampler", {"cursor": 3})
    other = ppo(16, actions=9)
    fresh = backend.open(other, mode="w+", capacity=7)
    assert len(fresh) == 0 and fresh.schema == other and fresh.capacity == 7
    assert fresh.load_state("sampler") is None
    assert fresh.streams() == []
    reopened = backend.open(mode="r")
    assert reopened.schema == other and len(reopened) == 0 and reopened.capacity == 7
    # the old writers' objects are gone
    assert backend.storage().list(layout.WRITERS) == []
    # and w+ on nothing just creates
    sib = backend.sibling()
    assert len(sib.open(SCHEMA, mode="w+")) == 0


@pytest.mark.parametrize("mode", ["rw", "", "W", "R+", None])
def test_unknown_mode(backend: Backend, mode: object) -> None:
    with pytest.raises(StoreError, match="mode"):
        backend.open(SCHEMA, mode=mode)
    assert not backend.storage().exists(layout.MANIFEST)


@pytest.mark.parametrize("capacity", [0, -1, 2.5, "10", True, 10.0])
def test_bad_capacity(backend: Backend, capacity: object) -> None:
    with pytest.raises(StoreError, match="capacity"):
        backend.open(SCHEMA, capacity=capacity)
    assert not backend.storage().exists(layout.MANIFEST)


def test_capacity_is_fixed_at_creation(backend: Backend) -> None:
    backend.open(SCHEMA, capacity=10)
    assert backend.open().capacity == 10
    assert backend.open(capacity=10).capacity == 10
    with pytest.raises(StoreError, match="capacity"):
        backend.open(capacity=11)


def test_schema_mismatch_on_reopen(backend: Backend) -> None:
    _filled(backend)
    for other in (ppo(16, actions=9), dqn(16, 2, actions=10), dqn(16, 3, actions=9), dqn(15, 2, actions=9),
                  {"records": SCHEMA, "extra": ppo(16)}, {"other_name": SCHEMA}):
        for mode in ("a", "r"):
            with pytest.raises(SchemaMismatchError):
                backend.open(other, mode=mode)
    assert len(backend.open(SCHEMA, mode="r")) == 12  # the same schema is fine
    assert len(backend.open({"records": SCHEMA}, mode="r")) == 12


def test_bad_schema_argument(backend: Backend) -> None:
    for bad in ("dqn", {}, {"records": "dqn"}, {"not an identifier": SCHEMA}, 3):
        with pytest.raises(StoreError):
            backend.open(bad)


@pytest.mark.parametrize("version", [3, 999, 0, "1", None])
def test_unknown_format_version(backend: Backend, version: object) -> None:
    body = {"format": "replaystore", "format_version": version, "tables": {"records": SCHEMA.to_dict()},
            "capacity": None, "created_ns": 1}
    backend.storage().write(layout.MANIFEST, records.encode(body))
    for mode in ("r", "a"):
        with pytest.raises(FormatVersionError):
            backend.open(mode=mode)
    with pytest.raises(FormatVersionError):
        backend.open(SCHEMA)
    with pytest.raises(FormatVersionError):  # mode "w" must not treat it as "no store"
        backend.open(SCHEMA, mode="w")


def test_not_a_replaystore_manifest(backend: Backend) -> None:
    body = {"format": "something-else", "format_version": 1, "tables": {}, "capacity": None}
    backend.storage().write(layout.MANIFEST, records.encode(body))
    with pytest.raises(FormatVersionError):
        backend.open(mode="r")


def test_damaged_record_documents_are_never_trusted(backend: Backend) -> None:
    _filled(backend)
    storage = backend.storage()
    record = layout.commit_record(0, 0)
    good = storage.read(record)
    for damaged in (good[: len(good) // 2], b"garbage", good.replace(b'"seq":0', b'"seq":1')):
        storage.delete(record)
        storage.write(record, damaged)
        with pytest.raises(CorruptObjectError) as info:
            backend.open(mode="r")
        assert info.value.path == record
    storage.delete(record)
    storage.write(record, good)
    assert len(backend.open(mode="r")) == 12
    storage.delete(layout.MANIFEST)
    storage.write(layout.MANIFEST, b'{"body": {"format": "replaystore"}, "crc32c": 1}')
    with pytest.raises(CorruptObjectError):
        backend.open(mode="a")


def test_read_only_store_refuses_every_mutation(backend: Backend) -> None:
    _filled(backend)
    before = sorted(backend.storage().list(layout.WRITERS))
    ro = backend.open(mode="r")
    with pytest.raises(ReadOnlyError):
        ro.writer()
    with pytest.raises(ReadOnlyError):
        ro.save_state("sampler", {"a": 1}, {"x": np.arange(3)})
    with pytest.raises(StoreError):  # ReadOnlyError is a StoreError
        ro.save_state("sampler", {})
    assert sorted(backend.storage().list(layout.WRITERS)) == before  # no writer was registered
    assert not backend.storage().exists(layout.STATE)
    assert ro.load_state("sampler") is None
    assert len(ro) == 12  # reads still work


# -- rejected appends ------------------------------------------------------------------------
def _bad_batches(rng: np.random.Generator) -> list[tuple[type[Exception], dict]]:
    def base() -> dict:
        return dict(vars(dqn_batch(rng, 6, extra=0)))

    out: list[tuple[type[Exception], dict]] = []
    b = base()
    b["rewards"] = b["rewards"].astype(np.float32)
    out.append((DTypeError, b))
    b = base()
    b["obs"] = b["obs"].astype(np.float64)
    out.append((DTypeError, b))
    b = base()
    b["bogus"] = np.zeros(6)
    out.append((UnknownFieldError, b))
    b = base()
    del b["masks"]
    out.append((MissingFieldError, b))
    b = base()
    b["masks"] = b["masks"][:, :1].copy()
    out.append((ShapeError, b))
    b = base()
    b["players"] = b["players"][:5].copy()
    out.append((RecordCountError, b))
    b = base()
    b["legal_offsets"] = b["legal_offsets"].copy()
    b["legal_offsets"][0] = 1
    out.append((OffsetsError, b))
    b = base()
    b["actions"] = b["actions"].copy()
    b["actions"][2] = 9
    out.append((IdRangeError, b))
    return out


def test_rejected_appends_leave_the_store_unchanged(backend: Backend) -> None:
    rng = np.random.default_rng(3)
    st, first = _filled(backend, n=8)
    before = snapshot(st)
    w = st.writer()
    good = dqn_batch(rng, 4, extra=0)
    w.append(good, stream="a")  # pending, valid: must survive the rejected appends below
    for error, bad in _bad_batches(rng):
        with pytest.raises(error) as info:
            w.append(bad, stream="a")
        assert info.value.field  # the error names the field
    for stream in (1.5, np.float64(2.0), True, np.bool_(False), object(), ["a"] * 5, [1.0] * 6, [None] * 6):
        with pytest.raises(StreamKeyError):
            w.append(dqn_batch(rng, 6, extra=0), stream=stream)
    other = backend.open(mode="r")
    assert snapshot(other) == before  # nothing of it is visible
    w.commit()
    st.refresh()
    assert len(st) == 12  # exactly the good pending append was committed
    want = columns_of(SCHEMA, [first, good])
    got = st.read(st.row_ids())
    for name, arr in want.arrays.items():
        assert got[name].tobytes() == arr.tobytes(), name
    _rows, steps = st.rows("a")
    assert steps.tolist() == list(range(12))  # rejected appends consumed no steps
    w.close()


def test_bad_commit_metadata_keeps_the_pending_records(backend: Backend) -> None:
    st, _ = _filled(backend, n=3)
    w = st.writer()
    w.append(dqn_batch(np.random.default_rng(0), 2, extra=0), stream="a")
    for bad in ({"x": object()}, {"x": float("nan")}, [1, 2], "text"):
        with pytest.raises(MetadataError):
            w.commit(metadata=bad)
    assert len(backend.open(mode="r")) == 3
    w.commit(metadata={"ok": True})
    st.refresh()
    assert len(st) == 5
    assert st.commits()[-1]["metadata"] == {"ok": True}


# -- step order ------------------------------------------------------------------------------
def test_non_increasing_steps_are_rejected_and_change_nothing(backend: Backend) -> None:
    rng = np.random.default_rng(5)
    st = backend.open(SCHEMA)
    w = st.writer()
    w.append(dqn_batch(rng, 5, extra=0), stream="s", step=np.array([0, 1, 2, 10, 11]))
    w.append(dqn_batch(rng, 3, extra=0), stream=4)  # auto: 0, 1, 2
    w.commit()
    before = snapshot(st)

    cases = [
        {"stream": "s", "step": np.array([20, 21, 21])},      # repeated within the batch
        {"stream": "s", "step": np.array([20, 22, 21])},      # decreasing within the batch
        {"stream": "s", "step": np.array([11, 12, 13])},      # equal to the last stored step
        {"stream": "s", "step": np.array([5, 12, 13])},       # inside the stored range
        {"stream": "s", "step": 3},                           # scalar start before stored steps
        {"stream": 4, "step": np.array([0, 3, 4])},
        {"stream": ["s", 4, "s"], "step": np.array([12, 3, 12])},  # one stream fine, the other repeats
        {"stream": ["s", 4, 4], "step": np.array([12, 3, 3])},
        {"stream": "new", "step": np.array([-1, 0, 1])},      # negative
        {"stream": "new", "step": np.array([0.0, 1.0, 2.0])},  # not integers
        {"stream": "new", "step": np.array([0, 1])},          # wrong length
        {"stream": ["x", "y", "x"], "step": 7},               # scalar step over several streams
    ]
    for kwargs in cases:
        with pytest.raises(StepOrderError):
            w.append(dqn_batch(rng, 3, extra=0), **kwargs)
    # a rejected append after a pending one: the pending one stays, the bad one is not staged
    w.append(dqn_batch(rng, 1, extra=0), stream="s", step=30)
    with pytest.raises(StepOrderError):
        w.append(dqn_batch(rng, 1, extra=0), stream="s", step=30)  # vs the *pending* step
    assert snapshot(backend.open(mode="r")) == before
    w.discard()
    w.commit()
    st.refresh()
    assert snapshot(st) == before

    # the writer continues where the stored steps left off
    w.append(dqn_batch(rng, 2, extra=0), stream="s")
    w.append(dqn_batch(rng, 2, extra=0), stream=4, step=np.array([3, 9]))
    w.commit()
    assert st.rows("s")[1].tolist() == [0, 1, 2, 10, 11, 12, 13]
    assert st.rows(4)[1].tolist() == [0, 1, 2, 3, 9]
    w.close()


def test_step_order_is_checked_against_the_store_by_a_new_writer(backend: Backend) -> None:
    rng = np.random.default_rng(6)
    st = backend.open(SCHEMA)
    with st.writer() as w:
        w.append(dqn_batch(rng, 4, extra=0), stream="s", step=np.array([0, 1, 5, 6]))
        w.append(dqn_batch(rng, 2, extra=0), stream=9)
    st.close()
    reopened = backend.open(SCHEMA)
    before = snapshot(reopened)
    w2 = reopened.writer()
    assert w2.id != 0
    for kwargs in ({"stream": "s", "step": 6}, {"stream": "s", "step": np.array([2, 3])},
                   {"stream": 9, "step": np.array([1, 2])}):
        with pytest.raises(StepOrderError):
            w2.append(dqn_batch(rng, 2 if not isinstance(kwargs["step"], int) else 1, extra=0), **kwargs)
    w2.commit()
    assert snapshot(backend.open(mode="r")) == before
    w2.append(dqn_batch(rng, 2, extra=0), stream="s")  # auto-increment continues after the stored 6
    w2.append(dqn_batch(rng, 1, extra=0), stream=9)
    w2.commit()
    assert reopened.rows("s")[1].tolist() == [0, 1, 5, 6, 7, 8]
    assert reopened.rows(9)[1].tolist() == [0, 1, 2]


def test_closed_writer_refuses_appends(backend: Backend) -> None:
    st = backend.open(SCHEMA)
    w = st.writer()
    w.close()
    with pytest.raises(StoreError):
        w.append(dqn_batch(np.random.default_rng(0), 2, extra=0), stream=1)
    with pytest.raises(StoreError):
        w.commit()
    assert len(st) == 0
