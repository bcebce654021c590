"""Codecs are classes in a registry: a new one is one class, registered, and the store runs it
end to end (append, read, sample, SQL, verify, compaction) without a change to any store module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from replaystore.codecs import Codec, LZ4Codec, ZstdCodec, codec_class, get_codec, register_codec, registered_codecs
from replaystore.errors import CodecRegistrationError, CorruptObjectError, SchemaError, UnknownCodecError
from replaystore.loaders import UniformSampler
from replaystore.schemas import Dense, Schema
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.format.codecs import BLOCK
from replaystore.store.maintenance import verify_store
from support.storecheck import Backend


class ZlibCodec(Codec):
    """zlib, its blocks prefixed with their decoded size (4 bytes, little-endian)."""

    name = "test_zlib"
    default_level = 6
    levels = (0, 9)

    def zarr_metadata(self) -> dict[str, Any]:
        return {"name": "test_zlib", "configuration": {"level": self.level}}

    def encode(self, raw: np.ndarray) -> bytes:
        return len(raw).to_bytes(4, "little") + zlib.compress(raw, self.level)

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        out[:] = np.frombuffer(zlib.decompress(data[4:].tobytes(), bufsize=out.size), np.uint8)

    def declared_size(self, data: np.ndarray) -> int | None:
        return int.from_bytes(data[:4].tobytes(), "little") if len(data) >= 4 else None


if ZlibCodec.name not in registered_codecs():  # (a module imported twice registers once)
    register_codec(ZlibCodec)

SCHEMA = Schema("zl", [Dense("obs", np.uint8, (16,), codec="test_zlib:9"), Dense("reward", np.float32)])


def _batch(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    obs = np.zeros((n, 16), np.uint8)
    obs[:, :5] = rng.integers(0, 256, (n, 5), dtype=np.uint8)  # part noise, part compressible
    return {"obs": obs, "reward": rng.standard_normal(n).astype(np.float32)}


def _fill(st: Any, sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    batches = [_batch(rng, n) for n in sizes]
    with st.writer() as w:
        for b in batches:
            w.append(b, stream=0)
            w.commit()
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_a_codec_of_one_class_appends_reads_samples_scans_and_verifies(tmp_path) -> None:
    url = str(tmp_path / "st")
    st = open_store(url, SCHEMA)
    want = _fill(st, (13, 1, 2 * BLOCK, 30))
    ids = st.row_ids()
    assert np.array_equal(st.read(ids)["obs"], want["obs"]) and st.default.schema.compressed == {"obs": "test_zlib:9"}

    pos = {int(r): i for i, r in enumerate(ids)}
    for request in UniformSampler(st, batch_size=16, seed=0, num_batches=3):
        rows = np.asarray(request.rows)
        got = st.read(rows)
        assert np.array_equal(got["obs"], want["obs"][[pos[int(r)] for r in rows]])

    table = st.sql("SELECT obs, reward FROM records ORDER BY step")
    assert np.array_equal(np.array(table.column("obs").to_pylist(), np.uint8), want["obs"])
    assert verify_store(st) == []

    frag = st.default.view().fragments[0]
    meta = json.loads((tmp_path / "st" / layout.fragment_dir(frag.writer, "records", frag.name) / "obs/zarr.json")
                      .read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]
    assert inner[1] == {"name": "test_zlib", "configuration": {"level": 9}}  # the class's Zarr entry, as written
    columns = st.info()["tables"]["records"]["columns"]["obs"]
    assert columns["codec"] == "test_zlib:9" and columns["stored"] < columns["raw"]


def test_a_damaged_block_of_a_registered_codec_is_refused_by_its_declared_size(tmp_path) -> None:
    st = open_store(str(tmp_path / "st"), SCHEMA)
    _fill(st, (BLOCK,))
    frag = st.default.view().fragments[0]
    chunk = tmp_path / "st" / layout.fragment_dir(frag.writer, "records", frag.name) / "obs/c/0/0"
    raw = chunk.read_bytes()
    # a block that declares more than one block's bytes (its checksum and the index made to match)
    import google_crc32c

    block = (10 ** 6).to_bytes(4, "little") + zlib.compress(b"\0" * 10 ** 6)
    body = block + google_crc32c.value(block).to_bytes(4, "little")
    index = np.array([(0, len(body))], "<u8").tobytes()
    assert len(body) < len(raw) * 50  # (still within what the shard may take)
    chunk.write_bytes(body + index + google_crc32c.value(index).to_bytes(4, "little"))
    with pytest.raises(CorruptObjectError, match="declares 1000000 bytes decoded.*test_zlib"):
        open_store(str(tmp_path / "st"), mode="r").read(st.row_ids())
    problems = verify_store(st)
    assert len(problems) == 1 and "declares" in problems[0].problem


def test_compaction_rewrites_a_registered_codecs_shards(tmp_path) -> None:
    st = Backend(str(tmp_path / "st")).open_fragments(SCHEMA)
    rng = np.random.default_rng(3)
    batches = [_batch(rng, n) for n in (5, 11, 3, 9)]
    with st.writer() as w:
        for b in batches:
            w.append(b, stream=0)
            w.commit()
        w.compact()
    assert len(st.default.view().fragments) < len(batches)
    assert np.array_equal(st.read(st.row_ids())["obs"], np.concatenate([b["obs"] for b in batches]))
    assert verify_store(st) == []


def test_a_process_without_the_registration_gets_a_typed_error(tmp_path) -> None:
    url = str(tmp_path / "st")
    _fill(open_store(url, SCHEMA), (3,))
    script = textwrap.dedent(f"""
        from replaystore.errors import UnknownCodecError
        from replaystore.store import open_store
        try:
            open_store({url!r}, mode="r")
        except UnknownCodecError as exc:
            print(type(exc).__name__, exc.field, exc.codec)
            print(exc)
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    first, message = run.stdout.splitlines()[:2]
    assert first == "UnknownCodecError obs test_zlib"
    assert "field 'obs'" in message and "register_codec" in message
    assert open_store(url, mode="r").read(np.arange(1))["obs"].shape == (1, 16)  # (registered here)


def test_lookups_of_unknown_codecs_are_typed_errors_naming_the_field() -> None:
    with pytest.raises(UnknownCodecError, match="field 'frame': codec 'nope'") as info:
        get_codec("nope:1", field="frame")
    assert (info.value.field, info.value.codec) == ("frame", "nope")
    assert isinstance(info.value, SchemaError)
    with pytest.raises(UnknownCodecError, match="'frame'"):
        Dense("frame", np.uint8, codec="nope")
    with pytest.raises(SchemaError, match=r"field 'frame': codec 'test_zlib' level must be an int in \[0, 9\]"):
        Dense("frame", np.uint8, codec="test_zlib:10")
    assert Dense("frame", np.uint8, codec="test_zlib").codec == "test_zlib:6"


def test_the_builtin_codecs_are_registered_classes() -> None:
    assert codec_class("zstd") is ZstdCodec and codec_class("lz4") is LZ4Codec
    assert get_codec("zstd:5").zarr_metadata() == {"name": "zstd", "configuration": {"level": 5, "checksum": False}}
    assert get_codec("lz4").zarr_metadata() == {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}
    block = np.arange(64, dtype=np.uint8)
    for spec in ("zstd:3", "lz4:1"):
        codec = get_codec(spec)
        data = np.frombuffer(codec.encode(block), np.uint8)
        assert codec.declared_size(data) == block.size
        out = np.empty_like(block)
        codec.decode_into(data, out)
        assert np.array_equal(out, block)


@settings(max_examples=60, deadline=None)
@given(data=st_.binary(min_size=1, max_size=4096), spec=st_.sampled_from(["zstd:1", "zstd:22", "lz4:1", "lz4:9",
                                                                         "test_zlib:0", "test_zlib:9"]))
def test_every_codec_round_trips_a_block_and_declares_its_size(data: bytes, spec: str) -> None:
    codec = get_codec(spec)
    raw = np.frombuffer(data, np.uint8)
    encoded = np.frombuffer(codec.encode(raw), np.uint8)
    assert codec.declared_size(encoded) == raw.size and encoded.size <= codec.max_encoded_bytes(raw.size)
    out = np.empty_like(raw)
    codec.decode_into(encoded, out)
    assert out.tobytes() == data


def _codec(**attrs: Any) -> type:
    """A concrete codec class with ``attrs`` replacing ZlibCodec's."""
    return type("Bad", (ZlibCodec,), attrs)


class _Abstract(Codec):  # declared_size missing
    name, default_level, levels = "test_abstract", 1, (1, 2)

    def zarr_metadata(self) -> dict[str, Any]:
        return {}

    def encode(self, raw: np.ndarray) -> bytes:
        return b""

    def decode_into(self, data: np.ndarray, out: np.ndarray) -> None:
        pass


@pytest.mark.parametrize(("cls", "needle"), [
    (_codec(name="zstd"), "name 'zstd' is taken by ZstdCodec"),
    (ZlibCodec, "name 'test_zlib' is taken"),
    (zlib, "expected a subclass"),
    (dict, "expected a subclass"),
    (_Abstract, r"abstract methods \['declared_size'\]"),
    (_codec(name="Zl:ib"), "name 'Zl:ib' must be"),
    (_codec(name=""), "name '' must be"),
    (_codec(name=3), "name 3 must be"),
    (_codec(name="test_levels", levels=(5, 1)), "levels"),
    (_codec(name="test_levels", levels=[0, 9]), "levels"),
    (_codec(name="test_default", default_level=10), "default_level 10"),
    (_codec(name="test_default", default_level=True), "default_level True"),
])
def test_a_duplicate_or_malformed_codec_class_is_refused(cls: Any, needle: str) -> None:
    before = {n: codec_class(n) for n in registered_codecs()}
    with pytest.raises(CodecRegistrationError, match=needle):
        register_codec(cls)
    assert {n: codec_class(n) for n in registered_codecs()} == before
