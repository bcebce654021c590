"""A DQN trained offline from a store that RecordEpisodes filled with random CartPole play, read through
make_loader, balances the pole far longer than random play does.

The training (8,000 recorded steps, 1,500 minibatches) is marked ``slow``; the default run keeps the same
pipeline at a small size (a few hundred steps, a few dozen minibatches), which checks the recording, the
loader's batches and that the updates move the network, but not the learning itself."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from replaystore.gym import RecordEpisodes
from replaystore.loaders import UniformSampler, make_loader
from replaystore.store import open_store


def _greedy_return(q: nn.Module, episodes: int, seed: int) -> float:
    env = gym.make("CartPole-v1")
    total = 0.0
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done = False
        while not done:
            with torch.no_grad():
                a = int(q(torch.as_tensor(obs)[None]).argmax())
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
    env.close()
    return total / episodes


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


@pytest.mark.parametrize(("min_steps", "updates"), [
    pytest.param(8_000, 1500, marks=pytest.mark.slow, id="training"),
    pytest.param(400, 40, id="small"),  # the default run's representative: the same pipeline, no learning check
])
def test_dqn_from_a_recorded_store_beats_random_play(tmp_path: Path, min_steps: int, updates: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: threads only contend
    try:
        _train_and_check(tmp_path, min_steps, updates)
    finally:
        torch.set_num_threads(threads)


def _train_and_check(tmp_path: Path, min_steps: int, updates: int) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = RecordEpisodes(gym.make("CartPole-v1"), str(tmp_path / "cartpole"))
    returns, steps, k = [], 0, 0
    while steps < min_steps:  # random play: about 22 steps an episode
        env.reset(seed=k)
        k += 1
        done, ret = False, 0.0
        while not done:
            _, r, term, trunc, _ = env.step(int(rng.integers(2)))
            ret += float(r)
            steps += 1
            done = term or trunc
        returns.append(ret)
    env.close()
    random_return = float(np.mean(returns))
    assert random_return < 30

    store = open_store(str(tmp_path / "cartpole"), mode="r")
    assert len(store) == steps
    q, target = _mlp(), _mlp()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in q.parameters()]
    batches = 0
    for i, batch in enumerate(make_loader(store, UniformSampler(store, 128, seed=1, num_batches=updates))):
        batches += 1
        assert batch["obs"].shape == batch["next_obs"].shape == (128, 4) and batch["action"].shape == (128,)
        with torch.no_grad():
            not_end = (~batch["terminated"]).float()
            y = batch["reward"].float() + 0.99 * not_end * target(batch["next_obs"]).max(1).values
        pred = q(batch["obs"]).gather(1, batch["action"].long()[:, None])[:, 0]
        loss = nn.functional.smooth_l1_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 100 == 99:
            target.load_state_dict(q.state_dict())
    assert batches == updates
    assert all(not torch.equal(b, p) for b, p in zip(before, q.parameters(), strict=True))  # the updates trained
    if updates >= 1500:  # enough minibatches to learn: the greedy policy balances far longer than random play
        greedy = _greedy_return(q, 5, seed=10_000)
        assert greedy > 3 * random_return, (greedy, random_return)
    store.close()
