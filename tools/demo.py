"""``replaystore demo``: the end-to-end main job."""

from __future__ import annotations

import argparse


def run_demo(args: argparse.Namespace) -> int:
    from replaystore.tools.cli import main

    print("replaystore demo: the store is not built yet; these are the batch schemas it will serve.\n")
    return main(["schemas"])
