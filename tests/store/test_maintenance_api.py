"""The store's public faces: the maintenance API (``live_objects``), the state-slot name
helpers of ``replaystore.store``, and the SQL face of ``Store`` (registered, loaded on use)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import InvalidNameError
from replaystore.schemas import dqn
from replaystore.store import check_slot_name, open_store, state_slot_names
from replaystore.store.format import layout
from replaystore.store.maintenance import MANIFEST, live_objects, read_state_record
from support.batches import dqn_batch

SCHEMA = dqn(16, 2, actions=9)


def test_live_objects_lists_what_the_log_and_the_state_reference_and_no_garbage(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), SCHEMA, mode="w")
    rng = np.random.default_rng(0)
    for k in range(2):
        with st.writer() as w:
            for i in range(3):
                w.append(dqn_batch(rng, 5, extra=0), stream=f"{k}-{i}")
                w.commit()
    st.save_state("sampler", {"i": 0}, {"prio": np.ones(4, np.float32)})
    st.save_state("sampler", {"i": 1}, {"prio": np.zeros(4, np.float32)})
    root = tmp_path / "s"
    leftover = root / layout.fragment_dir(0, "records", "s9999999999")  # a crash leftover: garbage
    leftover.mkdir(parents=True)
    (leftover / "zarr.json").write_text("{}")
    st.refresh()

    paths = live_objects(st)

    assert MANIFEST == "replaystore.json" and MANIFEST not in paths
    assert len(paths) == len(set(paths)) and all((root / p).is_file() for p in paths)
    assert not any(p.startswith(layout.fragment_dir(0, "records", "s9999999999")) for p in paths)
    writers = sorted(st.writers)
    records_ = [layout.writer_record(w) for w in writers]
    records_ += [layout.commit_record(w, s) for w in writers for s in range(st.log.writers[w].next_seq)]
    assert paths[:len(records_)] == records_  # the log's records first, in order
    state = [p for p in paths if p.startswith(layout.STATE + "/")]
    versions = [layout.state_record("sampler", v) for v in st.state_slots()["sampler"]["versions"]]
    assert [p for p in state if p.endswith(".json") and p.count("/") == 2] == versions
    for v in st.state_slots()["sampler"]["versions"]:
        body = read_state_record(st.storage, "sampler", v)
        assert set(body["arrays"].values()) <= set(state)
    # every other file of the store is the manifest or what vacuum finds as garbage (the leftover,
    # the segments close right-sized), and none of the garbage is listed
    garbage = {o.path for u in st.vacuum(older_than_s=0, dry_run=True).deleted for o in u.objects}
    every = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert str((leftover / "zarr.json").relative_to(root)) in garbage and not garbage & set(paths)
    assert every - set(paths) == {MANIFEST} | garbage


def test_state_slot_names_leave_out_names_the_grammar_refuses(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), SCHEMA, mode="w")
    st.save_state("a.b", {"x": 1})
    (tmp_path / "s" / layout.STATE / ".hidden").mkdir()
    assert state_slot_names(st) == ["a.b"]
    assert check_slot_name("ratelimit.records.x", "rate-limiter slot") == "ratelimit.records.x"
    with pytest.raises(InvalidNameError, match="rate-limiter slot"):
        check_slot_name("a/b", "rate-limiter slot")


def test_the_sql_face_is_registered_and_loaded_at_its_first_use(tmp_path: Path) -> None:
    code = ("import sys\n"
            "import numpy as np\n"
            "from replaystore.schemas import dqn\n"
            "from replaystore.store import open_store\n"
            "assert 'replaystore.store.sql' not in sys.modules and 'duckdb' not in sys.modules\n"
            f"st = open_store({str(tmp_path / 's')!r}, dqn(4, 2, actions=3), mode='w')\n"
            "print(st.sql('SELECT count(*) AS n FROM records').to_pylist())\n"
            "assert 'replaystore.store.sql' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[{'n': 0}]"
