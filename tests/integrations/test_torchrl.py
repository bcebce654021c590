"""ReplayStoreStorage under real TorchRL replay buffers, samplers and losses; make_loader(output="tensordict")."""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)

from replaystore.errors import (
    AppendOnlyError,
    DTypeError,
    LoaderOutputError,
    MissingFieldError,
    ResumeMismatchError,
    ShapeError,
    UnknownFieldError,
)
from replaystore.integrations.torchrl import UNBOUNDED, ReplayStoreStorage
from replaystore.loaders import SequenceSampler, UniformSampler, make_loader
from replaystore.schemas import Dense, Ragged, Schema, nested, transitions
from replaystore.store import open_store
from support.torchrl_procs import check_records, collect, extend_buffer, sample_all, sample_url, transition_batch

SPAWN = mp.get_context("spawn")


def _pair(url: str, sampler_factory, batch_size: int, seed: int = 0, capacity: int = 10_000):
    ours = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=sampler_factory(), batch_size=batch_size,
                                  generator=torch.Generator().manual_seed(seed))
    peer = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler_factory(),
                                  batch_size=batch_size, generator=torch.Generator().manual_seed(seed))
    return ours, peer


def _assert_same(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for k in b.keys(True, True):
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_random_sampler_gives_lazy_tensor_storage_batches(tmp_path: Path) -> None:
    ours, peer = _pair(str(tmp_path / "rb"), RandomSampler, 64)
    for start, n in ((0, 100), (100, 37), (137, 63)):
        assert torch.equal(ours.extend(transition_batch(start, n)), peer.extend(transition_batch(start, n)))
    assert len(ours) == len(peer) == 200 and ours.storage.max_size == UNBOUNDED
    for _ in range(5):
        got, want = ours.sample(), peer.sample()
        _assert_same(got, want)
        check_records(got)
    assert ours.sample()[("next", "reward")].shape == (64, 1)


def test_slice_sampler_matches_peer_and_stays_in_episodes(tmp_path: Path) -> None:
    for factory in (lambda: SliceSampler(traj_key="episode", slice_len=5),
                    lambda: SliceSampler(traj_key="episode", num_slices=4),
                    lambda: SliceSampler(end_key=("next", "done"), slice_len=5)):
        ours, peer = _pair(str(tmp_path / f"rb{id(factory)}"), factory, 20, seed=3)
        for start in (0, 50):
            ours.extend(transition_batch(start, 50))
            peer.extend(transition_batch(start, 50))
        for more in (100, 150):  # the whole-view read SliceSampler makes follows each extend
            got, want = ours.sample(), peer.sample()
            _assert_same(got, want)
            episodes = got["episode"].view(4, 5)
            steps = got["step"].view(4, 5)
            assert (episodes == episodes[:, :1]).all()
            assert (steps[:, 1:] - steps[:, :-1] == 1).all()
            ours.extend(transition_batch(more, 50))
            peer.extend(transition_batch(more, 50))
            assert len(ours.storage[:]) == more + 50


def test_dqn_loss_step_on_sampled_batches_changes_parameters(tmp_path: Path) -> None:
    from torchrl.data import OneHot
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss

    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(str(tmp_path / "dqn")), sampler=RandomSampler(),
                                batch_size=32)
    rb.extend(transition_batch(0, 200))
    torch.manual_seed(0)
    actor = QValueActor(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)),
                        in_keys=["observation"], spec=OneHot(2))
    loss_fn = DQNLoss(actor, action_space="one-hot", delay_value=False)
    opt = torch.optim.Adam(loss_fn.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in actor.parameters()]
    for _ in range(3):
        loss = loss_fn(rb.sample())["loss"]
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, actor.parameters(), strict=True))


def test_another_process_sees_what_was_extended(tmp_path: Path) -> None:
    url = str(tmp_path / "shared")
    storage = ReplayStoreStorage(url)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=16)
    rb.extend(transition_batch(0, 120))
    with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
        by_url = pool.submit(sample_url, url, 500, 1).result(timeout=120)
        pickled = pool.submit(sample_all, storage, 500, 1).result(timeout=120)
    assert by_url["len"] == pickled["len"] == 120
    assert by_url["ids"] == pickled["ids"]  # same seed, same records, same positions
    assert set(by_url["ids"]) <= set(range(120)) and len(set(by_url["ids"])) > 90


def test_extend_in_a_collector_process_while_sampling_gives_whole_records(tmp_path: Path) -> None:
    url = str(tmp_path / "live")
    storage = ReplayStoreStorage(url)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=256)
    rb.extend(transition_batch(0, 100))
    proc = SPAWN.Process(target=collect, args=(url, 1, 20, 100))
    proc.start()
    seen = set()
    deadline = time.monotonic() + 120
    while True:
        alive = proc.is_alive()  # read before the refresh: after a dead collector's last commit is in
        storage.refresh()
        n = len(rb)
        seen.add(n)
        td = rb.sample()
        check_records(td)
        assert int(td["observation"][:, 0].max()) < n  # positions map to visible records only
        if not alive:
            break
        assert time.monotonic() < deadline
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert len(rb) == 2100 and min(seen) == 100 and max(seen) == 2100  # sampled while it grew


def test_ragged_fields_round_trip_as_jagged_tensors(tmp_path: Path) -> None:
    def batch(start: int, n: int) -> TensorDict:
        counts = [(i % 3) + 1 for i in range(start, start + n)]
        lists = [torch.arange(c) + i for i, c in zip(range(start, start + n), counts, strict=True)]
        td = TensorDict({"observation": torch.arange(start, start + n).float()[:, None]}, [n])
        td["legal"] = torch.nested.nested_tensor(lists, layout=torch.jagged)
        return td

    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(str(tmp_path / "ragged")), sampler=RandomSampler(),
                                batch_size=12)
    rb.extend(batch(0, 30))
    rb.extend(batch(30, 10))
    td = rb.sample()
    legal = td["legal"]
    assert legal.is_nested and legal.layout == torch.jagged
    for i, row in zip(td["observation"][:, 0].long().tolist(), legal.unbind(), strict=True):
        assert row.tolist() == list(range(i, i + (i % 3) + 1))
    st = open_store(str(tmp_path / "ragged"), mode="r")
    assert st.schema.ragged_fields[0].name == "legal"


def test_existing_transitions_store_reads_in_torchrl_layout(tmp_path: Path) -> None:
    url = str(tmp_path / "tr")
    st = open_store(url, transitions(obs_shape=4))
    rng = np.random.default_rng(0)
    n = 50
    data = {"obs": rng.random((n, 4), np.float32), "action": rng.integers(0, 2, n),
            "reward": rng.random(n, np.float32), "next_obs": rng.random((n, 4), np.float32),
            "terminated": rng.random(n) < 0.2}
    with st.writer() as w:
        w.append(data, stream=0)
    storage = ReplayStoreStorage(url)
    td = storage[torch.arange(n)]
    assert torch.equal(td["observation"], torch.from_numpy(data["obs"]))
    assert torch.equal(td["next", "observation"], torch.from_numpy(data["next_obs"]))
    assert torch.equal(td["next", "reward"], torch.from_numpy(data["reward"])[:, None])
    assert torch.equal(td["next", "done"], torch.from_numpy(data["terminated"])[:, None])
    assert torch.equal(td["next", "terminated"], td["next", "done"])
    # extending it in TorchRL's layout writes the store's own fields
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=4)
    rb.extend(td[:5])
    assert len(st.default) == n and (st.refresh(), len(st))[1] == n + 5
    # an explicit mapping
    plain = ReplayStoreStorage(url, keys={"obs": "o", "next_obs": ("nx", "o")})
    got = plain[torch.arange(3)]
    assert set(got.keys(True, True)) == {"o", ("nx", "o"), "action", "reward", "terminated"}
    assert got["reward"].shape == (3,)
    with pytest.raises(MissingFieldError, match="nope"):
        ReplayStoreStorage(url, keys={"nope": "x"})[0]


def test_recorded_gym_store_reads_in_torchrl_layout(tmp_path: Path) -> None:
    import gymnasium as gym

    from replaystore.gym import RecordEpisodes

    url = str(tmp_path / "cartpole")
    env = RecordEpisodes(gym.make("CartPole-v1"), url)
    env.reset(seed=0)
    for _ in range(60):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    env.close()
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler(), batch_size=8)
    td = rb.sample()
    assert td["observation"].shape == (8, 4) and td["next", "observation"].shape == (8, 4)
    assert td["next", "done"].shape == (8, 1) and td["next", "done"].dtype == torch.bool
    assert torch.equal(td["next", "done"], td["next", "terminated"] | td["next", "truncated"])


def test_bad_batches_name_the_field_and_leave_the_store_unchanged(tmp_path: Path) -> None:
    url = str(tmp_path / "bad")
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler(), batch_size=4)
    rb.extend(transition_batch(0, 20))
    st = open_store(url, mode="r")
    commits = len(st.commits())
    good = transition_batch(20, 5)
    wrong_shape = good.clone()
    wrong_shape["observation"] = torch.zeros(5, 3)
    wrong_dtype = good.clone()
    wrong_dtype["next", "reward"] = torch.zeros(5, 1, dtype=torch.float64)
    extra = good.clone()
    extra["next", "info"] = torch.zeros(5)
    missing = good.exclude(("next", "truncated"))
    cases = [(wrong_shape, ShapeError, "observation"), (wrong_dtype, DTypeError, "next__reward"),
             (extra, UnknownFieldError, "next__info"), (missing, MissingFieldError, "next__truncated")]
    for td, error, name in cases:
        with pytest.raises(error, match=name):
            rb.extend(td)
    bf16 = good.clone()
    bf16["observation"] = torch.zeros(5, 4, dtype=torch.bfloat16)
    with pytest.raises(DTypeError, match="observation"):
        rb.extend(bf16)
    st.refresh()
    assert len(st) == 20 and len(st.commits()) == commits and len(rb) == 20
    rb.extend(good)  # the buffer still works
    assert len(rb) == 25


def test_overwrites_and_empty_are_refused(tmp_path: Path) -> None:
    storage = ReplayStoreStorage(str(tmp_path / "ao"))
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=4)
    rb.extend(transition_batch(0, 10))
    with pytest.raises(AppendOnlyError):
        storage[3] = transition_batch(3, 1)[0]
    with pytest.raises(AppendOnlyError):
        storage.set(torch.tensor([0, 5]), transition_batch(0, 2))
    with pytest.raises(AppendOnlyError):
        rb.empty()
    assert len(rb) == 10


def _keyed(keys: list[int]) -> TensorDict:
    """Records ranked by their key (TensorDictMaxValueWriter's default rank key is ``("next", "reward")``)."""
    k = torch.tensor(keys)
    return TensorDict({"key": k, "next": {"reward": k.float()[:, None]}}, batch_size=[len(keys)])


def test_max_value_writer_overwrites_are_refused_and_leave_the_store(tmp_path: Path) -> None:
    """TensorDictMaxValueWriter replaces the lowest-ranked record in place. Over a store that is refused (it
    would evict the oldest record instead: keys [1, 2, 10] where LazyTensorStorage keeps [3, 10, 2]); what is
    accepted (the appends while it fills, a replacement that lands on the ring's next slot) keeps the records
    LazyTensorStorage keeps."""
    from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter

    def pair(url: str) -> list[TensorDictReplayBuffer]:
        return [TensorDictReplayBuffer(storage=storage, writer=TensorDictMaxValueWriter(), batch_size=2)
                for storage in (LazyTensorStorage(3), ReplayStoreStorage(url, capacity=3))]

    peer, ours = pair(str(tmp_path / "mv"))
    for rb in (peer, ours):
        rb.extend(_keyed([3, 1, 2]))
    assert ours.storage[:]["key"].tolist() == peer.storage[:]["key"].tolist() == [3, 1, 2]
    peer.extend(_keyed([10]))
    assert peer.storage[:]["key"].tolist() == [3, 10, 2]
    st = open_store(str(tmp_path / "mv"), mode="r")
    commits = len(st.commits())
    with pytest.raises(AppendOnlyError, match=r"index 1 .*next append goes at index 0.*RoundRobinWriter"):
        ours.extend(_keyed([10]))
    with pytest.raises(AppendOnlyError, match="is not an append"):  # (the writer's ranking moved on: index 2)
        ours.add(_keyed([10])[0])
    st.refresh()
    assert len(st.commits()) == commits and st.default.read(st.default.row_ids())["key"].tolist() == [3, 1, 2]
    assert ours.storage[:]["key"].tolist() == [3, 1, 2]

    peer, ours = pair(str(tmp_path / "mv2"))  # the lowest is the oldest, at the ring's next slot: an append
    for rb in (peer, ours):
        rb.extend(_keyed([1, 3, 2]))
        rb.extend(_keyed([10]))
    assert peer.storage[:]["key"].tolist() == [10, 3, 2]
    assert ours.storage[:]["key"].tolist() == [3, 2, 10]  # the same records; positions count from the oldest


def test_set_elsewhere_than_the_append_cursor_is_refused(tmp_path: Path) -> None:
    """``storage.set(i, td)`` appends only at the cursor (as TorchRL's LazyTensorStorage grows by a write there);
    any other index, a non-consecutive run, or a first write that is not at 0 raises AppendOnlyError naming the
    index and the cursor, and writes nothing."""
    url = str(tmp_path / "set")
    ours, peer = ReplayStoreStorage(url), LazyTensorStorage(100)
    with pytest.raises(AppendOnlyError, match="index 7 .*at index 0"):
        ours.set(7, transition_batch(7, 1)[0])
    assert ours.store is None  # (not even created)
    for storage in (ours, peer):
        storage.set(torch.arange(10), transition_batch(0, 10))
    for index, match in ((3, "index 3 .*at index 10"), (11, "index 11 .*at index 10"),
                         (torch.tensor([10, 12]), r"indices \[10, 12\] .*consecutive")):
        with pytest.raises(AppendOnlyError, match=match):
            ours.set(index, transition_batch(40, 1 if isinstance(index, int) else 2).squeeze(0))
    assert len(ours) == 10
    for storage in (ours, peer):
        storage.set(10, transition_batch(10, 1)[0])  # at the cursor: an append
        storage.set(torch.arange(11, 14), transition_batch(11, 3))
    _assert_same(ours[:], peer[:])

    ring = ReplayStoreStorage(str(tmp_path / "ring"), capacity=4)
    ring.set(torch.arange(4), transition_batch(0, 4))
    with pytest.raises(AppendOnlyError, match="index 2 .*at index 0"):
        ring.set(2, transition_batch(9, 1)[0])
    ring.set(0, transition_batch(4, 1)[0])  # the cursor wrapped onto the oldest record: it is evicted
    ring.set(torch.tensor([1, 2]), transition_batch(5, 2))
    assert ring[:]["observation"][:, 0].round().long().tolist() == [3, 4, 5, 6]


def test_a_restored_or_new_writer_continues_appending(tmp_path: Path) -> None:
    """A buffer restored with ``loads`` continues at its saved cursor (kept in the storage's state too); a new
    buffer over the same store starts at 0; both append after the records the store holds."""
    url = str(tmp_path / "resume")
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(url, capacity=8), batch_size=4)
    rb.extend(transition_batch(0, 13))
    rb.dumps(tmp_path / "ckpt")
    assert rb.storage.state_dict()["cursor"] == 5
    again = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), batch_size=4)
    again.loads(tmp_path / "ckpt")
    again.extend(transition_batch(13, 2))
    fresh = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), batch_size=4)
    fresh.extend(transition_batch(15, 3))
    fresh.storage.refresh()
    assert fresh.storage[:]["observation"][:, 0].round().long().tolist() == list(range(10, 18))
    with pytest.raises(ResumeMismatchError, match="cursor"):
        fresh.storage.load_state_dict({"url": url, "cursor": 8})

    # the buffer's writer cursor moved on without this storage (other processes sharing the buffer wrote 4 records)
    cursor = fresh.storage.state_dict()["cursor"]
    fresh._writer._cursor = (cursor + 4) % 8
    fresh.extend(transition_batch(18, 2))  # the writer's own append: accepted
    stale = fresh.storage.state_dict()["cursor"]
    assert stale == (cursor + 6) % 8 == fresh._writer._cursor
    with pytest.raises(AppendOnlyError, match="is not an append"):  # ends at the cursor: rewrites the newest
        fresh.storage.set((stale - 1) % 8, transition_batch(40, 1)[0])
    with pytest.raises(AppendOnlyError, match="is not an append"):  # the writer did not issue it
        fresh.storage.set((stale + 2) % 8, transition_batch(40, 1)[0])
    assert sorted(fresh.storage[:]["observation"][:, 0].round().long().tolist()) == [12, 13, 14, 15, 16, 17, 18, 19]


def test_a_writer_run_over_records_set_since_is_refused(tmp_path: Path) -> None:
    """``storage.set`` at the cursor appends, and the buffer's writer (which did not see it) then writes its run
    over that record: LazyTensorStorage overwrites it, so over a store the run is refused and writes nothing
    (it was taken for an append from a writer moved by another process, evicting the oldest record)."""
    peer = TensorDictReplayBuffer(storage=LazyTensorStorage(3))
    ours = TensorDictReplayBuffer(storage=ReplayStoreStorage(str(tmp_path / "set-then-extend"), capacity=3))
    for rb in (peer, ours):
        rb.add(_keyed([0])[0])
        rb.storage.set(1, _keyed([1])[0])
    peer.extend(_keyed([2, 3]))
    assert peer.storage[:]["key"].tolist() == [0, 2, 3]
    with pytest.raises(AppendOnlyError, match=r"indices \[1, 2\] .*next append goes at index 2"):
        ours.extend(_keyed([2, 3]))
    assert ours.storage[:]["key"].tolist() == [0, 1]
    ours.storage.set(2, _keyed([4])[0])  # (still an append at the storage's cursor)
    assert ours.storage[:]["key"].tolist() == [0, 1, 4]
    for index in (3, 4, -4):  # past the positions (LazyTensorStorage: IndexError), even where 3 % 3 is the cursor
        with pytest.raises(AppendOnlyError, match=r"outside the storage's positions -3\.\.2"):
            ours.storage.set(index, _keyed([5])[0])
    assert ours.storage[:]["key"].tolist() == [0, 1, 4]


def test_a_set_away_from_the_cursor_is_refused_while_the_buffers_writer_has_not_moved() -> None:
    """``storage.set(-1, td)`` after ``storage.set(0, td)`` on a buffer of 3: index -1 is position 2, not the
    cursor 1. The buffer's round-robin writer still stands where it stood at the last write (it wrote
    nothing), so the run is no writer's append (LazyTensorStorage writes position 2 and shows position 1,
    never written, as a record)."""
    ours = TensorDictReplayBuffer(storage=ReplayStoreStorage(f"memory://torchrl-writes/{next(_memory_urls)}",
                                                             capacity=3))
    ours.storage.set(0, _keyed([1])[0])
    with pytest.raises(AppendOnlyError, match=r"index -1 .*next append goes at index 1"):
        ours.storage.set(-1, _keyed([2])[0])
    assert ours.storage[:]["key"].tolist() == [1]
    ours.storage.set(1, _keyed([3])[0])  # (a set at the cursor still appends)
    assert ours.storage[:]["key"].tolist() == [1, 3]


_WRITES = hs.one_of(
    hs.tuples(hs.just("extend"), hs.integers(1, 7)),
    hs.tuples(hs.just("add"), hs.just(0)),
    hs.tuples(hs.just("set"), hs.integers(-8, 8)),
    hs.tuples(hs.just("set_run"), hs.integers(0, 8), hs.integers(1, 4)),
    hs.tuples(hs.just("setitem"), hs.integers(0, 8)),
)


def _write(rb: TensorDictReplayBuffer, kind: str, args: list[int], batch: TensorDict, capacity: int) -> None:
    if kind == "extend":
        rb.extend(batch.clone())
    elif kind == "add":
        rb.add(batch[0].clone())
    elif kind == "set":
        rb.storage.set(args[0], batch[0].clone())
    elif kind == "set_run":
        rb.storage.set(torch.arange(args[0], args[0] + args[1]) % capacity, batch.clone())
    else:
        rb.storage[args[0] % capacity] = batch[0].clone()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=hs.integers(1, 6), writes=hs.lists(_WRITES, max_size=10), max_value=hs.booleans())
def test_every_write_is_refused_or_keeps_what_lazy_tensor_storage_keeps(capacity: int, writes: list[tuple[Any, ...]],
                                                                         max_value: bool) -> None:
    """Against LazyTensorStorage given the same writes (buffer extend/add with a RoundRobinWriter or a
    TensorDictMaxValueWriter, storage.set at any index or run, storage[i] = td): each write either raises
    AppendOnlyError and leaves the records as they were, or leaves the records LazyTensorStorage keeps."""
    from torchrl.data.replay_buffers.writers import RoundRobinWriter, TensorDictMaxValueWriter

    def writer() -> Any:
        return TensorDictMaxValueWriter() if max_value else RoundRobinWriter()

    peer = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), writer=writer())
    ours = TensorDictReplayBuffer(writer=writer(), storage=ReplayStoreStorage(
        f"memory://torchrl-writes/{next(_memory_urls)}", capacity=capacity))
    ids = itertools.count(1)

    def keys(rb: TensorDictReplayBuffer) -> list[int]:
        return sorted(rb.storage[:]["key"].tolist()) if len(rb) else []

    for kind, *args in writes:
        batch = _keyed([next(ids) for _ in range(args[-1] if kind in ("extend", "set_run") else 1)])
        before = keys(ours)
        try:
            _write(ours, kind, args, batch, capacity)
        except AppendOnlyError:
            assert keys(ours) == before
            return  # (the refused writer moved its cursor first, as it does over any storage: the two part here)
        _write(peer, kind, args, batch, capacity)
        assert keys(ours) == keys(peer)


def test_one_buffer_extended_from_several_processes_appends_from_each(tmp_path: Path) -> None:
    """A TorchRL buffer pickled to a spawned process shares its writer's cursor: the child's extend moves it,
    and the parent's next extend (a run starting past this storage's own cursor) is still the writer's append."""
    url = str(tmp_path / "shared")
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(url, capacity=25), sampler=RandomSampler(), batch_size=4)
    rb.extend(transition_batch(0, 10))
    proc = SPAWN.Process(target=extend_buffer, args=(rb, 10, 10))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    rb.extend(transition_batch(20, 10))
    rb.storage.refresh()
    assert sorted(rb.storage[:]["observation"][:, 0].round().long().tolist()) == list(range(5, 30))
    check_records(rb.storage[:])


def test_capped_store_keeps_the_newest_records(tmp_path: Path) -> None:
    url = str(tmp_path / "cap")
    storage = ReplayStoreStorage(url, capacity=50)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=100)
    for start in range(0, 120, 30):  # the writer's cursor wraps past max_size: still appends
        rb.extend(transition_batch(start, 30))
    assert storage.max_size == 50 and len(rb) == 50
    ids = rb.sample()["observation"][:, 0].round().long()
    assert int(ids.min()) >= 70 and storage._last_cursor_index == 49
    assert ReplayStoreStorage(url).max_size == 50


_memory_urls = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=hs.one_of(hs.none(), hs.integers(1, 40)), sizes=hs.lists(hs.integers(1, 25), min_size=1, max_size=6),
       picks=hs.lists(hs.integers(-60, 59), max_size=10))
def test_positions_follow_a_reference_ring(capacity: int | None, sizes: list[int], picks: list[int]) -> None:
    """Against the rule: after appends, position i is the i-th of the newest ``capacity`` records, in order."""
    storage = ReplayStoreStorage(f"memory://torchrl-prop/{next(_memory_urls)}", capacity=capacity)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=4)
    start = 0
    for n in sizes:
        rb.extend(transition_batch(start, n))
        start += n
    kept = list(range(start))[-capacity:] if capacity else list(range(start))
    assert len(rb) == len(kept) and storage.max_size == (capacity or UNBOUNDED)
    assert storage[:]["observation"][:, 0].round().long().tolist() == kept
    for p in picks:
        if -len(kept) <= p < len(kept):
            assert int(storage[p]["observation"][0].round()) == kept[p]
        else:
            with pytest.raises(KeyError):
                storage[p]


def test_other_writers_commits_show_at_refresh(tmp_path: Path) -> None:
    url = str(tmp_path / "follow")
    storage = ReplayStoreStorage(url)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=8)
    rb.extend(transition_batch(0, 10))
    with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
        assert pool.submit(collect, url, 1, 2, 10).result(timeout=120) == 20
    assert len(rb) == 10 and int(rb.sample()["observation"][:, 0].max()) < 10  # this view, until a refresh
    assert storage.refresh() and len(rb) == 30
    assert sorted(storage[:]["observation"][:, 0].round().long().tolist()) == list(range(30))


def test_state_dict_and_dumps_name_the_store(tmp_path: Path) -> None:
    url = str(tmp_path / "state")
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler(), batch_size=4)
    rb.extend(transition_batch(0, 30))
    rb.dumps(tmp_path / "ckpt")
    doc = json.loads((tmp_path / "ckpt" / "storage" / "replaystore.json").read_text())
    assert doc["url"] == url and doc["records"] == 30
    again = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=RandomSampler(), batch_size=4)
    again.loads(tmp_path / "ckpt")
    assert len(again) == 30
    other = ReplayStoreStorage(str(tmp_path / "other"))
    with pytest.raises(ResumeMismatchError, match="url"):
        other.load_state_dict(rb.storage.state_dict())


def test_plain_replay_buffer_takes_tensordicts(tmp_path: Path) -> None:
    rb = ReplayBuffer(storage=ReplayStoreStorage(str(tmp_path / "plain")), batch_size=8)
    rb.extend(transition_batch(0, 40))
    rb.add(transition_batch(40, 1)[0])  # one record at the cursor
    check_records(rb.sample())
    assert len(rb) == 41 and rb[3]["observation"].shape == (4,)
    _assert_same(rb[3], transition_batch(3, 1)[0])
    _assert_same(rb[-1], transition_batch(40, 1)[0])


def test_existing_store_with_nested_and_ragged_fields(tmp_path: Path) -> None:
    url = str(tmp_path / "nested")
    _nested_store(url)
    td = ReplayStoreStorage(url)[torch.tensor([4, 0, 5])]
    assert td["obs", "image"].dtype == torch.uint8 and td["obs", "image"].shape == (3, 2, 2)
    assert torch.equal(td["obs", "vec"][:, 0], torch.tensor([12.0, 0.0, 15.0]))
    assert [r.tolist() for r in td["legal"].unbind()] == [[7, 8], [0], [9, 10, 11]]
    assert set(td.keys(True, True)) == {("obs", "image"), ("obs", "vec"), "action", "legal"}


# -- make_loader(output="tensordict") ---------------------------------------------------------


def _nested_store(url: str):
    leaf = {"image": Dense("image", np.uint8, (2, 2)), "vec": Dense("vec", np.float32, (3,))}
    schema = Schema("td", [nested("obs", leaf), Dense("action", np.int64),
                           Ragged("legal", np.int64, offsets="legal_offsets")])
    st = open_store(url, schema)
    n = 40
    counts = np.arange(n) % 3 + 1
    with st.writer() as w:
        w.append({"obs": {"image": np.arange(n * 4, dtype=np.uint8).reshape(n, 2, 2),
                          "vec": np.arange(n * 3, dtype=np.float32).reshape(n, 3)},
                  "action": np.arange(n), "legal": np.arange(int(counts.sum())),
                  "legal_offsets": np.concatenate([[0], np.cumsum(counts)])}, stream=0)
    return st


@pytest.mark.parametrize("workers", [0, 1])
def test_make_loader_yields_tensordicts(tmp_path: Path, workers: int) -> None:
    st = _nested_store(str(tmp_path / "loader"))
    kw = {"multiprocessing_context": "spawn"} if workers else {}
    plain = list(make_loader(st, UniformSampler(st, 8, seed=5, num_batches=2)))
    tds = list(make_loader(st, UniformSampler(st, 8, seed=5, num_batches=2), num_workers=workers,
                           output="tensordict", **kw))
    assert len(tds) == 2
    for d, td in zip(plain, tds, strict=True):
        assert isinstance(td, TensorDict) and td.batch_size == (8,)
        assert torch.equal(td["obs", "image"], d["obs"]["image"]) and torch.equal(td["obs", "vec"], d["obs"]["vec"])
        assert torch.equal(td["action"], d["action"]) and torch.equal(td["indices"], d["indices"])
        assert torch.equal(td["legal"].offsets(), d["legal_offsets"]) and torch.equal(td["legal"].values(),
                                                                                      d["legal"])


def test_make_loader_tensordict_sequences_keep_ragged_as_csr(tmp_path: Path) -> None:
    st = _nested_store(str(tmp_path / "seq"))
    (td,) = make_loader(st, SequenceSampler(st, 3, batch_size=2, num_batches=1), output="tensordict")
    assert td.batch_size == (2,) and td["obs", "vec"].shape == (2, 3, 3)
    values, offsets = td["legal"]
    assert offsets.shape == (7,) and values.shape == (int(offsets[-1]),)


def test_make_loader_output_errors(tmp_path: Path) -> None:
    st = _nested_store(str(tmp_path / "err"))
    with pytest.raises(LoaderOutputError, match="tensordict"):
        make_loader(st, UniformSampler(st, 8), output="arrow")
    code = ("import sys; sys.modules['tensordict'] = None\n"
            "from replaystore.errors import MissingDependencyError\n"
            "from replaystore.loaders.tdoutput import check_output\n"
            "check_output('dict')\n"
            "try:\n    check_output('tensordict')\nexcept MissingDependencyError as e:\n    print('missing', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("missing") and "replaystore[torchrl]" in out.stdout
