"""Each health check fires on a store built with its defect and stays quiet on a clean store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from replaystore.report import CHECKS, Finding, episodes_of, field_stats, health
from replaystore.schemas import Dense, Schema
from replaystore.store import Store, open_store

SCHEMA = Schema("h", [Dense("obs", np.float32, (3,), finite=False), Dense("action", np.int64),
                      Dense("reward", np.float32, finite=False), Dense("next_obs", np.float32, (3,)),
                      Dense("terminated", np.bool_), Dense("truncated", np.bool_)])
N = 4000
STREAMS = 4


def clean_columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Healthy records: random observations and rewards, episodes of about 50 steps, few truncated."""
    ends = rng.random(n) < 0.02
    trunc = ends & (rng.random(n) < 0.1)
    return {"obs": rng.standard_normal((n, 3)).astype(np.float32), "action": rng.integers(0, 4, n),
            "reward": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.standard_normal((n, 3)).astype(np.float32), "terminated": ends & ~trunc,
            "truncated": trunc}


def build(path: Path, damage: Callable[[int, dict[str, np.ndarray]], None] | None = None,
          steps: Callable[[int], np.ndarray] | None = None) -> Store:
    """``STREAMS`` streams of ``N // STREAMS`` records, ``damage(stream, columns)`` applied to each before appending."""
    rng = np.random.default_rng(0)
    st = open_store(str(path), SCHEMA, mode="w")
    per = N // STREAMS
    with st.writer() as w:
        for s in range(STREAMS):
            cols = clean_columns(rng, per)
            cols["terminated"][-1] = True  # every stream ends its last episode
            if damage is not None:
                damage(s, cols)
            w.append(cols, stream=s, step=None if steps is None else steps(s), reset=True)
        w.commit()
    return st


def run(st: Store) -> list[Finding]:
    return health(st, field_stats(st), episodes_of(st))


def only(findings: list[Finding], check: str) -> list[Finding]:
    assert {f.check for f in findings} == {check}, findings
    return findings


def test_clean_store_is_quiet(tmp_path: Path) -> None:
    assert run(build(tmp_path / "s")) == []


def test_nan(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        if s == 1:
            cols["obs"][[5, 9]] = np.nan  # 6 values in 2 records
            cols["obs"][10, 0] = np.nan  # and one more in a third
    (f,) = only(run(build(tmp_path / "s", damage)), "nan")
    assert f.subject == "field 'obs'" and f.severity == "warning" and f.count == 7
    assert f.message == "field 'obs': 7 NaN values in 3 records"


def test_inf(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        if s == 0:
            cols["reward"][3] = np.inf
    (f,) = only(run(build(tmp_path / "s", damage)), "inf")
    assert f.message == "field 'reward': 1 infinite value in 1 record" and f.count == 1


def test_step_gaps(tmp_path: Path) -> None:
    per = N // STREAMS

    def steps(s: int) -> np.ndarray:
        st = np.arange(per)
        if s == 2:
            st[500:] += 3  # one gap of 3 missing steps
        return st
    findings = run(build(tmp_path / "s", steps=steps))
    gaps = [f for f in findings if f.check == "step_gaps"]
    assert len(gaps) == 1 and gaps[0].subject == "stream 2"
    assert gaps[0].message == "stream 2: 1 step gap, 3 missing steps"
    # the gap also starts an episode without an end: open_episodes says so, nothing else fires
    assert {f.check for f in findings} <= {"step_gaps", "open_episodes"}


def test_truncated_share(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        ends = cols["terminated"] | cols["truncated"]
        cols["truncated"] = ends.copy()
        cols["terminated"][:] = False
        cols["terminated"][-1] = s == 0  # one stream's last episode terminates
        cols["truncated"][-1] = s != 0
    (f,) = only(run(build(tmp_path / "s", damage)), "truncated_share")
    assert f.severity == "warning" and "were truncated" in f.message and "%" in f.message


def test_open_episodes_cut_by_a_reset(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    st = open_store(str(tmp_path / "s"), SCHEMA, mode="w")
    with st.writer() as w:
        for s in range(2):
            cols = clean_columns(rng, 300)
            cols["terminated"][-1] = True
            resets = np.zeros(300, bool)
            resets[0] = True
            if s == 1:
                resets[100] = True
                cols["terminated"][90:100] = False
                cols["truncated"][90:100] = False
            w.append(cols, stream=s, reset=resets)
        w.commit()
    (f,) = only(run(st), "open_episodes")
    assert f.severity == "warning" and f.count == 1
    assert f.message.startswith("1 episode (") and "end without a terminated/truncated flag" in f.message


def test_open_episodes_a_stream_that_never_ends(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        if s == 3:
            cols["terminated"][:] = False
            cols["truncated"][:] = False
    (f,) = only(run(build(tmp_path / "s", damage)), "open_episodes")
    assert f.subject == "stream 3" and f.count == N // STREAMS
    assert "steps since its last episode end" in f.message


def test_no_episode_ends_at_all(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        cols["terminated"][:] = False
        cols["truncated"][:] = False
    findings = run(build(tmp_path / "s", damage))
    (f,) = only(findings, "open_episodes")
    assert f.severity == "info" and f.message == f"no episode has ended in {N:,} records: is the " \
        "terminated/truncated flag written?"


def test_constant(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        cols["action"][:] = 2
        cols["obs"][:, 1] = 0.5
    findings = only(run(build(tmp_path / "s", damage)), "constant")
    by = {f.subject: f for f in findings}
    assert by["field 'action'"].message == f"field 'action': every value is 2 in {N:,} records"
    assert by["field 'obs'"].message == "field 'obs': 1 dimension of 3 never changes (1)"
    assert all(f.severity == "info" for f in findings)


def test_magnitude_jump_between_chunks(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        if s == 3:  # the last quarter of the records: rewards 10,000 times larger
            cols["reward"] *= 10_000
    (f,) = only(run(build(tmp_path / "s", damage)), "magnitude_jump")
    assert f.subject == "field 'reward'" and f.count >= 1000
    assert "-fold between chunks of 250 records" in f.message


def test_magnitude_jump_outliers(tmp_path: Path) -> None:
    def damage(s: int, cols: dict[str, np.ndarray]) -> None:
        if s == 1:
            cols["obs"][7, 2] = 1e7
    (f,) = only(run(build(tmp_path / "s", damage)), "magnitude_jump")
    assert f.subject == "field 'obs'"
    assert f.message.startswith("field 'obs': its largest magnitude 1e+07 is ")


def test_checks_named() -> None:
    assert CHECKS == ("nan", "inf", "step_gaps", "truncated_share", "open_episodes", "constant", "magnitude_jump")


@pytest.mark.parametrize("streams", [12, 3])
def test_many_streams_with_gaps_are_summed_up(tmp_path: Path, streams: int) -> None:
    rng = np.random.default_rng(2)
    st = open_store(str(tmp_path / "s"), SCHEMA, mode="w")
    with st.writer() as w:
        for s in range(streams):
            cols = clean_columns(rng, 100)
            cols["terminated"][-1] = True
            w.append(cols, stream=s, step=np.r_[np.arange(50), np.arange(52, 102)], reset=True)
        w.commit()
    gaps = [f for f in run(st) if f.check == "step_gaps"]
    if streams > 10:
        (f,) = gaps
        assert f.subject == "table" and f.count == streams
        assert f.message.startswith(f"{streams} streams of {streams} have step gaps: {streams} gaps and "
                                    f"{2 * streams} missing steps in all")
    else:
        assert [f.subject for f in gaps] == [f"stream {s}" for s in range(streams)]
