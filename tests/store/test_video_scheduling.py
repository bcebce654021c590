"""Encoding a video field leaves the process's scheduling as it was.

SVT-AV1 opened by root moves the calling thread (and its own threads) to real-time SCHED_FIFO
at priority 99; everything the process starts afterwards inherits it, and a child that polls
then starves the machine. The check runs in a child process so a regression cannot leave this
test process real-time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("av")

CHILD = """
import json, os
import numpy as np
from replaystore.video import VideoCodec
codec = VideoCodec("av1", gop=8).for_field(np.dtype("uint8"), (32, 32, 3))
frames = np.random.default_rng(0).integers(0, 255, (8, 32, 32, 3), dtype=np.uint8)
before = os.sched_getscheduler(0)
block = codec.encode(frames)
out = np.empty_like(frames)
codec.decode_into(np.frombuffer(block, np.uint8), out)
print(json.dumps({"before": before,
                  "after": {t: os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX scheduling calls on this platform")
def test_av1_encoding_leaves_every_thread_on_its_scheduling_policy() -> None:
    env = {**os.environ, "SVT_LOG": "0"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == os.SCHED_OTHER
    assert set(got["after"].values()) == {os.SCHED_OTHER}, got


EXPORT_CHILD = """
import json, os, sys
from replaystore.tools.formats.lerobot import export_lerobot, import_lerobot
st = import_lerobot(sys.argv[1], sys.argv[2])
before = os.sched_getscheduler(0)
export_lerobot(st, sys.argv[3])
print(json.dumps({"before": before,
                  "after": {t: os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX scheduling calls on this platform")
def test_lerobot_video_export_leaves_every_thread_on_its_scheduling_policy(tmp_path) -> None:
    """The export's MP4 muxer opens an AV1 encoder for its stream: the same restore applies."""
    src = Path(__file__).resolve().parents[1] / "data" / "lerobot" / "video"
    env = {**os.environ, "SVT_LOG": "0"}
    proc = subprocess.run([sys.executable, "-c", EXPORT_CHILD, str(src), str(tmp_path / "st"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == os.SCHED_OTHER
    assert set(got["after"].values()) == {os.SCHED_OTHER}, got
