"""A minimal DQN learner over DqnBatch minibatches, as the batch format prescribes.

Targets use the record's ``discounts`` as the bootstrap coefficient (never a
caller-side gamma) and the CSR next-legal slice for the masked max; records that
cannot bootstrap use their reward sum alone, selected with ``torch.where`` so no
``-inf`` or NaN from an empty slice reaches the loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from replaystore.loaders import PrioritizedSampler
from replaystore.loaders.masks import legal_mask


class QNet(nn.Module):
    """An MLP mapping observations to ``heads x actions`` Q-values."""

    def __init__(self, observation_size: int, actions: int, heads: int = 1, hidden: int = 128) -> None:
        super().__init__()
        self.heads, self.actions = heads, actions
        self.body = nn.Sequential(nn.Linear(observation_size, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, heads * actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs).view(len(obs), self.heads, self.actions)


def masked_max(q: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Max over legal actions per record and head (``-finfo.max`` where none is legal)."""
    fill = torch.finfo(q.dtype).min
    return q.masked_fill(~legal[:, None, :], fill).max(dim=-1).values


def td_errors(online: QNet, target: QNet, batch: Mapping[str, Any]) -> torch.Tensor:
    """Per record and head TD errors ``Q(s, a) - (r + discount * max_legal Q_target(s'))``."""
    q = online(batch["obs"])
    chosen = q.gather(2, batch["actions"].view(-1, 1, 1).expand(-1, q.shape[1], 1)).squeeze(2)
    with torch.no_grad():
        next_legal = legal_mask(batch, online.actions, ids="next_legal_ids", offsets="next_legal_offsets")
        bootstrap = masked_max(target(batch["next_obs"]), next_legal)
        can = batch["can_bootstrap"][:, None]
        rewards = batch["rewards"].to(q.dtype)[:, None]
        discounts = batch["discounts"].to(q.dtype)[:, None]
        y = torch.where(can, rewards + discounts * torch.where(can, bootstrap, torch.zeros_like(bootstrap)), rewards)
    return chosen - y


def dqn_loss(online: QNet, target: QNet, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, |TD error| per record)``.

    Huber loss per record/head, times the bootstrap ``masks`` and the prioritized-replay ``weights`` when present,
    averaged over the included record/head pairs.
    """
    td = td_errors(online, target, batch)
    per = nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")
    masks = batch["masks"].to(per.dtype)
    if "weights" in batch:
        per = per * batch["weights"].to(per.dtype)[:, None]
    loss = (per * masks).sum() / masks.sum().clamp_min(1.0)
    priority = (td.detach().abs() * masks).sum(1) / masks.sum(1).clamp_min(1.0)
    return loss, priority


def train_step(online: QNet, target: QNet, opt: torch.optim.Optimizer, batch: Mapping[str, Any],
               sampler: PrioritizedSampler) -> float:
    """One prioritized DQN step on ``batch``.

    Loss, backward, optimizer step, and the batch's |TD errors| written back to ``sampler`` as priorities. Returns the
    loss.
    """
    loss, priority = dqn_loss(online, target, batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sampler.update(batch["indices"], priority)
    return float(loss.detach())


def greedy(online: QNet, obs: torch.Tensor, legal_ids: torch.Tensor) -> int:
    """The legal action with the highest mean Q over heads, for one observation."""
    with torch.no_grad():
        q = online(obs[None])[0].mean(0)
    return int(legal_ids[q[legal_ids].argmax()])
