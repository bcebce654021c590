"""``field_stats`` equals numpy on the same arrays; ``lerobot_stats`` has LeRobot's ``stats.json`` layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from replaystore.errors import UnknownColumnError
from replaystore.report import QUANTILES, field_stats, lerobot_stats
from replaystore.schemas import BatchMeta, Dense, Ragged, Schema, dqn, nested
from replaystore.store import open_store
from support.batches import dqn_batch

LEROBOT_KEYS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
"""The keys of a feature in LeRobot's meta/stats.json (lerobot/datasets/compute_stats.py)."""


def reference(values: np.ndarray, per_dimension: bool) -> dict[str, np.ndarray]:
    """numpy's statistics of ``values`` ``(records, ...)``: per dimension, or over every value; finite values only."""
    x = values.astype(np.float64)
    cols = x.reshape(len(x), -1).T if per_dimension else x.reshape(1, -1)
    out: dict[str, list[float]] = {k: [] for k in ("min", "max", "mean", "std", *map(str, QUANTILES))}
    for c in cols:
        c = c[np.isfinite(c)]
        out["min"].append(np.min(c))
        out["max"].append(np.max(c))
        out["mean"].append(np.mean(c))
        out["std"].append(np.std(c))
        for q, v in zip(QUANTILES, np.quantile(c, QUANTILES), strict=True):
            out[str(q)].append(v)
    shape = values.shape[1:] if per_dimension else ()
    return {k: np.asarray(v).reshape(shape) for k, v in out.items()}


def assert_stats_equal(got, ref: dict[str, np.ndarray]) -> None:  # noqa: ANN001
    for k in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(getattr(got, k), ref[k], rtol=1e-9, atol=1e-12, err_msg=k)
        assert np.shape(getattr(got, k)) == np.shape(ref[k])
    for q in QUANTILES:
        np.testing.assert_allclose(got.quantiles[q], ref[str(q)], rtol=1e-9, atol=1e-12, err_msg=str(q))


DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int64, np.uint8, np.uint16, np.bool_]
SHAPES = [(), (3,), (2, 3), (40,)]


@hs.composite
def _arrays(draw: hs.DrawFn) -> tuple[np.ndarray, int]:
    dtype = np.dtype(draw(hs.sampled_from(DTYPES)))
    shape = draw(hs.sampled_from(SHAPES))
    n = draw(hs.integers(2, 60))
    seed = draw(hs.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        scale = draw(hs.sampled_from([1e-3, 1.0, 1e4]))
        x = (rng.standard_normal((n, *shape)) * scale).astype(dtype)
        if draw(hs.booleans()):
            flat = x.reshape(-1)
            bad = rng.choice(flat.size, size=draw(hs.integers(1, max(1, flat.size // 3))), replace=False)
            flat[bad[: len(bad) // 2 + 1]] = np.nan
            flat[bad[len(bad) // 2 + 1:]] = np.inf
            x.reshape(n, -1)[0] = 1.5  # at least one finite value in every dimension
    elif dtype.kind == "b":
        x = rng.random((n, *shape)) < draw(hs.sampled_from([0.0, 0.3, 1.0]))
    else:
        info = np.iinfo(dtype)
        wide = draw(hs.booleans())
        lo, hi = (info.min, info.max) if wide else (max(info.min, -5), min(info.max, 9))
        x = rng.integers(lo, hi, size=(n, *shape), endpoint=True, dtype=dtype)
    return x, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_arrays())
def test_dense_stats_equal_numpy(tmp_path_factory: pytest.TempPathFactory, data: tuple[np.ndarray, int]) -> None:
    x, _ = data
    schema = Schema("s", [Dense("x", x.dtype, x.shape[1:], finite=False)])
    st = open_store(str(tmp_path_factory.mktemp("s") / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"x": x})
        w.commit()
    (s,) = field_stats(st).values()
    per_dim = int(np.prod(x.shape[1:])) <= 32
    assert_stats_equal(s, reference(x, per_dim))
    finite = np.isfinite(x.astype(np.float64))
    assert s.count == int(finite.sum())
    assert s.nan == int(np.isnan(x.astype(np.float64)).sum())
    assert s.inf == int(np.isinf(x.astype(np.float64)).sum())
    assert s.nan_records == int(np.isnan(x.astype(np.float64)).reshape(len(x), -1).any(axis=1).sum())
    assert s.rows == len(x) and not s.sampled
    assert (s.kind, s.dtype, s.shape) == ("dense", str(x.dtype), x.shape[1:])
    # a field summarised per dimension also has its statistics over all its values
    if per_dim and int(np.prod(x.shape[1:])) > 1:
        assert s.overall is not None
        assert_stats_equal(s.overall, reference(x, False))
        assert (s.overall.count, s.overall.nan, s.overall.inf) == (s.count, s.nan, s.inf)
    else:
        assert s.overall is None


def test_ragged_and_nested_fields(tmp_path: Path) -> None:
    schema = Schema("n", [nested("obs", {"pos": Dense("pos", np.float32, (2,)),
                                         "cam": Dense("cam", np.uint8, (16, 16, 3))}),
                          Ragged("ids", np.int64, "ids_offsets")])
    rng = np.random.default_rng(3)
    n = 30
    pos = rng.standard_normal((n, 2)).astype(np.float32)
    cam = rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)
    lengths = rng.integers(0, 5, n)
    offsets = np.r_[0, np.cumsum(lengths)]
    ids = rng.integers(0, 100, int(offsets[-1]))
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"obs": {"pos": pos, "cam": cam}, "ids": ids, "ids_offsets": offsets})
        w.commit()
    stats = field_stats(st)
    assert list(stats) == ["obs__pos", "obs__cam", "ids"]
    assert_stats_equal(stats["obs__pos"], reference(pos, True))
    # images: per channel, scaled to [0, 1]
    img = stats["obs__cam"]
    assert img.kind == "image" and img.min.shape == (3,)
    ref = reference(cam.reshape(-1, 3).astype(np.float64) / 255.0, True)
    assert_stats_equal(img, ref)
    # ragged: over the values, with the list lengths
    r = stats["ids"]
    assert r.kind == "ragged" and r.count == len(ids)
    assert_stats_equal(r, reference(ids, False))
    assert r.lengths is not None
    assert_stats_equal(r.lengths, reference(lengths, False))
    # a nested field's name stands for its leaves
    assert list(field_stats(st, ["obs"])) == ["obs__pos", "obs__cam"]
    with pytest.raises(UnknownColumnError, match="nope"):
        field_stats(st, ["nope"])


def test_large_fields_are_sampled_with_a_seed(tmp_path: Path) -> None:
    schema = Schema("s", [Dense("x", np.float64, (4,)), Dense("frame", np.uint8, (16, 16))])
    n = 2000
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4))
    frames = rng.integers(0, 256, (n, 16, 16), dtype=np.uint8)
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"x": x, "frame": frames})
        w.commit()
    full = field_stats(st)
    assert full["x"].rows == n and not full["x"].sampled
    assert full["frame"].kind == "image" and full["frame"].rows == 1000 and full["frame"].sampled  # IMAGE_FRAMES
    small = field_stats(st, max_bytes=32 * 100, seed=1, image_frames=50)
    assert small["x"].rows == 100 and small["x"].sampled and small["x"].count == 400
    assert small["frame"].rows == 12 and small["frame"].sampled  # 3200 bytes hold 12 frames of 256
    assert np.all(small["x"].min >= full["x"].min) and np.all(small["x"].max <= full["x"].max)
    again = field_stats(st, max_bytes=32 * 100, seed=1, image_frames=50)
    np.testing.assert_array_equal(again["x"].mean, small["x"].mean)
    other = field_stats(st, max_bytes=32 * 100, seed=2, image_frames=50)
    assert not np.array_equal(other["x"].mean, small["x"].mean)
    assert field_stats(st, image_frames=7)["frame"].rows == 7


def test_progress_is_called_per_field(tmp_path: Path) -> None:
    schema = Schema("s", [Dense("a", np.float32), Dense("b", np.int64)])
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"a": np.ones(3, np.float32), "b": np.arange(3)})
        w.commit()
    calls: list[tuple[str, int, int]] = []
    field_stats(st, progress=lambda name, done, total: calls.append((name, done, total)))
    assert calls == [("a", 1, 2), ("b", 2, 2)]


def test_lerobot_layout(tmp_path: Path) -> None:
    schema = Schema("s", [Dense("state", np.float32, (6,)), Dense("reward", np.float64),
                          Dense("image", np.uint8, (32, 32, 3)), Ragged("legal", np.int64, "legal_offsets"),
                          Dense("wide", np.float32, (64,)), Dense("gone", np.float32, finite=False)])
    n = 40
    rng = np.random.default_rng(5)
    st = open_store(str(tmp_path / "s"), schema, mode="w")
    with st.writer() as w:
        w.append({"state": rng.standard_normal((n, 6)).astype(np.float32), "reward": rng.standard_normal(n),
                  "image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                  "legal": np.arange(2 * n), "legal_offsets": np.arange(0, 2 * n + 1, 2),
                  "wide": np.zeros((n, 64), np.float32), "gone": np.full(n, np.nan, np.float32)})
        w.commit()
    doc = lerobot_stats(field_stats(st))
    text = json.dumps(doc, allow_nan=False)  # strict JSON
    doc = json.loads(text)
    assert set(doc) == {"state", "reward", "image", "legal", "legal_offsets", "wide", "gone"}
    shapes = {"state": (6,), "reward": (1,), "image": (3, 1, 1), "legal": (1,), "legal_offsets": (1,), "wide": (1,),
              "gone": (1,)}
    for name, feature in doc.items():
        assert set(feature) == LEROBOT_KEYS, name
        assert np.shape(feature["count"]) == (1,)
        for key in LEROBOT_KEYS - {"count"}:
            assert np.shape(feature[key]) == shapes[name], (name, key)
    assert doc["state"]["count"] == [n] and doc["legal_offsets"]["mean"] == [2.0]
    image = np.asarray(doc["image"]["max"])
    assert np.all((image >= 0) & (image <= 1))
    assert doc["gone"]["mean"] == [None]  # no finite value: null, never NaN


def test_dqn_store_every_field_and_its_csr_lengths(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    batch = dqn_batch(rng, 300, observation_size=4, heads=2, actions=5)
    n = len(batch.obs)
    st = open_store(str(tmp_path / "s"), dqn(4, 2, actions=5), mode="w")
    with st.writer() as w:
        w.append(batch, stream=0)
        w.commit()
    cols = vars(batch)
    stats = field_stats(st)
    assert list(stats) == [f.name for f in st.schema.fields if not isinstance(f, BatchMeta)]
    for name in ("legal_ids", "next_legal_ids"):
        s = stats[name]
        assert s.lengths is not None
        offsets = cols[s.lengths.name]
        assert s.kind == "ragged" and s.count == offsets[-1] and s.rows == n
        assert_stats_equal(s.lengths, reference(np.diff(offsets), False))
        assert_stats_equal(s, reference(cols[name], False))
    assert_stats_equal(stats["masks"], reference(cols["masks"], True))
    assert_stats_equal(stats["dones"], reference(cols["dones"], True))


def test_empty_table(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "s"), dqn(3, 2, actions=4), mode="w")
    stats = field_stats(st)
    assert stats["obs"].rows == 0 and stats["obs"].count == 0 and np.all(np.isnan(stats["obs"].mean))
    doc = lerobot_stats(stats)
    assert doc["obs"]["count"] == [0] and doc["obs"]["mean"] == [None, None, None]
    json.dumps(doc, allow_nan=False)
