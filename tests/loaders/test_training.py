"""Training smoke test: a tiny DQN learns from a PrioritizedSampler DataLoader.

The TD target follows the DqnBatch format exactly: ``discounts`` is the bootstrap
coefficient (never a caller-side gamma); the max over next actions is taken over the
row's next-legal CSR slice, densified for the minibatch only, masked with
``torch.finfo(dtype).min``; rows that cannot bootstrap take just their reward through
``torch.where`` (never ``(1 - done) * max``). Per-head ``masks`` and importance
``weights`` multiply the loss; priorities are written back as |TD error|.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.loaders import PrioritizedSampler, legal_mask, make_loader
from replaystore.store import open_store
from support.loaderref import (
    TOY_ACTIONS,
    TOY_HEADS,
    TOY_STATES,
    toy_records,
    toy_schema,
)

STEPS, BATCH, SYNC_EVERY = 400, 64, 40


def td_target(batch: dict[str, Any], target_net: torch.nn.Module) -> torch.Tensor:
    """(records, heads) targets: rewards + discounts * max over next legal actions, or just rewards."""
    b = len(batch["obs"])
    with torch.no_grad():
        q_next = target_net(batch["next_obs"]).view(b, TOY_HEADS, TOY_ACTIONS)
        legal = legal_mask(batch, TOY_ACTIONS, ids="next_legal_ids", offsets="next_legal_offsets")
        assert legal.shape == (b, TOY_ACTIONS)
        masked = q_next.masked_fill(~legal[:, None, :], torch.finfo(q_next.dtype).min)
        next_max = masked.max(dim=2).values
        rewards = batch["rewards"].to(q_next.dtype)[:, None]
        discounts = batch["discounts"].to(q_next.dtype)[:, None]
        can = batch["can_bootstrap"][:, None]
        target = torch.where(can, rewards + discounts * next_max, rewards)
    assert torch.isfinite(target).all(), "a masked -inf/NaN leaked into the TD target"
    return target


@pytest.mark.slow  # a training
def test_tiny_dqn_learns_from_a_prioritized_loader(new_url: Any) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    st = open_store(new_url(), toy_schema())
    with st.writer() as w:
        for actor in range(4):
            w.append(toy_records(rng, 40), stream=f"actor-{actor}")
            w.commit()
    data = st.read(st.row_ids())
    assert np.array_equal(data["can_bootstrap"], np.diff(data["next_legal_offsets"]) > 0)
    assert (data["discounts"][~data["can_bootstrap"]] == 0).all() and (~data["can_bootstrap"]).any()
    assert (data["can_bootstrap"] & data["dones"]).any(), "no bootstrappable truncation in the data"

    net = torch.nn.Sequential(torch.nn.Linear(TOY_STATES, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, TOY_HEADS * TOY_ACTIONS))
    target_net = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    sampler = PrioritizedSampler(st, batch_size=BATCH, alpha=0.6, beta=0.4, seed=0, num_batches=STEPS)
    losses = []
    for step, batch in enumerate(make_loader(st, sampler, num_workers=0)):
        b = len(batch["obs"])
        q = net(batch["obs"]).view(b, TOY_HEADS, TOY_ACTIONS)
        q_sa = q.gather(2, batch["actions"].view(b, 1, 1).expand(b, TOY_HEADS, 1)).squeeze(2)
        td = td_target(batch, target_net) - q_sa
        masks = batch["masks"]
        weights = batch["weights"][:, None]
        assert weights.max() == 1.0 and (weights > 0).all()
        loss = (weights * masks * td.pow(2)).sum() / masks.sum().clamp(min=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        per_record = (td.detach().abs() * masks).sum(1) / masks.sum(1).clamp(min=1.0)
        sampler.update(batch["indices"], per_record)
        losses.append(loss.item())
        if (step + 1) % SYNC_EVERY == 0:
            target_net.load_state_dict(net.state_dict())
    assert len(losses) == STEPS and np.isfinite(losses).all()
    first, last = np.mean(losses[:50]), np.mean(losses[-50:])
    assert first > 0.05, "the problem was trivial from the start"
    assert last < 0.5 * first, (first, last)
    # priorities were written back: they now differ per record instead of all sitting at the max
    prios = sampler.priorities(st.row_ids())
    assert np.isfinite(prios).all() and prios.std() > 0 and prios.min() < 0.5 * sampler.max_priority
