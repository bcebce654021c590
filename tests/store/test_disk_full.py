"""A writer whose file writes fail (``EFBIG`` past ``RLIMIT_FSIZE``, as on a full disk), for real.

The child (support.procs ``fsize-writer``) lowers its own file size limit at chosen
moments: while a spare segment is created on the writer's I/O thread, at a rollover,
in the middle of an append's writes, and while the commit record is written. Each
failing call raises ``OSError`` and changes nothing visible; once the limit is lifted
the same writer goes on, and the store holds exactly the records of the calls that
returned, with nothing left behind for vacuum. Local disk only: the limit is the
process's own, object stores have no such fault.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from replaystore.store import open_store
from replaystore.store.maintenance.verify import verify
from support.procs import Child, fsize_batch


def test_failing_file_writes_raise_change_nothing_and_the_writer_recovers(tmp_path: Any) -> None:
    url = str(tmp_path / "store")
    with Child("fsize-writer", url=url) as child:
        steps = {d["step"]: (d["raised"], d["visible"]) for d in map(json.loads, child.finish(120))}
    assert steps == {
        "first": (None, 400),
        "half": (None, 400),
        "spare": ("EFBIG", 400),            # the background creation failed, silently
        "rollover": ("EFBIG", 400),         # the synchronous creation met the error
        "again": ("EFBIG", 400),
        "recovered": (None, 1200),          # 400 + 200 (pending since "half") + 600
        "mid-append": ("EFBIG", 1200),      # rolled back
        "append": (None, 1200),
        "commit": ("EFBIG", 1200),          # the record could not be written: nothing visible
        "commit again": (None, 1300),
        "close": (None, 1300),
    }
    st = open_store(url, mode="r")
    rows = st.row_ids()
    assert len(rows) == 1300
    got = st.read(rows)
    want = {k: np.concatenate([fsize_batch(a, n)[k] for a, n in ((0, 400), (400, 200), (600, 600), (1200, 100))])
            for k in ("obs", "action", "reward", "next_obs", "terminated")}
    for key, values in want.items():
        assert np.array_equal(got[key], values), key
    assert np.array_equal(st.rows(1)[1], np.arange(1300))  # steps: no gap where appends failed
    assert verify(st) == []
    assert st.vacuum(older_than_s=0, dry_run=True).deleted == []  # failed creations left nothing
