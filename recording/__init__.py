"""Recording Gymnasium environments into a store.

Schemas from spaces, and wrappers for single and vector environments that record every
transition (every autoreset mode).

Needs the optional dependency gymnasium: ``pip install "replaystore[gym]"``.
"""

try:
    import gymnasium  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without gymnasium
    raise ImportError('replaystore.gym needs gymnasium: pip install "replaystore[gym]"') from exc

from replaystore.gym.episodes import recorded_episodes
from replaystore.gym.spaces import schema_from_spaces, space_json
from replaystore.gym.wrappers import RecordEpisodes, RecordVectorEpisodes

__all__ = ["RecordEpisodes", "RecordVectorEpisodes", "recorded_episodes", "schema_from_spaces", "space_json"]
