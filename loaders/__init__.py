"""Samplers and the torch Dataset/DataLoader glue."""

from replaystore.loaders.base import EmptyStoreError, Request, StoreSampler
from replaystore.loaders.dataset import StoreDataset, gather, make_loader
from replaystore.loaders.prioritized import PrioritizedSampler
from replaystore.loaders.reservoir import ReservoirSampler
from replaystore.loaders.sequence import SequenceSampler
from replaystore.loaders.uniform import EpochSampler, UniformSampler

__all__ = [
    "EmptyStoreError",
    "EpochSampler",
    "PrioritizedSampler",
    "Request",
    "ReservoirSampler",
    "SequenceSampler",
    "StoreDataset",
    "StoreSampler",
    "UniformSampler",
    "gather",
    "make_loader",
]
