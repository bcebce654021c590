"""Field and schema model, the built-in batch schemas, validation, Arrow and Zarr layout."""

from replaystore.schemas.builtin import (
    BUILTINS,
    alphazero,
    deep_cfr_advantage,
    deep_cfr_strategy,
    dqn,
    episode,
    frames,
    goal_transitions,
    ppo,
    rollout,
    transitions,
    treestrap,
)
from replaystore.schemas.columns import Columns
from replaystore.schemas.containers import episode_columns, rollout_columns
from replaystore.schemas.csr import dense_mask, gather_csr
from replaystore.schemas.fields import FIELD_NAME_BYTES, BatchMeta, Dense, Field, Ragged
from replaystore.schemas.layout import ArraySpec
from replaystore.schemas.nesting import NESTED_NODES_LIMIT, NESTING_DEPTH_LIMIT, Nested, Nesting, map_tree, nested
from replaystore.schemas.schema import FIELDS_LIMIT, Schema
from replaystore.schemas.tables import validate_tables

__all__ = [
    "BUILTINS",
    "FIELDS_LIMIT",
    "FIELD_NAME_BYTES",
    "NESTED_NODES_LIMIT",
    "NESTING_DEPTH_LIMIT",
    "ArraySpec",
    "BatchMeta",
    "Columns",
    "Dense",
    "Field",
    "Nested",
    "Nesting",
    "Ragged",
    "Schema",
    "alphazero",
    "deep_cfr_advantage",
    "deep_cfr_strategy",
    "dense_mask",
    "dqn",
    "episode",
    "episode_columns",
    "frames",
    "goal_transitions",
    "gather_csr",
    "map_tree",
    "nested",
    "ppo",
    "rollout",
    "rollout_columns",
    "transitions",
    "treestrap",
    "validate_tables",
]
