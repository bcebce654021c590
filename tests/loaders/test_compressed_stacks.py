"""Stacked minibatches from compressed frames (blocks decoded once per read, several at a time, rows
copied straight into ``obs``/``next_obs``) are bit-identical to the same minibatches from the same
frames stored raw, over random stores with episode boundaries, streams and several fragments."""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.loaders import SequenceSampler, UniformSampler, gather
from replaystore.schemas import frames
from replaystore.store import open_store

FRAME = (5, 7)

episodes = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30), st.booleans()), min_size=1, max_size=8)


def _fill(path: str, codec: str | None, plan: list[tuple[int, int, bool]], seed: int, commit_each: int) -> None:
    """Episodes ``(stream, steps, closed)`` (closed: ending with a frame-only record), committed every
    ``commit_each`` episodes (one fragment per commit); frames that compress like pixels do."""
    rng = np.random.default_rng(seed)
    st_ = open_store(path, frames(FRAME, 4, codec=codec), mode="w")
    with st_.writer() as w:
        for i, (stream, steps, closed) in enumerate(plan):
            n = steps + 1 if closed else steps
            base = rng.integers(0, 256, FRAME)
            data = ((base[None] + np.arange(n)[:, None, None] * rng.integers(0, 3)) % 256).astype(np.uint8)
            data[rng.random(n) < 0.3] = rng.integers(0, 256, FRAME, dtype=np.uint8)
            term = np.zeros(n, bool)
            if closed:
                term[steps - 1] = True
            w.append({"frame": data, "action": rng.integers(0, 4, n), "reward": rng.random(n).astype(np.float32),
                      "terminated": term, "truncated": np.zeros(n, bool)}, stream=stream, reset=True)
            if (i + 1) % commit_each == 0:
                w.commit()
        w.commit()
    st_.close()


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if hasattr(x, "numpy"):
            x, y = x.numpy(), y.numpy()
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=key)
        if key in ("obs", "next_obs"):
            assert x.dtype == y.dtype and x.flags.c_contiguous


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=episodes, codec=st.sampled_from(["zstd:3", "zstd:1", "lz4:1"]), k=st.integers(1, 4),
       padding=st.sampled_from(["reset", "zero"]), n_step=st.sampled_from([1, 3]), seed=st.integers(0, 999),
       commit_each=st.integers(1, 4))
def test_compressed_frames_give_the_raw_stores_minibatches(plan, codec, k, padding, n_step, seed, commit_each):
    plan = [*plan, (0, 12, True)]  # windows of 5 steps to draw, whatever else was drawn
    with tempfile.TemporaryDirectory() as root:
        _fill(f"{root}/raw", None, plan, seed, commit_each)
        _fill(f"{root}/zip", codec, plan, seed, commit_each)
        raw, zipped = open_store(f"{root}/raw", mode="r"), open_store(f"{root}/zip", mode="r")
        assert zipped.schema.compressed == {"frame": codec}
        kw = {"stack": k, "stack_padding": padding, **({"n_step": n_step, "gamma": 0.9} if n_step > 1 else {})}
        a = UniformSampler(raw, batch_size=24, seed=seed, **kw)
        b = UniformSampler(zipped, batch_size=24, seed=seed, **kw)
        for _ in range(3):
            _same(gather(raw.default, a.sample()), gather(zipped.default, b.sample()))
        # sequences: windows of stacks, padding slots among them
        a = SequenceSampler(raw, batch_size=4, length=5, seed=seed, stack=k, stack_padding=padding)
        b = SequenceSampler(zipped, batch_size=4, length=5, seed=seed, stack=k, stack_padding=padding)
        _same(gather(raw.default, a.sample()), gather(zipped.default, b.sample()))
        raw.close()
        zipped.close()


def test_a_read_of_many_rows_equals_the_raw_rows(tmp_path) -> None:
    """Rows in any order, repeated, across blocks and fragments, into a new array and into ``out``."""
    plan = [(0, 30, True), (1, 17, False), (0, 9, True), (2, 40, True)]
    _fill(str(tmp_path / "raw"), None, plan, 7, 2)
    _fill(str(tmp_path / "zip"), "zstd:3", plan, 7, 2)
    raw, zipped = open_store(tmp_path / "raw", mode="r"), open_store(tmp_path / "zip", mode="r")
    ids = raw.default.row_ids()
    rng = np.random.default_rng(0)
    for rows in (ids, ids[::-1], rng.choice(ids, 300), ids[:1], ids[5:6].repeat(9)):
        np.testing.assert_array_equal(zipped.read(rows, columns=["frame"])["frame"],
                                      raw.read(rows, columns=["frame"])["frame"])
