"""State slots under concurrent savers, and with a damaged latest version."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from replaystore.schemas import transitions
from replaystore.store import open_store
from replaystore.store.format import layout, records


def test_concurrent_savers_never_mix_their_arrays(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    barrier = threading.Barrier(6)

    def save(i: int) -> None:
        barrier.wait()
        st.save_state("slot", {"saver": i}, {"values": np.full(100, i, dtype=np.int64)}, keep_last=6)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = st._state_versions("slot")
    assert versions == list(range(6))
    savers = set()
    for v in versions:
        path = layout.state_record("slot", v)
        body = records.decode(path, st.storage.read(path))
        values = np.load(st.storage.local_path(body["arrays"]["values"]))
        assert (values == body["doc"]["saver"]).all()
        savers.add(body["doc"]["saver"])
    assert savers == set(range(6))


def test_a_damaged_latest_version_is_skipped_with_a_warning(tmp_path):
    st = open_store(str(tmp_path / "s"), transitions(4))
    st.save_state("slot", {"n": 1}, {"a": np.arange(3)})
    st.save_state("slot", {"n": 2}, {"a": np.arange(4)})
    (tmp_path / "s" / layout.state_record("slot", 1)).write_bytes(b'{"body": {"n"')
    with pytest.warns(UserWarning, match="skipping damaged version 1"):
        doc, arrays = st.load_state("slot")
    assert doc == {"n": 1} and arrays["a"].tolist() == [0, 1, 2]
