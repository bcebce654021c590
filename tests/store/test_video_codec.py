"""Video-coded frame fields (``Dense(..., codec="video:...")``): a block is one GOP of PyAV packets.

Lossless (ffv1) round trips are bit-exact; lossy ones (AV1, H.264) give what PyAV decodes from
the stored packets, frame for frame; a random frame decodes one block; blocks stay GOP-aligned
across appends and commits of odd sizes; verify names a damaged block; without PyAV a video
field is a typed error naming the field and the extra.
"""

from __future__ import annotations

import sys
from fractions import Fraction

import av
import google_crc32c
import numpy as np
import pytest

from replaystore.errors import SchemaError, VideoUnavailableError
from replaystore.schemas import Dense, Schema
from replaystore.store import open_store
from replaystore.store.format import layout
from replaystore.store.format.codecs import CompressedArray, _index
from replaystore.store.format.zarrio import chunk_path
from replaystore.video import VideoCodec, pack_gop, unpack_gop

H, W = 16, 24


def _frames(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Frames that move like pixels do (a drifting pattern with a little noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:shape[0], :shape[1]]
    out = np.empty((n, *shape), np.uint8)
    for t in range(n):
        img = ((xx * 7 + yy * 3 + t * 5) % 256).astype(np.int64)
        img = img[..., None] + np.arange(shape[2] if len(shape) == 3 else 1) * 40 if len(shape) == 3 else img
        out[t] = np.clip(img + rng.integers(-4, 5, img.shape), 0, 255).astype(np.uint8)
    return out


def _store(path, codec, shape=(H, W, 3), sizes=(13, 1, 8, 30), seed=0):
    schema = Schema("video", [Dense("frames", np.uint8, shape, codec=codec), Dense("index", np.int64)])
    frames = _frames(sum(sizes), shape, seed)
    st = open_store(str(path), schema, mode="w")
    at = 0
    with st.writer() as w:
        for i, n in enumerate(sizes):
            w.append({"frames": frames[at:at + n], "index": np.arange(at, at + n)}, stream=0)
            at += n
            if i % 2 == 0 or i == len(sizes) - 1:
                w.commit()
    return st, frames


def _shards(st, root):
    """Per fragment (in row order): the shard's bytes and its blocks ``(offset, size)`` (checksums excluded)."""
    out = []
    ndim = len(st.schema.field("frames").shape) + 1
    for frag in st.default.view().fragments:
        path = root / layout.fragment_dir(frag.writer, st.default.name, frag.name)
        raw = np.frombuffer((path / chunk_path("frames", ndim)).read_bytes(), np.uint8)
        block = VideoCodec.from_spec(st.schema.field("frames").codec.partition(":")[2]).gop
        index = _index(raw, frag.rows, str(path), block)
        out.append((frag, raw, [(int(o), int(n) - 4) for o, n in index]))
    return out


def _pyav_decode(codec: str, packets, shape) -> np.ndarray:
    """PyAV's own decode of packets (a fresh decoder, as any FFmpeg user would)."""
    ctx = av.CodecContext.create({"av1": "libdav1d", "h264": "h264", "ffv1": "ffv1"}[codec], "r")
    got = []
    for data, pts, dts, _ in packets:
        pkt = av.Packet(data)
        pkt.pts, pkt.dts = pts, dts
        got.extend(ctx.decode(pkt))
    got.extend(ctx.decode(None))
    if len(shape) == 3 and shape[2] == 3:
        return np.stack([f.to_ndarray(format="rgb24") for f in got])
    return np.stack([np.frombuffer(f.planes[0], np.uint8).reshape(f.height, f.planes[0].line_size)[:, :f.width]
                     for f in got]).reshape(len(got), *shape)


@pytest.mark.parametrize("shape", [(H, W, 3), (H, W), (H, W, 1)])
def test_lossless_round_trip_is_bit_exact(tmp_path, shape) -> None:
    st, frames = _store(tmp_path / "st", "video:ffv1:gop=4", shape)
    got = st.read(st.row_ids())
    assert got["frames"].shape == frames.shape
    np.testing.assert_array_equal(got["frames"], frames)
    np.testing.assert_array_equal(got["index"], np.arange(len(frames)))
    again = open_store(str(tmp_path / "st"), mode="r")
    assert again.schema.field("frames").codec == "video:ffv1:gop=4"
    np.testing.assert_array_equal(again.read(again.row_ids())["frames"], frames)


@pytest.mark.parametrize("codec", ["video:av1:crf=35:gop=8", "video:h264:crf=28:gop=6"])
@pytest.mark.parametrize("shape", [(H, W, 3), (H, W)])
def test_lossy_read_equals_pyavs_decode_of_the_stored_packets(tmp_path, codec, shape) -> None:
    st, frames = _store(tmp_path / "st", codec, shape)
    got = st.read(st.row_ids())["frames"]
    name = codec.split(":")[1]
    gop = VideoCodec.from_spec(codec.partition(":")[2]).gop
    want = []
    for frag, raw, spans in _shards(st, tmp_path / "st"):
        decoded = []
        for off, size in spans:
            packets = unpack_gop(raw[off:off + size])
            assert len(packets) == gop  # the last block padded to a whole GOP
            assert packets[0][3]  # a GOP starts with a keyframe
            assert pack_gop(packets) == raw[off:off + size].tobytes()  # the framing round trips
            decoded.append(_pyav_decode(name, packets, shape))
        want.append(np.concatenate(decoded)[:frag.rows])
    want = np.concatenate(want)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, frames)  # lossy: the decoder's frames, not the input
    assert np.abs(got.astype(int) - frames).mean() < 12  # ... close to it


def test_blocks_are_gops_aligned_to_each_fragment_across_appends_and_commits(tmp_path) -> None:
    sizes = (13, 1, 8, 30, 5)
    st, frames = _store(tmp_path / "st", "video:h264:gop=4", sizes=sizes)
    shards = _shards(st, tmp_path / "st")
    rows = [frag.rows for frag, _, _ in shards]
    assert sum(rows) == len(frames) and len(rows) == 3  # commits after batches 0, 2 and 4
    for frag, raw, spans in shards:
        assert len(spans) == -(-frag.rows // 4)
        for off, size in spans:
            keys = [key for _, _, _, key in unpack_gop(raw[off:off + size])]
            assert keys == [True, False, False, False]


def test_a_random_frame_decodes_one_block_and_a_window_in_a_gop_decodes_it_once(tmp_path) -> None:
    st, _ = _store(tmp_path / "st", "video:ffv1:gop=8", sizes=(64,))
    ids = st.row_ids()
    for row in (0, 13, 63):
        before = CompressedArray.blocks_decoded
        st.read(ids[row:row + 1], columns=["frames"])
        assert CompressedArray.blocks_decoded - before == 1
    before = CompressedArray.blocks_decoded
    st.read(ids[[16, 17, 18, 19, 20, 21, 22, 23, 16]], columns=["frames"])
    assert CompressedArray.blocks_decoded - before == 1
    before = CompressedArray.blocks_decoded
    st.read(ids[[5, 9, 6]], columns=["frames"])  # two GOPs
    assert CompressedArray.blocks_decoded - before == 2
    before = CompressedArray.blocks_decoded
    st.read(ids, columns=["index"])  # other columns decode nothing
    assert CompressedArray.blocks_decoded == before


def test_a_frame_read_equals_pack_gop_unpack_gop_and_pyav(tmp_path) -> None:
    """The store's blocks are what pack_gop frames around the encoder's packets, decoded as PyAV decodes them."""
    frames = _frames(10, (H, W, 3), 3)
    codec = VideoCodec("av1", crf=30, gop=5).for_field(np.dtype(np.uint8), (H, W, 3))
    packets = codec.encode_packets(frames[:5])
    block = pack_gop(packets)
    assert unpack_gop(block) == packets
    out = np.empty(5 * H * W * 3, np.uint8)
    codec.decode_into(np.frombuffer(block, np.uint8), out)
    np.testing.assert_array_equal(out.reshape(5, H, W, 3), _pyav_decode("av1", packets, (H, W, 3)))
    assert codec.declared_size(np.frombuffer(block, np.uint8)) == out.size


def test_verify_reports_a_damaged_block_and_a_forged_one(tmp_path) -> None:
    from replaystore.store.maintenance import verify_store

    st, _ = _store(tmp_path / "st", "video:ffv1:gop=4", sizes=(12,))
    assert verify_store(st) == []
    frag, raw, spans = _shards(st, tmp_path / "st")[0]
    path = tmp_path / "st" / layout.fragment_dir(frag.writer, st.default.name, frag.name) / chunk_path("frames", 4)
    data = bytearray(raw.tobytes())
    off, size = spans[1]
    data[off + size - 3] ^= 0xFF  # inside block 1's last packet
    path.write_bytes(bytes(data))
    problems = verify_store(st)
    assert len(problems) == 1 and "frames" in problems[0].path and "crc32c" in problems[0].problem
    # a forged block with a valid checksum: its packet table does not add up (the first packet's size + 1)
    data[off + size - 3] ^= 0xFF
    data[off + 12] += 1
    data[off + size:off + size + 4] = np.uint32(google_crc32c.value(bytes(data[off:off + size]))).tobytes()
    path.write_bytes(bytes(data))
    problems = verify_store(st)
    assert len(problems) == 1 and "block 1" in problems[0].problem, problems


@pytest.mark.parametrize("codec", ["video:vp9", "video:av1:crf=99", "video:av1:gop=0", "video:av1:bogus=1",
                                   "video:av1:crf=x", "video:av1:gop=4:gop=8"])
def test_bad_video_codecs_are_schema_errors_naming_the_field(codec) -> None:
    with pytest.raises(SchemaError, match="'frames'"):
        Dense("frames", np.uint8, (H, W, 3), codec=codec)


@pytest.mark.parametrize("dtype,shape,codec", [
    (np.float32, (H, W, 3), "video:ffv1"), (np.uint8, (H, W, 4), "video:av1"), (np.uint8, (H,), "video:av1"),
    (np.uint8, (15, W, 3), "video:h264")])
def test_frames_a_video_codec_cannot_carry_are_schema_errors(dtype, shape, codec) -> None:
    with pytest.raises(SchemaError, match="'frames'"):
        Dense("frames", dtype, shape, codec=codec)


def test_codec_spellings_normalise_to_one_spec() -> None:
    a = Dense("frames", np.uint8, (H, W, 3), codec="video:av1")
    b = Dense("frames", np.uint8, (H, W, 3), codec=VideoCodec("av1", crf=30, gop=16, preset="8"))
    assert a.codec == b.codec == "video:av1:crf=30:gop=16:preset=8"
    c = Dense("gray", np.uint8, (H, W), codec="video:ffv1:gop=8:crf=12")  # crf means nothing to ffv1
    assert c.codec == "video:ffv1:gop=8"
    assert Schema.from_json(Schema("s", [a, c]).to_json()) == Schema("s", [a, c])


def test_from_stream_carries_an_mp4s_parameters_and_its_gops_decode_as_the_file(tmp_path) -> None:
    """The importer's path: demux an MP4's packets into GOP blocks (no re-encoding) and decode them."""
    frames = _frames(12, (H, W, 3), 4)
    path = str(tmp_path / "clip.mp4")
    with av.open(path, "w") as out:
        s = out.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.codec_context.gop_size = 4
        s.codec_context.options = {"x264-params": "keyint=4:min-keyint=4:scenecut=0", "crf": "25"}
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            vf.pts = i
            out.mux(s.encode(vf))
        out.mux(s.encode(None))
    with av.open(path) as inp:
        stream = inp.streams.video[0]
        codec = VideoCodec.from_stream(stream, gop=4)
        time_base = stream.time_base
        packets = [(bytes(p), p.pts, p.dts, bool(p.is_keyframe)) for p in inp.demux(stream) if p.size]
    with av.open(path) as inp:
        want = np.stack([f.to_ndarray(format="rgb24") for f in inp.decode(video=0)])
    assert (codec.codec, codec.width, codec.height, codec.pix_fmt) == ("h264", W, H, "yuv420p")
    assert codec.extradata and Fraction(codec.time_base) == time_base
    assert VideoCodec.from_spec(codec.spec.partition(":")[2]).config == codec.config  # the spec keeps it all
    bound = codec.for_field(np.dtype(np.uint8), (H, W, 3))
    got = np.empty((3, 4 * H * W * 3), np.uint8)
    for g in range(3):
        gop = packets[4 * g:4 * g + 4]
        assert gop[0][3]
        bound.decode_into(np.frombuffer(pack_gop(gop), np.uint8), got[g])
    np.testing.assert_array_equal(got.reshape(12, H, W, 3), want)


def test_sql_reads_a_video_store_without_decoding_unselected_frames(tmp_path) -> None:
    st, frames = _store(tmp_path / "st", "video:ffv1:gop=4", sizes=(20,))
    before = CompressedArray.blocks_decoded
    got = st.sql("SELECT count(*) AS n, sum(index) AS s FROM records").to_pylist()
    assert got == [{"n": 20, "s": sum(range(20))}]
    assert CompressedArray.blocks_decoded == before


def test_without_pyav_a_video_field_names_the_field_and_the_extra(tmp_path, monkeypatch) -> None:
    st, _ = _store(tmp_path / "st", "video:ffv1:gop=4", sizes=(8,))
    reader = open_store(str(tmp_path / "st"), mode="r")
    monkeypatch.setitem(sys.modules, "av", None)  # (import av now fails, as where it is not installed)
    with pytest.raises(VideoUnavailableError, match=r"'frames'.*replaystore\[video\]"):
        Dense("frames", np.uint8, (H, W, 3), codec="video:av1")
    with pytest.raises(VideoUnavailableError, match=r"'frames'.*replaystore\[video\]"):  # create
        open_store(str(tmp_path / "new"), Schema("v", [Dense("frames", np.uint8, (H, W), codec="video:h264")]))
    with pytest.raises(VideoUnavailableError, match=r"replaystore\[video\]"):  # open
        open_store(str(tmp_path / "st"), mode="r")
    with pytest.raises(VideoUnavailableError, match=r"replaystore\[video\]"):  # read, opened before
        reader.read(reader.row_ids(), columns=["frames"])
    before = st.schema
    monkeypatch.undo()
    assert open_store(str(tmp_path / "st"), mode="r").schema == before  # the store is as it was


def test_the_reports_frame_strips_show_the_decoded_frames(tmp_path) -> None:
    from replaystore.report.episodes import episodes_of
    from replaystore.report.frames import frames_html, image_fields, png_data_uri

    st, _ = _store(tmp_path / "st", "video:av1:gop=4", sizes=(10,))
    table = st.default
    fields = image_fields(st.schema)
    assert fields == ["frames"]
    html = frames_html(table, episodes_of(table), fields)
    decoded = st.read(st.row_ids(), columns=["frames"])["frames"]
    assert html.count("<img") == 3
    for row in (0, 4, 9):  # first, middle and last record of the stream
        assert png_data_uri(decoded[row]) in html


def test_a_parquet_export_holds_the_decoded_frames(tmp_path) -> None:
    import pyarrow.parquet as pq

    from replaystore.tools.formats.parquet import export_parquet

    st, _ = _store(tmp_path / "st", "video:h264:gop=4", sizes=(9, 4))
    export_parquet(st, str(tmp_path / "out"))
    files = sorted((tmp_path / "out").rglob("*.parquet"))
    table = pq.read_table(files[0]) if len(files) == 1 else pq.read_table(str(tmp_path / "out"))
    got = np.asarray(table.column("frames").to_pylist(), np.uint8).reshape(-1, H, W, 3)
    np.testing.assert_array_equal(got, st.read(st.row_ids(), columns=["frames"])["frames"])
