"""replaystore: a persistent, on-disk dataset and replay store for reinforcement learning."""

__version__ = "0.1.0"
