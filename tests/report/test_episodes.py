"""``episodes_of`` and ``stream_summaries`` against ``iter_episodes`` and hand-built stores."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.loaders import iter_episodes
from replaystore.report import Episodes, episodes_of, field_stats, health, stream_summaries
from replaystore.schemas import Dense, Schema, dqn, frames, transitions
from replaystore.store import ROW_BITS, Store, open_store
from support.batches import dqn_batch


def _schema(truncated: bool = True, reward_shape: tuple[int, ...] = ()) -> Schema:
    fields = [Dense("obs", np.float32, (2,)), Dense("next_obs", np.float32, (2,)),
              Dense("reward", np.float64, reward_shape), Dense("terminated", np.bool_)]
    if truncated:
        fields.append(Dense("truncated", np.bool_))
    return Schema("t", fields)


def _batch(n: int, term: np.ndarray, trunc: np.ndarray | None, reward: np.ndarray) -> dict[str, np.ndarray]:
    b = {"obs": np.zeros((n, 2), np.float32), "next_obs": np.zeros((n, 2), np.float32), "reward": reward,
         "terminated": term}
    if trunc is not None:
        b["truncated"] = trunc
    return b


def assert_matches_iter_episodes(table: object, eps: Episodes, reward: str = "reward") -> None:
    """Episode for episode, ``eps`` is what ``iter_episodes(complete_only=False)`` yields."""
    ref = list(iter_episodes(table, complete_only=False))  # type: ignore[arg-type]
    assert len(eps) == len(ref)
    for i, e in enumerate(ref):
        rows = np.asarray(e["rows"])
        assert eps.stream[i] == e["stream"]
        assert eps.first_row[i] == rows[0] and eps.last_row[i] == rows[-1]
        assert eps.first_step[i] == int(np.asarray(e["steps"])[0])
        assert eps.length[i] == len(rows)
        ended = eps.end[i] != "open"
        assert bool(e["terminated"]) == (eps.end[i] == "terminated")
        assert bool(e["truncated"]) == (eps.end[i] != "terminated")
        assert bool(e["complete"]) == bool(eps.complete[i] and ended)
        np.testing.assert_allclose(eps.ret[i], float(np.asarray(e[reward], dtype=np.float64).sum()))


def test_recorded_cartpole_matches_iter_episodes(tmp_path: Path) -> None:
    url = str(tmp_path / "cp")
    from replaystore.gym import RecordVectorEpisodes

    env = RecordVectorEpisodes(gym.make_vec("CartPole-v1", num_envs=3), url, commit_every=40)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(150):
        env.step(env.action_space.sample())
    env.close()
    with open_store(url, mode="r") as st:
        eps = episodes_of(st.default)
        assert eps.end_flags == ("terminated", "truncated")
        assert len(eps) > 3 and eps.whole.sum() >= 3
        assert_matches_iter_episodes(st.default, eps)
        # CartPole pays 1 per step: a return is the episode's length
        np.testing.assert_array_equal(eps.ret, eps.length)
        summaries = stream_summaries(st.default, eps)
        assert [s.stream for s in summaries] == st.default.streams()
        assert sum(s.records for s in summaries) == len(st.default)
        assert sum(s.episodes + s.open for s in summaries) == len(eps)
        assert all(s.open <= 1 for s in summaries)  # at most the trailing steps of each env


def test_end_time_is_the_commit_of_the_last_record(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), _schema(), mode="w")
    with st.writer() as w:
        w.append(_batch(3, np.array([0, 0, 1], bool), np.zeros(3, bool), np.ones(3)), stream=0)
        w.commit()
        w.append(_batch(2, np.array([0, 1], bool), np.zeros(2, bool), np.ones(2)), stream=0)
        w.append(_batch(2, np.array([0, 0], bool), np.zeros(2, bool), np.ones(2)), stream=1)
        w.commit()
    times = [c["time_ns"] / 1e9 for c in st.commits() if c["kind"] == "append"]
    eps = episodes_of(st)
    assert list(eps.stream) == [0, 0, 1]
    np.testing.assert_array_equal(eps.end_time, [times[0], times[1], times[1]])
    np.testing.assert_array_equal(eps.end_time, times_from_commits(st, eps.last_row))
    assert list(eps.end) == ["terminated", "terminated", "open"]
    # a view that is no longer the table's current one gives the same episodes
    old = st.default.view()
    with st.writer() as w:
        w.append(_batch(1, np.array([1], bool), np.zeros(1, bool), np.ones(1)), stream=1)
        w.commit()
    again = episodes_of(old)
    np.testing.assert_array_equal(again.first_row, eps.first_row)
    np.testing.assert_array_equal(again.end_time, eps.end_time)
    assert len(episodes_of(st)) == 3 and episodes_of(st).end[-1] == "terminated"


def test_no_end_flag_gives_no_episodes(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), Schema("x", [Dense("obs", np.float32, (2,))]), mode="w")
    with st.writer() as w:
        w.append({"obs": np.zeros((4, 2), np.float32)})
        w.commit()
    eps = episodes_of(st)
    assert len(eps) == 0 and eps.end_flags == ()
    (s,) = stream_summaries(st, eps)
    assert (s.records, s.episodes, s.open) == (4, 0, 0) and np.isnan(s.return_mean)


def test_dones_and_vector_rewards(tmp_path: Path) -> None:
    schema = Schema("d", [Dense("obs", np.float32, (2,)), Dense("next_obs", np.float32, (2,)),
                          Dense("reward", np.float32, (2,)), Dense("dones", np.bool_)])
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"obs": np.zeros((3, 2), np.float32), "next_obs": np.zeros((3, 2), np.float32),
                  "reward": np.array([[1, 2], [3, 4], [5, 6]], np.float32), "dones": np.array([0, 1, 0], bool)})
        w.commit()
    eps = episodes_of(st)
    assert eps.end_flags == ("dones",)
    np.testing.assert_array_equal(eps.ret, [10.0, 11.0])
    assert list(eps.end) == ["terminated", "open"]
    assert_matches_iter_episodes(st.default, eps)


def test_summaries_count_gaps_and_whole_episode_returns(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), _schema(), mode="w")
    with st.writer() as w:
        # stream 7: steps 0..3 (episode ends at 1), a gap, steps 10..12 ending truncated
        w.append(_batch(4, np.array([0, 1, 0, 0], bool), np.zeros(4, bool), np.array([1.0, 2, 3, 4])),
                 stream=7, step=np.arange(4))
        w.append(_batch(3, np.zeros(3, bool), np.array([0, 0, 1], bool), np.array([5.0, 6, 7])),
                 stream=7, step=np.arange(10, 13))
        w.commit()
    eps = episodes_of(st)
    assert list(eps.end) == ["terminated", "open", "truncated"]
    assert list(eps.complete) == [True, True, False]
    (s,) = stream_summaries(st, eps)
    assert (s.records, s.first_step, s.last_step, s.gaps, s.episodes, s.open) == (7, 0, 12, 1, 2, 1)
    assert (s.return_mean, s.return_min, s.return_max) == (3.0, 3.0, 3.0)  # only the whole episode
    assert (s.length_mean, s.length_min, s.length_max) == (2.0, 2.0, 2.0)
    assert_matches_iter_episodes(st.default, eps)


def times_from_commits(st: Store, rows: np.ndarray) -> np.ndarray:
    """The commit time of each row, from ``Store.commits()``' append row ranges (the reference mapping)."""
    spans = []
    for body in st.commits():
        for a in body.get("tables", {}).get(st.default.name, {}).get("appends", []):
            lo, hi = a["rows"]
            base = body["writer"] << ROW_BITS
            spans.append((base | lo, base | hi, body["time_ns"] / 1e9))
    return np.array([next(t for lo, hi, t in spans if lo <= r < hi) for r in rows.tolist()], dtype=np.float64)


@hs.composite
def _plans(draw: hs.DrawFn) -> tuple[list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]], int | None]:
    """Appends ``(stream, steps, resets, terminated, truncated)`` plus a capacity."""
    appends = []
    nexts: dict[int, int] = {}
    for _ in range(draw(hs.integers(1, 8))):
        s = draw(hs.sampled_from([0, 1, 2]))
        n = draw(hs.integers(1, 6))
        gap = draw(hs.sampled_from([0, 0, 0, 1, 3]))
        first = nexts.get(s, 0) + (gap if s in nexts else draw(hs.sampled_from([0, 0, 2])))
        steps = first + np.arange(n)
        nexts[s] = int(steps[-1]) + 1
        bits = draw(hs.lists(hs.integers(0, 11), min_size=n, max_size=n))
        term = np.array([b == 0 for b in bits])
        trunc = np.array([b == 1 for b in bits])
        resets = np.array([b == 2 for b in bits])
        appends.append((s, n, steps, resets, term, trunc))
    capacity = draw(hs.sampled_from([None, None, 5, 9]))
    return appends, capacity


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=_plans(), commit_each=hs.booleans(), compact=hs.booleans(), second_writer=hs.integers(0, 7))
def test_generated_stores_match_iter_episodes(tmp_path_factory: pytest.TempPathFactory,
                                             plan: tuple[list, int | None], commit_each: bool, compact: bool,
                                             second_writer: int) -> None:
    """Streams, step gaps, resets, ends, truncation, capacity eviction, compaction and a second writer."""
    appends, capacity = plan
    url = str(tmp_path_factory.mktemp("gen") / "s")
    st = open_store(url, _schema(), mode="w", capacity=capacity)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for s, n, steps, resets, term, trunc in appends:
            w.append(_batch(n, term, trunc, rng.standard_normal(n)), stream=s, step=steps, reset=resets)
            if commit_each:
                w.commit()
        w.commit()
        if compact:
            w.compact()
    if second_writer:  # its own stream: row ids with another writer's bits
        with st.writer() as w2:
            n = second_writer
            w2.append(_batch(n, np.arange(n) % 3 == 2, np.zeros(n, bool), rng.standard_normal(n)), stream="other")
            w2.commit()
    st.refresh()
    eps = episodes_of(st)
    assert_matches_iter_episodes(st.default, eps)
    assert int(eps.length.sum()) == len(st)
    summaries = stream_summaries(st, eps)
    assert sum(s.episodes + s.open for s in summaries) == len(eps)
    assert np.all(np.isfinite(eps.end_time))
    np.testing.assert_array_equal(eps.end_time, times_from_commits(st, eps.last_row))


def test_many_streams_cover_every_record_once(tmp_path: Path) -> None:
    """64 streams of transitions: every record lies in exactly one episode, sorted by stream and step."""
    n_streams, per = 64, 2000
    st = open_store(str(tmp_path / "s"), transitions(4, actions=3), mode="w")
    rng = np.random.default_rng(1)
    with st.writer() as w:
        for s in range(n_streams):
            w.append({"obs": np.zeros((per, 4), np.float32), "action": np.zeros(per, np.int64),
                      "reward": np.ones(per, np.float32), "next_obs": np.zeros((per, 4), np.float32),
                      "terminated": rng.random(per) < 0.02}, stream=s, reset=True)
        w.commit()
    eps = episodes_of(st)
    assert int(eps.length.sum()) == n_streams * per
    np.testing.assert_array_equal(eps.ret, eps.length)
    keys = np.array(eps.stream.tolist())
    assert np.all(np.diff(keys) >= 0)
    same = keys[1:] == keys[:-1]
    assert np.all(eps.first_step[1:][same] > eps.first_step[:-1][same])


def test_dqn_records_sum_rewards_and_end_at_dones(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    st = open_store(str(tmp_path / "s"), dqn(4, 2, actions=5), mode="w")
    with st.writer() as w:
        for s in ("a", "b"):
            w.append(dqn_batch(rng, 200, observation_size=4, heads=2, actions=5), stream=s)
        w.commit()
    eps = episodes_of(st)
    assert eps.end_flags == ("dones",) and set(eps.end) <= {"terminated", "open"}
    assert_matches_iter_episodes(st.default, eps, reward="rewards")


def reference_spans(steps: np.ndarray, resets: np.ndarray, end: np.ndarray) -> list[tuple[int, int, bool]]:
    """One stream's episodes as ``iter_episodes`` split them record by record before the split was shared."""
    out = []
    start = np.zeros(len(steps), dtype=bool)
    start[0] = True
    start[1:] = resets[1:] | end[:-1] | (np.diff(steps) != 1)
    bounds = np.r_[np.flatnonzero(start), len(steps)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        began = bool(resets[lo]) or steps[lo] == 0 or (lo > 0 and bool(end[lo - 1]) and steps[lo] == steps[lo - 1] + 1)
        out.append((lo, hi, began))
    return out


@settings(max_examples=200, deadline=None)
@given(streams=hs.lists(hs.lists(hs.tuples(hs.integers(1, 3), hs.booleans(), hs.booleans()), min_size=1, max_size=12),
                        min_size=1, max_size=4),
       first_step=hs.integers(0, 2))
def test_spans_of_concatenated_streams_are_each_streams_spans(streams: list[list[tuple[int, bool, bool]]],
                                                              first_step: int) -> None:
    """``episode_spans`` over several streams at once equals the per-stream split, stream by stream."""
    from replaystore.episodebounds import episode_spans

    steps, resets, ends, firsts, expected = [], [], [], [], []
    offset = 0
    for records in streams:
        st = first_step + np.cumsum([d for d, _, _ in records]) - records[0][0]
        rs = np.array([r for _, r, _ in records])
        en = np.array([e for _, _, e in records])
        expected += [(lo + offset, hi + offset, b) for lo, hi, b in reference_spans(st, rs, en)]
        steps.append(st)
        resets.append(rs)
        ends.append(en)
        firsts.append(np.r_[True, np.zeros(len(records) - 1, bool)])
        offset += len(records)
    lo, hi, began = episode_spans(np.concatenate(steps), np.concatenate(resets), np.concatenate(ends),
                                  np.concatenate(firsts))
    assert list(zip(lo.tolist(), hi.tolist(), began.tolist(), strict=True)) == expected


def test_frames_layout_closing_records_belong_to_no_episode(tmp_path: Path) -> None:
    """An episode of T steps is T + 1 records in a frames store; its length and return are of its T steps."""
    st = open_store(str(tmp_path / "f"), frames((16, 16), actions=3), mode="w")

    def episode(t: int, end: str | None) -> dict[str, np.ndarray]:
        n = t + 1 if end else t  # the frame-only record closes an ended episode
        cols = {"frame": np.zeros((n, 16, 16), np.uint8), "action": np.zeros(n, np.int64),
                "reward": np.r_[np.ones(t, np.float32), np.zeros(n - t, np.float32)],
                "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
        if end:
            cols[end][t - 1] = True
        return cols

    with st.writer() as w:
        for t, end in ((5, "terminated"), (3, "truncated"), (4, None)):
            w.append(episode(t, end), stream=0, reset=True)
        w.append(episode(6, "terminated"), stream=1, reset=True)
        w.commit()
    eps = episodes_of(st)
    assert list(eps.stream) == [0, 0, 0, 1]
    assert list(eps.length) == [5, 3, 4, 6] and list(eps.ret) == [5.0, 3.0, 4.0, 6.0]
    assert list(eps.end) == ["terminated", "truncated", "open", "terminated"]
    assert list(eps.first_step) == [0, 6, 10, 0] and bool(eps.complete.all())
    summaries = stream_summaries(st, eps)
    assert [(s.records, s.episodes, s.open) for s in summaries] == [(14, 2, 1), (7, 1, 0)]
    assert [f.check for f in health(st, field_stats(st), eps) if f.severity == "warning"] == []


def test_recorded_pong_frames(tmp_path: Path) -> None:
    from gymnasium.wrappers import FrameStackObservation

    from replaystore.gym import RecordEpisodes
    from support.pixels import pong

    url = str(tmp_path / "pong")
    env = RecordEpisodes(FrameStackObservation(pong(max_episode_steps=12), 4), url, frame_stack=4)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lengths, n = [], 0
    for _ in range(40):
        _, _, term, trunc, _ = env.step(int(rng.integers(6)))
        n += 1
        if term or trunc:
            lengths.append(n)
            n = 0
            env.reset()
    env.close()
    with open_store(url, mode="r") as st:
        eps = episodes_of(st)
        done = eps.end != "open"
        assert list(eps.length[done]) == lengths and len(lengths) == 3
        assert set(eps.end[done]) == {"truncated"} and bool(eps.complete.all())
        # the episode under way: its steps, and the frame the recorder holds for the next one
        assert list(eps.length[~done]) == [n + 1]

