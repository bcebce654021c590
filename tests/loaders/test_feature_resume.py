"""States saved before features were parts resume, and continue exactly as the old samplers did.

tests/loaders/data/sampler_states_before_parts.json holds, per configuration below, the state the samplers
wrote when stacking, n-step returns and HER were branches of each sampler (after two minibatches on the
store of tests/support/gridref.py) and the three requests they drew next. Today's samplers, given the same
arguments, must write the same state (keys and values) after the same draws, resume from the old one
(``resume=True``, through the store's state slot) and draw the same three requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore.loaders import HER, RateLimiter
from support.gridref import MAKERS, SUBSET, build, goal_reward

DATA = json.loads((Path(__file__).parent / "data" / "sampler_states_before_parts.json").read_text())["states"]

CONFIGS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "uniform-stack-nstep-subset": ("uniform", lambda: dict(stack=2, n_step=3, gamma=0.9, subset=SUBSET)),
    "uniform-her": ("uniform", lambda: dict(her=HER("future", 4, compute_reward=goal_reward, seed=3))),
    "prioritized-her-ratelimit": ("prioritized", lambda: dict(her=HER("final", 2, compute_reward=goal_reward, seed=5),
                                                              rate_limiter=RateLimiter(1000.0, 1, 1e9, name="grid"))),
    "prioritized-stack-nstep": ("prioritized", lambda: dict(stack=2, n_step=2, gamma=0.5)),
    "epoch-stack": ("epoch", lambda: dict(stack=2)),
    "epoch-nstep": ("epoch", lambda: dict(n_step=3, gamma=0.9)),
    "sequence-stack": ("sequence", lambda: dict(stack=2)),
    "reservoir": ("reservoir", lambda: dict()),
}


def encode(v: Any) -> Any:
    """As the fixture holds values: arrays as ``{"__array__", "dtype", "shape"}``, through JSON."""
    def enc(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return {"__array__": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
        if isinstance(v, dict):
            return {k: enc(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [enc(x) for x in v]
        return v.item() if isinstance(v, np.generic) else v

    return json.loads(json.dumps(enc(v), sort_keys=True))


def decode(v: Any) -> Any:
    if isinstance(v, dict) and "__array__" in v:
        return np.array(v["__array__"], dtype=v["dtype"]).reshape(v["shape"])
    if isinstance(v, dict):
        return {k: decode(x) for k, x in v.items()}
    return v


def request(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": r.rows, "outputs": dict(r.outputs)}
    stack, nstep = r.parts.get("stack"), r.parts.get("n_step")
    if stack is not None:
        out["frames"] = stack.frames
    if nstep is not None:
        out["nstep"] = {"last": nstep.last, "reward": nstep.reward, "k": nstep.k, "discount": nstep.discount}
    if stack is not None and stack.next_frames is not None:
        out["next_frames"] = stack.next_frames
    return out


def warmed(store: Any, kind: str, kw: dict[str, Any]) -> Any:
    sampler = MAKERS[kind](store, **kw)
    if kind == "prioritized":
        rows = sampler.table.rows_at(np.arange(len(sampler.table)))
        sampler.update(rows, 1.0 + (rows % 7))
    return sampler


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_state_saved_before_features_were_parts_resumes(tmp_path: Any, name: str) -> None:
    kind, kwargs = CONFIGS[name]
    saved = DATA[name]
    store, _, _ = build(str(tmp_path / "st"), later=False)
    fresh = warmed(store, kind, kwargs())
    for _ in range(2):
        fresh.sample()
    assert encode(fresh.state_dict()) == saved["state"]  # the same keys, hyperparameters and values
    state = decode(saved["state"])
    arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
    store.save_state(fresh.name, {k: v for k, v in state.items() if k not in arrays}, arrays)
    resumed = MAKERS[kind](store, resume=True, **kwargs())
    assert resumed.batches_drawn == 2
    assert [encode(request(resumed.sample())) for _ in range(3)] == saved["next"]
