"""LeRobot import: frames/s (target >= 40k on 2 cores) and the store's bytes against the source dataset's.

    python bench/lerobot_import_bench.py            # 1,000 episodes, 50,000 frames (one AV1 camera)
    python bench/lerobot_import_bench.py --quick    # 200 episodes, 10,000 frames

The source is the AV1 fixture tests/data/lerobot/video (written by LeRobot 0.6.1: 4 episodes, one
64x64 camera at GOP 2) repeated: imported, its episodes appended again and again with new episode
indices and video timestamps, and exported to LeRobot v3 (one data file, one MP4 of all episodes).
Then ``import_store(..., "lerobot")`` is timed (best of ``--reps``, each into a new store): wall and
CPU seconds, frames per second of each, and the bytes on disk of the store (allocated) and of the
source's files, with the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "lerobot" / "video"
TARGET_FPS = 40_000


def build(tmp: Path, reps: int) -> Path:
    """A LeRobot dataset of the fixture's 4 episodes repeated ``reps`` times (see the module)."""
    from replaystore.store import open_store
    from replaystore.tools.export import export_store
    from replaystore.tools.importer import import_store

    src = import_store(str(FIXTURE), str(tmp / "fixture"), "lerobot")
    eps = [src.read(src.rows(e)[0]) for e in src.streams()]
    big = open_store(str(tmp / "big"), src.default.schema, mode="w")
    n = "observation__images__top"
    step = int(eps[0][n + "__pts"][1] - eps[0][n + "__pts"][0])
    shift = index = ep = 0
    with big.writer() as w:
        for r in range(reps):
            for d in eps:
                d = dict(d)
                k = len(d["frame_index"])
                d["episode_index"] = np.full(k, ep, np.int64)
                d["index"] = np.arange(index, index + k, dtype=np.int64)
                d[n + "__pts"] = d[n + "__dts"] = np.arange(k, dtype=np.int64) * step + shift
                w.append(d, stream=ep, step=d["frame_index"], reset=np.arange(k) == 0)
                shift, index, ep = shift + k * step, index + k, ep + 1
            if r % 20 == 19:
                w.commit()
    export_store(big, str(tmp / "dataset"), "lerobot")
    return tmp / "dataset"


def du(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    import av  # noqa: F401  (imported before the timing, as a user's process has it)
    import pyarrow.parquet  # noqa: F401

    from replaystore.tools.importer import import_store

    tmp = Path(tempfile.mkdtemp(prefix="lerobot-bench-"))
    try:
        dataset = build(tmp, 50 if args.quick else 250)
        best = None
        for i in range(args.reps):
            url = tmp / f"imported-{i}"
            t0, c0 = time.perf_counter(), time.process_time()
            st = import_store(str(dataset), str(url), "lerobot")
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if best is None or wall < best[0]:
                best = (wall, cpu, len(st), st.info()["bytes"])
        assert best is not None
        wall, cpu, frames, size = best
        source = du(dataset)
        print(f"import lerobot: {frames:,} frames in {wall:.2f} s wall ({frames / wall:,.0f} frames/s, "
              f"target {TARGET_FPS:,}: ratio {TARGET_FPS / (frames / wall):.2f}), {cpu:.2f} s CPU "
              f"({frames / cpu:,.0f} frames/CPU-s)")
        print(f"bytes: store {size:,} (allocated) vs source {source:,} ({size / source:.2f}x)")
        print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
