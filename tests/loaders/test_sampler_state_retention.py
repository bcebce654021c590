"""A sampler's ``save()`` keeps the newest two versions of its state slot, and resumes from the newest."""

from __future__ import annotations

import numpy as np

from replaystore.loaders import UniformSampler
from replaystore.schemas import dqn
from replaystore.store import open_store
from support.batches import dqn_batch


def test_sampler_save_keeps_the_newest_two_versions(tmp_path) -> None:
    st = open_store(str(tmp_path / "s"), dqn(4, 1, actions=3))
    with st.writer() as w:
        w.append(dqn_batch(np.random.default_rng(0), 50, observation_size=4, heads=1, actions=3, extra=0))
    s = UniformSampler(st, batch_size=5, seed=3, name="learner")
    versions = []
    for _ in range(20):
        s.sample()
        versions.append(s.save())
    assert st.state_slots()["learner"]["versions"] == versions[-2:]
    state = s.state_dict()
    r = UniformSampler(open_store(str(tmp_path / "s"), mode="r"), batch_size=5, seed=3, name="learner", resume=True)
    assert r.state_dict()["rng"] == state["rng"] and r.batches_drawn == s.batches_drawn
