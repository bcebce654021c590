"""Write LeRobot's own items of a dataset, with ``delta_timestamps``, to an ``.npz`` for comparison.

Run with a Python >= 3.12 environment that has LeRobot (see make_fixtures.py)::

    python tests/data/lerobot/dump_lerobot_items.py ROOT OUT.npz DELTAS_JSON BACKEND

Loads ``LeRobotDataset(repo_id, root=ROOT, delta_timestamps=json.loads(DELTAS_JSON),
video_backend=BACKEND)``, reads every item and saves each key stacked over the items (in index
order; ``task`` as a string array). Prints ``ok <items>``. The test suite runs it when LeRobot is
importable (tests/loaders/test_lerobot_windows_lerobot.py).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def main(argv: list[str]) -> None:
    root, out, deltas, backend = argv
    ds = LeRobotDataset("replaystore/check", root=root, delta_timestamps=json.loads(deltas), video_backend=backend)
    items = [ds[i] for i in range(len(ds))]
    arrays = {}
    for k, v in items[0].items():
        if isinstance(v, torch.Tensor):
            arrays[k] = torch.stack([it[k] for it in items]).numpy()
        else:
            arrays[k] = np.array([str(it[k]) for it in items])
    np.savez(out, **arrays)
    print(f"ok {len(items)}")


if __name__ == "__main__":
    main(sys.argv[1:])
