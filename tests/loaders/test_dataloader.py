"""make_loader: torch DataLoaders over every sampler, in the main process and in fork/spawn workers.

Batches are mappings of tensors named after the schema's fields (with its dtypes) plus
``indices`` and the sampler's outputs; sequence batches are ``[batch, burn_in + length,
...]``; ragged fields come out as CSR of just the chosen rows. Gathering in workers
gives exactly the batches of ``num_workers=0`` for the same seed, and those are exactly
``gather(table, sampler.sample())``.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import StoreError
from replaystore.loaders import (
    EmptyStoreError,
    EpochSampler,
    PrioritizedSampler,
    ReservoirSampler,
    SequenceSampler,
    StoreDataset,
    UniformSampler,
    WorkerBatch,
    gather,
    legal_mask,
    make_loader,
)
from replaystore.schemas import dqn
from replaystore.schemas.columns import Columns, concat_columns
from replaystore.store import open_store
from support.batches import dqn_batch
from support.loaderref import (
    csr_rows,
    dense_legal,
    same_batches,
    to_numpy_batch,
    torch_dtype,
)

OBS, HEADS, ACTIONS = 6, 2, 9
SCHEMA = dqn(observation_size=OBS, heads=HEADS, actions=ACTIONS)
KINDS = ("uniform", "epoch", "sequence", "prioritized", "reservoir")


class Source:
    """A DQN store on local disk (3 streams, resets, 4 commits) and every record appended, in row order."""

    def __init__(self, url: str) -> None:
        self.store = open_store(url, SCHEMA)
        rng = np.random.default_rng(2024)
        parts = []
        with self.store.writer() as w:
            for c in range(4):
                for key in ("left", 7, "right"):
                    batch = dqn_batch(rng, 5, observation_size=OBS, heads=HEADS, actions=ACTIONS, extra=c % 2)
                    w.append(batch, stream=key, reset=c == 0)
                    parts.append(SCHEMA.validate(batch))
                w.commit()
        self.columns: Columns = concat_columns(parts)
        self.n = len(self.columns)
        assert np.array_equal(self.store.row_ids(), np.arange(self.n))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return Source(str(tmp_path_factory.mktemp("dl") / "dqn"))


def sampler_for(kind: str, st: Any) -> Any:
    if kind == "uniform":
        return UniformSampler(st, batch_size=16, seed=5, num_batches=4)
    if kind == "epoch":
        return EpochSampler(st, batch_size=16, seed=5)
    if kind == "sequence":
        return SequenceSampler(st, length=3, burn_in=2, batch_size=6, seed=5, num_batches=4)
    if kind == "prioritized":
        return PrioritizedSampler(st, batch_size=16, seed=5, num_batches=4)
    return ReservoirSampler(st, capacity=20, batch_size=16, seed=5, num_batches=4)


def direct(kind: str, st: Any) -> list[dict[str, Any]]:
    """The reference batches: gather(table, request) for each request of a fresh sampler."""
    sampler = sampler_for(kind, st)
    return [gather(sampler.table, req) for req in sampler]


OUTPUTS = {"uniform": {}, "epoch": {}, "reservoir": {},
           "prioritized": {"weights": torch.float32},
           "sequence": {"loss_mask": torch.bool, "sequence_valid": torch.bool, "steps": torch.int64,
                        "reset": torch.bool, "stream": torch.int64}}


def check_structure(kind: str, batch: dict[str, Any], src: Source) -> None:
    """Field names and dtypes of the schema, indices, sampler outputs; shapes; data = Columns.take."""
    names = {f.name for f in SCHEMA.dense_fields} | {n for off, ns in SCHEMA.offsets_groups.items()
                                                      for n in (off, *ns)}
    extra = {"indices", *OUTPUTS[kind]} | ({"stream_keys"} if kind == "sequence" else set())
    assert set(batch) == names | extra
    for f in SCHEMA.dense_fields:
        assert isinstance(batch[f.name], torch.Tensor) and batch[f.name].dtype == torch_dtype(f.dtype), f.name
    for off, ns in SCHEMA.offsets_groups.items():
        assert batch[off].dtype == torch.int64
        for n in ns:
            assert batch[n].dtype == torch_dtype(SCHEMA.field(n).dtype)
    for name, dtype in OUTPUTS[kind].items():
        assert batch[name].dtype == dtype, name
    assert batch["indices"].dtype == torch.int64
    rows = batch["indices"].numpy()
    if kind == "sequence":
        assert rows.shape == (6, 5)
        for f in SCHEMA.dense_fields:
            assert tuple(batch[f.name].shape) == (6, 5, *f.shape)
        for name in OUTPUTS[kind]:
            assert tuple(batch[name].shape) == ((6,) if name == "stream" else (6, 5))
        assert len(batch["stream_keys"]) == 6
        flat = rows.reshape(-1)
    else:
        assert rows.ndim == 1
        flat = rows
    real = flat >= 0
    want = src.columns.take(flat[real])
    b = to_numpy_batch(batch)
    for f in SCHEMA.dense_fields:
        got = b[f.name].reshape(len(flat), *f.shape)
        assert np.array_equal(got[real], want[f.name]) and not got[~real].any(), f.name
    for off, ns in SCHEMA.offsets_groups.items():
        counts = np.diff(b[off])
        assert b[off][0] == 0 and len(counts) == len(flat) and not counts[~real].any()
        for n in ns:
            got_rows = [x for x, ok in zip(csr_rows(b[n], b[off]), real, strict=True) if ok]
            assert got_rows == csr_rows(want[n], want[off]), n


@pytest.mark.parametrize("kind", KINDS)
def test_single_process_loader_yields_the_gathered_minibatches(source: Source, kind: str) -> None:
    st = source.store
    loader = make_loader(st, sampler_for(kind, st), num_workers=0)
    batches = list(loader)
    assert len(batches) == len(loader) == (-(-source.n // 16) if kind == "epoch" else 4)
    same_batches(batches, direct(kind, st))
    for b in batches:
        check_structure(kind, b, source)
    if kind == "epoch":
        rows = np.concatenate([b["indices"].numpy() for b in batches])
        assert sorted(rows.tolist()) == list(range(source.n))
        assert len(batches[-1]["indices"]) == source.n - 16 * (len(batches) - 1) < 16


@pytest.mark.parametrize("kind", KINDS)
def test_fork_workers_give_the_same_batches(source: Source, kind: str) -> None:
    st = source.store
    got = list(make_loader(st, sampler_for(kind, st), num_workers=2, multiprocessing_context="fork"))
    same_batches(got, list(make_loader(st, sampler_for(kind, st), num_workers=0)))
    same_batches(got, direct(kind, st))


@pytest.mark.parametrize("kind", ["sequence", "prioritized"])
def test_spawn_workers_give_the_same_batches(source: Source, kind: str) -> None:
    st = source.store
    got = list(make_loader(st, sampler_for(kind, st), num_workers=2, multiprocessing_context="spawn"))
    same_batches(got, direct(kind, st))
    for b in got:
        check_structure(kind, b, source)


def test_workers_send_numpy_arrays_and_the_loader_makes_the_tensors(source: Source) -> None:
    """A worker's batch crosses as a WorkerBatch of numpy arrays (pickled through the pipe, no
    shared-memory segment per batch); make_loader's StoreLoader yields tensors from it, and a
    plain DataLoader over StoreDataset hands the WorkerBatch over for ``tensors()``."""
    st = source.store
    plain = torch.utils.data.DataLoader(StoreDataset(st.url, "records"), batch_sampler=sampler_for("sequence", st),
                                        num_workers=1, collate_fn=lambda b: b, multiprocessing_context="fork")
    raw = list(plain)
    assert all(isinstance(b, WorkerBatch) for b in raw)
    assert all(isinstance(v, np.ndarray) for b in raw for k, v in b.arrays.items() if k != "stream_keys")
    same_batches([b.tensors() for b in raw], direct("sequence", st))
    loaded = list(make_loader(st, sampler_for("sequence", st), num_workers=1, multiprocessing_context="fork"))
    assert all(isinstance(b["obs"], torch.Tensor) for b in loaded)
    same_batches(loaded, direct("sequence", st))


@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_keeps_the_batches_correct(source: Source, workers: int) -> None:
    """On a CPU-only torch, pin_memory only warns that no accelerator is there; batches are unchanged."""
    st = source.store
    kw = {"multiprocessing_context": "fork"} if workers else {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        got = list(make_loader(st, sampler_for("sequence", st), num_workers=workers, pin_memory=True, **kw))
    same_batches(got, direct("sequence", st))
    if torch.cuda.is_available():
        assert all(b["obs"].is_pinned() for b in got)


def test_workers_see_records_committed_after_they_opened_the_store(source: Source, tmp_path: Any) -> None:
    """Persistent workers open the store once; a request naming newer rows makes them refresh."""
    st = open_store(str(tmp_path / "grow"), SCHEMA)
    rng = np.random.default_rng(0)
    with st.writer() as w:
        w.append(dqn_batch(rng, 8, observation_size=OBS, heads=HEADS, actions=ACTIONS, extra=0), stream=0)
    sampler = EpochSampler(st, batch_size=16, seed=0)
    loader = make_loader(st, sampler, num_workers=1, multiprocessing_context="fork", persistent_workers=True)
    assert sorted(next(iter(loader))["indices"].tolist()) == list(range(8))
    with st.writer() as w:  # a second writer: row ids 1 << 40 | 0..7
        w.append(dqn_batch(rng, 8, observation_size=OBS, heads=HEADS, actions=ACTIONS, extra=0), stream=0)
    batch = next(iter(loader))
    assert sorted(batch["indices"].tolist()) == st.row_ids().tolist() == list(range(8)) + [(1 << 40) | i
                                                                                         for i in range(8)]
    assert np.array_equal(batch["obs"].numpy(), st.read(batch["indices"].numpy())["obs"])


def _note_worker(folder: str, worker_id: int) -> None:
    """A worker_init_fn: one file per worker process started."""
    with open(os.path.join(folder, f"{os.getpid()}-{worker_id}"), "w"):
        pass


@pytest.mark.parametrize(("persistent", "starts"), [(None, 2), (False, 4)])
def test_epoch_passes_reuse_the_workers_unless_told_otherwise(source: Source, tmp_path: Any,
                                                              persistent: bool | None, starts: int) -> None:
    """make_loader's workers persist across passes by default; persistent_workers=False restarts them."""
    st = source.store
    sampler = EpochSampler(st, batch_size=8, seed=0)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    loader = make_loader(st, sampler, num_workers=2, multiprocessing_context="fork",
                         worker_init_fn=functools.partial(_note_worker, str(tmp_path)), **extra)
    passes = [np.concatenate([b["indices"].numpy() for b in loader]) for _ in range(2)]
    assert all(sorted(p.tolist()) == st.row_ids().tolist() for p in passes)
    assert len(os.listdir(tmp_path)) == starts


def test_priority_updates_reach_the_next_minibatch(source: Source) -> None:
    st = source.store
    sampler = PrioritizedSampler(st, batch_size=32, alpha=1.0, beta=0.5, seed=1, num_batches=3)
    it = iter(make_loader(st, sampler, num_workers=0))
    first = next(it)
    assert len(set(first["indices"].tolist())) > 5
    sampler.update(st.row_ids(), np.full(source.n, 1e-3))
    sampler.update([17], [1e6])
    second = next(it)
    assert second["indices"].tolist() == [17] * 32
    assert torch.equal(second["weights"], torch.ones(32))


def test_empty_store_error_through_the_loader(tmp_path: Any) -> None:
    st = open_store(str(tmp_path / "empty"), SCHEMA)
    for kind in KINDS:
        with pytest.raises(EmptyStoreError):
            next(iter(make_loader(st, sampler_for(kind, st), num_workers=0)))


def test_memory_stores_refuse_workers() -> None:
    st = open_store("memory://loaders-refuse-workers", SCHEMA, mode="w+")
    with pytest.raises(StoreError):
        make_loader(st, UniformSampler(st, batch_size=2), num_workers=2)


# -- CSR per minibatch and the dense legality mask ---------------------------------------------------

@pytest.mark.parametrize("kind", ["uniform", "prioritized", "sequence"])
def test_ragged_fields_are_csr_of_the_chosen_rows_and_legal_mask_is_minibatch_sized(source: Source,
                                                                                    kind: str) -> None:
    st = source.store
    for batch in make_loader(st, sampler_for(kind, st), num_workers=0):
        rows = batch["indices"].reshape(-1).numpy()
        real = rows >= 0
        want = source.columns.take(rows[real])
        for prefix in ("", "next_"):
            ids, off = f"{prefix}legal_ids", f"{prefix}legal_offsets"
            # values and offsets of these rows only, rebased to 0
            assert len(batch[off]) == len(rows) + 1 and int(batch[off][0]) == 0
            assert int(batch[off][-1]) == len(batch[ids]) == len(want[ids])
            mask = legal_mask(batch, ACTIONS, ids=ids, offsets=off)
            assert mask.shape == (len(rows), ACTIONS) and mask.dtype == torch.bool
            expect = np.zeros((len(rows), ACTIONS), dtype=bool)
            expect[real] = dense_legal(csr_rows(want[ids], want[off]), ACTIONS)
            assert np.array_equal(mask.numpy(), expect)
        # the contract of the DQN format: can_bootstrap exactly where the next-legal slice is non-empty
        counts = np.diff(batch["next_legal_offsets"].numpy())
        cb = batch["can_bootstrap"].reshape(-1).numpy()
        assert np.array_equal(cb[real], counts[real] > 0)


def test_legal_mask_of_a_hand_built_batch() -> None:
    batch = {"legal_ids": torch.tensor([2, 0, 1, 4]), "legal_offsets": torch.tensor([0, 1, 1, 4])}
    mask = legal_mask(batch, 5)
    assert mask.tolist() == [[False, False, True, False, False], [False] * 5, [True, True, False, False, True]]
