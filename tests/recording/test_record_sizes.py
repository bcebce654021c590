"""A recorded CartPole store is the size ``du`` says, and not many times more (docs/GUIDE.md, "Size on disk").

3,000 steps recorded by ``RecordEpisodes`` (one writer, closed by the recorder), then
``vacuum``: the store's apparent size is within twice what it allocates, ``info`` reports both
as ``du`` does, and the records are the ones the environment produced.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from replaystore.gym import RecordEpisodes
from replaystore.store import open_store
from replaystore.store.maintenance.verify import verify


def du(path: Path, apparent: bool) -> int:
    args = ["du", "-sb"] if apparent else ["du", "-s", "--block-size=1"]
    return int(subprocess.run([*args, str(path)], capture_output=True, text=True, check=True,
                              timeout=60).stdout.split()[0])


@pytest.mark.skipif(shutil.which("du") is None, reason="needs du (coreutils)")
def test_a_recorded_3000_step_cartpole_store_is_right_sized(tmp_path: Path) -> None:
    path = tmp_path / "cartpole"
    rec = RecordEpisodes(gym.make("CartPole-v1"), path)
    obs, _ = rec.reset(seed=0)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(3000):
        seen.append(obs)
        obs, _, terminated, truncated, _ = rec.step(int(rng.integers(0, 2)))
        if terminated or truncated:
            obs, _ = rec.reset()
    rec.close()
    recorded = open_store(str(path), mode="r")
    before = recorded.read(recorded.row_ids())
    assert np.array_equal(before["obs"], np.stack(seen))
    open_store(str(path), mode="a").vacuum(older_than_s=0)  # the closed writer's sparse originals
    st = open_store(str(path), mode="r")
    after = st.read(st.row_ids())
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert verify(st) == []
    apparent, allocated = du(path, apparent=True), du(path, apparent=False)
    assert apparent <= 2 * allocated, (apparent, allocated)  # before: 63 MiB apparent, 360 KiB allocated
    info = st.info()
    assert (info["bytes"], info["apparent_bytes"]) == (allocated, apparent)
