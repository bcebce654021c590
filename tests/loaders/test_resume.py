"""Resuming every sampler: across processes (save() / resume=True) and in-process (state_dict).

Across processes: child A (spawned) samples k minibatches (prioritized: with priority
updates derived from each batch; prioritized and reservoir: ingesting a commit of its
own before each draw, the prioritized table evicting), calls ``save()``, commits once
more, then records m minibatches. Child B (another spawn) reopens the store, constructs
the sampler with ``resume=True`` and records m minibatches. They must be identical. Both on a
local store and on S3 (moto on loopback), each child with its own storage client.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple
from unittest import mock

import numpy as np
import pytest

from replaystore.loaders import gather
from replaystore.loaders.sumtree import SEARCH_TOP
from replaystore.store import open_store
from support.loaderref import (
    RESUME_K,
    RESUME_KINDS,
    RESUME_M,
    Append,
    Harness,
    load_result,
    make_sampler,
    resume_children,
    resume_prepare,
    resume_priorities,
    same_batches,
)
from support.s3 import moto_s3

CHILD_TIMEOUT_S = 180


class Resumed(NamedTuple):
    root: str  # where the children's results are
    base: str  # where the stores are (a directory or an s3:// prefix)
    options: dict[str, Any] | None


@pytest.fixture(scope="module", params=["local", "s3"])
def resumed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resumed]:
    """Children A then B (each a fresh spawned process with its own storage client) on a local
    store, or on S3 (moto on loopback)."""
    root = str(tmp_path_factory.mktemp("resume"))
    with contextlib.ExitStack() as stack:
        base, options = root, None
        if request.param == "s3":
            server = stack.enter_context(moto_s3("replaystore-resume"))
            base, options = server.url(f"resume-{uuid.uuid4().hex}"), server.storage_options
        resume_prepare(base, options)
        ctx = mp.get_context("spawn")
        for role in ("A", "B"):  # B starts after A has exited: a fresh process that only has the store
            proc = ctx.Process(target=resume_children, args=(role, root, base, options))
            proc.start()
            proc.join(CHILD_TIMEOUT_S)
            assert proc.exitcode == 0, f"child {role} failed with exit code {proc.exitcode}"
        yield Resumed(root, base, options)


@pytest.mark.parametrize("kind", RESUME_KINDS)
def test_resume_across_processes(resumed: Resumed, kind: str) -> None:
    a = load_result(resumed.root, kind, "A")
    b = load_result(resumed.root, kind, "B")
    assert a.meta == b.meta and a.meta["batches_drawn"] == RESUME_K + RESUME_M
    assert sorted(a.arrays) == sorted(b.arrays)
    assert len({k.split("/")[0] for k in a.arrays}) == RESUME_M
    for key in a.arrays:
        assert a.arrays[key].dtype == b.arrays[key].dtype and np.array_equal(a.arrays[key], b.arrays[key]), key
    # the state really was restored: a sampler started afresh draws something else
    st = open_store(f"{resumed.base}/{kind}", mode="r", storage_options=resumed.options)
    fresh = make_sampler(kind, st, resume=False)
    fresh_rows = [fresh.sample().rows for _ in range(RESUME_M)]
    assert any(not np.array_equal(r, a.arrays[f"{i}/indices"]) for i, r in enumerate(fresh_rows))
    if kind == "epoch":  # 30 records, batches of 4: the pass resumed mid-way, then a new pass began
        sizes = [len(a.arrays[f"{i}/indices"]) for i in range(RESUME_M)]
        assert sizes == [4, 4, 4, 2, 4, 4]
        rest = np.concatenate([a.arrays[f"{i}/indices"] for i in range(4)])
        assert len(set(rest.tolist())) == 14
    if kind == "prioritized":
        assert a.arrays["0/weights"].dtype == np.float32
    if kind == "prioritized":  # the post-save commit entered at the running max and was drawn
        late = [k for k in a.arrays if k.endswith("/tag")]
        assert any((a.arrays[k] >= 1000 + 10 * RESUME_K).any() for k in late), "post-save commit never drawn"
    if kind == "reservoir":  # 30 records from the parent, then 3 per commit of A, the last after the save
        assert a.meta["seen"] == 30 + 3 * (RESUME_K + 1) and len(a.meta["members"]) == 9


def _plan(h: Harness, commits: int, start: int = 0) -> None:
    for c in range(start, start + commits):
        for key in ("a", 2):
            h.append(Append((key,) * 4, c % 3 == 2, (1, 0, 0, 0), "first" if c % 2 == 0 else "none",
                            (False,) * 4))
        h.commit()


@pytest.mark.parametrize("kind", RESUME_KINDS)
def test_state_dict_round_trip_in_process(new_url: Any, kind: str) -> None:
    """state_dict() mid-run, more commits (evicting), then load_state_dict() into a sampler with another
    seed: the next minibatches are those the original sampler drew."""
    h = Harness(new_url(), 30)
    _plan(h, 4)
    one = make_sampler(kind, h.store, resume=False)

    def draw(s: Any) -> dict[str, Any]:
        batch = gather(s.table, s.sample())
        if kind == "prioritized":
            s.update(batch["indices"], resume_priorities(batch, s.batches_drawn))
        return batch

    for _ in range(3):
        draw(one)
    state = one.state_dict()
    _plan(h, 2, start=4)  # 16 new records: 10 of the oldest are evicted
    want = [draw(one) for _ in range(5)]
    two = make_sampler(kind, h.store, resume=False)
    two.seed = 999
    two.rng = np.random.default_rng(999)
    two.load_state_dict(state)
    got = [draw(two) for _ in range(5)]
    same_batches(got, want)
    assert two.batches_drawn == one.batches_drawn == 8


def test_resume_without_a_saved_state_starts_fresh(new_url: Any) -> None:
    h = Harness(new_url(), None)
    _plan(h, 2)
    for kind in RESUME_KINDS:
        a = make_sampler(kind, h.store, resume=True)
        b = make_sampler(kind, h.store, resume=False)
        assert np.array_equal(a.sample().rows, b.sample().rows), kind
        assert not a.restore()


def test_saved_states_are_versioned_and_named_per_sampler(new_url: Any) -> None:
    from replaystore.loaders import UniformSampler
    h = Harness(new_url(), None)
    _plan(h, 1)
    s = UniformSampler(h.store, batch_size=3, seed=4, name="learner-7")
    s.sample()
    v0 = s.save()
    s.sample()
    v1 = s.save()
    assert v1 == v0 + 1
    reopened = open_store(h.store.url)
    r = UniformSampler(reopened, batch_size=3, seed=4, name="learner-7", resume=True)
    assert r.batches_drawn == 2 and np.array_equal(r.sample().rows, s.sample().rows)
    other = UniformSampler(reopened, batch_size=3, seed=0, name="someone-else", resume=True)
    assert other.batches_drawn == 0
    assert open_store(h.store.url).load_state("learner-7") is not None


def _drawn_with(store_url: str, numba: str, state: dict[str, Any] | None, draws: int) -> tuple[list, dict]:
    """``draws`` prioritized minibatches (gathered, priorities written back) from a fresh handle of
    the store with the numba kernels on ("1") or off ("0"), starting from ``state`` if given."""
    from replaystore.loaders import PrioritizedSampler

    with mock.patch.dict(os.environ, {"REPLAYSTORE_NUMBA": numba}):
        st = open_store(store_url, mode="r")
        s = PrioritizedSampler(st, batch_size=64, alpha=0.6, beta=0.4, seed=21)
        if state is not None:
            s.load_state_dict(state)
        out = []
        for _ in range(draws):
            batch = gather(s.table, s.sample())
            rewards = batch["rewards"].numpy()  # priorities derived from the batch and the draw counter
            s.update(batch["indices"], np.abs(rewards) * (1 + s.batches_drawn % 5) + 0.01)
            out.append(batch)
        assert (s.tree._kernels is not None) == (numba == "1")  # (a tree with levels to descend)
        assert (s.table.reader._csr is not None) == (numba == "1")
        return out, s.state_dict()


@pytest.mark.parametrize("first, then", [("1", "0"), ("0", "1")])
def test_prioritized_replay_is_the_same_bit_for_bit_with_or_without_numba(tmp_path: Any, first: str,
                                                                          then: str) -> None:
    """A run saved with the compiled kernels resumes exactly without them, and the other way round:
    the sum tree and the CSR gather are the same arithmetic either way (issue 4, Resume)."""
    from replaystore.schemas import dqn
    from support.batches import dqn_batch

    url = str(tmp_path / "st")
    st = open_store(url, dqn(16, 2, actions=9), mode="w")
    rng = np.random.default_rng(3)
    with st.writer() as w:
        for c in range(6):
            w.append(dqn_batch(rng, 1500, extra=0), stream=c % 2)
            w.commit()
    assert len(st) > 4 * SEARCH_TOP  # a tree with levels below its searched top: the kernels descend them
    _, state = _drawn_with(url, first, None, 5)
    resumed, _ = _drawn_with(url, then, state, 6)
    same_backend, _ = _drawn_with(url, first, state, 6)  # what the first backend draws from the same state
    for got, want in zip(resumed, same_backend, strict=True):
        assert sorted(got) == sorted(want)
        for key in want:
            assert np.array_equal(got[key].numpy(), want[key].numpy()), key


def test_without_numba_installed_the_numpy_paths_run(tmp_path: Any) -> None:
    """numba unimportable (as where it cannot load): no kernels, sampling and
    ragged reads work."""
    code = f"""
import sys
sys.modules["numba"] = None  # import numba now raises ImportError
import numpy as np
from replaystore.compiled import kernels
from replaystore.loaders import PrioritizedSampler, gather
from replaystore.schemas import dqn
from replaystore.store import open_store
sys.path.insert(0, {os.path.join(os.path.dirname(__file__), os.pardir)!r})
from support.batches import dqn_batch
assert kernels("replaystore.store.read.csrkernels") is None and kernels("replaystore.loaders.treekernels") is None
st = open_store({str(tmp_path / "st")!r}, dqn(16, 2, actions=9), mode="w")
with st.writer() as w:
    w.append(dqn_batch(np.random.default_rng(0), 9000, extra=0), stream=0)
s = PrioritizedSampler(st, batch_size=32, seed=0)
b = gather(s.table, s.sample())
s.update(b["indices"], np.ones(32))
assert s.tree._kernels is None and s.table.reader._csr is None and b["legal_offsets"].shape == (33,)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
