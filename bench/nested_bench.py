"""Nested-field cost on the sampler hot loop: UniformSampler.sample() + gather(), 256 records.

    python bench/nested_bench.py [--records 200000] [--rounds 7]

Rows printed (µs per minibatch, median over rounds, same process, interleaved):

1. flat store, the current gather (``Table.read`` checks ``schema.nesting``, ``to_tensors``
   checks non-array values for dicts/tuples);
2. flat store, the gather as it was before nested fields (``reader.read`` directly and the old
   ``to_tensors``), rebuilt here: the difference from row 1 is what flat stores pay;
3. the same data with ``obs``/``next_obs`` as nested fields of two leaves (what nesting costs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from replaystore.loaders import UniformSampler, gather
from replaystore.schemas import Dense, Schema, nested
from replaystore.store import open_store


def _old_gather(table, request):
    table.reader.sync()
    rows = np.asarray(request.rows, dtype=np.int64)
    data = table.reader.read(rows, None)
    batch = {**data, "indices": rows, **request.outputs}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
            for k, v in batch.items()}


def _store(root: str, schema: Schema, n: int, nest: bool):
    st = open_store(root, schema)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for lo in range(0, n, 50_000):
            k = min(50_000, n - lo)
            obs = rng.normal(size=(k, 64)).astype(np.float32)
            b = {"action": rng.integers(0, 9, k), "reward": rng.normal(size=k).astype(np.float32),
                 "done": rng.random(k) < 0.01}
            if nest:
                b["obs"] = {"a": obs[:, :32], "b": obs[:, 32:]}
                b["next_obs"] = {"a": obs[:, :32], "b": obs[:, 32:]}
            else:
                b["obs"], b["next_obs"] = obs, obs
            w.append(b, stream=0)
            w.commit()
    return st


def _time(fn, loops: int) -> float:
    t = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t) / loops * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--loops", type=int, default=500)
    a = ap.parse_args()
    root = tempfile.mkdtemp()
    rest = [Dense("action", np.int64), Dense("reward", np.float32), Dense("done", np.bool_)]
    flat = _store(f"{root}/flat", Schema("flat", [Dense("obs", np.float32, (64,)), *rest,
                                                  Dense("next_obs", np.float32, (64,))]), a.records, False)
    leaves = {"a": Dense("a", np.float32, (32,)), "b": Dense("b", np.float32, (32,))}
    nest = _store(f"{root}/nested", Schema("nested", [nested("obs", leaves), *rest, nested("next_obs", leaves)]),
                  a.records, True)
    s_flat, s_nest = UniformSampler(flat, 256, seed=1), UniformSampler(nest, 256, seed=1)
    cases = {
        "flat, current gather": lambda: gather(s_flat.table, s_flat.sample()),
        "flat, gather before nested fields": lambda: _old_gather(s_flat.table, s_flat.sample()),
        "nested obs/next_obs (2 leaves each)": lambda: gather(s_nest.table, s_nest.sample()),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, fn in cases.items():
            times[k].append(_time(fn, a.loops))
    for k, v in times.items():
        print(f"{k:<40} {statistics.median(v):8.1f} µs/minibatch  (min {min(v):.1f})")


if __name__ == "__main__":
    main()
