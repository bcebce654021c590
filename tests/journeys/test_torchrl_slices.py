"""Journey: record 4 CartPoles, slice them with TorchRL over the store, train a TorchRL loss from the loader.

A user records a vector env with ``RecordVectorEpisodes``, samples trajectory slices with
TorchRL's ``SliceSampler`` over ``ReplayStoreStorage`` (checked against the same sampler
over TorchRL's ``LazyTensorStorage`` holding each env's records one env after another),
and trains ``DQNLoss`` on ``make_loader(..., output="torchrl")`` batches as they come.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

from replaystore.errors import UnsupportedCombinationError
from replaystore.gym import RecordVectorEpisodes
from replaystore.integrations.torchrl import TRAJ_KEY, ReplayStoreStorage
from replaystore.loaders import UniformSampler, make_loader
from replaystore.store import open_store

ENVS = 4


def _record(url: str, steps: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Record ``steps`` vector steps of 4 CartPoles; return each env's transitions as the env gave them."""
    vec = gym.make_vec("CartPole-v1", num_envs=ENVS, vectorization_mode="sync")
    env = RecordVectorEpisodes(vec, url)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    per_env: list[list[dict[str, Any]]] = [[] for _ in range(ENVS)]
    resetting = np.zeros(ENVS, dtype=bool)  # NEXT_STEP autoreset: the step after an end is a reset, no transition
    for _ in range(steps):
        action = rng.integers(0, 2, ENVS)
        nxt, reward, terminated, truncated, _ = env.step(action)
        for i in range(ENVS):
            if not resetting[i]:
                per_env[i].append({"obs": obs[i].copy(), "action": int(action[i]), "reward": float(reward[i]),
                                   "next_obs": nxt[i].copy(), "terminated": bool(terminated[i]),
                                   "truncated": bool(truncated[i])})
        resetting = terminated | truncated
        obs = nxt
    env.close()
    return per_env


def _peer(per_env: list[list[dict[str, Any]]], like: TensorDict) -> TensorDictReplayBuffer:
    """TorchRL's own storage with each env's records contiguous, env 0 first, episodes numbered in that order."""
    rows = [t for env in per_env for t in env]
    start = np.zeros(len(rows), dtype=bool)
    at = 0
    for env in per_env:
        start[at] = True
        at += len(env)
    done = np.array([t["terminated"] or t["truncated"] for t in rows])
    start[1:] |= done[:-1]

    def col(name: str, key: Any) -> torch.Tensor:
        ref = like.get(key)
        return torch.as_tensor(np.stack([np.asarray(t[name]) for t in rows])).to(ref.dtype).reshape(
            len(rows), *ref.shape[1:])

    td = TensorDict({
        "observation": col("obs", "observation"),
        "action": col("action", "action"),
        "next": {"observation": col("next_obs", ("next", "observation")),
                 "reward": col("reward", ("next", "reward")),
                 "terminated": col("terminated", ("next", "terminated")),
                 "truncated": col("truncated", ("next", "truncated")),
                 "done": torch.as_tensor(done)[:, None]},
        TRAJ_KEY: torch.as_tensor(np.cumsum(start) - 1, dtype=torch.int64),
    }, batch_size=[len(rows)])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), sampler=SliceSampler(traj_key=TRAJ_KEY,
                                slice_len=8), batch_size=32, generator=torch.Generator().manual_seed(7))
    rb.extend(td)
    return rb


def _slices_continue(td: TensorDict, slice_len: int) -> bool:
    """Every step of every slice starts where the one before it ended (one env's trajectory)."""
    obs = td["observation"].reshape(-1, slice_len, *td["observation"].shape[1:])
    nxt = td["next", "observation"].reshape(obs.shape)
    return bool(torch.equal(obs[:, 1:], nxt[:, :-1]))


@pytest.mark.parametrize("steps", [150, 2_000])
def test_record_four_cartpoles_slice_with_torchrl_and_train_dqn(tmp_path: Path, steps: int) -> None:
    url = str(tmp_path / "cartpoles")
    per_env = _record(url, steps)
    st = open_store(url, mode="r")
    assert len(st.default.view().streams()) == ENVS

    # TorchRL's SliceSampler over our storage: the same slices as over TorchRL's own storage of the same records
    storage = ReplayStoreStorage(url)
    ours = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(traj_key=TRAJ_KEY, slice_len=8),
                                  batch_size=32, generator=torch.Generator().manual_seed(7))
    whole = storage[:]
    assert len(whole) == sum(len(e) for e in per_env)
    peer = _peer(per_env, whole)
    for _ in range(5):
        a, b = ours.sample(), peer.sample()
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in b.keys(True, True):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k

    # 400 slices: none mixes envs (every step continues the one before), each one trajectory
    auto = TensorDictReplayBuffer(storage=ReplayStoreStorage(url), sampler=SliceSampler(slice_len=8), batch_size=8,
                                  generator=torch.Generator().manual_seed(1))  # finds "episode" itself
    for _ in range(400):
        td = auto.sample()
        assert _slices_continue(td, 8)
        assert bool((td[TRAJ_KEY] == td[TRAJ_KEY][0]).all())

    # end_key alone cannot see where one env's unfinished episode meets the next env's records: refused
    by_done = TensorDictReplayBuffer(storage=ReplayStoreStorage(url),
                                     sampler=SliceSampler(end_key=("next", "done"), slice_len=8), batch_size=32)
    with pytest.raises(UnsupportedCombinationError, match="traj_key='episode'"):
        by_done.sample()

    # a TorchRL loss takes make_loader batches in TorchRL's layout as they are
    from torchrl.data import Categorical
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.manual_seed(0)
    actor = QValueActor(torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)),
                        in_keys=["observation"], spec=Categorical(2))
    loss_fn = DQNLoss(actor, action_space="categorical", delay_value=True)
    updater = SoftUpdate(loss_fn, eps=0.9)
    opt = torch.optim.Adam(loss_fn.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in actor.parameters()]
    loader = make_loader(st, UniformSampler(st, 32, num_batches=5, seed=0), output="torchrl")
    seen = 0
    for batch in loader:
        assert batch["next", "reward"].shape == (32, 1) and batch["next", "done"].shape == (32, 1)
        loss = loss_fn(batch)["loss"]
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        updater.step()
        seen += 1
    assert seen == 5
    assert any(not torch.equal(b, p) for b, p in zip(before, actor.parameters(), strict=True))
