"""Write the LeRobot v3 fixtures of the LeRobot import/export tests with LeRobot's own writer.

Run by hand, not by the tests, with a Python >= 3.12 environment that has LeRobot (LeRobot needs
torch < 2.12, so it cannot be a test dependency of replaystore)::

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/lerobot-py312
    /tmp/lerobot-py312/bin/pip install 'lerobot[dataset]'
    /tmp/lerobot-py312/bin/python tests/data/lerobot/make_fixtures.py

It writes, next to itself (replacing what is there):

``video/``
    4 episodes at 30 fps (48 + 61 + 37 + 54 frames), 2 tasks: ``observation.state`` (float32, 6),
    ``action`` (float32, 6), ``next.reward`` (float32), ``next.done`` (bool) and one camera
    ``observation.images.top`` (64x64 RGB) that LeRobot encodes as AV1 video with its defaults
    (libsvtav1, yuv420p, GOP 2, CRF 30): all episodes in ``videos/observation.images.top/
    chunk-000/file-000.mp4``.
``image/``
    3 episodes (20 + 17 + 23 frames), 2 tasks, ``observation.state``, ``action`` and a camera
    ``observation.image`` (48x48 RGB) stored as images (``dtype="image"``: PNG bytes in the
    data parquet), as LeRobot writes with ``use_videos=False``.

``split/``
    14 episodes (7 to 20 frames) at 30 fps, ``observation.state``, ``action`` and a 32x32 camera
    ``observation.images.top`` (AV1 video), written with tiny size limits
    (``data_files_size_in_mb=0.003``, ``video_files_size_in_mb=0.006``, ``chunks_size=2``) so
    LeRobot's writer splits it: 8 data files in 4 chunks, 2 episode files, 9 video files in 5
    chunks.

Run with names (``video``, ``image``, ``split``) to write only those.

The frames are synthetic but not trivial: a lit gradient background, a coloured disc moving on
a Lissajous path and a square whose size follows the action, seeded so reruns give the same
pixels (the encoded bytes depend on the encoder's build).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

HERE = Path(__file__).resolve().parent
TASKS = ("push the disc to the corner", "hold the square still")


def frame(t: int, episode: int, size: int, action: np.ndarray) -> np.ndarray:
    """One RGB frame (uint8, HWC) of episode ``episode`` at step ``t``."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    phase = 0.7 * episode
    img = np.stack([
        96 + 80 * x + 20 * np.sin(6.0 * y + 0.2 * t + phase),
        64 + 100 * y,
        160 - 90 * x * y + 30 * np.cos(0.15 * t),
    ], axis=-1)
    cx = 0.5 + 0.35 * np.sin(0.21 * t + phase)
    cy = 0.5 + 0.35 * np.sin(0.13 * t * 1.7 + 2 * phase)
    disc = (x - cx) ** 2 + (y - cy) ** 2 < 0.012
    img[disc] = (240, 40 + 20 * episode, 30)
    half = int(2 + 4 * abs(float(action[0])))
    c = size // 2 + int(6 * np.sin(0.3 * t))
    img[c - half:c + half, c - half:c + half] = (20, 220, 90 + 30 * episode)
    return np.clip(img, 0, 255).astype(np.uint8)


def episodes(lengths: tuple[int, ...], seed: int) -> list[list[dict[str, np.ndarray | int]]]:
    """Per episode, per step: state, action, reward, done and the task index."""
    rng = np.random.default_rng(seed)
    out = []
    for e, n in enumerate(lengths):
        state = rng.normal(size=6).astype(np.float32)
        steps = []
        for t in range(n):
            action = np.tanh(rng.normal(size=6)).astype(np.float32)
            state = (0.9 * state + 0.1 * action + 0.01 * rng.normal(size=6)).astype(np.float32)
            steps.append({"state": state.copy(), "action": action, "reward": np.float32(-np.abs(state).sum()),
                          "done": t == n - 1, "task": e % len(TASKS)})
        out.append(steps)
    return out


def make_video(root: Path) -> None:
    size = 64
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "observation.images.top": {"dtype": "video", "shape": (size, size, 3),
                                   "names": ["height", "width", "channels"]},
    }
    ds = LeRobotDataset.create("replaystore/fixture-video", fps=30, features=features, root=root,
                               robot_type="synthetic_arm", use_videos=True)
    for e, steps in enumerate(episodes((48, 61, 37, 54), seed=1)):
        for t, s in enumerate(steps):
            ds.add_frame({
                "observation.state": s["state"],
                "action": s["action"],
                "next.reward": np.array([s["reward"]], np.float32),
                "next.done": np.array([s["done"]], bool),
                "observation.images.top": frame(t, e, size, s["action"]),
                "task": TASKS[int(s["task"])],
            })
        ds.save_episode()
    ds.finalize()


def make_image(root: Path) -> None:
    size = 48
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "observation.image": {"dtype": "image", "shape": (size, size, 3), "names": ["height", "width", "channels"]},
    }
    ds = LeRobotDataset.create("replaystore/fixture-image", fps=10, features=features, root=root,
                               robot_type="synthetic_arm", use_videos=False)
    for e, steps in enumerate(episodes((20, 17, 23), seed=2)):
        for t, s in enumerate(steps):
            ds.add_frame({
                "observation.state": s["state"],
                "action": s["action"],
                "observation.image": frame(t, e, size, s["action"]),
                "task": TASKS[(int(s["task"]) + 1) % len(TASKS)],
            })
        ds.save_episode()
    ds.finalize()


def make_split(root: Path) -> None:
    size = 32
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (6,), "names": [f"joint_{i}" for i in range(6)]},
        "observation.images.top": {"dtype": "video", "shape": (size, size, 3),
                                   "names": ["height", "width", "channels"]},
    }
    ds = LeRobotDataset.create("replaystore/fixture-split", fps=30, features=features, root=root,
                               robot_type="synthetic_arm", use_videos=True, data_files_size_in_mb=0.003,
                               video_files_size_in_mb=0.006)
    ds.meta.update_chunk_settings(chunks_size=2)
    for e, steps in enumerate(episodes((12, 20, 9, 15, 11, 18, 7, 14, 10, 16, 8, 13, 12, 9), seed=3)):
        for t, s in enumerate(steps):
            ds.add_frame({
                "observation.state": s["state"],
                "action": s["action"],
                "observation.images.top": frame(t, e, size, s["action"]),
                "task": TASKS[int(s["task"])],
            })
        ds.save_episode()
    ds.finalize()


def main(names: list[str]) -> None:
    makers = {"video": make_video, "image": make_image, "split": make_split}
    for name, make in makers.items():
        if names and name not in names:
            continue
        root = HERE / name
        if root.exists():
            shutil.rmtree(root)
        make(root)
        total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"{root}: {total} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
