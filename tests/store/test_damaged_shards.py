"""Compressed shards damaged so that their checksums still match: a block that decodes to fewer
bytes than a block holds, a block the decoder rejects, a 0-byte shard, index entries that overflow
or overlap, a sparse 64 GiB shard, a codec swapped in the schema. A read raises CorruptObjectError
naming the shard and the block (never returns other rows or leftover memory), and ``verify``
reports each without a MemoryError (docs/FORMAT.md, "Compressed fields")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from replaystore.errors import CorruptObjectError
from replaystore.schemas import Dense, Schema
from replaystore.store import open_store
from replaystore.store.format import layout, records
from replaystore.store.format.codecs import BLOCK, compressor
from replaystore.store.format.zarrio import chunk_path
from replaystore.store.maintenance import verify_store
from replaystore.tools.cli import EXIT_DAMAGED
from support.storecheck import Backend

ROWS = 3 * BLOCK - 2  # three blocks, the last one padded
SHAPE = (6, 5)
BLOCK_BYTES = BLOCK * int(np.prod(SHAPE))


def _schema(codec: str) -> Schema:
    return Schema("records", [Dense("obs", np.uint8, SHAPE, codec=codec), Dense("reward", np.float32)])


def _crc(data: bytes) -> bytes:
    return np.uint32(google_crc32c.value(data)).astype("<u4").tobytes()


class Shard:
    """A store with one fragment of ``ROWS`` records whose ``obs`` is a shard of ``codec`` blocks,
    and that shard taken apart (blocks without their checksums, index) and put back together with
    every checksum recomputed."""

    def __init__(self, root: Path, codec: str) -> None:
        self.url = str(root)
        self.codec = codec
        st = open_store(self.url, _schema(codec), mode="w")
        rng = np.random.default_rng(3)
        self.obs = rng.integers(0, 4, (ROWS, *SHAPE)).astype(np.uint8)  # compressible, not constant
        with st.writer() as w:
            w.append({"obs": self.obs, "reward": np.arange(ROWS, dtype=np.float32)}, stream=0)
            w.commit()
        frag = st.default.view().fragments[0]
        self.path = chunk_path(layout.fragment_dir(frag.writer, "records", frag.name) + "/obs", 1 + len(SHAPE))
        self.file = Path(self.url, self.path)
        raw = self.file.read_bytes()
        blocks = -(-ROWS // BLOCK)
        index = np.frombuffer(raw[len(raw) - 16 * blocks - 4:-4], dtype="<u8").reshape(blocks, 2)
        self.blocks = [raw[int(o):int(o) + int(n) - 4] for o, n in index]
        self.encode = compressor(st.default.schema.compressed["obs"]).encode

    def write(self, blocks: list[bytes] | None = None, index: list[tuple[int, int]] | None = None) -> None:
        """The shard of ``blocks`` (each given its CRC32C) and ``index`` (default: the blocks in
        order), with the index's CRC32C."""
        blocks = self.blocks if blocks is None else blocks
        body = b"".join(b + _crc(b) for b in blocks)
        if index is None:
            sizes = [len(b) + 4 for b in blocks]
            index = [(sum(sizes[:k]), n) for k, n in enumerate(sizes)]
        raw = np.array(index, dtype="<u8").tobytes()
        self.file.write_bytes(body + raw + _crc(raw))

    def read(self) -> np.ndarray:
        st = open_store(self.url, mode="r")
        return st.default.read(np.arange(ROWS), columns=["obs"])["obs"]

    def refused(self, *needles: str) -> CorruptObjectError:
        """The read's error: a CorruptObjectError naming the shard and saying each of ``needles``."""
        with pytest.raises(CorruptObjectError) as info:
            self.read()
        assert info.value.path == self.path, info.value
        for needle in needles:
            assert needle in str(info.value), info.value
        return info.value

    def reported(self, *needles: str) -> None:
        """``verify`` reports the shard, saying each of ``needles``."""
        problems = verify_store(open_store(self.url, mode="r"))
        assert [p.path for p in problems] == [self.path], problems
        for needle in needles:
            assert needle in problems[0].problem, problems


@pytest.fixture(params=["zstd", "lz4"])
def shard(request: pytest.FixtureRequest, tmp_path: Path) -> Shard:
    return Shard(tmp_path / "st", request.param)


def test_an_intact_shard_reads_back_and_verifies(shard: Shard) -> None:
    shard.write()  # taken apart and put back: the same bytes
    assert np.array_equal(shard.read(), shard.obs)
    assert verify_store(open_store(shard.url, mode="r")) == []


def test_a_block_decoding_to_fewer_bytes_is_refused_not_padded_with_memory(shard: Shard) -> None:
    first = shard.obs[BLOCK:2 * BLOCK].tobytes()
    shard.write([shard.blocks[0], bytes(shard.encode(first[:BLOCK_BYTES // 2])), shard.blocks[2]])
    shard.refused("block 1", f"expected {BLOCK_BYTES}")
    shard.reported("block 1")


def test_a_block_decoding_to_more_bytes_is_refused(shard: Shard) -> None:
    shard.write([shard.blocks[0], bytes(shard.encode(bytes(2 * BLOCK_BYTES))), shard.blocks[2]])
    shard.refused("block 1", f"expected {BLOCK_BYTES}")
    shard.reported("block 1")


def test_garbage_with_a_matching_checksum_is_refused(shard: Shard) -> None:
    shard.write([shard.blocks[0], b"garbage, not a compressed block" * 3, shard.blocks[2]])
    shard.refused("block 1")
    shard.reported("block 1")


def test_a_decoder_error_is_a_corrupt_object_error(shard: Shard) -> None:
    # a header declaring the right size, then bytes the decoder rejects
    head = (b"\x28\xb5\x2f\xfd\x20" + BLOCK_BYTES.to_bytes(1, "little") if shard.codec == "zstd"
            else BLOCK_BYTES.to_bytes(4, "little"))
    shard.write([head + b"\xff" * 40, *shard.blocks[1:]])
    shard.refused("block 0", "does not decode")
    shard.reported("block 0", "does not decode")


def test_a_zero_byte_shard_is_refused(shard: Shard) -> None:
    shard.file.write_bytes(b"")
    shard.refused("shorter than its index")
    shard.reported("shorter than its index")


@pytest.mark.parametrize("entry", [(2**64 - 8, 16), (2**63 - 1, 100), (2**62, 2**62 + 8), (0, 2**64 - 1)])
def test_index_entries_that_overflow_are_refused(shard: Shard, entry: tuple[int, int]) -> None:
    sizes = [len(b) + 4 for b in shard.blocks]
    shard.write(index=[(0, sizes[0]), entry, (sizes[0] + sizes[1], sizes[2])])
    shard.refused("block 1")
    shard.reported("block 1")


def test_overlapping_block_ranges_are_refused_not_read_as_other_rows(shard: Shard) -> None:
    sizes = [len(b) + 4 for b in shard.blocks]
    shard.write(index=[(0, sizes[0]), (0, sizes[0]), (sizes[0] + sizes[1], sizes[2])])  # block 1 -> block 0's
    shard.refused("block 1", "overlapping")
    shard.reported("block 1")


def test_a_gap_between_blocks_is_refused(shard: Shard) -> None:
    sizes = [len(b) + 4 for b in shard.blocks]
    body = b"".join(b + _crc(b) for b in shard.blocks)
    index = np.array([(0, sizes[0]), (sizes[0] + 8, sizes[1]), (sizes[0] + sizes[1] + 8, sizes[2])], "<u8").tobytes()
    body = body[:sizes[0]] + bytes(8) + body[sizes[0]:]
    shard.file.write_bytes(body + index + _crc(index))
    shard.refused("block 1")
    shard.reported("block 1")


def test_a_sparse_64_gib_shard_is_refused_quickly_without_allocating(tmp_path: Path) -> None:
    shard = Shard(tmp_path / "st", "zstd")
    with open(shard.file, "r+b") as f:
        f.truncate(64 << 30)  # sparse: no disk allocated
    started = time.monotonic()
    shard.refused("more than a shard of")
    shard.reported("more than a shard of")
    assert time.monotonic() - started < 30
    # the command too, in a process whose address space could not hold 64 GiB
    code = """if True:
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from replaystore.tools.cli import main
        sys.exit(main(["verify", sys.argv[1]]))
        """
    result = subprocess.run([sys.executable, "-c", code, shard.url], capture_output=True, text=True, timeout=120)
    assert result.returncode == EXIT_DAMAGED, result
    assert f"DAMAGED {shard.path}: size {64 << 30} bytes" in result.stdout and "MemoryError" not in result.stderr
    os.unlink(shard.file)


def test_a_raw_chunk_larger_than_declared_is_reported_unread(tmp_path: Path) -> None:
    url = str(tmp_path / "st")
    st = Backend(url).open_fragments(Schema("records", [Dense("obs", np.float32, (4,))]))
    with st.writer() as w:
        w.append({"obs": np.ones((5, 4), np.float32)}, stream=0)
        w.commit()
    frag = st.default.view().fragments[0]
    path = chunk_path(layout.fragment_dir(frag.writer, "records", frag.name) + "/obs", 2)
    with open(Path(url, path), "r+b") as f:
        f.truncate(64 << 30)
    problems = verify_store(open_store(url, mode="r"))
    assert [(p.path, p.problem) for p in problems] == [(path, f"size {64 << 30} bytes, expected {5 * 4 * 4 + 4}")]
    os.unlink(Path(url, path))


@pytest.mark.parametrize(("stored", "claimed"), [("zstd", "lz4:1"), ("lz4", "zstd:3")])
def test_a_codec_swapped_in_the_schema_is_refused_and_reported(tmp_path: Path, stored: str, claimed: str) -> None:
    shard = Shard(tmp_path / "st", stored)
    body = records.decode(layout.MANIFEST, Path(shard.url, layout.MANIFEST).read_bytes())
    fields = body["tables"]["records"]["fields"]
    obs = next(f for f in fields if f["name"] == "obs")
    obs["codec"] = claimed
    Path(shard.url, layout.MANIFEST).write_bytes(records.encode(body))  # a valid checksum again
    assert open_store(shard.url, mode="r").default.schema.compressed == {"obs": claimed}
    shard.refused("block 0")
    shard.reported("block 0")


def test_the_verify_command_reports_a_short_block(tmp_path: Path) -> None:
    shard = Shard(tmp_path / "st", "zstd")
    shard.write([shard.blocks[0], shard.blocks[1], bytes(shard.encode(bytes(10)))])
    result = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "verify", shard.url],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == EXIT_DAMAGED and f"DAMAGED {shard.path}: block 2 declares 10 bytes" in result.stdout, \
        result
