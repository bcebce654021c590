"""``replaystore info``: the short summary people read, ``--json`` for programs, ``--verbose`` for the internals.

The JSON keys are the ones docs/GUIDE.md ("Command line: info") documents, exactly; the episode
numbers equal those of ``iter_episodes`` (a different reading of the same rule) and of the Gymnasium
recorder's own episode list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from replaystore.loaders import iter_episodes
from replaystore.schemas import Dense, Schema, transitions
from replaystore.store import open_store
from replaystore.tools import info as info_module
from replaystore.tools.info import episode_summary, info_document
from support.s3 import moto_s3
from support.tty import run_cli

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"
CARTPOLE_STEPS = 1500


def _section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"\n### {title}\n")
    end = text.index("\n#", start + 5)
    return text[start:end]


def _table_keys(section: str, after: str) -> list[str]:
    """The backticked keys of the first ``| key | value |`` table after the line starting with ``after``."""
    lines = section[section.index(after):].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| key |"))
    keys = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        keys.append(re.fullmatch(r"\| `(\w+)` \|.*", line).group(1))  # type: ignore[union-attr]
    return keys


def _prose_keys(section: str, lead: str) -> list[str]:
    """The backticked keys of the paragraph starting with ``lead`` (a list in prose)."""
    para = section[section.index(lead):].split("\n\n")[0].split(":", 1)[1]
    return re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", para))  # (what parentheses say is no key)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"{name} in the JSON document")


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> str:
    gym = pytest.importorskip("gymnasium")
    from replaystore.gym import RecordEpisodes

    url = str(tmp_path_factory.mktemp("info") / "cartpole")
    env = RecordEpisodes(gym.make("CartPole-v1"), url, commit_every=500)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(CARTPOLE_STEPS):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    return url


def test_json_has_exactly_the_documented_keys(cartpole: str) -> None:
    r = run_cli("info", "--json", cartpole, tty=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout, parse_constant=_no_constants)  # one document: NaN, Infinity refused
    section = _section("Command line: info")
    assert list(doc) == _table_keys(section, "- `--json`") == list(info_module.INFO_KEYS)
    table = doc["tables"]["records"]
    assert list(table) == _table_keys(section, "Each table:") == list(info_module.TABLE_KEYS)
    for f in table["fields"]:
        assert list(f) == _prose_keys(section, "Each field:") == list(info_module.FIELD_KEYS)
    episodes = table["episodes"]
    assert list(episodes) == _prose_keys(section, "Episodes:") == list(info_module.EPISODE_KEYS)
    assert list(episodes["return"]) == list(episodes["length"]) == list(info_module.STAT_KEYS)
    assert doc["records"] == CARTPOLE_STEPS and doc["streams"] == 1 and doc["tables_count"] == 1
    assert doc["first_commit"] <= doc["last_commit"] and doc["last_commit"].endswith("Z")
    assert [f["name"] for f in table["fields"]] == ["obs", "action", "reward", "next_obs", "terminated", "truncated"]
    assert table["fields"][0] == {"name": "obs", "kind": "dense", "dtype": "float32", "shape": [4], "codec": None,
                                  "offsets": None}
    assert table["metadata"]["env_id"] == "CartPole-v1"
    assert set(doc["commit_metadata"]) == {"0"} and "episodes" in doc["commit_metadata"]["0"]


def test_json_of_a_store_on_s3(tmp_path: Path) -> None:
    with moto_s3("replaystore-info") as server:
        url = server.url("ragged")
        st = open_store(url, Schema("r", [Dense("x", np.float32, (2,)), Dense("done", np.bool_)]),
                        storage_options=server.storage_options)
        with st.writer() as w:
            w.append({"x": np.zeros((5, 2), np.float32), "done": np.zeros(5, bool)}, stream="a")
            w.commit(metadata={"note": "s3"})
        r = run_cli("info", "--json", url, "--storage-options", json.dumps(server.storage_options), tty=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout, parse_constant=_no_constants)
    assert list(doc) == list(info_module.INFO_KEYS)
    assert doc["url"].startswith("s3://") and doc["records"] == 5 and doc["bytes"] == doc["apparent_bytes"] > 0
    assert doc["commit_metadata"] == {"0": {"note": "s3"}}
    # no "terminated"/"dones": a "done" flag is not an end flag this summary knows
    assert doc["tables"]["records"]["episodes"] is None


def test_no_nan_in_json_where_no_episode_ended(tmp_path: Path) -> None:
    url = str(tmp_path / "open")
    st = open_store(url, transitions(2))
    with st.writer() as w:
        w.append({"obs": np.zeros((4, 2), np.float32), "action": np.zeros(4, np.int64),
                  "reward": np.ones(4, np.float32), "next_obs": np.zeros((4, 2), np.float32),
                  "terminated": np.zeros(4, bool)}, stream=0)
        w.commit()
    r = run_cli("info", "--json", url, tty=False)
    assert r.returncode == 0, r.stderr
    episodes = json.loads(r.stdout, parse_constant=_no_constants)["tables"]["records"]["episodes"]
    assert episodes == {"episodes": 1, "ended": 0, "open": 1, "terminated": 0, "truncated": None, "whole": 0,
                        "return": {"mean": None, "min": None, "max": None},
                        "length": {"mean": None, "min": None, "max": None}}
    human = run_cli("info", url, tty=False).stdout
    assert "episodes  1: 0 ended, 1 open" in human and "returns" not in human


def test_human_summary_shows_the_schema_table_pretty_metadata_and_episodes(cartpole: str) -> None:
    from replaystore.gym import recorded_episodes

    r = run_cli("info", cartpole, tty=False)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    lines = out.splitlines()
    assert lines[0] == f"store     {cartpole}"
    assert re.search(r"^size      [\d.]+ \w+ allocated on disk \(as du counts it\), [\d.]+ \w+ apparent$", out, re.M)
    assert re.search(r"^commits   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \.\. \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s\)$",
                     out, re.M)
    # the schema as an aligned table
    header = lines.index("  field       kind   dtype    shape   codec")
    assert lines[header + 1] == "  ----------  -----  -------  ------  -----"
    assert lines[header + 2].split() == ["obs", "dense", "float32", "(4,)", "-"]
    assert lines[header + 3].split() == ["action", "dense", "int64", "scalar", "-"]
    # metadata: indented key: value lines; the JSON text of spaces and specs shown as its content
    assert '\\"' not in out and '{"' not in out
    spec = lines.index("    env_spec:")
    assert "      max_episode_steps: 500" in lines[spec + 1:spec + 12]
    assert "      id: CartPole-v1" in lines[spec + 1:spec + 12]
    assert "    env_id: CartPole-v1" in lines
    # episodes and returns, as the recorder listed the ended ones
    ended = [e for e in recorded_episodes(open_store(cartpole, mode="r")) if e["terminated"] or e["truncated"]]
    returns = [e["return"] for e in ended]
    lengths = [e["length"] for e in ended]
    total = len(ended) + (sum(lengths) < CARTPOLE_STEPS)
    assert f"  episodes  {total}: {len(ended)} ended ({sum(e['terminated'] for e in ended)} terminated, " \
           f"{sum(e['truncated'] for e in ended)} truncated), {total - len(ended)} open" in lines
    assert (f"  returns   mean {np.mean(returns):.4g}, min {min(returns):.4g}, max {max(returns):.4g} "
            f"({len(ended)} whole episodes)") in lines  # (each began at a reset)
    assert f"  lengths   mean {np.mean(lengths):.4g} steps, min {min(lengths)}, max {max(lengths)}" in lines
    assert "commit metadata (each writer's newest):" in lines
    # the internals are --verbose's
    assert "internals:" not in out and "log checkpoint" not in out and "fragments" not in out


def test_verbose_adds_the_internals(cartpole: str) -> None:
    short = run_cli("info", cartpole, tty=False).stdout
    r = run_cli("info", "--verbose", cartpole, tty=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(short.rstrip("\n") + "\n\ninternals:\n")
    rest = r.stdout[len(short):]
    for needle in ("log checkpoint  none", "size on disk    ", " allocated, ", "state slots     none",
                   f"table 'records': {CARTPOLE_STEPS} records, 1 streams, 1 fragments"):
        assert needle in rest
    assert re.search(r"^  obs +[\d.]+ \w+ stored, +[\d.]+ \w+ raw \(1\.0x\) codec none$", rest, re.M)


def test_commit_metadata_is_not_read_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "many")
    st = open_store(url, transitions(2))
    with st.writer() as w:
        for i in range(3):
            w.append({"obs": np.zeros((2, 2), np.float32), "action": np.zeros(2, np.int64),
                      "reward": np.ones(2, np.float32), "next_obs": np.zeros((2, 2), np.float32),
                      "terminated": np.array([False, True])}, stream=0)
            w.commit(metadata={"i": i})
    st = open_store(url, mode="r")
    assert info_document(st)["commit_metadata"] == {"0": {"i": 2}}
    assert info_document(st, commit_limit=2)["commit_metadata"] is None
    times = sorted(c["time_ns"] for c in st.commits() if c["kind"] == "append")
    doc = info_document(st, commit_limit=2)
    assert (doc["first_commit"], doc["last_commit"]) == (info_module._iso(times[0]), info_module._iso(times[-1]))
    monkeypatch.setattr(info_module, "COMMIT_METADATA_LIMIT", 2)
    info_module.print_info(st)
    assert "commit metadata: not read (4 commits; --verbose reads them)" in capsys.readouterr().out
    info_module.print_info(st, verbose=True)
    assert "commit metadata (each writer's newest):\n  writer 0:\n    i: 2\n" in capsys.readouterr().out


def test_json_and_the_summary_agree_with_info_document(cartpole: str) -> None:
    doc = info_document(open_store(cartpole, mode="r"))
    assert json.loads(run_cli("info", "--json", cartpole, tty=False).stdout) == json.loads(json.dumps(doc))


# -- the episode rule, against iter_episodes ------------------------------------------------------------
def _reference(table: Any) -> dict[str, Any]:
    """Episodes as iter_episodes yields them (complete_only=False), summarised."""
    eps = list(iter_episodes(table, complete_only=False))
    ended = [e for e in eps if e["terminated"]]  # transitions(2): terminated is the only end flag
    whole = [e for e in ended if e["complete"]]
    returns = [float(e["reward"].double().sum()) for e in whole]
    lengths = [len(e["steps"]) for e in whole]
    return {"episodes": len(eps), "ended": len(ended), "open": len(eps) - len(ended), "whole": len(whole),
            "returns": returns, "lengths": lengths}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st_.data())
def test_episode_summary_counts_as_iter_episodes(tmp_path: Path, data: st_.DataObject) -> None:
    """Several streams (int and str keys, one key "1" beside 1), resets in mid-episode, step gaps, ends."""
    url = str(tmp_path / f"ep{data.draw(st_.integers(0, 10**9))}")
    st = open_store(url, transitions(2), mode="w+")
    keys = data.draw(st_.lists(st_.sampled_from([0, 1, "1", "b"]), min_size=1, max_size=3, unique=True))
    with st.writer() as w:
        for key in keys:
            n = data.draw(st_.integers(1, 25))
            gaps = np.array(data.draw(st_.lists(st_.sampled_from([1, 1, 1, 2]), min_size=n, max_size=n)))
            resets = np.array(data.draw(st_.lists(st_.booleans(), min_size=n, max_size=n)))
            ends = np.array(data.draw(st_.lists(st_.sampled_from([False, False, True]), min_size=n, max_size=n)))
            rewards = np.array(data.draw(st_.lists(st_.integers(-3, 3), min_size=n, max_size=n)), np.float32)
            w.append({"obs": np.zeros((n, 2), np.float32), "action": np.zeros(n, np.int64), "reward": rewards,
                      "next_obs": np.zeros((n, 2), np.float32), "terminated": ends},
                     stream=key, step=np.cumsum(gaps) - 1, reset=resets)
        w.commit()
    got = episode_summary(st.default)
    want = _reference(st.default)
    assert got is not None
    assert (got["episodes"], got["ended"], got["open"], got["terminated"], got["whole"]) == \
        (want["episodes"], want["ended"], want["open"], want["ended"], want["whole"])
    if want["whole"]:
        assert got["return"] == pytest.approx({"mean": np.mean(want["returns"]), "min": min(want["returns"]),
                                               "max": max(want["returns"])})
        assert got["length"] == pytest.approx({"mean": np.mean(want["lengths"]), "min": min(want["lengths"]),
                                               "max": max(want["lengths"])})
    else:
        assert got["return"] == got["length"] == {"mean": None, "min": None, "max": None}


def test_pretty_lines_cut_long_lists_and_nest_mappings() -> None:
    lines = info_module.pretty_lines({"a": list(range(20)), "b": {"c": "{\"d\": [1, 2]}", "e": {}},
                                      "f": [{"g": 1}, 2], "h": "  padded"})
    assert lines == ["  a: [0, 1, 2, 3, 4, 5, 6, 7, ... (20 items)]", "  b:", "    c:", "      d: [1, 2]",
                     "    e: {}", "  f: (2 items)", "    - [0]", "      g: 1", "    - 2", '  h: "  padded"']


def test_command_summaries_are_readable_lines(cartpole: str, tmp_path: Path) -> None:
    """export, import, copy and vacuum end with one line of counts, sizes and paths, never a Python dict."""
    size = r"[\d.]+ (?:B|KiB|MiB|GiB)"
    out = str(tmp_path / "pq")
    lines = {
        "export": run_cli("export", cartpole, out, "--to", "parquet", tty=False),
        "export-minari": run_cli("export", cartpole, str(tmp_path / "mi"), "--to", "minari", "--dataset-id",
                                 "cart/random-v0", tty=False),
        "import": run_cli("import", out, str(tmp_path / "back"), "--from", "parquet", tty=False),
        "copy": run_cli("copy", cartpole, str(tmp_path / "copy"), tty=False),
        "vacuum": run_cli("vacuum", str(tmp_path / "copy"), "--dry-run", tty=False),
    }
    for name, r in lines.items():
        assert r.returncode == 0, (name, r.stderr)
        assert "{" not in r.stdout and "'" not in r.stdout, (name, r.stdout)
    assert re.fullmatch(rf"exported {re.escape(cartpole)} to parquet at {re.escape(out)}: {CARTPOLE_STEPS} records "
                        rf"in 1 stream, 2 files, {size}\n", lines["export"].stdout)
    assert re.fullmatch(rf"exported {re.escape(cartpole)} to minari dataset cart/random-v0 at "
                        rf"{re.escape(str(tmp_path / 'mi' / 'cart' / 'random-v0'))}: {CARTPOLE_STEPS} records in 1 "
                        rf"stream, \d+ episodes, \d+ files, {size}\n", lines["export-minari"].stdout)
    assert re.fullmatch(rf"imported {re.escape(out)} \(parquet\) into {re.escape(str(tmp_path / 'back'))}: "
                        rf"{CARTPOLE_STEPS} records in 1 stream, {size} on disk\n", lines["import"].stdout)
    assert re.fullmatch(rf"copied \d+ objects \({size}, {size} of data written\) from {re.escape(cartpole)} to "
                        rf"{re.escape(str(tmp_path / 'copy'))}; verified\n", lines["copy"].stdout)
    assert re.fullmatch(r"would delete 0 unreferenced units, 0 objects, 0 B; kept 0 unreferenced units newer than "
                        r"3600 s\n", lines["vacuum"].stdout)
