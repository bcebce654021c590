"""Compressed fields (``Dense(..., codec=)``): bit-identical round trips on every backend,
readable by zarr-python, random reads that decode only the blocks they touch."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from replaystore.errors import SchemaError
from replaystore.schemas import Dense, Schema
from replaystore.store.format import layout
from replaystore.store.format.codecs import BLOCK, CompressedArray
from support.storecheck import Backend

SCHEMA = Schema("pixels", [
    Dense("frame", np.uint8, (12, 10), codec="zstd"),
    Dense("depth", np.float32, (3,), codec="lz4:2"),
    Dense("action", np.int64),
    Dense("reward", np.float32),
])


def _batch(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    frame = np.zeros((n, 12, 10), np.uint8)
    frame[:, :4] = rng.integers(0, 256, (n, 4, 10), dtype=np.uint8)  # part noise, part compressible
    return {"frame": frame, "depth": rng.standard_normal((n, 3)).astype(np.float32),
            "action": rng.integers(0, 4, n), "reward": rng.standard_normal(n).astype(np.float32)}


def _fill(backend: Backend, sizes: tuple[int, ...] = (13, 1, 8, 30)) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    batches = [_batch(rng, n) for n in sizes]
    st = backend.open(SCHEMA, mode="w")
    with st.writer() as w:
        for i, b in enumerate(batches):
            w.append(b, stream=i % 2)
            w.commit()
    return st, {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_compressed_round_trip_is_bit_identical(backend: Backend) -> None:
    st, want = _fill(backend)
    for handle in (st, backend.open(mode="r")):
        ids = handle.row_ids()
        got = handle.read(ids)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        pick = np.random.default_rng(1).integers(0, len(ids), 40)
        got = handle.default.read(pick, columns=["frame", "action"])
        assert np.array_equal(got["frame"], want["frame"][pick])
        assert np.array_equal(got["action"], want["action"][pick])
        assert handle.default.schema.compressed == {"frame": "zstd:3", "depth": "lz4:2"}


def test_compressed_fragments_are_smaller_and_zarr_python_reads_them(backend: Backend) -> None:
    st, want = _fill(backend, (40,))
    frag = st.default.view().fragments[0]
    path = layout.fragment_dir(frag.writer, st.default.name, frag.name) + "/frame"
    storage = backend.storage()
    stored = len(storage.read(path + "/c/0/0/0"))
    assert stored < want["frame"].nbytes / 2
    zstore = zarr.storage.FsspecStore.from_url(backend.url, storage_options=backend.storage_options,
                                               read_only=True) if backend.kind != "local" else backend.url
    for name in ("frame", "depth"):
        arr = zarr.open_array(zstore, path=path.rsplit("/", 1)[0] + "/" + name, mode="r")
        assert np.array_equal(arr[:], want[name])


def test_random_reads_decode_only_the_blocks_they_touch(tmp_path) -> None:
    st, want = _fill(Backend(str(tmp_path / "st")), (20 * BLOCK,))
    before = CompressedArray.blocks_decoded
    rows = np.array([3, 5, BLOCK * 7 + 1, 3])  # two distinct blocks
    got = st.default.read(rows, columns=["frame"])
    assert np.array_equal(got["frame"], want["frame"][rows])
    assert CompressedArray.blocks_decoded - before == 2


@pytest.mark.parametrize("codec", ["gzip", "zstd:99", "zstd:x", ("lz4", 0), 3])
def test_bad_codecs_are_schema_errors_naming_the_field(codec: object) -> None:
    with pytest.raises(SchemaError, match="'frame'"):
        Dense("frame", np.uint8, (4,), codec=codec)  # type: ignore[arg-type]


def test_codec_survives_the_schema_document() -> None:
    again = Schema.from_json(SCHEMA.to_json())
    assert again == SCHEMA and again.compressed == SCHEMA.compressed
    assert "codec" not in Schema("raw", [Dense("x", np.uint8)]).to_json()


def test_verify_accepts_intact_shards_and_reports_a_damaged_block(tmp_path) -> None:
    from replaystore.store.maintenance import verify_store

    st, _ = _fill(Backend(str(tmp_path / "st")), (3 * BLOCK,))
    assert verify_store(st) == []
    frag = st.default.view().fragments[0]
    chunk = tmp_path / "st" / layout.fragment_dir(frag.writer, st.default.name, frag.name) / "frame/c/0/0/0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF  # inside the first block
    chunk.write_bytes(bytes(data))
    problems = verify_store(st)
    assert len(problems) == 1 and "frame" in problems[0].path and "crc32c" in problems[0].problem


def test_s3_chunk_cache_holds_the_compressed_shards(s3_server, tmp_path) -> None:
    from replaystore.store import ChunkCache, open_store

    backend = Backend(s3_server.url("codec-cache"), s3_server.storage_options)
    _, want = _fill(backend, (3 * BLOCK + 2,))
    reader = open_store(backend.url, mode="r", storage_options=backend.storage_options,
                        cache=ChunkCache(tmp_path / "cache"))
    rows = np.array([0, 3 * BLOCK + 1])
    assert np.array_equal(reader.default.read(rows, columns=["frame"])["frame"], want["frame"][rows])
    cached = sorted(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
    frag = reader.default.view().fragments[0]
    path = layout.fragment_dir(frag.writer, reader.default.name, frag.name) + "/frame/c/0/0/0"
    uploaded = len(backend.storage().read(path))
    assert uploaded < want["frame"].nbytes / 2 and uploaded in cached  # the shard as uploaded, not decoded


def test_compaction_keeps_compressed_fields(tmp_path) -> None:
    backend = Backend(str(tmp_path / "st"))
    rng = np.random.default_rng(3)
    st = backend.open_fragments(SCHEMA)
    batches = [_batch(rng, n) for n in (5, 11, 3, 9)]
    with st.writer() as w:
        for b in batches:
            w.append(b, stream=0)
            w.commit()
        w.compact()
    want = np.concatenate([b["frame"] for b in batches])
    assert len(st.default.view().fragments) < len(batches)
    assert np.array_equal(st.read(st.row_ids())["frame"], want)


def test_info_shows_stored_and_raw_bytes_per_column(tmp_path) -> None:
    import subprocess
    import sys

    st, want = _fill(Backend(str(tmp_path / "st")), (40,))
    cols = st.info()["tables"][st.default.name]["columns"]
    assert cols["frame"]["raw"] == want["frame"].nbytes and cols["frame"]["codec"] == "zstd:3"
    assert 0 < cols["frame"]["stored"] < cols["frame"]["raw"]
    assert cols["action"] == {"stored": 40 * 8, "raw": 40 * 8, "codec": None}
    out = subprocess.run([sys.executable, "-m", "replaystore.tools.cli", "info", "--verbose",
                          str(tmp_path / "st")],
                         capture_output=True, text=True, check=True).stdout
    assert any(line.split()[:1] == ["frame"] and "codec zstd:3" in line for line in out.splitlines())


@pytest.mark.parametrize("field", ["frame", "action"])
def test_a_fields_chunk_encoding_writes_reads_checks_and_sizes_its_own_layout(tmp_path, field: str) -> None:
    """One encoding object per field: what its writer writes, its reader, check and size agree on."""
    from replaystore.store.format.codecs import RAW, Shards, encoding_of
    from replaystore.store.format.zarrio import chunk_path
    from replaystore.store.storage import LocalStorage

    enc = encoding_of(SCHEMA, field)
    assert (enc is RAW) == (field == "action") and isinstance(enc, Shards) == (field == "frame")
    assert encoding_of(SCHEMA, "_stream") is RAW
    storage = LocalStorage(str(tmp_path))
    rows = _batch(np.random.default_rng(1), 2 * BLOCK + 3)[field]
    shape, dtype, path = rows.shape, rows.dtype, "t/a"
    writer = enc.writer(storage, path, rows.ndim, True)
    writer.append(rows[:5])
    writer.append(rows[5:])
    storage.write_objects(enc.metadata(path, dtype, shape), [writer.finish()])
    writer.close()
    np.testing.assert_array_equal(np.asarray(enc.read(storage, path, dtype, shape, cached=False)), rows)
    assert enc.check(storage, path, dtype, shape)[0] is None
    stored = enc.stored_bytes(storage, [path], rows.ndim, rows.nbytes)
    assert stored == rows.nbytes if enc is RAW else 0 < stored < rows.nbytes
    assert zarr.open_array(str(tmp_path / path), mode="r")[:].tolist() == rows.tolist()
    chunk = tmp_path / chunk_path(path, rows.ndim)
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert enc.check(storage, path, dtype, shape)[0]  # a damaged chunk is named by its own check
