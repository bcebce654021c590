"""Open an HTML file in the distribution's headless Chromium (driven by playwright) and say what went wrong.

What :meth:`Browser.open` checks on a page (:class:`PageCheck` holds the findings):

- **network**: every request whose URL is not ``file:``, ``data:``, ``blob:`` or ``about:`` is aborted
  before it leaves and recorded (``requests``); WebSockets are recorded too. A self-contained page makes none;
- **console errors** (``console.error`` and what Chromium logs as errors, a failed load among them) and
  **page errors** (uncaught exceptions);
- **every plot and frame strip renders**: each ``svg``, ``img`` and ``canvas`` element (an ``svg`` nested in
  another is part of it, not checked alone) must have a non-zero bounding box; an ``img`` must have loaded
  (``complete`` with ``naturalWidth > 0``) and hold more than one colour; an ``svg`` must have drawn
  children (shapes or text with a non-zero box); a ``canvas`` must differ from a blank canvas of its size.
  Elements inside closed ``<details>`` are checked with those opened (after the screenshot), so a
  collapsed section is checked as a reader who opens it sees it;
- a **full-page screenshot** (PNG) to a path, taken as the page first shows.

Chromium is Debian's ``/usr/bin/chromium`` (``.ci/run`` installs it when missing); playwright's own browser
downloads are never used. :func:`chromium_or_skip` decides what a test does without it: under ``CI`` (a true
value) the test fails with a message saying how to install it; elsewhere it is skipped with that reason. A
skipped browser test has checked nothing: it is not a pass.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from support.slow_selection import ci_enabled

CHROMIUM = "/usr/bin/chromium"
"""Where Debian's ``chromium`` package puts the browser."""
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
"""Chromium's flags: headless, no sandbox (containers), and none of its own background traffic."""
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
"""URL schemes a self-contained page may load from; any other request is aborted and recorded."""
WIDTH, HEIGHT = 1200, 900
"""The viewport (CSS pixels); the full-page screenshot is WIDTH wide."""
INSTALL = "install it with `apt-get install chromium` (.ci/run does), or set REPLAYSTORE_CHROMIUM to its path"


def chromium_path() -> str | None:
    """The Chromium executable: ``REPLAYSTORE_CHROMIUM``, ``/usr/bin/chromium`` or ``chromium`` on PATH; None."""
    for candidate in (os.environ.get("REPLAYSTORE_CHROMIUM"), CHROMIUM, shutil.which("chromium")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def chromium_or_skip(path: str | None = None, environ: dict[str, str] | None = None) -> str:
    """The Chromium executable, or the test ends: failed under ``CI``, skipped (with the reason) elsewhere.

    ``path`` (the executable to use, default :func:`chromium_path`'s) and ``environ`` (default ``os.environ``)
    are for the harness's own tests. playwright missing is treated the same way.
    """
    env = os.environ if environ is None else environ
    found = chromium_path() if path is None else (path if os.path.isfile(path) else None)
    why = None
    if found is None:
        why = f"Chromium not found (looked at $REPLAYSTORE_CHROMIUM, {CHROMIUM}, PATH): {INSTALL}"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as exc:
            why = f"playwright's Python package is missing ({exc}): pip install -e '.[test]'"
    if why is None:
        assert found is not None
        return found
    if ci_enabled(env):
        pytest.fail(f"browser tests cannot run under CI: {why}", pytrace=False)
    pytest.skip(f"browser tests skipped (nothing was checked): {why}")


@dataclass
class Element:
    """One ``svg``, ``img`` or ``canvas`` of the page and what was found wrong with it (``problem``; "" if none)."""

    tag: str
    name: str
    """Where it is: its ``id``, ``alt`` or ``aria-label``, else its heading, else its position."""
    width: float
    height: float
    problem: str
    plot: str = ""
    """The ``data-plot`` of the report figure it is in ("" if none)."""
    x: float = 0.0
    y: float = 0.0
    """Its top left corner in the page (CSS pixels)."""


@dataclass
class PageCheck:
    """What opening a page found: problems in ``console_errors``, ``page_errors``, ``requests``, ``broken``."""

    path: Path
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """The URLs the page tried to reach beyond ``LOCAL_SCHEMES`` (each was aborted)."""
    elements: list[Element] = field(default_factory=list)
    page_width: int = 0
    """The document's scroll width (CSS pixels): above :data:`WIDTH`, the page scrolls sideways."""
    screenshot: Path | None = None

    @property
    def broken(self) -> list[Element]:
        """The plots, images and canvases that did not render."""
        return [e for e in self.elements if e.problem]

    def count(self, tag: str) -> int:
        """How many elements of ``tag`` (``svg``, ``img``, ``canvas``) the page has."""
        return sum(e.tag == tag for e in self.elements)

    def problems(self) -> list[str]:
        """Every finding, one line each (empty for a clean page)."""
        return ([f"console error: {m}" for m in self.console_errors]
                + [f"page error: {m}" for m in self.page_errors]
                + [f"network request: {u}" for u in self.requests]
                + [f"{e.tag} {e.name!r} ({e.width:.0f}x{e.height:.0f}): {e.problem}" for e in self.broken])

    def assert_clean(self) -> None:
        """Fail (AssertionError listing every finding) unless the page has none."""
        problems = self.problems()
        assert not problems, f"{self.path}: {len(problems)} problem(s):\n  " + "\n  ".join(problems)


_INSPECT = r"""
() => {
  const named = (el, i) => {
    const own = el.id || el.getAttribute('alt') || el.getAttribute('aria-label') || el.getAttribute('title');
    if (own) return own;
    let node = el;
    while (node && node !== document.body) {
      let sib = node.previousElementSibling;
      while (sib) {
        if (/^H[1-6]$/.test(sib.tagName)) return sib.textContent.trim().slice(0, 80) + ' #' + i;
        const inner = sib.querySelector && sib.querySelector('h1,h2,h3,h4,h5,h6');
        if (inner) return inner.textContent.trim().slice(0, 80) + ' #' + i;
        sib = sib.previousElementSibling;
      }
      node = node.parentElement;
    }
    return el.tagName.toLowerCase() + ' #' + i;
  };
  const drawn = 'path,rect,circle,ellipse,line,polyline,polygon,text,image,use';
  const out = [];
  const all = Array.from(document.querySelectorAll('svg, img, canvas'))
    .filter(el => !(el.tagName.toLowerCase() === 'svg' && el.parentElement && el.parentElement.closest('svg')));
  all.forEach((el, i) => {
    const tag = el.tagName.toLowerCase();
    const box = el.getBoundingClientRect();
    let problem = '';
    if (!(box.width > 0 && box.height > 0)) problem = 'zero-size bounding box (hidden or not laid out)';
    if (!problem && tag === 'img') {
      if (!el.complete || el.naturalWidth === 0) problem = 'image did not load (naturalWidth 0)';
      else {
        try {
          const c = document.createElement('canvas');
          c.width = el.naturalWidth; c.height = el.naturalHeight;
          const ctx = c.getContext('2d');
          ctx.drawImage(el, 0, 0);
          const px = ctx.getImageData(0, 0, c.width, c.height).data;
          let same = true;
          for (let k = 4; k < px.length && same; k += 4)
            same = px[k] === px[0] && px[k + 1] === px[1] && px[k + 2] === px[2] && px[k + 3] === px[3];
          if (same) problem = 'image is one colour (shows nothing)';
        } catch (e) { /* a cross-origin image cannot be read back: loaded is all we know */ }
      }
    }
    if (!problem && tag === 'svg') {
      const shapes = Array.from(el.querySelectorAll(drawn)).filter(s => {
        if (s.closest('defs, clipPath, mask, symbol, marker, pattern')) return false;
        try { const b = s.getBBox(); return b.width > 0 || b.height > 0; } catch (e) { return false; }
      });
      if (shapes.length === 0) problem = 'svg has no drawn shapes or text';
    }
    if (!problem && tag === 'canvas') {
      const blank = document.createElement('canvas');
      blank.width = el.width; blank.height = el.height;
      if (el.width === 0 || el.height === 0 || el.toDataURL() === blank.toDataURL()) problem = 'canvas is blank';
    }
    const fig = el.closest('figure[data-plot]');
    out.push({tag, name: named(el, i), width: box.width, height: box.height, problem,
              plot: fig ? fig.getAttribute('data-plot') : '',
              x: box.left + window.scrollX, y: box.top + window.scrollY});
  });
  return out;
}
"""


class Browser:
    """A headless Chromium to open pages with; a context manager (``with Browser() as b: b.open(path)``).

    Parameters
    ----------
    executable : str, optional
        The Chromium to run (default: :func:`chromium_or_skip`, which skips or fails the test without one).
    """

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or chromium_or_skip()
        self._pw: Any = None
        self._browser: Any = None

    def __enter__(self) -> Browser:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(executable_path=self.executable, args=ARGS, headless=True)
        except BaseException:
            self._pw.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self._browser is not None:
                self._browser.close()
        finally:
            self._pw.stop()

    def open(self, path: str | os.PathLike[str], screenshot: str | os.PathLike[str] | None = None,
             width: int = WIDTH, settle_ms: int = 0) -> PageCheck:
        """Open the HTML file at ``path`` in a fresh context, check it, and screenshot it to ``screenshot``.

        Parameters
        ----------
        path : path-like
            The HTML file.
        screenshot : path-like, optional
            Where to write the full-page PNG (as the page first shows, before closed details are opened).
        width : int, optional
            The viewport's width in CSS pixels.
        settle_ms : int, optional
            Extra time after the load event for pages that draw late (timers); 0 for static pages.

        Returns
        -------
        PageCheck
            The findings.
        """
        page_path = Path(path).resolve()
        check = PageCheck(page_path)
        context = self._browser.new_context(viewport={"width": width, "height": HEIGHT}, device_scale_factor=1,
                                            service_workers="block")
        try:
            def route(r: Any) -> None:
                url = r.request.url
                if url.startswith(LOCAL_SCHEMES):
                    r.continue_()
                else:
                    check.requests.append(url)
                    r.abort("blockedbyclient")

            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: check.console_errors.append(f"{m.text} ({m.location.get('url', '')})")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: check.page_errors.append(str(e)))
            page.on("websocket", lambda ws: check.requests.append(ws.url))
            page.goto(page_path.as_uri(), wait_until="load")
            page.evaluate("() => document.fonts ? document.fonts.ready.then(() => true) : true")
            if settle_ms:
                page.wait_for_timeout(settle_ms)
            if screenshot is not None:
                check.screenshot = Path(screenshot)
                check.screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(check.screenshot), full_page=True)
            page.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")
            check.elements = [Element(**e) for e in page.evaluate(_INSPECT)]
            check.page_width = int(page.evaluate("() => document.documentElement.scrollWidth"))
        finally:
            context.close()
        # route() handlers and console events arrive on the same thread before close returns
        check.requests = list(dict.fromkeys(check.requests))
        return check


def check_page(path: str | os.PathLike[str], screenshot: str | os.PathLike[str] | None = None,
               width: int = WIDTH) -> PageCheck:
    """Open one page in a Chromium of its own (:meth:`Browser.open`); see there."""
    with Browser() as browser:
        return browser.open(path, screenshot, width)
