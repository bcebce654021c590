"""iter_episodes yields only whole episodes: not one whose beginning retention evicted."""

from __future__ import annotations

import numpy as np

from replaystore.loaders import iter_episodes
from replaystore.schemas import episode
from replaystore.store import open_store
from support.batches import episode_batch


def test_an_episode_with_an_evicted_beginning_is_not_yielded_as_whole(tmp_path):
    st = open_store(str(tmp_path / "e"), episode(4, actions=3), capacity=8)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        w.append(episode_batch(rng, 5), stream="s")    # steps 0-4
        w.commit()
        w.append(episode_batch(rng, 6), stream="s")    # steps 5-10: with capacity 8, steps 0-2 go
        w.commit()
    _, steps = st.rows("s")
    assert steps.tolist() == list(range(3, 11))
    whole = list(iter_episodes(st.default))
    assert [e["steps"].tolist() for e in whole] == [list(range(5, 11))]
    every = list(iter_episodes(st.default, complete_only=False))
    assert [e["steps"].tolist() for e in every] == [[3, 4], list(range(5, 11))]
    assert not every[0]["complete"] and every[1]["complete"]
