"""zstd blocks decoded through a reused context per thread equal numcodecs' own decoding; damaged
blocks still fail as damage; threads decode at once with their own contexts."""

from __future__ import annotations

import threading
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from replaystore.codecs import Codec, ZstdCodec
from replaystore.codecs import _zstd_contexts as zstd_contexts
from replaystore.errors import CorruptObjectError
from replaystore.schemas import frames
from replaystore.store import open_store
from replaystore.store.format.codecs import CompressedArray


def _blocks(rng: np.random.Generator, count: int, size: int, level: int) -> tuple[list[np.ndarray], np.ndarray]:
    raw = np.empty((count, size), np.uint8)
    for i in range(count):  # compressible and not
        raw[i] = rng.integers(0, 256 if i % 3 == 0 else 4, size, dtype=np.uint8)
    z = numcodecs.Zstd(level=level)
    return [np.frombuffer(z.encode(r), np.uint8) for r in raw], raw


def test_the_reused_context_is_there_and_decodes_as_numcodecs_does() -> None:
    assert zstd_contexts() is not None  # (numcodecs' zstd library exports its symbols here)
    rng = np.random.default_rng(0)
    for level in (1, 3, 19):
        enc, raw = _blocks(rng, 12, 4_096, level)
        codec = ZstdCodec(level)
        for e, r in zip(enc, raw, strict=True):
            out = np.empty_like(r)
            codec.decode_into(e, out)
            np.testing.assert_array_equal(out, r)
            plain = np.empty_like(r)
            codec._impl.decode(e, out=plain)  # numcodecs' own, a context per call
            np.testing.assert_array_equal(out, plain)
        shard = np.concatenate(enc)
        starts = np.concatenate(([0], np.cumsum([len(e) for e in enc])[:-1])).tolist()
        spans = [(s, len(e)) for s, e in zip(starts, enc, strict=True)]
        out = np.zeros_like(raw)
        codec.decode_blocks(shard, spans, out)
        np.testing.assert_array_equal(out, raw)
        fallback = np.zeros_like(raw)  # the base class's loop over decode_into gives the same
        Codec.decode_blocks(codec, shard, spans, fallback)
        np.testing.assert_array_equal(fallback, raw)


def test_damaged_or_misfit_blocks_raise_and_never_write_past_the_output() -> None:
    rng = np.random.default_rng(1)
    enc, raw = _blocks(rng, 2, 1_000, 3)
    codec = ZstdCodec()
    guard = np.full(1_100, 7, np.uint8)
    for bad in (enc[1][:len(enc[1]) // 2], np.concatenate(([0], enc[1][1:])).astype(np.uint8)):  # cut; no magic
        with pytest.raises(ValueError):
            codec.decode_into(bad, guard[:1_000])
    assert (guard[1_000:] == 7).all()
    with pytest.raises(ValueError, match="too small"):  # a block larger than the output
        codec.decode_into(enc[1], np.empty(999, np.uint8))
    with pytest.raises(ValueError, match="decoded 1000 bytes, expected 1001"):  # smaller
        codec.decode_into(enc[1], np.empty(1_001, np.uint8))
    with pytest.raises(ValueError, match="outside"):
        codec.decode_blocks(enc[0], [(0, len(enc[0]) + 1)], np.empty((1, 1_000), np.uint8))


def test_threads_decode_at_once_each_with_its_context() -> None:
    rng = np.random.default_rng(2)
    enc, raw = _blocks(rng, 64, 8_192, 3)
    codec, errors = ZstdCodec(), []

    def work(offset: int) -> None:
        try:
            for _ in range(20):
                for i in range(offset, len(enc), 4):
                    out = np.empty_like(raw[i])
                    codec.decode_into(enc[i], out)
                    assert (out == raw[i]).all()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_damaged_block_among_many_is_named(tmp_path) -> None:
    """The batched decode fails as a whole; the read then names the damaged block."""
    st = open_store(tmp_path / "s", frames((16, 16), 4, codec="zstd:3"), mode="w")
    rng = np.random.default_rng(3)
    n = 80
    with st.writer() as w:
        w.append({"frame": rng.integers(0, 3, (n, 16, 16), dtype=np.uint8), "action": np.zeros(n, np.int64),
                  "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool),
                  "truncated": np.zeros(n, bool)}, reset=True)
        w.commit()
    st.close()
    shard = next(p for p in (tmp_path / "s").rglob("*") if p.is_file() and "/frame/c" in str(p))
    data = bytearray(shard.read_bytes())
    # block 3's bytes (after its header), its CRC32C recomputed: only the decoder can tell
    import google_crc32c

    blocks = (n + 7) // 8
    index = np.frombuffer(bytes(data[-(blocks * 16 + 4):-4]), "<u8").reshape(blocks, 2)
    off, size = int(index[3, 0]), int(index[3, 1])
    body = bytearray(data[off:off + size - 4])
    for i in range(12, len(body)):
        body[i] ^= 0xFF
    data[off:off + size - 4] = body
    data[off + size - 4:off + size] = np.uint32(google_crc32c.value(bytes(body))).astype("<u4").tobytes()
    shard.write_bytes(bytes(data))
    st = open_store(tmp_path / "s", mode="r")
    with pytest.raises(CorruptObjectError, match="block 3 does not decode"):
        st.read(st.default.row_ids()[:40], columns=["frame"])
    before = CompressedArray.blocks_decoded
    st.read(st.default.row_ids()[40:], columns=["frame"])  # the other blocks read
    assert CompressedArray.blocks_decoded == before + 5


def test_a_zstd_read_decodes_its_blocks_in_one_batched_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only codecs that decode part of a block for less (video) take the per-block path
    assert ZstdCodec.decode_rows_into is Codec.decode_rows_into
    st = open_store(str(tmp_path / "s"), frames((16, 16), actions=2, codec="zstd"))
    n = 200
    rng = np.random.default_rng(1)
    batch = {"frame": rng.integers(0, 4, (n, 16, 16), dtype=np.uint8), "action": np.zeros(n, np.int64),
             "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    with st.writer() as w:
        w.append(batch, stream=0)
        w.commit()
    calls = []
    real = ZstdCodec.decode_blocks

    def counting(self: ZstdCodec, raw: np.ndarray, spans: list, out: np.ndarray) -> None:
        calls.append(len(spans))
        real(self, raw, spans, out)

    monkeypatch.setattr(ZstdCodec, "decode_blocks", counting)
    rows = np.arange(0, n, 5)  # one writer: row ids are positions; 40 rows over every block
    got = st.read(rows, columns=["frame"])["frame"]
    np.testing.assert_array_equal(got, batch["frame"][rows])
    assert len(calls) == 1 and calls[0] > 1
