"""Check that LeRobot's own ``LeRobotDataset`` loads a dataset directory, optionally item for item like another.

Run with a Python >= 3.12 environment that has LeRobot (see make_fixtures.py)::

    python tests/data/lerobot/check_lerobot_loads.py EXPORTED [ORIGINAL]

Loads ``EXPORTED`` (and ``ORIGINAL``) with ``LeRobotDataset(repo_id, root=..., video_backend="pyav")``,
reads every item, and when ``ORIGINAL`` is given checks that both have the same length, tasks, and
per item the same keys and values (tensors equal exactly: video frames decode from the same packets).
Prints ``ok <frames> frames, <episodes> episodes`` and exits 0, or raises.
The test suite runs it when ``lerobot`` is importable (tests/tools/test_lerobot_export.py).
"""

from __future__ import annotations

import sys

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def load(root: str) -> LeRobotDataset:
    return LeRobotDataset("replaystore/check", root=root, video_backend="pyav")


def main(argv: list[str]) -> None:
    ds = load(argv[0])
    items = [ds[i] for i in range(len(ds))]
    if len(argv) > 1:
        ref = load(argv[1])
        assert len(ref) == len(ds), (len(ref), len(ds))
        assert list(ref.meta.tasks.index) == list(ds.meta.tasks.index)
        for i, item in enumerate(items):
            want = ref[i]
            assert set(want) == set(item), (i, set(want) ^ set(item))
            for k, v in want.items():
                got = item[k]
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v, got), (i, k)
                else:
                    assert v == got, (i, k, v, got)
    print(f"ok {len(ds)} frames, {ds.meta.total_episodes} episodes")


if __name__ == "__main__":
    main(sys.argv[1:])
