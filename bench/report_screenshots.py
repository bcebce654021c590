"""Regenerate the report screenshots in docs/images/ (``report-demo.png``, ``report-pong.png``).

    python bench/report_screenshots.py                 # both, into docs/images/
    python bench/report_screenshots.py --keep DIR      # keep the stores and the HTML reports in DIR
    python bench/report_screenshots.py --fast-demo     # the demo's store built in-process (no training run)

- **demo**: the store ``replaystore demo DIR`` leaves (``DIR/tictactoe-dqn``: 2 writers, 8 streams of random
  tic-tac-toe games, a trained ``PrioritizedSampler``'s saved state). The demo itself is run (about a
  minute); ``--fast-demo`` builds the same store with tests/support/reportstores.py instead, with the demo's
  game count and a shorter training.
- **pong**: random Pong through gymnasium's ``AtariPreprocessing`` in 4 environments under
  ``FrameStackObservation(4)``, recorded with ``RecordVectorEpisodes(frame_stack=4)`` (the ``frames``
  layout), 1,500 vector steps, episodes cut at 300 steps, a commit every 500 records, with a saved
  ``PrioritizedSampler(stack=4)``.

Each report is opened in headless Chromium (tests/support/browser.py) at 1200 CSS pixels wide; the page must
be clean (no console or page errors, no network request, every plot and frame strip rendered) or the script
fails. The full-page screenshot is saved as PNG, its colours reduced with pillow (256, then fewer) until it
is under 1.5 MB.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # support.browser, support.reportstores

LIMIT = 1_500_000
"""Bytes a committed screenshot may take."""


def demo(where: Path, fast: bool) -> str:
    """The demo's store under ``where``: ``replaystore demo`` run for real, or built in-process with ``fast``."""
    if fast:
        from support.reportstores import demo_store

        return demo_store(where, games=300, train_steps=300, train=True)
    subprocess.run([sys.executable, "-c", "import sys; from replaystore.tools.cli import main; sys.exit(main())",
                    "demo", str(where)], check=True, stdout=subprocess.DEVNULL)
    return str(where / "tictactoe-dqn")


def pong(where: Path) -> str:
    """The Pong ``frames`` store under ``where``."""
    from support.reportstores import pong_store

    return pong_store(where, envs=4, steps=1_500, episode_steps=300, sampler=True, commit_every=500)


def shrink(png: Path, limit: int = LIMIT) -> int:
    """Rewrite ``png`` with fewer colours (256, 128, 64, 32) until it takes at most ``limit`` bytes; its size."""
    from PIL import Image

    with Image.open(png) as im:
        rgb = im.convert("RGB")
    data = png.read_bytes()
    for colours in (256, 128, 64, 32):
        if len(data) <= limit:
            break
        buf = io.BytesIO()
        rgb.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(buf, format="PNG", optimize=True)
        data = buf.getvalue()
    png.write_bytes(data)
    return len(data)


def shoot(url: str, html: Path, png: Path) -> None:
    """Build the report of ``url`` into ``html``, open it in Chromium, check it and screenshot it to ``png``."""
    from replaystore.report import build_report
    from replaystore.store import open_store
    from support.browser import Browser

    with open_store(url, mode="r") as st:
        build_report(st, str(html))
    with Browser() as browser:
        check = browser.open(html, screenshot=png)
    check.assert_clean()
    size = shrink(png)
    print(f"{png}: {size / 1e6:.2f} MB; {html.stat().st_size / 1e6:.2f} MB of HTML; "
          f"{check.count('svg')} svg, {check.count('img')} img, {check.count('canvas')} canvas; "
          f"page {check.page_width} px wide")


def main() -> int:
    """Build the stores, their reports and the screenshots."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "images"), help="where the PNGs go (docs/images/)")
    ap.add_argument("--keep", default=None, help="build the stores and reports in DIR and keep them")
    ap.add_argument("--fast-demo", action="store_true", help="build the demo's store in-process, not by the demo")
    ap.add_argument("--only", choices=("demo", "pong"), default=None, help="just one of the two")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="report-screenshots-")).resolve()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if args.only in (None, "demo"):
            shoot(demo(work / "demo", args.fast_demo), work / "report-demo.html", out / "report-demo.png")
        if args.only in (None, "pong"):
            shoot(pong(work / "pong"), work / "report-pong.html", out / "report-pong.png")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
