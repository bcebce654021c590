"""Our ``output="lerobot"`` items with ``delta_timestamps`` equal LeRobot's own ``LeRobotDataset`` items.

Runs LeRobot in its own interpreter (``$LEROBOT_PYTHON``, or this one when ``lerobot`` is
importable: LeRobot needs Python >= 3.12 and torch < 2.12) through
tests/data/lerobot/dump_lerobot_items.py, over the committed fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from replaystore.loaders import EpochSampler, make_loader
from replaystore.tools.importer import import_store

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot"
DUMP = DATA / "dump_lerobot_items.py"


def _lerobot_python() -> str | None:
    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    return os.environ.get("LEROBOT_PYTHON") or None


CASES = {
    "image": {"observation.state": [-0.2, -0.1, 0.0], "action": [0.0, 0.1, 0.2, 0.3],
              "observation.image": [-0.1, 0.0]},
    "video": {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2],
              "observation.images.top": [-0.1, -1 / 30, 0.0], "next.reward": [0.0, 1 / 30]},
}


@pytest.mark.skipif(_lerobot_python() is None,
                    reason="lerobot is not importable here and LEROBOT_PYTHON names no interpreter that has it "
                           "(LeRobot needs Python >= 3.12 and torch < 2.12; see tests/data/lerobot/make_fixtures.py)")
@pytest.mark.parametrize(("name", "backend"), [("image", "pyav"), ("video", "pyav"), ("video", "torchcodec")])
def test_items_equal_lerobot_dataset(tmp_path: Path, name: str, backend: str) -> None:
    pytest.importorskip("PIL.Image")
    if name == "video":
        pytest.importorskip("av")
    deltas = CASES[name]
    python = _lerobot_python()
    assert python is not None
    out = tmp_path / "lerobot.npz"
    done = subprocess.run([python, str(DUMP), str(DATA / name), str(out), json.dumps(deltas), backend],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if backend == "torchcodec" and done.returncode != 0 and "torchcodec" in done.stderr.lower():
        pytest.skip(f"LeRobot's torchcodec backend does not run here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    want = dict(np.load(out))
    st = import_store(str(DATA / name), str(tmp_path / "s"), "lerobot")
    n = len(want["index"])
    ours: dict[int, dict[str, object]] = {}
    for b in make_loader(st, EpochSampler(st, 32, seed=0), output="lerobot", delta_timestamps=deltas):
        for j, ix in enumerate(b["index"].tolist()):
            ours[ix] = {k: v[j] for k, v in b.items()}
        if len(ours) == n:
            break
    assert sorted(ours) == want["index"].tolist()
    keys = set(want) - {"task"}
    assert keys <= set(ours[0]), keys - set(ours[0])
    for i in range(n):
        assert ours[i]["task"] == str(want["task"][i])
        for k in keys:
            got, ref = ours[i][k], torch.from_numpy(np.asarray(want[k][i]))
            assert isinstance(got, torch.Tensor)
            assert got.shape == ref.shape and got.dtype == ref.dtype, (i, k, got.shape, ref.shape, got.dtype, ref.dtype)
            if k.startswith("observation.images") and backend != "pyav":
                assert (got - ref).abs().max() <= 3 / 255, (i, k)  # another decoder's colour conversion
            else:
                assert torch.equal(got, ref), (i, k)
