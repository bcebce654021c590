"""N-step returns on the uniform, prioritized and epoch samplers, against a plain-Python reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import ResumeMismatchError, SamplerParameterError
from replaystore.loaders import EpochSampler, PrioritizedSampler, SequenceSampler, UniformSampler, gather
from replaystore.schemas import Dense, Schema, episode, transitions
from replaystore.store import open_store

SAMPLERS = {
    "uniform": lambda st_, **kw: UniformSampler(st_, batch_size=32, seed=3, **kw),
    "prioritized": lambda st_, **kw: PrioritizedSampler(st_, batch_size=32, seed=3, **kw),
    "epoch": lambda st_, **kw: EpochSampler(st_, batch_size=32, seed=3, **kw),
}


def _columns(n: int, start: int, ends: str | None, obs_size: int = 2) -> dict[str, np.ndarray]:
    """``n`` episode-schema records; the last ends the episode as ``ends`` says (terminal/truncated/None)."""
    steps = np.arange(start, start + n, dtype=np.float32)
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    if ends == "terminal":
        terminated[-1] = True
    elif ends == "truncated":
        truncated[-1] = True
    rng = np.random.default_rng(start * 7919 + n)
    return {"obs": np.repeat(steps[:, None], obs_size, axis=1), "action": np.zeros(n, dtype=np.int64),
            "reward": rng.normal(size=n).astype(np.float32),
            "next_obs": np.repeat(steps[:, None] + 0.5, obs_size, axis=1) + rng.normal(size=(n, obs_size)).astype(
                np.float32), "terminated": terminated, "truncated": truncated}


def reference(table: Any, rows: np.ndarray, n: int, gamma: float) -> dict[str, np.ndarray]:
    """Plain-Python n-step targets of start rows, walking (stream, step) over the visible records."""
    visible = table.row_ids()
    keys, steps, resets = table.index_of(visible)
    data = table.read(visible)
    at: dict[tuple[Any, int], int] = {}
    for i, (key, step) in enumerate(zip(keys.tolist(), steps.tolist(), strict=True)):
        at[(key, step)] = i
    pos_of = {int(r): i for i, r in enumerate(visible.tolist())}
    has_trunc = "truncated" in data
    out: dict[str, list[Any]] = {"reward": [], "discount": [], "n": [], "next_obs": [], "terminated": [],
                                 "truncated": []}
    for row in rows.tolist():
        i = pos_of[row]
        key, step = keys[i], int(steps[i])
        total, k, last = 0.0, 0, i
        while True:
            total += gamma ** k * float(data["reward"][last])
            k += 1
            ended = bool(data["terminated"][last]) or (has_trunc and bool(data["truncated"][last]))
            if k == n or ended:
                break
            j = at.get((key, step + k))
            if j is None or bool(resets[j]):
                break
            last = j
        out["reward"].append(total)
        out["n"].append(k)
        out["discount"].append(0.0 if data["terminated"][last] else gamma ** k)
        out["next_obs"].append(data["next_obs"][last])
        out["terminated"].append(bool(data["terminated"][last]))
        out["truncated"].append(bool(data["truncated"][last]) if has_trunc else False)
    return {k: np.asarray(v) for k, v in out.items()}


def check_batch(table: Any, batch: dict[str, Any], n: int, gamma: float) -> None:
    rows = batch["indices"].numpy()
    ref = reference(table, rows, n, gamma)
    np.testing.assert_array_equal(batch["n"].numpy(), ref["n"])
    np.testing.assert_allclose(batch["reward"].numpy(), ref["reward"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch["discount"].numpy(), ref["discount"], rtol=1e-12)
    np.testing.assert_array_equal(batch["next_obs"].numpy(), ref["next_obs"])
    np.testing.assert_array_equal(batch["terminated"].numpy(), ref["terminated"])
    if "truncated" in batch:
        np.testing.assert_array_equal(batch["truncated"].numpy(), ref["truncated"])
    assert batch["discount"].dtype.is_floating_point and batch["n"].dtype == batch["indices"].dtype


# one stream segment: (length, how it ends, steps skipped before it, reset at its start)
segment = st.tuples(st.integers(1, 9), st.sampled_from(["terminal", "truncated", None]), st.integers(0, 2),
                    st.booleans())
writer_plan = st.lists(st.tuples(st.integers(0, 2), st.lists(segment, min_size=1, max_size=4)), min_size=1,
                       max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=st.lists(writer_plan, min_size=1, max_size=2), n=st.integers(1, 5),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]), capacity=st.sampled_from([None, 12, 40]),
       kind=st.sampled_from(sorted(SAMPLERS)))
def test_nstep_matches_reference(plans: list[Any], n: int, gamma: float, capacity: int | None, kind: str) -> None:
    """Random streams from several writers (gaps, resets, terminal and truncated ends, eviction)."""
    store = open_store(f"memory://nstep/{np.random.default_rng().integers(2**62)}", episode(2), mode="w+",
                       capacity=capacity)
    writers = [store.writer() for _ in plans]
    next_step: dict[Any, int] = {}
    for w, (writer, plan) in enumerate(zip(writers, plans, strict=True)):
        for stream, segments in plan:
            key = f"w{w}s{stream}"
            for length, ends, skip, reset in segments:
                start = next_step.get(key, 0) + skip
                writer.append(_columns(length, start, ends), stream=key,
                              step=np.arange(start, start + length), reset=reset)
                next_step[key] = start + length
                writer.commit()  # commits one by one: eviction cuts streams between them
    store.refresh()
    if not len(store.default):
        return
    sampler = SAMPLERS[kind](store, n_step=n, gamma=gamma)
    for _ in range(3):
        check_batch(store.default, gather(store.default, sampler.sample()), n, gamma)
    for w in writers:
        w.close()


def _cartpole_like(store: Any) -> None:
    with store.writer() as writer:
        writer.append(_columns(7, 0, "terminal"), stream=0, reset=True)
        writer.append(_columns(5, 0, "truncated"), stream=1, reset=True)
        writer.append(_columns(6, 7, None), stream=0, reset=True)  # a new episode, same stream
        writer.append(_columns(4, 5, None), stream=1, reset=False)  # continues stream 1's steps, no reset
        writer.commit()


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_nstep_windows_stop_at_terminal_truncated_reset_and_end(kind: str) -> None:
    store = open_store("memory://nstep/fixed", episode(2), mode="w+")
    _cartpole_like(store)
    sampler = SAMPLERS[kind](store, n_step=3, gamma=0.9)
    batch = gather(store.default, sampler.sample())
    check_batch(store.default, batch, 3, 0.9)
    got = dict(zip(batch["indices"].tolist(), batch["n"].tolist(), strict=True))
    rows, _ = store.default.rows(0)
    # stream 0: steps 0..6 (terminal at 6), then a reset episode 7..12 (visible end at 12)
    expect = {int(r): n for r, n in zip(rows.tolist(), [3, 3, 3, 3, 3, 2, 1, 3, 3, 3, 3, 2, 1], strict=True)}
    assert all(expect[r] == k for r, k in got.items() if r in expect)


def test_nstep_through_loader_workers(tmp_path: Any) -> None:
    from replaystore.loaders import make_loader

    store = open_store(str(tmp_path / "s"), episode(2), mode="w+")
    _cartpole_like(store)
    sampler = UniformSampler(store, batch_size=16, seed=1, n_step=3, gamma=0.9, num_batches=3)
    batches = list(make_loader(store, sampler, num_workers=1, multiprocessing_context="fork"))
    assert len(batches) == 3
    for batch in batches:
        check_batch(store.default, batch, 3, 0.9)


def test_transitions_without_truncated_and_indices_are_start_rows() -> None:
    store = open_store("memory://nstep/transitions", transitions(2), mode="w+")
    cols = _columns(10, 0, "terminal")
    del cols["truncated"]
    with store.writer() as writer:
        writer.append(cols, stream=0)
        writer.commit()
    sampler = PrioritizedSampler(store, batch_size=64, seed=0, n_step=4, gamma=0.5)
    request = sampler.sample()
    batch = gather(store.default, request)
    assert "truncated" not in batch
    np.testing.assert_array_equal(batch["indices"].numpy(), request.rows)
    check_batch(store.default, batch, 4, 0.5)
    sampler.update(batch["indices"], np.ones(64))  # priorities stay per start record


def test_nstep_resume_is_exact_and_checks_n_step(tmp_path: Any) -> None:
    url = str(tmp_path / "s")
    store = open_store(url, episode(2), mode="w+")
    _cartpole_like(store)
    for cls in (UniformSampler, PrioritizedSampler, EpochSampler):
        a = cls(store, batch_size=4, seed=5, n_step=3, gamma=0.9)
        a.sample()
        a.save()
        state = a.state_dict()
        assert state["hyperparameters"]["n_step"] == 3 and state["hyperparameters"]["gamma"] == 0.9
        expected = [gather(store.default, a.sample()) for _ in range(3)]
        b = cls(store, batch_size=4, seed=5, n_step=3, gamma=0.9, resume=True)
        for want in expected:
            got = gather(store.default, b.sample())
            for name in ("indices", "reward", "discount", "n", "next_obs"):
                np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())
        for other in ({"n_step": 2}, {"n_step": None}, {"n_step": 3, "gamma": 0.5}):
            with pytest.raises(ResumeMismatchError):
                cls(store, batch_size=4, seed=5, resume=True, **other)
        plain = cls(store, batch_size=4, seed=5, name=f"plain-{cls.kind}")
        plain.save()
        with pytest.raises(ResumeMismatchError):
            cls(store, batch_size=4, seed=5, name=f"plain-{cls.kind}", n_step=3, resume=True)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_step": 0}, "n_step"), ({"n_step": 2.0}, "n_step"), ({"n_step": True}, "n_step"),
    ({"n_step": 3, "gamma": 1.5}, "gamma"), ({"n_step": 3, "gamma": float("nan")}, "gamma"),
    ({"n_step": 3, "gamma": "0.9"}, "gamma"),
])
def test_invalid_n_step_or_gamma_is_named(kwargs: dict[str, Any], field: str) -> None:
    store = open_store("memory://nstep/bad", episode(2), mode="w+")
    for cls in (UniformSampler, PrioritizedSampler, EpochSampler):
        with pytest.raises(SamplerParameterError) as err:
            cls(store, batch_size=4, **kwargs)
        assert err.value.field == field


def test_schema_without_reward_or_terminated_is_refused() -> None:
    store = open_store("memory://nstep/noreward", Schema("plain", [Dense("obs", np.float32, (2,)),
                                                                   Dense("reward", np.float32)]), mode="w+")
    with pytest.raises(SamplerParameterError, match="terminated"):
        UniformSampler(store, batch_size=4, n_step=3)


def test_sequence_sampler_refuses_n_step() -> None:
    store = open_store("memory://nstep/seq", episode(2), mode="w+")
    with pytest.raises(SamplerParameterError, match="n_step"):
        SequenceSampler(store, length=4, n_step=3)
