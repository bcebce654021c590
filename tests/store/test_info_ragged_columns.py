"""``Store.info`` (and ``replaystore info``) lists every column's size, ragged id lists included."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from replaystore.schemas import Dense, Ragged, Schema
from replaystore.store import open_store


def test_info_sizes_ragged_columns_values_and_offsets(tmp_path) -> None:
    schema = Schema("r", [Dense("x", np.float32, (2,)), Ragged("legal_ids", np.int64, offsets="legal_offsets"),
                          Ragged("next_legal_ids", np.int32, offsets="next_offsets")])
    st = open_store(str(tmp_path / "st"), schema, mode="w+")
    with st.writer() as w:
        for n in (3, 5):  # two fragments' worth of commits
            w.append({"x": np.zeros((n, 2), np.float32), "legal_ids": np.arange(2 * n, dtype=np.int64),
                      "legal_offsets": np.arange(0, 2 * n + 1, 2, dtype=np.int64),
                      "next_legal_ids": np.arange(n, dtype=np.int32),
                      "next_offsets": np.arange(n + 1, dtype=np.int64)})
            w.commit()
    cols = st.info()["tables"][st.default.name]["columns"]
    assert cols["legal_ids"] == {"stored": 16 * 8 + 8 * 8, "raw": 16 * 8 + 8 * 8, "codec": None}
    assert cols["next_legal_ids"] == {"stored": 8 * 4 + 8 * 8, "raw": 8 * 4 + 8 * 8, "codec": None}
    out = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "info", "--verbose",
                          str(tmp_path / "st")],
                         capture_output=True, text=True, check=True).stdout
    assert any(line.split()[:1] == ["next_legal_ids"] and "stored" in line for line in out.splitlines())
