"""The browser harness (tests/support/browser.py) has power: each check it makes fails on a page built to fail it.

Hand-written pages, each with one defect (a broken image, a ``console.error``, an uncaught exception, an
external request, an empty SVG, a blank canvas, a one-colour image, a hidden plot), must each be caught, and a
page with none must pass. Without Chromium these tests are skipped (failed under ``CI``): a skip checked
nothing and is not a pass.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from support.browser import WIDTH, Browser, PageCheck, chromium_or_skip


def _png(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


STRIPES = _png(np.tile(np.repeat(np.array([0, 255], np.uint8), 4), (16, 2)))
FLAT = _png(np.full((16, 16), 128, np.uint8))
PLOT = ('<svg width="200" height="100" xmlns="http://www.w3.org/2000/svg"><defs><path id="m" d="M0 0L1 1"/></defs>'
        '<path d="M10 90 L190 10" stroke="black"/><text x="5" y="15">return</text></svg>')
CANVAS = ('<canvas id="c" width="60" height="30"></canvas>'
          '<script>const x = document.getElementById("c").getContext("2d"); x.fillRect(5, 5, 20, 10);</script>')

CLEAN = f"""<!doctype html><html><head><meta charset="utf-8"><title>clean</title>
<style>body {{ font-family: sans-serif; }}</style></head><body>
<h2>Returns</h2>{PLOT}
<h2>Frames</h2><img alt="frame strip" src="{STRIPES}" width="64" height="32">
<h2>Canvas</h2>{CANVAS}
<details><summary>more</summary><h3>Hidden until opened</h3>{PLOT}</details>
<script>console.log("a log line is not an error"); console.warn("nor is a warning");</script>
</body></html>"""


def _page(tmp_path: Path, body: str, name: str = "page.html") -> Path:
    path = tmp_path / name
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body>{body}</body></html>')
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as b:
        yield b


def test_a_clean_page_passes_every_check_and_is_screenshotted(browser: Browser, tmp_path: Path) -> None:
    path = tmp_path / "clean.html"
    path.write_text(CLEAN)
    check = browser.open(path, screenshot=tmp_path / "shots" / "clean.png")
    check.assert_clean()
    assert (check.count("svg"), check.count("img"), check.count("canvas")) == (2, 1, 1)
    assert check.elements[0].name.startswith("Returns")  # named by the heading before it
    assert check.page_width <= WIDTH
    with Image.open(tmp_path / "shots" / "clean.png") as shot:
        assert shot.format == "PNG" and shot.width == WIDTH and shot.height >= 100


@pytest.mark.parametrize(("body", "expect"), [
    (f'<img alt="strip" src="{tmp}">', "did not load") for tmp in ("missing.png", "data:image/png;base64,AAAA")
] + [
    (f'<img alt="strip" src="{FLAT}">', "one colour"),
    ('<svg width="100" height="50"></svg>', "no drawn shapes"),
    ('<svg width="100" height="50"><defs><path d="M0 0L9 9"/></defs><g></g></svg>', "no drawn shapes"),
    (f'<div style="display:none">{PLOT}</div>', "zero-size"),
    (f'<img alt="strip" src="{STRIPES}" style="width:0">', "zero-size"),
    ('<canvas width="60" height="30"></canvas>', "canvas is blank"),
], ids=["missing-file", "corrupt-data", "one-colour", "empty-svg", "defs-only-svg", "hidden-svg", "zero-width-img",
        "blank-canvas"])
def test_a_plot_or_image_that_did_not_render_is_caught(browser: Browser, tmp_path: Path, body: str,
                                                       expect: str) -> None:
    check = browser.open(_page(tmp_path, PLOT + body))
    assert [e.problem for e in check.elements][0] == ""  # the good plot beside it passes
    (bad,) = check.broken
    assert expect in bad.problem
    with pytest.raises(AssertionError, match=expect):
        check.assert_clean()


def test_console_errors_are_caught(browser: Browser, tmp_path: Path) -> None:
    check = browser.open(_page(tmp_path, PLOT + '<script>console.error("plot data missing")</script>'))
    assert [m.split(" (")[0] for m in check.console_errors] == ["plot data missing"]
    assert not check.page_errors and not check.requests and not check.broken
    with pytest.raises(AssertionError, match="console error: plot data missing"):
        check.assert_clean()


def test_uncaught_exceptions_are_caught(browser: Browser, tmp_path: Path) -> None:
    check = browser.open(_page(tmp_path, PLOT + "<script>undefinedPlotFunction();</script>"))
    assert len(check.page_errors) == 1 and "undefinedPlotFunction" in check.page_errors[0]
    with pytest.raises(AssertionError, match="page error"):
        check.assert_clean()


@pytest.mark.parametrize("body", [
    '<img alt="logo" src="https://cdn.example.com/logo.png">',
    '<script src="http://cdn.example.com/plotly.js"></script>',
    '<link rel="stylesheet" href="https://fonts.example.com/css">',
    '<script>fetch("https://telemetry.example.com/hit").catch(() => {});</script>',
], ids=["image", "script", "stylesheet", "fetch"])
def test_every_external_request_is_blocked_and_recorded(browser: Browser, tmp_path: Path, body: str) -> None:
    check = browser.open(_page(tmp_path, PLOT + body))
    assert len(check.requests) == 1 and "example.com" in check.requests[0]
    with pytest.raises(AssertionError, match="network request: https?://"):
        check.assert_clean()


def test_a_local_file_and_inline_data_are_not_network_requests(browser: Browser, tmp_path: Path) -> None:
    Image.fromarray(np.tile(np.array([0, 255], np.uint8), (8, 8))).save(tmp_path / "strip.png")
    check: PageCheck = browser.open(_page(tmp_path, f'<img alt="a" src="strip.png"><img alt="b" src="{STRIPES}">'))
    check.assert_clean()
    assert check.count("img") == 2


def test_without_chromium_a_browser_test_skips_or_fails_under_ci(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-chromium")
    with pytest.raises(pytest.skip.Exception, match="nothing was checked.*apt-get install chromium"):
        chromium_or_skip(missing, environ={})
    with pytest.raises(pytest.fail.Exception, match="cannot run under CI.*apt-get install chromium"):
        chromium_or_skip(missing, environ={"CI": "true"})
