"""ReplayStoreStorage over stores with streams and episodes: trajectory order, the "episode" key, end_key refused;
make_loader(output="torchrl")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from torchrl.data import LazyTensorStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer

from replaystore.errors import LoaderOutputError, UnsupportedCombinationError
from replaystore.integrations.torchrl import TRAJ_KEY, TRANSITION_KEYS, ReplayStoreStorage
from replaystore.loaders import SequenceSampler, UniformSampler, make_loader
from replaystore.loaders.tdoutput import TORCHRL_KEYS
from replaystore.schemas import Dense, Schema, transitions
from replaystore.store import open_store


def _interleaved(url: str, lengths: list[list[int]], unfinished: bool = True) -> dict[str, list[np.ndarray]]:
    """Streams of episodes of the given lengths, appended one step of each stream at a time.

    Record values: obs[0] = stream, obs[1] = the step within the stream. With ``unfinished``, each
    stream's last episode has no end flag.
    """
    st = open_store(url, transitions(obs_shape=2))
    per: dict[str, list[np.ndarray]] = {}
    flags = []
    for eps in lengths:
        term = np.zeros(sum(eps), dtype=bool)
        term[np.cumsum(eps) - 1] = True
        if unfinished:
            term[-1] = False
        flags.append(term)
    with st.writer() as w:
        for t in range(max(sum(e) for e in lengths)):
            for s, eps in enumerate(lengths):
                if t >= sum(eps):
                    continue
                obs = np.array([[s, t]], np.float32)
                nxt = obs + np.array([[0, 1]], np.float32)
                w.append({"obs": obs, "action": np.array([t % 2]), "reward": np.array([1.0], np.float32),
                          "next_obs": nxt, "terminated": flags[s][t:t + 1]}, stream=f"env{s}")
                per.setdefault(f"env{s}", []).append(obs[0])
    return per


def _expected_episodes(lengths: list[list[int]]) -> list[tuple[int, int]]:
    """(stream, step) in trajectory order, and the episode id of each."""
    out = []
    ep = 0
    for s, eps in enumerate(lengths):
        t = 0
        for n in eps:
            out += [(s, t + k, ep) for k in range(n)]
            t += n
            ep += 1
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=hs.lists(hs.lists(hs.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=4))
def test_positions_run_stream_by_stream_with_one_episode_id_per_trajectory(tmp_path_factory, lengths) -> None:
    url = str(tmp_path_factory.mktemp("s") / "st")
    _interleaved(url, lengths)
    td = ReplayStoreStorage(url)[:]
    want = _expected_episodes(lengths)
    got = [(int(o[0]), int(o[1]), int(e)) for o, e in zip(td["observation"], td[TRAJ_KEY], strict=True)]
    assert got == want
    assert td[TRAJ_KEY].dtype == torch.int64


def test_slices_match_torchrl_over_its_own_storage_and_never_mix_streams(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    lengths = [[9, 12, 5], [20, 7], [3, 3, 30], [15]]
    _interleaved(url, lengths)
    storage = ReplayStoreStorage(url)
    whole = storage[:]
    peer_storage = LazyTensorStorage(10_000)
    kw = {"sampler_factory": lambda: SliceSampler(traj_key=TRAJ_KEY, slice_len=4), "batch_size": 16}
    ours = TensorDictReplayBuffer(storage=storage, sampler=kw["sampler_factory"](), batch_size=16,
                                  generator=torch.Generator().manual_seed(3))
    peer = TensorDictReplayBuffer(storage=peer_storage, sampler=kw["sampler_factory"](), batch_size=16,
                                  generator=torch.Generator().manual_seed(3))
    peer.extend(whole.clone())  # the same records, each stream contiguous, as TorchRL keeps one env after another
    for _ in range(400):
        a, b = ours.sample(), peer.sample()
        for k in b.keys(True, True):
            assert torch.equal(a[k], b[k]), k
        obs = a["observation"].reshape(4, 4, 2)
        assert bool((obs[:, :, 0] == obs[:, :1, 0]).all())  # one stream per slice
        assert bool((obs[:, 1:, 1] == obs[:, :-1, 1] + 1).all())  # consecutive steps


def test_end_key_slicing_is_refused_only_where_it_would_cross(tmp_path: Path) -> None:
    crossing = str(tmp_path / "crossing")
    _interleaved(crossing, [[4, 5], [6]])
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(crossing),
                                sampler=SliceSampler(end_key=("next", "done"), slice_len=2), batch_size=4)
    with pytest.raises(UnsupportedCombinationError, match="end_key") as info:
        rb.sample()
    assert "traj_key='episode'" in str(info.value)
    # every stream's episodes finished: done marks every boundary, end_key slices are right and allowed
    finished = str(tmp_path / "finished")
    _interleaved(finished, [[4, 5], [6]], unfinished=False)
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(finished),
                                sampler=SliceSampler(end_key=("next", "done"), slice_len=2), batch_size=4)
    td = rb.sample()
    obs = td["observation"].reshape(2, 2, 2)
    assert bool((obs[:, 1, 0] == obs[:, 0, 0]).all())


def test_extend_back_a_sample_with_the_episode_key(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    _interleaved(url, [[3, 4], [5]])
    storage = ReplayStoreStorage(url)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=4)
    td = rb.sample()
    assert TRAJ_KEY in td.keys()
    n = len(storage)
    rb.extend(td.exclude("index"))
    assert len(storage) == n + 4
    assert TRAJ_KEY not in open_store(url, mode="r").schema.names
    # the storage's own stream comes last: the records just appended are the last positions
    assert torch.equal(storage[torch.arange(n, n + 4)]["observation"], td["observation"])


def test_make_loader_torchrl_layout(tmp_path: Path) -> None:
    assert TRANSITION_KEYS == TORCHRL_KEYS
    url = str(tmp_path / "st")
    _interleaved(url, [[3, 4], [5]])
    st = open_store(url, mode="r")
    (td,) = make_loader(st, UniformSampler(st, 6, num_batches=1, seed=0), output="torchrl")
    assert set(td.keys(True, True)) >= {"observation", "action", ("next", "observation"), ("next", "reward"),
                                        ("next", "terminated"), ("next", "done"), "indices"}
    assert "obs" not in td.keys() and "reward" not in td.keys()
    assert td["next", "reward"].shape == (6, 1) and td["next", "done"].dtype == torch.bool
    assert torch.equal(td["next", "done"], td["next", "terminated"])  # (no truncated field: done = terminated)
    # the same rows as the dict output
    (d,) = make_loader(st, UniformSampler(st, 6, num_batches=1, seed=0))
    assert torch.equal(td["observation"], d["obs"]) and torch.equal(td["next", "observation"], d["next_obs"])
    assert torch.equal(td["next", "reward"][:, 0], d["reward"])
    # "tensordict" keeps the table's own names
    (plain,) = make_loader(st, UniformSampler(st, 6, num_batches=1, seed=0), output="tensordict")
    assert "obs" in plain.keys() and "observation" not in plain.keys()
    # sequence windows: the flags get the trailing dim too
    (seq,) = make_loader(st, SequenceSampler(st, 2, batch_size=3, num_batches=1), output="torchrl")
    assert seq["next", "reward"].shape[-1] == 1 and seq["next", "reward"].shape[:-1] == seq["action"].shape


def test_make_loader_torchrl_refuses_a_table_without_transitions(tmp_path: Path) -> None:
    st = open_store(str(tmp_path / "plain"), Schema("plain", [Dense("x", np.float32, (2,))]))
    with st.writer() as w:
        w.append({"x": np.zeros((4, 2), np.float32)}, stream=0)
    with pytest.raises(LoaderOutputError, match="next_obs"):
        make_loader(st, UniformSampler(st, 2), output="torchrl")


def test_slices_of_a_full_capped_recorded_store_stay_in_one_env(tmp_path: Path) -> None:
    import gymnasium as gym

    from replaystore.gym import RecordVectorEpisodes

    url = str(tmp_path / "capped")
    env = RecordVectorEpisodes(gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"), url, capacity=200)
    env.reset(seed=0)
    for _ in range(300):
        env.step(env.action_space.sample())
    env.close()
    storage = ReplayStoreStorage(url)
    assert len(storage) == storage.max_size == 200  # full: TorchRL treats it as a ring
    rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(traj_key=TRAJ_KEY, slice_len=8), batch_size=8,
                                generator=torch.Generator().manual_seed(0))
    for _ in range(200):
        td = rb.sample()
        assert torch.equal(td["observation"][1:], td["next", "observation"][:-1])
        assert bool((td[TRAJ_KEY] == td[TRAJ_KEY][0]).all())
