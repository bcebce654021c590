"""A read that S3 refuses (403) is an error, never taken for a missing object: following the
log would otherwise stop at a commit it cannot read, or skip a log checkpoint, without a word.
A loopback proxy in front of the moto server denies the reads (``support.s3proxy``)."""

from __future__ import annotations

import numpy as np
import pytest

from replaystore.schemas import dqn
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.read import log as log_module
from replaystore.store.storage import FsspecStorage
from support.batches import dqn_batch
from support.s3 import S3Server
from support.s3proxy import Faults, faulty_s3, options_via

DQN = dqn(16, 2, actions=9)


@pytest.mark.parametrize("denied", ["commits", "checkpoint"])
def test_a_denied_read_of_the_log_is_raised(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch,
                                            denied: str) -> None:
    monkeypatch.setattr(log_module, "CHECKPOINT_EVERY", 4)
    url = s3_server.url(f"denied-{denied}")
    rng = np.random.default_rng(0)
    st = open_store(url, DQN, mode="w", storage_options=s3_server.storage_options)
    writers = [st.writer() for _ in range(2)]
    for _ in range(6):
        for w in writers:
            w.append(dqn_batch(rng, 1, extra=0), stream=w.id)
            w.commit()
    assert st.log.checkpoint_numbers()
    reader = open_store(url, mode="r", storage_options=s3_server.storage_options)
    for w in writers:  # new records for the reader's refresh to read, both writers at once
        w.append(dqn_batch(rng, 1, extra=0), stream=w.id)
        w.commit()
    hidden = layout.commits_dir(writers[1].id) if denied == "commits" else f"{layout.CHECKPOINTS}/"
    faults = Faults(deny_reads=hidden)
    with faulty_s3(s3_server.endpoint_url, faults) as endpoint:
        options = options_via(s3_server.storage_options, endpoint)
        with pytest.raises(PermissionError):
            open_store(url, mode="r", storage_options=options)
        if denied == "commits":
            reader.log.storage = FsspecStorage(url, options)  # the reader's log, now through the proxy
            before = reader.log.writers[writers[1].id].next_seq
            with pytest.raises(PermissionError):
                reader.refresh()
            assert reader.log.writers[writers[1].id].next_seq == before  # nothing applied
    assert faults.denied > 0
    for w in writers:
        w.close()
