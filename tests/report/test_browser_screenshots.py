"""The report screenshots GUIDE shows are there and fit: PNG, 1200 pixels wide, full page, under 1.5 MB each.

They are made by bench/report_screenshots.py (which opens each report in Chromium and refuses a page with
a console error, a network request or a plot that did not render); this checks what was committed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ("report-demo.png", "report-pong.png")


def test_guide_shows_both_screenshots_in_look_at_a_dataset() -> None:
    guide = (ROOT / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    section = guide.split("\n## Look at a dataset\n", 1)[1].split("\n## ", 1)[0]
    shown = re.findall(r"!\[[^\]]+\]\(images/([^)]+)\)", section)
    assert shown == list(SHOTS)
    assert "bench/report_screenshots.py" in section
    assert guide.index("\n## Look at a dataset\n") < guide.index("\n## Maintain a store\n")


@pytest.mark.parametrize("name", SHOTS)
def test_each_screenshot_is_a_full_page_png_1200_wide_under_1_5_mb(name: str) -> None:
    path = ROOT / "docs" / "images" / name
    assert path.stat().st_size <= 1_500_000
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.width == 1200
        assert im.height >= 2000  # the whole page, not one screen of it
        assert len(im.convert("RGB").getcolors(1 << 16) or range(1 << 16)) >= 16  # not a blank page


def test_the_html_report_subsection_is_under_look_at_a_dataset() -> None:
    guide = (ROOT / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    look = guide.split("\n## Look at a dataset\n", 1)[1].split("\n## ", 1)[0]
    maintain = guide.split("\n## Maintain a store\n", 1)[1].split("\n## ", 1)[0]
    assert "\n### The HTML report\n" in look and "### The HTML report" not in maintain
    assert "looked_at.report(" in look  # its runnable example moved with it
    assert '"The HTML report" (in "Maintain a store")' not in guide
