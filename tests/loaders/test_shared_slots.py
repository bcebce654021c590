"""Persistent loader workers (forked or spawned) hand large arrays over in shared slots: the minibatches equal
those gathered in-process, whether a slot was free or the batch went through the pipe; a slot is
reused once the arrays viewing it are garbage."""

from __future__ import annotations

import gc

import numpy as np
import torch

from replaystore.loaders import UniformSampler, gather, make_loader
from replaystore.loaders.shared import MIN_BYTES
from replaystore.schemas import frames
from replaystore.store import open_store

H = 84


def _store(path):
    st = open_store(path, frames((H, H), 4, codec="zstd:3"), mode="w")
    rng = np.random.default_rng(0)
    with st.writer() as w:
        for _ in range(4):
            n = 120
            term = np.zeros(n, bool)
            term[n - 2] = True
            w.append({"frame": rng.integers(0, 4, (n, H, H), dtype=np.uint8), "action": rng.integers(0, 4, n),
                      "reward": rng.random(n).astype(np.float32), "terminated": term,
                      "truncated": np.zeros(n, bool)}, reset=True)
        w.commit()
    st.close()
    return open_store(path, mode="r")


def test_slot_and_pipe_minibatches_equal_the_in_process_ones(tmp_path) -> None:
    st = _store(tmp_path / "s")
    loader = make_loader(st, UniformSampler(st, batch_size=16, stack=4, seed=5), num_workers=2,
                         multiprocessing_context="fork")
    slots = loader.dataset.slots
    assert slots is not None and 16 * 4 * H * H >= MIN_BYTES
    ref = UniformSampler(st, batch_size=16, stack=4, seed=5)
    it = iter(loader)
    held = [next(it) for _ in range(30)]  # held: every slot busy, later batches come through the pipe
    assert slots.states.all()
    for got in held:
        want = gather(st.default, ref.sample())
        assert list(got) == list(want)
        for k in want:
            assert torch.equal(got[k], want[k]), k
    del held, got
    gc.collect()
    assert slots.states.sum() <= 2 * 2  # only batches in flight (prefetch) hold a slot now
    for _ in range(10):  # slots reused: still the same minibatches
        got = next(it)
        want = gather(st.default, ref.sample())
        for k in want:
            assert torch.equal(got[k], want[k]), k
    assert slots.states.sum() >= 1  # the batch held in ``got`` is in a slot


def test_spawned_workers_get_the_slots_too(tmp_path) -> None:
    st = _store(tmp_path / "s")
    loader = make_loader(st, UniformSampler(st, batch_size=16, stack=4, seed=2), num_workers=1,
                         multiprocessing_context="spawn")
    slots = loader.dataset.slots
    ref = UniformSampler(st, batch_size=16, stack=4, seed=2)
    it = iter(loader)
    held = [next(it) for _ in range(8)]
    assert slots.states.sum() >= 1  # the worker wrote into the slots the main process maps
    for got in held:
        want = gather(st.default, ref.sample())
        for k in want:
            assert torch.equal(got[k], want[k]), k


def test_workers_that_do_not_persist_use_the_pipe(tmp_path) -> None:
    st = _store(tmp_path / "s")
    loader = make_loader(st, UniformSampler(st, batch_size=16, stack=4, seed=1), num_workers=1,
                         persistent_workers=False, multiprocessing_context="fork")
    assert loader.dataset.slots is None
    ref = UniformSampler(st, batch_size=16, stack=4, seed=1)
    got = next(iter(loader))
    want = gather(st.default, ref.sample())
    for k in want:
        assert torch.equal(got[k], want[k]), k
