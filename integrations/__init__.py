"""Adapters that put a store behind the replay buffers of other trainers.

``replaystore.integrations.torchrl`` (extra ``replaystore[torchrl]``) and
``replaystore.integrations.sb3`` (extra ``replaystore[sb3]``) import their trainer
library when imported; this package imports neither.
"""
