"""Record documents whose checksum matches but whose body is malformed (wrong types, missing keys,
absurd counts, copied writer directories, early close records, an edited capacity) and special
files in place of a record: every reader entry point (open_store, refresh, info, verify and the
``replaystore`` command) answers with a typed error or a verify failure naming the object, and
leaves the store as it was (docs/FORMAT.md, "What a reader must refuse")."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import CorruptObjectError, ReplayStoreError
from replaystore.schemas import dqn
from replaystore.store import Store, open_store
from replaystore.store.format import layout, records
from replaystore.store.maintenance.verify import verify
from replaystore.store.storage import Storage, open_storage
from replaystore.tools.cli import main as cli_main
from support.batches import dqn_batch
from support.bounded import bounded

DQN = dqn(8, 2, actions=5)
COMMIT0 = layout.commit_record(0, 0)
BUILTIN_ERRORS = (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError, MemoryError)


# -- helpers -----------------------------------------------------------------------------------
def _make_url(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "local":
        yield str(tmp_path / "st")
        return
    root = f"memory://malformed-{os.urandom(6).hex()}"
    yield root
    fs = fsspec.filesystem("memory")
    with contextlib.suppress(FileNotFoundError):
        fs.rm(root, recursive=True)


@pytest.fixture(params=("local", "memory"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _make_url(request.param, tmp_path)


@pytest.fixture
def kind_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The store URL for a test parametrized with ``kind`` (every case runs on ``memory://``,
    a sample also on local disk, where each commit's fsyncs make a case slower)."""
    yield from _make_url(request.node.callspec.params["kind"], tmp_path)


def _cases(names: list[str], local: set[str]) -> list[Any]:
    return [pytest.param(n, "memory", id=f"memory-{n}") for n in names] + [
        pytest.param(n, "local", id=f"local-{n}") for n in names if n in local]


def _fill(url: str, commits: int = 3, capacity: int | None = None, rows: int = 4) -> Store:
    """A store written by writer 0: ``commits`` appends of ``rows`` records, then its close record."""
    st = open_store(url, DQN, mode="w", capacity=capacity)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for _ in range(commits):
            w.append(dqn_batch(rng, rows, observation_size=8, actions=5, extra=0), stream="s")
            w.commit()
    return st


def _files(storage: Storage) -> dict[str, bytes]:
    """Every object of the store with its bytes (what "unchanged" compares)."""
    return {o.path: storage.read(o.path) for o in storage.walk("") if not os.path.basename(o.path).startswith(".tmp-")}


def _body(storage: Storage, path: str) -> dict[str, Any]:
    return records.decode(path, storage.read(path))


def _forge(storage: Storage, path: str, body: dict[str, Any]) -> None:
    """Replace record ``path`` with a checksum-valid document of ``body``."""
    storage.write(path, records.encode(body))


def _cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(list(args))
    return code, out.getvalue() + err.getvalue()


def _typed(fn: Callable[[], Any]) -> ReplayStoreError | None:
    """Run ``fn``; the typed error it raised (None if none). Any other exception fails the test."""
    try:
        fn()
    except ReplayStoreError as exc:
        return exc
    return None


def _assert_verify_fails(store: Store, path_part: str) -> None:
    problems = verify(store)
    assert problems, "verify passed a damaged store"
    assert any(path_part in p.path for p in problems), problems
    code, text = _cli("verify", store.url)
    assert code == 1 and "DAMAGED" in text and "Traceback" not in text, text


# -- commit records --------------------------------------------------------------------------
def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        d = body
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return mutate


def _drop(*keys: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        d = body
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return mutate


FRAG = ("tables", "records", "add", 0)
COMMIT_DAMAGE = {
    "rows 10**12": _set(*FRAG, "rows", value=10**12),
    "rows -1": _set(*FRAG, "rows", value=-1),
    "rows a string": _set(*FRAG, "rows", value="abc"),
    "rows a bool": _set(*FRAG, "rows", value=True),
    "rows disagree with parts": _set(*FRAG, "rows", value=3),
    "row_start negative": _set(*FRAG, "row_start", value=-8),
    "nnz lacks its offsets": _set(*FRAG, "nnz", value={}),
    "nnz negative": lambda b: b["tables"]["records"]["add"][0]["nnz"].update(
        {k: -1 for k in b["tables"]["records"]["add"][0]["nnz"]}),
    "streams holds null": _set(*FRAG, "streams", value=[None]),
    "parts malformed": _set(*FRAG, "parts", value=[[0, 1]]),
    "name missing": _drop(*FRAG, "name"),
    "add is an object": _set("tables", "records", "add", value={}),
    "tables is a list": _set("tables", value=[]),
    "unknown table": lambda b: b["tables"].update({"nope": {}}),
    "kind missing": _drop("kind"),
    "kind unknown": _set("kind", value="merge"),
    "time_ns a float": _set("time_ns", value=1.5),
    "metadata a string": _set("metadata", value="x"),
    "seq not its place": _set("seq", value=5),
    "writer not its directory": _set("writer", value=3),
    "close that lists tables": _set("kind", value="close"),
    "body a list": lambda b: b.clear(),  # (replaced below by a non-object body)
}


@pytest.mark.parametrize(("damage", "kind"), _cases(sorted(COMMIT_DAMAGE), {
    "rows 10**12", "rows a bool", "nnz lacks its offsets", "kind unknown", "writer not its directory", "body a list"}))
def test_a_malformed_commit_record_is_a_typed_error_everywhere(kind_url: str, damage: str, kind: str) -> None:
    url = kind_url
    st = open_store(url, DQN, mode="w")
    early = [open_store(url, mode="r") for _ in range(3)]  # handles that have applied nothing yet
    _fill_more(st)
    storage = st.storage
    body = _body(storage, COMMIT0)
    COMMIT_DAMAGE[damage](body)
    if damage == "body a list":
        storage.write(COMMIT0, b'{"body":[1,2],"crc32c":%d}' % _crc(b"[1,2]"))
    else:
        _forge(storage, COMMIT0, body)
    before = _files(storage)

    err = _typed(lambda: open_store(url, mode="r"))
    assert isinstance(err, CorruptObjectError) and err.path == COMMIT0, err
    err = _typed(early[0].refresh)
    assert isinstance(err, CorruptObjectError) and err.path == COMMIT0, err
    err = _typed(early[1].info)
    assert isinstance(err, CorruptObjectError) and err.path == COMMIT0, err
    _assert_verify_fails(early[2], COMMIT0)
    code, text = _cli("info", url)
    assert code != 0 and COMMIT0 in text and "Traceback" not in text, text
    assert _files(storage) == before


def _fill_more(st: Store) -> None:
    rng = np.random.default_rng(1)
    with st.writer() as w:
        for _ in range(3):
            w.append(dqn_batch(rng, 4, observation_size=8, actions=5, extra=0), stream="s")
            w.commit()


def _crc(raw: bytes) -> int:
    import google_crc32c

    return google_crc32c.value(raw)


def test_a_segment_descriptor_out_of_range_is_refused(tmp_path: Path) -> None:
    """Local version-2 stores describe segment-backed fragments: their segment fields are checked too."""
    url = str(tmp_path / "st")
    _fill(url)
    storage = open_storage(url)
    for mutate in (_set(*FRAG, "segment", "capacity", "rows", value=0),
                   _set(*FRAG, "segment", "row", value=-1),
                   lambda b: b["tables"]["records"]["add"][0]["segment"]["crc32c"].update(obs=[2**40]),
                   _set(*FRAG, "segment", "values", value="x")):
        good = storage.read(COMMIT0)
        body = records.decode(COMMIT0, good)
        assert "segment" in body["tables"]["records"]["add"][0]
        mutate(body)
        _forge(storage, COMMIT0, body)
        err = _typed(lambda: open_store(url, mode="r"))
        assert isinstance(err, CorruptObjectError) and err.path == COMMIT0 and "segment" in str(err), err
        storage.write(COMMIT0, good)
    assert len(open_store(url, mode="r")) == 12


def _last_adding_record(storage: Storage) -> str:
    """Writer 0's last commit record that adds a fragment (with local segments: the compact record
    of the right-sizing at close)."""
    n = 0
    while storage.exists(layout.commit_record(0, n + 1)):
        n += 1
    while "add" not in _body(storage, layout.commit_record(0, n)).get("tables", {}).get("records", {}):
        n -= 1
    return layout.commit_record(0, n)


def test_rows_beyond_the_data_are_refused_when_read(url: str) -> None:
    """A descriptor consistent with itself (rows and parts edited together) but claiming more rows
    than its objects hold: opening checks the claim against the data's real size, so ``len``,
    ``row_ids`` and samplers never see (nor allocate for) records that do not exist."""
    st = _fill(url)
    early = open_store(url, mode="r")  # (has applied every record)
    last = _last_adding_record(st.storage)  # (its fragment is the writer's last: no other overlaps it)
    body = _body(st.storage, last)
    frag = body["tables"]["records"]["add"][0]
    frag["parts"][-1][2] += (1 << 31) - frag["rows"]  # (a compact record's fragment has several parts)
    frag["rows"] = 1 << 31
    if "segment" in frag:
        frag["segment"]["capacity"]["rows"] = frag["segment"]["row"] + (1 << 31)
    _forge(st.storage, last, body)
    err = _typed(lambda: open_store(url, mode="r"))
    assert isinstance(err, CorruptObjectError) and "_reset" in err.path and "do not exist" in str(err), err
    assert (frag["segment"]["name"] if "segment" in frag else frag["name"]) in str(err), err
    assert len(early) == 12  # (a handle that applied the honest record keeps it)
    assert verify(early)


def test_overlapping_live_fragments_are_refused(url: str) -> None:
    """A record adding a second copy of a fragment under another name would show its rows twice."""
    st = _fill(url)
    body = _body(st.storage, layout.commit_record(0, 1))
    dup = copy.deepcopy(_body(st.storage, COMMIT0)["tables"]["records"]["add"][0])
    dup["name"] = "f0000009999"
    dup["parts"] = [[1, p[1], p[2]] for p in dup["parts"]]
    body["tables"]["records"]["add"].append(dup)
    _forge(st.storage, layout.commit_record(0, 1), body)
    err = _typed(lambda: open_store(url, mode="r"))
    assert isinstance(err, CorruptObjectError) and "overlap" in str(err), err
    _assert_verify_fails(st, layout.commits_dir(0))


# -- writer directories, close records --------------------------------------------------------
def _copy_dir(storage: Storage, src: str, dst: str) -> None:
    for o in storage.walk(src):
        storage.write(dst + o.path[len(src):], storage.read(o.path))


def test_a_copied_writer_directory_is_refused(url: str) -> None:
    st = _fill(url)
    early = open_store(url, mode="r")
    rows = len(st)
    _copy_dir(st.storage, layout.writer_dir(0), layout.writer_dir(1))
    before = _files(st.storage)
    err = _typed(lambda: open_store(url, mode="r"))
    assert isinstance(err, CorruptObjectError) and err.path.startswith(layout.writer_dir(1)), err
    assert "copied writer directory" in str(err)
    assert isinstance(_typed(early.refresh), CorruptObjectError)
    assert len(early) == rows  # (nothing of the copy was applied)
    _assert_verify_fails(st, layout.writer_dir(1))
    assert _files(st.storage) == before


def test_an_early_close_record_is_a_verify_failure(url: str) -> None:
    """A close record in place of commit 0 hides every later record of its writer from readers:
    verify says so (readers stop at a close record by the format)."""
    st = _fill(url)
    body = _body(st.storage, COMMIT0)
    _forge(st.storage, COMMIT0, {**body, "kind": "close", "tables": {}, "metadata": {}})
    hidden = open_store(url, mode="r")
    assert len(hidden) == 0  # what readers see: nothing of writer 0
    _assert_verify_fails(hidden, layout.commits_dir(0))
    assert any("after the close record" in p.problem for p in verify(hidden))


def test_a_close_record_at_seq_0_of_an_empty_writer_is_fine(url: str) -> None:
    st = open_store(url, DQN, mode="w")
    st.writer().close()
    assert _body(st.storage, COMMIT0)["kind"] == "close"
    assert verify(open_store(url, mode="r")) == []


def test_a_gap_in_a_writers_commits_is_a_verify_failure(url: str) -> None:
    st = _fill(url)
    st.storage.delete(layout.commit_record(0, 1))
    _assert_verify_fails(open_store(url, mode="r"), layout.commits_dir(0))


def test_a_malformed_registration_is_a_verify_failure(url: str) -> None:
    st = _fill(url)
    path = layout.writer_record(0)
    _forge(st.storage, path, {**_body(st.storage, path), "writer": 4})
    _assert_verify_fails(open_store(url, mode="r"), path)


# -- manifest ------------------------------------------------------------------------------------
MANIFEST_DAMAGE = {
    "capacity 0": _set("capacity", value=0),
    "capacity -1": _set("capacity", value=-1),
    "capacity a string": _set("capacity", value="abc"),
    "capacity a bool": _set("capacity", value=True),
    "capacity absurd": _set("capacity", value=10**15),
    "capacity missing": _drop("capacity"),
    "tables empty": _set("tables", value={}),
    "tables a list": _set("tables", value=[]),
    "schema malformed": _set("tables", "records", value={"format": "replaystore.schema/1", "fields": 3}),
    "created_ns a string": _set("created_ns", value="yesterday"),
    "dense shape absurd": lambda b: b["tables"]["records"]["fields"][0].update(shape=[2**40, 2**40]),
}


@pytest.mark.parametrize(("damage", "kind"), _cases(sorted(MANIFEST_DAMAGE), {"capacity 0", "schema malformed"}))
def test_a_malformed_manifest_is_a_typed_error(kind_url: str, damage: str, kind: str) -> None:
    url = kind_url
    st = _fill(url, commits=1)
    body = _body(st.storage, layout.MANIFEST)
    MANIFEST_DAMAGE[damage](body)
    _forge(st.storage, layout.MANIFEST, body)
    before = _files(st.storage)
    for mode in ("r", "a"):
        err = _typed(lambda mode=mode: open_store(url, mode=mode))
        assert isinstance(err, CorruptObjectError) and err.path == layout.MANIFEST, err
    for command in ("verify", "info"):
        code, text = _cli(command, url)
        assert code != 0 and layout.MANIFEST in text and "Traceback" not in text, text
    assert _files(st.storage) == before


# -- an edited capacity -----------------------------------------------------------------------------
@pytest.mark.parametrize(("capacity", "edited"), [(40, 1), (None, 5), (5, None)])
def test_an_edited_capacity_never_makes_a_writer_delete_records(url: str, capacity: int | None,
                                                                 edited: int | None) -> None:
    """A replay's capacity lowered, a dataset given one, a replay made a dataset: the manifest
    never changes, so a writer refuses (registering nothing, reclaiming nothing)."""
    st = _fill(url, commits=6, capacity=capacity)
    visible = len(st)
    body = _body(st.storage, layout.MANIFEST)
    _forge(st.storage, layout.MANIFEST, {**body, "capacity": edited})
    before = _files(st.storage)
    edited_st = open_store(url, mode="a")
    err = _typed(edited_st.writer)
    assert isinstance(err, CorruptObjectError) and err.path == layout.MANIFEST, err
    assert "capacity" in str(err)
    assert _files(edited_st.storage) == before  # no registration, no reclaim
    _assert_verify_fails(edited_st, layout.MANIFEST)
    _forge(st.storage, layout.MANIFEST, body)  # restored: writers write again, nothing was lost
    restored = open_store(url, mode="a")
    assert len(restored) == visible
    with restored.writer() as w:
        w.append(dqn_batch(np.random.default_rng(9), 2, observation_size=8, actions=5, extra=0), stream="s")
    assert verify(open_store(url, mode="r")) == []


# -- checkpoints, state records -----------------------------------------------------------------
def test_a_checkpoint_with_absurd_positions_is_a_verify_failure_without_reading_them(url: str) -> None:
    st = _fill(url)
    number = st.log.write_checkpoint()
    assert number is not None
    path = layout.checkpoint(number)
    body = _body(st.storage, path)
    good = copy.deepcopy(body)
    body["writers"]["0"]["next_seq"] = 10**9
    _forge(st.storage, path, body)
    _assert_verify_fails(open_store(url, mode="r"), path)
    for bad in ("abc", -1, True):
        body = copy.deepcopy(good)
        body["writers"]["0"]["next_seq"] = bad
        _forge(st.storage, path, body)
        reader = open_store(url, mode="r")  # a malformed checkpoint is skipped: the records hold it all
        assert reader.log.checkpoint is None and len(reader) == len(st)
        _assert_verify_fails(reader, path)


def test_a_malformed_state_record_is_skipped_and_reported(url: str) -> None:
    st = _fill(url, commits=1)
    st.save_state("sampler", {"cursor": 1}, {"w": np.arange(3)})
    st.save_state("sampler", {"cursor": 2})
    path = layout.state_record("sampler", 1)
    _forge(st.storage, path, {**_body(st.storage, path), "arrays": ["x"]})
    with pytest.warns(UserWarning, match="skipping damaged version 1"):
        doc, arrays = st.load_state("sampler")
    assert doc == {"cursor": 1} and arrays["w"].tolist() == [0, 1, 2]
    _assert_verify_fails(st, path)


# -- special files -----------------------------------------------------------------------------------
def _bounded(fn: Callable[[], Any], seconds: float = 30.0) -> BaseException | None:
    return bounded(fn, seconds)


def _refused(problem: str) -> bool:
    """A special file is refused as one, or (a symlink to a device) as a link out of the store."""
    return "regular file" in problem or "outside the store root" in problem


@pytest.mark.parametrize("target", [layout.MANIFEST, COMMIT0, layout.writer_record(0)])
@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
def test_a_special_file_in_place_of_a_record_is_refused_promptly(tmp_path: Path, target: str, special: str) -> None:
    url = str(tmp_path / "st")
    st = _fill(url)
    full = Path(url) / target
    full.unlink()
    if special == "fifo":
        os.mkfifo(full)
    else:
        os.symlink("/dev/zero", full)
    if target != layout.writer_record(0):  # (readers never read a registration)
        err = _bounded(lambda: open_store(url, mode="r"))
        assert isinstance(err, CorruptObjectError) and err.path == target and _refused(str(err)), err
    problems: list[Any] = []
    err = _bounded(lambda: problems.extend(verify(st)))
    assert err is None and any(p.path == target and _refused(p.problem) for p in problems), problems
    got: list[tuple[int, str]] = []
    assert _bounded(lambda: got.append(_cli("verify", url))) is None
    assert got[0][0] == 1 and target in got[0][1] and "Traceback" not in got[0][1], got


def test_the_verify_command_refuses_a_fifo_record_in_a_process_of_its_own(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _fill(url)
    full = Path(url) / COMMIT0
    full.unlink()
    os.mkfifo(full)
    result = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "verify", url],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and f"DAMAGED {COMMIT0}" in result.stdout, result
    assert "Traceback" not in result.stderr


# -- property: one field of a valid record set to any JSON value --------------------------------------
JSON = hs.recursive(hs.none() | hs.booleans() | hs.integers(-(2**70), 2**70) | hs.floats(allow_nan=False,
                    allow_infinity=False) | hs.text(max_size=8),
                    lambda inner: hs.lists(inner, max_size=3) | hs.dictionaries(hs.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into ``doc`` (objects and arrays alike)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    doc = copy.deepcopy(doc)
    d = doc
    for k in path[:-1]:
        d = d[k]
    if delete and isinstance(d, dict):
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return doc


@pytest.mark.parametrize("record", [COMMIT0, layout.MANIFEST, "checkpoint"])
def test_any_one_field_changed_only_typed_errors_escape(tmp_path: Path, record: str) -> None:
    """Property: whatever JSON value one field of a valid record (commit record, manifest, log
    checkpoint) is set to, or if it is deleted, opening, refreshing, ``info`` and ``verify`` either
    work or raise a ReplayStoreError; the store's other objects stay as they were."""
    made = _make_url("memory", tmp_path)
    url = next(made)
    st = _fill(url)
    path = record
    if record == "checkpoint":
        path = layout.checkpoint(st.log.write_checkpoint())  # type: ignore[arg-type]
    storage = st.storage
    good = storage.read(path)
    body = records.decode(path, good)
    paths = _paths(body)
    others = {p: b for p, b in _files(storage).items() if p != path}

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(which=hs.integers(0, len(paths) - 1), value=JSON, delete=hs.booleans())
    def prop(which: int, value: Any, delete: bool) -> None:
        _forge(storage, path, _replace(body, paths[which], value, delete))
        try:
            for step in (lambda: open_store(url, mode="r").info(), lambda: verify(st), st.refresh):
                try:
                    step()
                except ReplayStoreError:
                    pass
                except BUILTIN_ERRORS as exc:
                    raise AssertionError(f"{type(exc).__name__} escaped for {paths[which]} = {value!r}: {exc}") from exc
            assert {p: b for p, b in _files(storage).items() if p != path} == others
        finally:
            storage.write(path, good)

    prop()
    next(made, None)  # (deletes the store)
