"""Samplers and the torch Dataset/DataLoader glue."""

from replaystore.loaders.base import EmptyStoreError, Request, StoreSampler
from replaystore.loaders.buffer import ReplayBuffer
from replaystore.loaders.dataset import StoreDataset, StoreLoader, WorkerBatch, gather, make_loader
from replaystore.loaders.episodes import iter_episodes
from replaystore.loaders.her import HER, GoalFields
from replaystore.loaders.masks import legal_mask
from replaystore.loaders.prioritized import PrioritizedSampler
from replaystore.loaders.ratelimit import RateLimiter
from replaystore.loaders.reservoir import ReservoirSampler
from replaystore.loaders.sequence import SequenceSampler
from replaystore.loaders.uniform import EpochSampler, UniformSampler

__all__ = [
    "EmptyStoreError",
    "EpochSampler",
    "GoalFields",
    "HER",
    "PrioritizedSampler",
    "RateLimiter",
    "ReplayBuffer",
    "Request",
    "ReservoirSampler",
    "SequenceSampler",
    "StoreDataset",
    "StoreLoader",
    "StoreSampler",
    "UniformSampler",
    "WorkerBatch",
    "gather",
    "iter_episodes",
    "legal_mask",
    "make_loader",
]
