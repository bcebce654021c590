"""The on-disk format.

Tables of Zarr columns in immutable fragments, a commit log per writer, a stream/step index, retention, state slots.
"""

from replaystore.store.chunkcache import ChunkCache
from replaystore.store.index import StreamIndex
from replaystore.store.store import DEFAULT_TABLE, Mode, Store, Table, open_store
from replaystore.store.writer import CommitResult, Writer

__all__ = ["DEFAULT_TABLE", "ChunkCache", "CommitResult", "Mode", "Store", "StreamIndex", "Table", "Writer", "open_store"]
