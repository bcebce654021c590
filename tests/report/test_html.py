"""The HTML report: one self-contained file with every section and the figures the store holds.

Pages are parsed with ``html.parser`` (:class:`Page`): sections by id, their tables as text cells,
their inline SVG plots and PNG frames, and every ``src``/``href`` on the page.
"""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from replaystore.errors import StoreError
from replaystore.loaders import EpochSampler, PrioritizedSampler, ReservoirSampler, SequenceSampler, UniformSampler
from replaystore.report.html import MAX_STREAM_ROWS, SECTIONS, build_report
from replaystore.schemas import Dense, Schema, transitions
from replaystore.store import Store, open_store


class Page(HTMLParser):
    """What a report page holds, per section: tables (rows of cell texts), plots, images, slots."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value) of every src/href
        self.tags: set[str] = set()
        self._section: dict[str, Any] | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._svg_depth = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        for k in ("src", "href", "xlink:href"):
            if k in a:
                self.links.append((tag, k, a[k]))
        if tag == "section":
            self._section = {"tables": [], "svgs": 0, "imgs": [], "plots": [], "strips": [], "slots": [], "text": [],
                             "svg_text": []}
            self.sections[a["id"]] = self._section
            self.order.append(a["id"])
        s = self._section
        if s is None:
            return
        if tag == "svg":
            if self._svg_depth == 0:
                s["svgs"] += 1
            self._svg_depth += 1
        elif tag == "table":
            s["tables"].append([])
        elif tag == "tr":
            self._row = []
            s["tables"][-1].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "img":
            s["imgs"].append(a)
        elif tag == "figure" and "data-plot" in a:
            s["plots"].append(a["data-plot"])
        elif tag == "div" and a.get("class") == "strip":
            s["strips"].append(a["data-field"])
        elif tag == "div" and a.get("class") == "slot":
            s["slots"].append(a["data-slot"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        elif tag == "svg":
            self._svg_depth -= 1
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._section is not None:
            self._section["text" if self._svg_depth == 0 else "svg_text"].append(data)

    def table(self, section: str, header: str) -> dict[str, list[str]]:
        """The table of ``section`` whose first header cell is ``header``: first cell -> row."""
        for t in self.sections[section]["tables"]:
            if t and t[0] and t[0][0] == header:
                return {r[0]: r for r in t[1:]}
        raise AssertionError(f"no table starting {header!r} in section {section!r}")

    def pairs(self, section: str) -> dict[str, str]:
        """Every two-cell row (``<th>name</th><td>value</td>``) of ``section``'s tables."""
        return {r[0]: r[1] for t in self.sections[section]["tables"] for r in t if len(r) == 2}

    def text(self, section: str) -> str:
        """The section's text outside its plots."""
        return " ".join(self.sections[section]["text"])


def parse(path: str | Path) -> Page:
    return Page(Path(path).read_text("utf-8"))


def assert_self_contained(page: Page) -> None:
    """No script, no stylesheet link, no src/href that leaves the page."""
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    for tag, attr, value in page.links:
        assert value.startswith(("#", "data:")), (tag, attr, value[:80])
        assert "//" not in value.split(",", 1)[0], (tag, attr, value[:80])


# -- a transitions store with known episodes ---------------------------------------------------
EPISODES = {"a": [(3, "terminated"), (5, "terminated")], "b": [(4, "truncated"), (2, "open")]}
"""Per stream: (length, how it ends); every reward is 1, so an episode's return is its length."""


def _episode_batch(length: int, end: str, obs0: float) -> dict[str, np.ndarray]:
    obs = (obs0 + np.arange(length * 2, dtype=np.float32).reshape(length, 2))
    return {"obs": obs, "action": np.arange(length) % 3, "reward": np.ones(length, np.float32), "next_obs": obs + 1,
            "terminated": np.arange(length) == length - 1 if end == "terminated" else np.zeros(length, bool),
            "truncated": np.arange(length) == length - 1 if end == "truncated" else np.zeros(length, bool)}


def small_store(url: str) -> Store:
    schema = Schema("steps", [Dense("obs", np.float32, (2,)), Dense("action", np.int64), Dense("reward", np.float32),
                              Dense("next_obs", np.float32, (2,)), Dense("terminated", np.bool_),
                              Dense("truncated", np.bool_)])
    st = open_store(url, schema, mode="x")
    with st.writer() as w:
        for stream, eps in EPISODES.items():
            for i, (length, end) in enumerate(eps):
                w.append(_episode_batch(length, end, 10.0 * i), stream=stream)
                w.commit()
    with st.writer() as w2:  # a second writer
        w2.append(_episode_batch(3, "terminated", -5.0), stream="c")
    return st


def test_every_section_with_the_stores_figures(tmp_path: Path) -> None:
    st = small_store(str(tmp_path / "small"))
    per = PrioritizedSampler(st, batch_size=4, seed=0, name="per")
    rows = per.sample().rows
    per.update(rows, np.array([0.5, 2.0, 8.0, 32.0]))
    per.save()
    epoch = EpochSampler(st, batch_size=5, seed=1, name="pass")
    epoch.sample()
    epoch.save()
    ReservoirSampler(st, batch_size=2, capacity=6, seed=0, name="keep").save()
    windows = SequenceSampler(st, length=2, batch_size=3, seed=0, name="windows")
    for _ in range(3):
        windows.sample()
    windows.save()
    uniform = UniformSampler(st, batch_size=3, seed=0, name="uni")
    uniform.sample()
    uniform.save()
    st.save_state("model", {"step": 7}, {"weights": np.zeros((2, 3))})
    out = tmp_path / "r.html"

    done = build_report(st, out, progress=False)

    assert done.path == str(out) and done.bytes == out.stat().st_size and done.seconds > 0
    assert done.sections == SECTIONS
    page = parse(out)
    assert page.order == list(SECTIONS)
    assert_self_contained(page)

    # summary: records, streams, episodes, writers, size as du counts it, the schema table
    info = st.info()
    summary = page.pairs("summary")
    assert summary["records"] == "17" and summary["streams"] == "3"
    assert summary["episodes"].startswith("5 (3 terminated, 1 truncated, 1 open)")
    assert summary["writers"] == "2 (2 closed)"
    assert f"({info['bytes']:,} bytes" in summary["size on disk"]
    assert summary["state slots"].count("(v") == 6
    schema_rows = page.table("summary", "field")
    assert schema_rows["obs"][1:5] == ["dense", "float32", "(2,)", "raw"]
    assert set(schema_rows) == set(st.schema.names)

    # streams: records, episodes and the returns of whole episodes (return = length)
    streams = page.table("streams", "stream")
    assert streams["a"][1] == "8" and streams["a"][4] == "2" and streams["a"][5] == "0"
    assert [streams["a"][i] for i in (6, 7, 8)] == ["4", "3", "5"]
    assert streams["b"][4] == "1" and streams["b"][5] == "1" and streams["b"][6] == "4"

    # episodes: the histograms and the learning curve, as inline SVG
    assert page.sections["episodes"]["plots"] == ["returns", "lengths", "learning-curve"]
    assert page.sections["episodes"]["svgs"] == 3
    titles = page.sections["episodes"]["svg_text"]
    assert "episode return (4 episodes)" in titles and "episode length (4 episodes)" in titles
    assert "stream a" in titles and "stream b" in titles and "stream c" in titles  # the learning curve's lines

    # fields: per dimension of obs, equal to numpy's on the same values
    data = st.read(st.row_ids())
    fields = page.table("fields", "field")
    for d in (0, 1):
        row = fields[f"obs[{d}]"]
        assert float(row[5]) == pytest.approx(float(data["obs"][:, d].min()), rel=1e-3)
        assert float(row[6]) == pytest.approx(float(data["obs"][:, d].max()), rel=1e-3)
        assert float(row[7]) == pytest.approx(float(data["obs"][:, d].mean()), rel=1e-3)
        assert float(row[8]) == pytest.approx(float(data["obs"][:, d].std()), rel=1e-3)
        assert float(row[11]) == pytest.approx(float(np.quantile(data["obs"][:, d], 0.5)), rel=1e-3)
    assert fields["reward"][3] == "17"

    # health: every finding of the data layer, as a row
    from replaystore.report.episodes import episodes_of
    from replaystore.report.health import health
    from replaystore.report.stats import field_stats

    findings = health(st.default, field_stats(st.default), episodes_of(st.default))
    rows_shown = [r for t in page.sections["health"]["tables"] for r in t[1:]]
    assert sorted((r[1], r[2], r[4]) for r in rows_shown) == sorted((f.check, f.subject, f.message) for f in findings)

    # frames: none here, and the page says so
    assert page.sections["frames"]["imgs"] == [] and "No image fields" in page.text("frames")

    # samplers: every slot, where it stands, and the priority histogram of the prioritized one
    slots = page.sections["samplers"]["slots"]
    assert slots == ["keep", "model", "pass", "per", "uni", "windows"]
    assert page.sections["samplers"]["plots"] == ["priorities-per"] and page.sections["samplers"]["svgs"] == 1
    assert "priorities of 'per' (17 rows)" in page.sections["samplers"]["svg_text"]
    pos = {slot: {r[0]: r[1] for r in t} for slot, t in zip(slots, page.sections["samplers"]["tables"], strict=True)}
    assert [pos[s]["kind"] for s in ("keep", "pass", "per", "uni", "windows")] == [
        "reservoir", "epoch", "prioritized", "uniform", "sequence"]
    assert pos["pass"]["rows taken of this pass"].startswith("5 of 17") and pos["pass"]["pass (epoch)"] == "0"
    assert pos["keep"]["capacity"] == "6" and pos["keep"]["members"] == "6" and pos["keep"]["records offered"] == "17"
    assert pos["per"]["max priority"] == "32" and pos["per"]["rows tracked"] == "17"
    assert pos["windows"]["minibatches drawn"] == "3" and '"length": 2' in pos["windows"]["hyperparameters"]
    assert pos["uni"]["minibatches drawn"] == "1"
    assert pos["model"]["arrays"] == "weights float64[2, 3]" and pos["model"]["document keys"] == "step"

    # commits: rows per writer over time, and the writers' table
    assert page.sections["commits"]["plots"] == ["commits"]
    writers = page.table("commits", "writer")
    commits = st.commits()
    for w, rows_added in ((0, 14), (1, 3)):  # each writer's close compacts its fragments: a commit too
        mine = [c for c in commits if c["writer"] == w]
        assert writers[str(w)][1:4] == [str(len(mine)), str(sum(c["kind"] == "compact" for c in mine)),
                                        str(rows_added)]


def test_a_larger_store_stays_small_and_caps_its_tables(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "big"), transitions(obs_shape=4), mode="x")
    rng = np.random.default_rng(0)
    streams, steps = 64, 1_500
    with st.writer() as w:
        for _ in range(3):
            for s in range(streams):
                n = steps // 3
                w.append({"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 4, n),
                          "reward": rng.normal(size=n).astype(np.float32),
                          "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
                          "terminated": rng.random(n) < 0.01}, stream=s)
            w.commit()
    out = tmp_path / "big.html"
    done = build_report(st, out, progress=False)
    assert done.bytes < 5 * 2**20
    page = parse(out)
    assert_self_contained(page)
    assert len(page.table("streams", "stream")) == MAX_STREAM_ROWS
    assert f"{streams - MAX_STREAM_ROWS} more streams not shown" in page.text("streams")
    assert page.sections["episodes"]["svgs"] == 3
    # past 8 streams: the 4 with most episodes (in key order), the mean of all, and the band of all
    legend = [t for t, _ in legend_texts(plot_svg(out.read_text("utf-8"), "learning-curve"))]
    shown = [int(t.split()[1]) for t in legend if t.startswith("stream ")]
    assert len(shown) == 4 and shown == sorted(shown) and legend[-2:] == ["mean", "min–max, all"]


def test_a_table_of_a_multi_table_store(tmp_path: Path) -> None:
    schemas = {"left": transitions(obs_shape=1), "right": Schema("plain", [Dense("x", np.float32)])}
    st = open_store(str(tmp_path / "two"), schemas, mode="x")
    with st.writer() as w:
        w.append({**_plain_transitions(3), "x": np.arange(3, dtype=np.float32) * 2}, stream=0)
    with pytest.raises(StoreError, match="left"):
        build_report(st, tmp_path / "no.html", progress=False)
    assert not (tmp_path / "no.html").exists()
    st.report(tmp_path / "right.html", table="right", progress=False)  # the Store face
    page = parse(tmp_path / "right.html")
    assert page.table("fields", "field")["x"][6] == "4"
    assert "No episodes" in page.text("episodes")
    # a Table alone: no sampler states; its commits from its fragments
    build_report(st.table("left"), tmp_path / "left.html", progress=False)
    page = parse(tmp_path / "left.html")
    assert page.order == list(SECTIONS)
    assert "A Table was given" in page.text("samplers")
    assert page.table("commits", "writer")["0"][3] == "3"


def test_many_commits_are_read_from_the_fragments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replaystore.report import html

    st = small_store(str(tmp_path / "s"))
    build_report(st, tmp_path / "history.html", progress=False)
    monkeypatch.setattr(html, "HISTORY_COMMITS", 2)  # the store has 7 commits: over it
    build_report(st, tmp_path / "fragments.html", progress=False)
    history, fragments = parse(tmp_path / "history.html"), parse(tmp_path / "fragments.html")
    assert "not the whole commit history" in fragments.text("commits")
    by_history, by_fragments = history.table("commits", "writer"), fragments.table("commits", "writer")
    for w in ("0", "1"):  # the same appends, rows and times; compactions only from the history
        appends = sum(c["kind"] == "append" for c in st.commits() if c["writer"] == int(w))
        assert by_fragments[w][1] == str(appends) and by_fragments[w][2] == "–"
        assert by_fragments[w][3:] == by_history[w][3:]


def _plain_transitions(n: int) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((n, 1), np.float32), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
            "next_obs": np.zeros((n, 1), np.float32), "terminated": np.arange(n) == n - 1}


def test_an_unwritable_path_names_it_and_leaves_nothing(tmp_path: Path) -> None:
    st = small_store(str(tmp_path / "s"))
    target = tmp_path / "missing" / "r.html"
    with pytest.raises(FileNotFoundError, match="missing"):
        build_report(st, target, progress=False)
    assert not (tmp_path / "missing").exists()


def test_repr_html_is_the_summary_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = small_store(str(tmp_path / "s"))
    page = Page("<section id='repr'>" + st._repr_html_() + "</section>")
    assert "script" not in page.tags
    pairs = page.pairs("repr")
    assert pairs["records"] == "17" and pairs["episodes"].startswith("5 (")
    assert set(page.table("repr", "field")) == set(st.schema.names)
    assert pairs["commits"].startswith("7; ") and " → " in pairs["commits"]
    # past its cap it does not count episodes, and says so
    from replaystore.report import summary

    monkeypatch.setattr(summary, "REPR_EPISODE_RECORDS", 10)
    pairs = Page("<section id='repr'>" + st._repr_html_() + "</section>").pairs("repr")
    assert pairs["episodes"].startswith("not counted here")


def frames_of(page: Page, field: str) -> list[np.ndarray]:
    """The frames shown for ``field``, decoded from their inline PNGs."""
    out = []
    for img in page.sections["frames"]["imgs"]:
        if img["alt"].startswith(field + " step"):
            head, data = img["src"].split(",", 1)
            assert head == "data:image/png;base64"
            out.append(np.asarray(Image.open(io.BytesIO(base64.b64decode(data)))))
    return out


def test_frame_strips_of_a_recorded_pong_frames_store(tmp_path: Path) -> None:
    gym = pytest.importorskip("gymnasium")
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordEpisodes
    from support.pixels import pong

    url = str(tmp_path / "pong")
    env = RecordEpisodes(FrameStackObservation(pong(max_episode_steps=60), 4), url, frame_stack=4)
    env.reset(seed=0)
    for _ in range(200):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    env.close()
    st = open_store(url, mode="r")
    out = tmp_path / "pong.html"
    build_report(st, out, progress=False)
    page = parse(out)
    assert_self_contained(page)
    strips = page.sections["frames"]["strips"]
    assert strips and set(strips) == {"frame"} and len(strips) == 3
    shown = frames_of(page, "frame")
    assert len(shown) == 9 and all(f.shape == (84, 84) for f in shown)
    # the first strip: the first ended episode's first frame as stored, and its last frame the
    # final observation, which the frame-only record closing the episode holds
    from replaystore.report.episodes import episodes_of

    eps = episodes_of(st)
    i = int(np.flatnonzero(eps.end != "open")[0])
    rows, steps = st.rows(eps.stream[i])
    first, last = (int(np.flatnonzero(rows == r)[0]) for r in (eps.first_row[i], eps.last_row[i]))
    assert steps[last + 1] == steps[last] + 1
    expected = st.read(rows[[first, last + 1]], columns=["frame"])["frame"]
    np.testing.assert_array_equal(shown[0], expected[0])
    np.testing.assert_array_equal(shown[2], expected[1])
    assert gym is not None


def test_noisy_pictures_keep_the_page_under_5_mb(tmp_path: Path) -> None:
    from replaystore.report.frames import FRAMES_BYTES

    names = [f"camera{i}" for i in range(4)]
    schema = Schema("cams", [*(Dense(n, np.uint8, (256, 256, 3)) for n in names), Dense("reward", np.float32),
                             Dense("terminated", np.bool_)])
    st = open_store(str(tmp_path / "cams"), schema, mode="x")
    rng = np.random.default_rng(0)
    n = 30  # three episodes of 10: 9 frames a field, each ~260 KB of noise as base64 PNG
    with st.writer() as w:
        w.append({**{k: rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8) for k in names},
                  "reward": np.ones(n, np.float32), "terminated": np.arange(n) % 10 == 9}, stream=0)
    out = tmp_path / "cams.html"
    done = build_report(st, out, progress=False)
    assert done.bytes < 5 * 2**20
    page = parse(out)
    strips = page.sections["frames"]["strips"]
    assert set(strips) == set(names)  # every field keeps its first strip
    assert len(strips) < 3 * len(names) and "more strips left out" in page.text("frames")
    assert sum(len(i["src"]) for i in page.sections["frames"]["imgs"]) <= FRAMES_BYTES


def test_frames_of_any_layout_become_small_pngs() -> None:
    from replaystore.report.frames import MAX_SIDE, png_data_uri

    rng = np.random.default_rng(0)
    for frame, shape in ((rng.integers(0, 255, (300, 400, 3), dtype=np.uint8), (192, MAX_SIDE, 3)),
                         (rng.integers(0, 255, (3, 20, 30), dtype=np.uint8), (20, 30, 3)),  # channels first
                         (rng.integers(0, 255, (4, 20, 30), dtype=np.uint8), (20, 30)),  # a stack: the newest
                         (rng.normal(size=(10, 12)).astype(np.float32), (10, 12))):  # scaled to 0-255
        data = base64.b64decode(png_data_uri(frame).split(",", 1)[1])
        assert np.asarray(Image.open(io.BytesIO(data))).shape == shape


def test_frame_strips_of_every_image_leaf_of_a_dict_observation(tmp_path: Path) -> None:
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordEpisodes
    from support.dictenv import DictObsEnv

    for name, env, fields in (
            ("nested", RecordEpisodes(DictObsEnv(), str(tmp_path / "nested")), {"obs__image"}),
            ("stacked", RecordEpisodes(FrameStackObservation(DictObsEnv(), 3), str(tmp_path / "stacked"),
                                       frame_stack=3), {"frame_image"})):
        env.reset(seed=0)
        for t in range(40):
            _, _, term, trunc, _ = env.step(t % 3)
            if term or trunc:
                env.reset()
        env.close()
        st = open_store(str(tmp_path / name), mode="r")
        build_report(st, tmp_path / f"{name}.html", progress=False)
        page = parse(tmp_path / f"{name}.html")
        assert set(page.sections["frames"]["strips"]) == fields, name
        (field,) = fields
        shown = frames_of(page, field)
        assert shown and all(f.shape == (8, 8, 3) for f in shown)


# -- how the page reads: plots, the fields table, stream order, the commit span ------------------
def plot_svg(html: str, plot: str) -> str:
    """The inline SVG of the figure ``data-plot=plot``."""
    at = html.index(f'data-plot="{plot}"')
    return html[html.index("<svg", at):html.index("</svg>", at)]


def tick_labels(svg: str, axis: str) -> list[str]:
    """The text of the ``axis`` ("x" or "y") tick labels of a matplotlib SVG."""
    out = []
    for m in re.finditer(rf'<g id="[^"]*{axis}tick_\d+">', svg):  # each tick's group holds one label
        label = re.search(r"<text[^>]*>([^<]*)</text>", svg[m.end():])
        assert label is not None
        out.append(label.group(1).replace("\u2212", "-"))
    return out


def axes_right(svg: str) -> float:
    """The right edge of the axes' background rectangle."""
    path = re.search(r'<g id="[^"]*patch_2">\s*<path d="([^"]+)"', svg, re.S)
    assert path is not None
    return max(float(x) for x in re.findall(r"[ML] ([\d.]+) [\d.]+", path.group(1)))


def legend_texts(svg: str) -> list[tuple[str, float]]:
    """(text, x) of every legend entry."""
    part = svg[svg.index('legend_1"'):]
    return [(t, float(x)) for x, t in re.findall(r'<text[^>]*x="([\d.]+)"[^>]*>([^<]*)</text>', part)]


def test_legends_sit_right_of_the_axes_and_cover_no_line(tmp_path: Path) -> None:
    st = small_store(str(tmp_path / "s"))
    build_report(st, tmp_path / "r.html", progress=False)
    html = (tmp_path / "r.html").read_text("utf-8")
    for plot, labels in (("learning-curve", {"stream a", "stream b", "stream c"}),
                         ("commits", {"writer 0", "writer 1"})):
        svg = plot_svg(html, plot)
        entries = legend_texts(svg)
        assert labels <= {t for t, _ in entries}, plot
        assert all(x > axes_right(svg) for _, x in entries), plot
    # two writers: their lines and the total, once (no "mean" of cumulative counts)
    assert sorted(t for t, _ in legend_texts(plot_svg(html, "commits"))) == ["total", "writer 0", "writer 1"]


def test_the_learning_curve_is_a_wide_mean_per_stream_over_one_min_max_band(tmp_path: Path) -> None:
    st = small_store(str(tmp_path / "s"))
    build_report(st, tmp_path / "r.html", progress=False)
    html = (tmp_path / "r.html").read_text("utf-8")
    assert '<figure class="plot wide" data-plot="learning-curve">' in html
    svg = plot_svg(html, "learning-curve")
    assert svg.count("FillBetweenPolyCollection") == 1  # one band under every line
    assert "min–max, all" in {t for t, _ in legend_texts(svg)}
    # two players' episodes ending at one time cancel: the mean is 0, the band spans -1 to 1
    from replaystore.report.plots import ranges

    x, mean, lo, hi = ranges(np.array([0.0, 0.0, 1.0, 1.0, 1.0]), np.array([1.0, -1.0, 1.0, -1.0, 3.0]))
    np.testing.assert_array_equal(x, [0.0, 1.0])
    np.testing.assert_allclose(mean, [0.0, 1.0])
    np.testing.assert_array_equal(lo, [-1.0, -1.0])
    np.testing.assert_array_equal(hi, [1.0, 3.0])


def _one_commit_store(url: str, length: int = 300, episodes: int = 4) -> Store:
    """One writer, one commit (and the close's compaction): episodes all ``length`` long, returns of whole numbers."""
    st = open_store(url, transitions(obs_shape=1), mode="x")
    n = length * episodes
    with st.writer() as w:
        w.append({"obs": np.zeros((n, 1), np.float32), "action": np.zeros(n, np.int64),
                  "reward": np.where(np.arange(n) % 7 == 0, 1.0, 0.0).astype(np.float32),
                  "next_obs": np.zeros((n, 1), np.float32), "terminated": np.arange(n) % length == length - 1},
                 stream=0)
    return st


def _whole(labels: list[str]) -> bool:
    return bool(labels) and all(re.fullmatch(r"-?[\d,]+", t) for t in labels)


def test_integer_data_gets_integer_ticks_and_one_commit_no_zero_width_axis(tmp_path: Path) -> None:
    st = _one_commit_store(str(tmp_path / "one"))
    build_report(st, tmp_path / "r.html", progress=False)
    html = (tmp_path / "r.html").read_text("utf-8")
    lengths = plot_svg(html, "lengths")  # every episode 300 long: the tick 300, not 299.6 ... 300.4
    assert _whole(tick_labels(lengths, "x")) and "300" in tick_labels(lengths, "x"), tick_labels(lengths, "x")
    assert _whole(tick_labels(lengths, "y"))  # counts
    returns = plot_svg(html, "returns")  # whole-number returns (float rewards): integer ticks too
    assert _whole(tick_labels(returns, "x")), tick_labels(returns, "x")
    commits = plot_svg(html, "commits")  # one append: numbered commits, not -0.04 ... 0.04 s
    xs = tick_labels(commits, "x")
    assert _whole(xs) and "1" in xs, xs
    assert "commit (" in " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", commits))
    # fractional data keeps its fractional ticks
    from replaystore.report.plots import histogram

    assert not _whole(tick_labels(histogram(np.linspace(0, 1, 50), "t", "x"), "x"))


def _field_rows(html: str) -> dict[str, tuple[str, list[str]]]:
    """Every row of the fields section: first cell -> (the row's class, its cells)."""
    section = html[html.index('<section id="fields">'):]
    section = section[:section.index("</section>")]
    out = {}
    for cls, row in re.findall(r'<tr class="(\w+)">(.*?)</tr>', section, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cls != "dims":
            out[cells[0]] = (cls, cells)
    return out


def test_a_vector_fields_summary_row_is_over_all_its_values_with_its_dimensions_under_it(tmp_path: Path) -> None:
    wide = 18
    schema = Schema("wide", [Dense("obs", np.float32, (wide,)), Dense("pair", np.float32, (2,)),
                             Dense("gappy", np.float64, (3,), finite=False)])
    st = open_store(str(tmp_path / "w"), schema, mode="x")
    rng = np.random.default_rng(0)
    n = 50
    gappy = rng.normal(size=(n, 3))
    gappy[3, 1] = np.nan
    with st.writer() as w:
        w.append({"obs": rng.normal(size=(n, wide)).astype(np.float32),
                  "pair": rng.normal(size=(n, 2)).astype(np.float32), "gappy": gappy}, stream=0)
    build_report(st, tmp_path / "r.html", progress=False)
    html = (tmp_path / "r.html").read_text("utf-8")
    rows = _field_rows(html)
    data = st.read(st.row_ids())
    for name, values in (("obs", data["obs"]), ("pair", data["pair"])):
        cls, top = rows[f"{name} (all {values.shape[1]} values)"]
        flat = values.astype(np.float64).ravel()
        assert cls == "field" and top[3] == f"{flat.size:,}" and top[4] == str(n) and top[-2:] == ["0", "0"]
        for col, want in ((5, flat.min()), (6, flat.max()), (7, flat.mean()), (8, flat.std()),
                          (11, np.quantile(flat, 0.5))):
            assert float(top[col]) == pytest.approx(float(want), rel=1e-3, abs=1e-6), (name, col)
        for d in range(values.shape[1]):  # each dimension: every column filled, its own figures
            cls, row = rows[f"{name}[{d}]"]
            assert cls == "dim" and row[3] == str(n) and row[4] == str(n) and row[-2:] == ["0", "0"]
            assert float(row[7]) == pytest.approx(float(values[:, d].mean()), rel=1e-3, abs=1e-6)
    # past 8 dimensions they are folded into a <details>; 2 stay open under their field
    folded = re.findall(r'<details data-field="([^"]+)"><summary>([^<]+)</summary>', html)
    assert folded == [("obs", f"{wide} dimensions of obs")]
    pair_at = html.index("pair (all 2 values)")
    assert "<details" not in html[pair_at:html.index("pair[1]")]
    # with a NaN the per-dimension counts are not known: a dash, not an empty cell
    cls, top = rows["gappy (all 3 values)"]
    assert top[3] == f"{3 * n - 1:,}" and top[-2:] == ["1", "0"]
    assert all(rows[f"gappy[{d}]"][1][3] == "–" for d in range(3))


def test_streams_are_listed_in_key_order(tmp_path: Path) -> None:
    from replaystore.report.markup import stream_key

    assert sorted([10, 2, 1], key=stream_key) == [1, 2, 10]
    assert sorted(["env10", "env2", "collector1/game0", "collector0/game1", "collector0/game0"], key=stream_key) == [
        "collector0/game0", "collector0/game1", "collector1/game0", "env2", "env10"]
    assert sorted(["b", 3, "a"], key=stream_key) == [3, "a", "b"]
    for keys, order in (([10, 2, 1], ["1", "2", "10"]),
                        (["collector1/game0", "env10", "collector0/game1", "env2"],
                         ["collector0/game1", "collector1/game0", "env2", "env10"])):
        name = f"s{len(order)}{type(keys[0]).__name__}"
        st = open_store(str(tmp_path / name), transitions(obs_shape=1), mode="x")
        with st.writer() as w:
            for k in keys:
                w.append(_plain_transitions(3), stream=k)
        build_report(st, tmp_path / f"{name}.html", progress=False)
        page = parse(tmp_path / f"{name}.html")
        streams = [r[0] for t in page.sections["streams"]["tables"] for r in t[1:]]
        assert streams == order
        html = (tmp_path / f"{name}.html").read_text("utf-8")
        legend = [t for t, _ in legend_texts(plot_svg(html, "learning-curve")) if t.startswith("stream ")]
        assert legend == [f"stream {k}" for k in order]


def test_the_commit_span_is_that_of_the_appends_from_the_history_or_the_fragments(tmp_path: Path) -> None:
    from replaystore.report.summary import commit_span, held_commits

    st = small_store(str(tmp_path / "s"))  # each writer's close compacts: commits after the last append
    history = st.commits()
    assert max(c["time_ns"] for c in history if c["kind"] == "compact") > max(
        c["time_ns"] for c in history if c["kind"] == "append")
    held = held_commits([st.default])
    appends = [c for c in history if c["kind"] == "append"]
    assert sorted(c["time_ns"] for c in held) == sorted(c["time_ns"] for c in appends)
    assert commit_span(history) == commit_span(held) == commit_span(appends)
    # the report's summary (from the history) says what the notebook view (from the fragments) says
    build_report(st, tmp_path / "r.html", progress=False)
    report = parse(tmp_path / "r.html").pairs("summary")["commits"]
    notebook = Page("<section id='repr'>" + st._repr_html_() + "</section>").pairs("repr")["commits"]
    assert report.split("; ", 1)[1] == notebook.split("; ", 1)[1] == "appends " + commit_span(held)
    # a compaction long after the appends does not stretch it
    assert commit_span([{"time_ns": 10**9, "kind": "append"}, {"time_ns": 2 * 10**9, "kind": "append"},
                        {"time_ns": 99 * 10**9, "kind": "compact"}]).endswith("(1 s)")
    # the writers' table: first and last append, the same from either source
    assert page_header(tmp_path / "r.html", "commits", "writer")[4:] == ["first append", "last append"]


def page_header(path: Path, section: str, first: str) -> list[str]:
    for t in parse(path).sections[section]["tables"]:
        if t and t[0] and t[0][0] == first:
            return t[0]
    raise AssertionError(first)
