"""Spawned-process entry points and batch makers for tests/integrations/test_torchrl.py.

Every record is a pure function of its id ``i``, so a reader checks any record it samples
without knowing which batches were written: see :func:`check_records`.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

OBS = 4


def transition_batch(start: int, n: int, episode_len: int = 10) -> TensorDict:
    """``n`` CartPole-shaped transitions with ids ``start .. start+n-1`` in TorchRL's layout."""
    i = torch.arange(start, start + n)
    obs = i[:, None].float() + torch.arange(OBS).float() / 10
    end = (i % episode_len == episode_len - 1)[:, None]
    return TensorDict({
        "observation": obs,
        "action": torch.nn.functional.one_hot(i % 2, 2),
        "episode": i // episode_len,
        "step": i % episode_len,
        "next": {"observation": obs + 1, "reward": (i % 7).float()[:, None] / 2, "done": end.clone(),
                 "terminated": end.clone(), "truncated": torch.zeros(n, 1, dtype=torch.bool)},
    }, batch_size=[n])


def check_records(td: Any) -> None:
    """Every record of ``td`` is whole: all its fields belong to the same id (raises AssertionError)."""
    i = td["observation"][:, 0].round().long()
    expect = transition_batch(0, int(i.max()) + 1)[i]
    for key in expect.keys(include_nested=True, leaves_only=True):
        assert torch.equal(td[key], expect[key]), key


def sample_all(storage: Any, batch_size: int, seed: int) -> dict[str, Any]:
    """Child: sample ``storage`` (pickled across spawn) through a fresh buffer; report what it saw."""
    from torchrl.data import RandomSampler, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=batch_size,
                                generator=torch.Generator().manual_seed(seed))
    td = rb.sample()
    check_records(td)
    return {"len": len(rb), "ids": td["observation"][:, 0].round().long().tolist()}


def sample_url(url: str, batch_size: int, seed: int) -> dict[str, Any]:
    """Child: reopen the store at ``url`` as a TorchRL buffer and sample it."""
    from replaystore.integrations.torchrl import ReplayStoreStorage

    return sample_all(ReplayStoreStorage(url), batch_size, seed)


def collect(url: str, first: int, batches: int, n: int) -> int:
    """Child: extend batches ``first .. first+batches-1`` of ``n`` transitions into ``url``, one commit each."""
    from torchrl.data import RandomSampler, TensorDictReplayBuffer

    from replaystore.integrations.torchrl import ReplayStoreStorage

    storage = ReplayStoreStorage(url)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=8)
    for b in range(first, first + batches):
        rb.extend(transition_batch(b * n, n))
    storage.close()
    return batches * n


def extend_buffer(rb: Any, start: int, n: int) -> None:
    """Child: extend a whole TorchRL buffer pickled across spawn (its writer's cursor shared) with ids ``start ..``."""
    rb.extend(transition_batch(start, n))
