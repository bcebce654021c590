"""The HTML report opens in a real headless browser: Debian's Chromium, driven by playwright (tests/support/browser.py).

For the demo's tic-tac-toe DQN store (with its saved prioritized sampler) and a recorded Pong ``frames`` store
(tests/support/reportstores.py): the report opens with no console error, no page error and no network request
(every non-local request is aborted and recorded), and every plot and frame strip (``svg``, ``img``,
``canvas``) renders. The report is built each of the three ways a user builds it: ``build_report``,
``Store.report`` and ``replaystore report STORE -o FILE``. A recording with a Dict observation shows strips of
its image leaf, and the notebook view (``Store._repr_html_``) renders clean in a page of its own.

Without Chromium these tests are skipped with the reason (and fail under ``CI``, where ``.ci/run`` installs
it): a skipped browser test checked nothing and is not a pass. The ``slow`` variant opens the reports of
stores the size of the demo's own and of a longer Pong recording.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaystore.store import open_store
from support.browser import WIDTH, Browser, PageCheck
from support.reportstores import demo_store, dict_pong_store, pong_store


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as b:  # first: without Chromium the module skips before any store is built
        yield b


@pytest.fixture(scope="module")
def demo_url(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> str:
    return demo_store(tmp_path_factory.mktemp("demo"), games=30, train_steps=20)


@pytest.fixture(scope="module")
def pong_url(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> str:
    return pong_store(tmp_path_factory.mktemp("pong"), envs=2, steps=150, episode_steps=60, commit_every=50)


@pytest.fixture(scope="module")
def dict_url(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> str:
    return dict_pong_store(tmp_path_factory.mktemp("dict"), steps=60, episode_steps=25)


def _opened(browser: Browser, html: Path) -> PageCheck:
    check = browser.open(html, screenshot=html.with_suffix(".png"))
    check.assert_clean()
    assert check.page_width <= WIDTH, f"the page scrolls sideways at {WIDTH} px: {check.page_width} px wide"
    return check


def _text(html: Path) -> str:
    return html.read_text(encoding="utf-8")


def test_the_demo_store_report_opens_clean_and_every_plot_renders(browser: Browser, demo_url: str,
                                                                   tmp_path: Path) -> None:
    from replaystore.report import build_report

    html = tmp_path / "demo.html"
    with open_store(demo_url, mode="r") as st:
        build_report(st, str(html))
    check = _opened(browser, html)
    assert check.count("svg") >= 4  # return and length histograms, returns over commits, commits per writer
    assert "demo-per" in _text(html)  # the saved sampler's section
    # two plots a row: the histograms side by side, each about half the page; the learning curve a row of its own
    box = {e.plot: e for e in check.elements if e.tag == "svg" and e.plot}
    returns, lengths, curve = box["returns"], box["lengths"], box["learning-curve"]
    assert abs(returns.y - lengths.y) < 2 and lengths.x > returns.x + returns.width - 2
    assert 380 < returns.width < 600 and 380 < lengths.width < 600
    assert curve.y > returns.y + returns.height and curve.width > 1.8 * returns.width


def test_the_pong_frames_store_report_opens_clean_with_frame_strips(browser: Browser, pong_url: str,
                                                                    tmp_path: Path) -> None:
    html = tmp_path / "pong.html"
    with open_store(pong_url, mode="r") as st:
        st.report(str(html))
    check = _opened(browser, html)
    assert check.count("img") + check.count("canvas") >= 1  # the frame strips
    assert check.count("svg") >= 3
    assert "pong-per" in _text(html)


def test_the_cli_report_opens_clean(browser: Browser, pong_url: str, tmp_path: Path) -> None:
    html = tmp_path / "cli.html"
    from replaystore.tools.cli import main

    assert main(["report", pong_url, "-o", str(html), "--quiet"]) == 0
    _opened(browser, html)


def test_a_dict_observation_recording_shows_strips_of_its_image_leaf(browser: Browser, dict_url: str,
                                                                    tmp_path: Path) -> None:
    html = tmp_path / "dict.html"
    with open_store(dict_url, mode="r") as st:
        st.report(str(html))
    check = _opened(browser, html)
    assert check.count("img") >= 2
    frames = _text(html).split('id="frames"', 1)[1].split("</section>", 1)[0]
    assert "obs__screen" in frames and "<img" in frames


def test_the_notebook_view_renders_clean(browser: Browser, demo_url: str, tmp_path: Path) -> None:
    html = tmp_path / "notebook.html"
    with open_store(demo_url, mode="r") as st:
        html.write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body>{st._repr_html_()}'
                        "</body></html>", encoding="utf-8")
    _opened(browser, html)
    assert "tictactoe-dqn" in _text(html)


@pytest.mark.slow
def test_reports_of_the_demo_sized_store_and_a_longer_pong_recording_open_clean(browser: Browser,
                                                                                tmp_path: Path) -> None:
    from replaystore.report import build_report

    urls = [demo_store(tmp_path / "demo", games=300, train_steps=300, train=True),
            pong_store(tmp_path / "pong", envs=4, steps=1_000, episode_steps=250, commit_every=400)]
    for i, url in enumerate(urls):
        html = tmp_path / f"report-{i}.html"
        with open_store(url, mode="r") as st:
            build_report(st, str(html))
        check = _opened(browser, html)
        assert check.count("svg") >= 3
        assert os.path.getsize(html) <= 5_000_000
