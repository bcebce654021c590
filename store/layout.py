"""Object names of the on-disk format (docs/FORMAT.md, "Layout"), in one place."""

from __future__ import annotations

FORMAT_NAME = "replaystore"
FORMAT_VERSION = 2
"""Written into new stores' manifests (segments, docs/FORMAT.md); readers also read version 1."""
READ_VERSIONS = (1, 2)
MANIFEST = "replaystore.json"
WRITERS = "writers"
STATE = "state"
CHECKPOINTS = "checkpoints"
ROW_BITS = 40
"""A row id is ``writer << ROW_BITS | local row``: stable across refreshes, evictions and compaction."""
INDEX_ARRAYS = ("_stream", "_step", "_reset")


def writer_dir(writer: int) -> str:
    return f"{WRITERS}/{writer:06d}"


def writer_record(writer: int) -> str:
    return f"{writer_dir(writer)}/writer.json"


def commits_dir(writer: int) -> str:
    return f"{writer_dir(writer)}/commits"


def commit_record(writer: int, seq: int) -> str:
    return f"{commits_dir(writer)}/{seq:010d}.json"


def fragment_dir(writer: int, table: str, name: str) -> str:
    return f"{writer_dir(writer)}/data/{table}/{name}"


def fragment_name(seq: int) -> str:
    return f"f{seq:010d}"


def segment_name(seq: int) -> str:
    return f"s{seq:010d}"


def checkpoint(number: int) -> str:
    return f"{CHECKPOINTS}/{number:010d}.json"


def state_dir(slot: str) -> str:
    return f"{STATE}/{slot}"


def state_record(slot: str, version: int) -> str:
    return f"{state_dir(slot)}/{version:010d}.json"


def state_payload(slot: str, token: str, name: str) -> str:
    return f"{state_dir(slot)}/payload-{token}/{name}"


def row_id(writer: int, local: int) -> int:
    return (writer << ROW_BITS) | local
