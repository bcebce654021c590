"""One read face: ``Store``, ``Table`` and ``TableView`` read the same records the same way.

The three share one implementation (``store/read/face.py``): the same arguments
(``columns=`` wherever columns are read), the same results, the same errors. Checked against
a small in-memory model of what was appended.
"""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import StaleReadError, StoreError, UnknownColumnError, UnknownFieldError
from replaystore.schemas import ppo
from replaystore.store import open_store
from support.batches import ppo_batch

OBS, ACTIONS = 4, 3
SCHEMA = ppo(OBS, actions=ACTIONS)
DENSE = ["obs", "players", "actions", "behavior_log_probs", "advantages", "returns", "values"]
FIELDS = [*DENSE, "legal_ids"]


class Model:
    """What was appended, in row order (one writer, no capacity: row ids are ``0 .. n-1``)."""

    def __init__(self) -> None:
        self.dense: dict[str, list[np.ndarray]] = {n: [] for n in DENSE}
        self.ragged: list[np.ndarray] = []  # each record's legal_ids
        self.streams: list[Any] = []
        self.steps: list[int] = []
        self.next_step: dict[Any, int] = {}

    def append(self, batch: Any, stream: Any) -> None:
        for n in DENSE:
            self.dense[n].append(getattr(batch, n))
        off = batch.legal_offsets
        self.ragged += [batch.legal_ids[off[i]:off[i + 1]] for i in range(len(off) - 1)]
        first = self.next_step.get(stream, 0)
        self.streams += [stream] * (len(off) - 1)
        self.steps += range(first, first + len(off) - 1)
        self.next_step[stream] = first + len(off) - 1

    def read(self, rows: np.ndarray, columns: list[str] | None) -> dict[str, np.ndarray]:
        names = FIELDS if columns is None else columns
        out: dict[str, np.ndarray] = {}
        for n in DENSE:
            if n in names:
                out[n] = np.concatenate(self.dense[n])[rows]
        if "legal_ids" in names:
            picked = [self.ragged[r] for r in rows]
            out["legal_ids"] = np.concatenate([np.zeros(0, dtype=np.int64), *picked])
            out["legal_offsets"] = np.concatenate([[0], np.cumsum([len(p) for p in picked])]).astype(np.int64)
        return out


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str) -> None:
    assert got.keys() == want.keys(), where
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{where}: {k}")


def _faces(url: str) -> dict[str, Any]:
    store = open_store(url, mode="r")
    return {"Store": store, "Table": store.default, "TableView": store.default.view()}


COMMITS = st.lists(st.tuples(st.integers(1, 9), st.sampled_from([0, 1, "a"])), min_size=1, max_size=4)
COLUMNS = st.one_of(st.none(), st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commits=COMMITS, columns=COLUMNS, data=st.data())
def test_every_face_reads_the_model(commits: list[tuple[int, Any]], columns: list[str] | None,
                                    data: st.DataObject) -> None:
    url = f"memory://face-{uuid.uuid4().hex}"
    writer_store = open_store(url, SCHEMA, mode="w")
    model, rng = Model(), np.random.default_rng(len(commits))
    with writer_store.writer() as w:
        for n, stream in commits:
            batch = ppo_batch(rng, n, observation_size=OBS, actions=ACTIONS, extra=0)
            w.append(batch, stream=stream)
            model.append(batch, stream)
            w.commit()
    total = len(model.streams)
    rows = np.asarray(data.draw(st.lists(st.integers(0, total - 1), max_size=12)), dtype=np.int64)
    want = model.read(rows, columns)
    want_all = model.read(rows, None)
    scan_cols = None if columns is None else ["row", "stream", "step", *columns]
    for name, face in _faces(url).items():
        assert len(face) == total, name
        np.testing.assert_array_equal(face.row_ids(), np.arange(total), err_msg=name)
        np.testing.assert_array_equal(face.rows_at(np.arange(total)), np.arange(total), err_msg=name)
        _same(face.read(rows, columns=columns), want, f"{name}.read(columns={columns})")
        _same(face.read(rows), want_all, f"{name}.read")
        _same(dict(face.read_columns(rows, columns).arrays), want, f"{name}.read_columns")
        keys, steps, _ = face.index_of(rows)
        assert keys.tolist() == [model.streams[r] for r in rows], name
        assert steps.tolist() == [model.steps[r] for r in rows], name
        schema = face.scan_schema(scan_cols)
        table = pa.Table.from_batches(list(face.scan(scan_cols, batch_rows=4)), schema=schema)
        assert table.num_rows == total, name
        assert table.column("row").to_pylist() == list(range(total)), name
        assert [str(k) for k in table.column("stream").to_pylist()] == [str(k) for k in model.streams], name
        assert table.column("step").to_pylist() == model.steps, name
        for n in DENSE:
            if columns is None or n in columns:
                got = np.asarray(table.column(n).to_pylist())
                np.testing.assert_array_equal(got, np.concatenate(model.dense[n]), err_msg=f"{name}.scan {n}")
        for key in set(model.streams):
            expect = [r for r in range(total) if model.streams[r] == key]
            got_rows, got_steps = face.rows(key)
            assert got_rows.tolist() == expect, name
            np.testing.assert_array_equal(face.lookup(key, got_steps), got_rows, err_msg=name)
            assert face.runs(key).tolist() == [[0, len(expect) - 1]], name
        assert set(face.streams()) == set(model.streams), name


@pytest.mark.parametrize("face", ["Store", "Table", "TableView"])
def test_an_unknown_column_is_the_same_typed_error_on_every_face(face: str) -> None:
    url = f"memory://face-{uuid.uuid4().hex}"
    st_ = open_store(url, SCHEMA, mode="w")
    with st_.writer() as w:
        w.append(ppo_batch(np.random.default_rng(0), 5, observation_size=OBS, actions=ACTIONS, extra=0), stream=0)
    reader = _faces(url)[face]
    calls = [lambda: reader.read([0, 1], columns=["obs", "nope"]),
             lambda: reader.read_columns([0], ["nope"]),
             lambda: reader.scan(["row", "nope"]),
             lambda: reader.scan_schema(["nope"])]
    for call in calls:
        with pytest.raises(UnknownColumnError, match="'nope'") as info:
            call()
        # one type for every read: a field error (as read raised) and a store error (as scan raised)
        assert isinstance(info.value, UnknownFieldError) and isinstance(info.value, StoreError)
        assert info.value.field == "nope" and info.value.unknown == ["nope"] and info.value.table == "records"
        assert "has no column" in str(info.value)
        again = pickle.loads(pickle.dumps(info.value))  # it crosses process boundaries intact
        assert type(again) is UnknownColumnError and str(again) == str(info.value)
    with pytest.raises(UnknownColumnError, match="'telemetry'"):  # batch metadata is not per record
        reader.read([0], columns=["telemetry"])


def test_store_read_takes_columns() -> None:
    url = f"memory://face-{uuid.uuid4().hex}"
    st_ = open_store(url, SCHEMA, mode="w")
    batch = ppo_batch(np.random.default_rng(1), 6, observation_size=OBS, actions=ACTIONS, extra=0)
    with st_.writer() as w:
        w.append(batch, stream=0)
    got = open_store(url, mode="r").read([4, 1], columns=["returns", "legal_ids"])
    assert set(got) == {"returns", "legal_ids", "legal_offsets"}
    np.testing.assert_array_equal(got["returns"], batch.returns[[4, 1]])


def test_stream_lookups_of_an_older_view_are_stale() -> None:
    url = f"memory://face-{uuid.uuid4().hex}"
    st_ = open_store(url, SCHEMA, mode="w")
    rng = np.random.default_rng(2)
    with st_.writer() as w:
        w.append(ppo_batch(rng, 3, observation_size=OBS, actions=ACTIONS, extra=0), stream=0)
        w.commit()
        old = st_.default.view()
        assert old.streams() == [0]
        w.append(ppo_batch(rng, 3, observation_size=OBS, actions=ACTIONS, extra=0), stream=1)
        w.commit()
    assert st_.default.view() is not old
    for call in (old.streams, old.stream_index, lambda: old.rows(0), lambda: old.lookup(0, 1)):
        with pytest.raises(StaleReadError, match="older than"):
            call()
    # the older view still reads its own records
    assert len(old) == 3 and old.read([0, 2], columns=["players"])["players"].shape == (2,)


def test_views_stay_frozen_dataclasses() -> None:
    url = f"memory://face-{uuid.uuid4().hex}"
    st_ = open_store(url, SCHEMA, mode="w")
    with st_.writer() as w:
        w.append(ppo_batch(np.random.default_rng(3), 2, observation_size=OBS, actions=ACTIONS, extra=0), stream=0)
    view = st_.default.view()
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.name = "other"  # type: ignore[misc]
