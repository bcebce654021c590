"""What a store claims never drives an allocation or a read past its data: row ids that are not
integers are refused, chunks must have exactly the size their descriptor implies, fragments of one
segment may not share its rows, state payloads must hold what their header claims, and records
that are not regular files (or not well-formed) are typed errors in every command, never a hang
(docs/FORMAT.md, "What a reader must refuse")."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.errors import CorruptObjectError, RowIdTypeError
from replaystore.schemas import dqn
from replaystore.store import Store, open_store
from replaystore.store.format import layout, records
from replaystore.store.maintenance import verify_store
from replaystore.tools.cli import main as cli_main
from support.batches import dqn_batch
from support.s3 import S3Server

DQN = dqn(8, 2, actions=5)


def _fill(url: str, commits: int = 3) -> Store:
    st = open_store(url, DQN, mode="w")
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for _ in range(commits):
            w.append(dqn_batch(rng, 4, observation_size=8, actions=5, extra=0), stream="s")
            w.commit()
    return st


def _forge(root: Path, path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    body = records.decode(path, (root / path).read_bytes())
    edit(body)
    (root / path).write_bytes(records.encode(body))


def _cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(args))
    return code, out.getvalue() + err.getvalue()


# -- row ids ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [[1.5], np.array([1.0, 2.0]), np.array([True, False, True]), [True], ["1"],
                                  np.array([1 << 63], dtype=np.uint64), [1, 2.5]])
def test_row_ids_that_are_not_integers_are_refused_everywhere(rows: Any) -> None:
    st = _fill(f"memory://rowids-{os.urandom(4).hex()}")
    table = st.table("records")
    view = table.view()
    calls: list[Callable[[], Any]] = [lambda: st.read(rows), lambda: table.read(rows), lambda: view.read(rows),
                                      lambda: table.read_columns(rows), lambda: view.read_columns(rows),
                                      lambda: table.index_of(rows), lambda: view.index_of(rows),
                                      lambda: view.locate(rows), lambda: table.rows_at(rows),
                                      lambda: view.rows_at(rows)]
    for call in calls:
        with pytest.raises(RowIdTypeError) as err:
            call()
        assert isinstance(err.value, TypeError)
    with pytest.raises(RowIdTypeError, match="steps"):
        table.lookup("s", [0.5])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
def test_integer_row_ids_of_any_dtype_read_the_same_records(dtype: Any) -> None:
    st = _fill(f"memory://rowids-{os.urandom(4).hex()}")
    want = st.read(np.array([3, 1, 7]))
    got = st.read(np.array([3, 1, 7], dtype=dtype))
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert all(len(v) == 0 for k, v in st.read([]).items() if not k.endswith("offsets"))
    assert st.table("records").rows_at(np.array([0, 2], dtype=dtype)).tolist() == [0, 2]


# -- chunk sizes --------------------------------------------------------------------------------
def test_a_chunk_longer_than_declared_is_refused_not_read_as_other_rows(tmp_path: Path) -> None:
    """Another array's bytes in place of a segment's ``_step`` chunk (four times as long): reads
    would take its first bytes as steps."""
    root = tmp_path / "st"
    st = _fill(str(root))
    seg = st.table("records").reader.fragments[0].path
    steps = root / seg / "_step" / "c" / "0"
    steps.write_bytes((root / seg / "obs" / "c" / "0" / "0").read_bytes())
    reader = open_store(str(root), mode="r")
    with pytest.raises(CorruptObjectError) as err:
        reader.table("records").index_of([0, 1])
    assert err.value.path.endswith("_step/c/0") and "declares" in str(err.value)
    with pytest.raises(CorruptObjectError):
        reader.table("records").stream_index()
    assert verify_store(reader)


def test_fragments_sharing_segment_rows_are_refused(tmp_path: Path) -> None:
    """A checksum-valid record placing its fragment at the segment rows of the previous one would
    show those records twice, under two row ids. (Read while the writer is open: at close its
    segment is right-sized into one fragment, which no forged record of the appends would touch.)"""
    root = tmp_path / "st"
    st = open_store(str(root), DQN, mode="w")
    rng = np.random.default_rng(0)
    w = st.writer()
    for _ in range(3):
        w.append(dqn_batch(rng, 4, observation_size=8, actions=5, extra=0), stream="s")
        w.commit()
    first = st.table("records").reader.fragments[0]
    assert first.segment is not None

    def edit(b: dict[str, Any]) -> None:
        seg = b["tables"]["records"]["add"][0]["segment"]
        seg["row"], seg["values"] = first.segment.row, dict(first.segment.values)  # type: ignore[union-attr]
    _forge(root, layout.commit_record(0, 1), edit)
    with pytest.raises(CorruptObjectError) as err:
        open_store(str(root), mode="r")
    assert "overlap in segment" in str(err.value) and err.value.path == layout.commits_dir(0)
    assert any("overlap" in p.problem for p in verify_store(st))
    w.discard()


# -- records that are not regular files, malformed state records ---------------------------------
def test_a_directory_in_place_of_the_manifest_is_a_typed_error(tmp_path: Path) -> None:
    root = tmp_path / "st"
    _fill(str(root))
    (root / layout.MANIFEST).unlink()
    (root / layout.MANIFEST).mkdir()
    with pytest.raises(CorruptObjectError) as err:
        open_store(str(root), mode="r")
    assert err.value.path == layout.MANIFEST and "directory" in str(err.value)
    code, text = _cli("info", str(root))
    assert code == 4 and text.count("\n") == 1 and "Traceback" not in text, text


def test_copy_refuses_a_fifo_record_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "st"
    _fill(str(root))
    commit = root / layout.commit_record(0, 1)
    commit.unlink()
    os.mkfifo(commit)
    run = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "copy", str(root), str(tmp_path / "dst")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stderr
    assert "not a regular file" in run.stderr and run.stderr.count("\n") == 1


def test_copy_refuses_a_state_record_without_arrays(tmp_path: Path) -> None:
    root = tmp_path / "st"
    st = _fill(str(root))
    st.save_state("slot", {"a": 1}, {"x": np.arange(3)})
    path = layout.state_record("slot", 0)
    _forge(root, path, lambda b: b.__setitem__("arrays", ["x"]))
    code, text = _cli("copy", str(root), str(tmp_path / "dst"))
    assert code == 4 and path in text and "arrays" in text and "Traceback" not in text, text


@pytest.mark.parametrize("damage", ["claims 2**40 items", "pickled objects", "truncated"])
def test_a_state_payload_is_checked_against_its_header(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "st"
    st = _fill(str(root))
    st.save_state("slot", {"v": 0}, {"x": np.arange(10)})
    st.save_state("slot", {"v": 1}, {"x": np.arange(10) * 2})
    body = records.decode(layout.state_record("slot", 1), (root / layout.state_record("slot", 1)).read_bytes())
    payload = root / body["arrays"]["x"]
    data = payload.read_bytes()
    if damage == "claims 2**40 items":
        end = data.index(b"\n") + 1
        payload.write_bytes(data[:end].replace(b"(10,)", b"(1099511627776,)") + data[end:])
    elif damage == "pickled objects":
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        payload.write_bytes(buf.getvalue())
    else:
        payload.write_bytes(data[: len(data) - 8])
    reader = open_store(str(root), mode="r")
    with pytest.warns(UserWarning, match="skipping damaged version 1"):
        doc, arrays = reader.load_state("slot")  # type: ignore[misc]
    assert doc == {"v": 0} and np.array_equal(arrays["x"], np.arange(10))
    problems = verify_store(reader)
    assert [p.path for p in problems] == [body["arrays"]["x"]], problems


def test_a_claimed_row_count_on_s3_is_checked_before_it_is_used(s3_server: S3Server) -> None:
    """On object storage too: the claim is checked (HEAD requests, asked together) when a view is
    built, so ``len`` and ``row_ids`` never count or allocate for records that do not exist."""
    url = s3_server.url(f"t-{uuid.uuid4().hex}")
    opts = s3_server.storage_options
    st = open_store(url, DQN, mode="w", storage_options=opts)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for _ in range(3):
            w.append(dqn_batch(rng, 4, observation_size=8, actions=5, extra=0), stream="s")
            w.commit()
    early = open_store(url, mode="r", storage_options=opts)
    assert len(early) == 12
    last = layout.commit_record(0, 2)
    body = records.decode(last, st.storage.read(last))
    frag = body["tables"]["records"]["add"][0]
    frag["parts"][-1][2] += (1 << 32) - frag["rows"]
    frag["rows"] = 1 << 32
    st.storage.write(last, records.encode(body))
    with pytest.raises(CorruptObjectError) as err:
        open_store(url, mode="r", storage_options=opts)
    assert "_reset" in err.value.path and frag["name"] in str(err.value) and "do not exist" in str(err.value)
    assert len(early) == 12 and len(early.row_ids()) == 12  # (a handle that applied the honest record keeps it)
    assert verify_store(early)
