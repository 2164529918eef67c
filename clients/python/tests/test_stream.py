"""The stream reader against streams built from the spec (strapfake.StreamWriter) and the Go
writer's golden files in testdata/stream (when present)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from conftest import TESTDATA
from strapfake import StreamWriter

from llm_instrumentation import StreamFormatError, StreamReader, UnsupportedCodecError, analyze_activations, open_stream
from llm_instrumentation._dtypes import DTYPE_IDS, dtype_size

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def _tensor(dt, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dt)
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-100 if dt != torch.uint8 else 0, 100, shape, generator=g).to(dt)


def _raw(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_stream(path, tensors, codec="none", block_size=64, finish="complete", index=True, drops=(), parts=None):
    """tensors: list of (name, torch tensor, meta dict or None)."""
    with open(path, "wb") as f:
        w = StreamWriter(f, {"codec": codec, "client_metadata": {"model_class": "X"}}, codec=codec, block_size=block_size)
        seq = 0
        for i, (name, t, meta) in enumerate(tensors):
            raw = _raw(t)
            mb = json.dumps(meta).encode() if meta else b""
            dt = DTYPE_IDS[str(t.dtype).removeprefix("torch.")]
            if parts and len(raw) > parts:
                for off in range(0, len(raw), parts):
                    seq += 1
                    w.packet(1, dtype=dt, shape=tuple(t.shape), name=name, meta=mb, seq=seq, step=i, forward=i,
                             raw=raw[off:off + parts], part_offset=off, tensor_len=len(raw), flags=1)
            else:
                seq += 1
                w.packet(1, dtype=dt, shape=tuple(t.shape), name=name, meta=mb, seq=seq, step=i, forward=i, raw=raw)
        for name, nbytes in drops:
            seq += 1
            w.packet(2, name=name, seq=seq, meta=b'{"reason":"ring_full"}', raw_len=nbytes, tensor_len=nbytes)
        if finish:
            w.finish(finish, len(tensors), len(drops), index=index)
    return path


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("index", [True, False])
def test_roundtrip_all_dtypes(tmp_path, codec, index):
    ts = [(f"m.{i}", _tensor(dt, seed=i), None) for i, dt in enumerate(DTYPES)]
    ts.append(("zeros", torch.zeros(300, 4), None))  # compressible: exercises compressed blocks
    ts.append(("scalar", torch.tensor(3.5), None))
    ts.append(("empty", torch.zeros(0, 4), None))
    p = write_stream(tmp_path / "s.strap", ts, codec=codec, block_size=64, index=index)
    with open_stream(p) as r:
        assert r.indexed is index
        got = list(r)
        assert [t.name for t in got] == [n for n, _, _ in ts]
        for (name, t, _), g in zip(ts, got):
            assert g.dtype == str(t.dtype).removeprefix("torch.") and g.shape == tuple(t.shape)
            back = g.tensor()
            assert back.dtype == t.dtype
            assert torch.equal(back.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else back,
                               t.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else t)
            arr = g.numpy()
            if t.dtype.is_floating_point:
                ref = t.float().numpy()
                assert arr.dtype in (np.float32, np.float16, np.float64)
                np.testing.assert_array_equal(arr.astype(np.float32), ref)
            else:
                np.testing.assert_array_equal(arr, t.numpy())
        assert r.end().meta["status"] == "complete"


def test_fp8_and_bf16_upcast_exact_all_values(tmp_path):
    allbits = torch.arange(256, dtype=torch.uint8)
    ts = [("e4m3", allbits.view(torch.float8_e4m3fn), None), ("e5m2", allbits.view(torch.float8_e5m2), None),
          ("bf16", torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16), None)]
    p = write_stream(tmp_path / "f.strap", ts)
    with open_stream(p) as r:
        for (_, t, _), g in zip(ts, r):
            want = t.float().numpy()
            got = g.numpy()
            assert got.dtype == np.float32
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            ok = ~np.isnan(want)
            assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_parts_reassembled(tmp_path, codec):
    big = _tensor(torch.float32, (40, 33), seed=3)
    ts = [("a", _tensor(torch.float32, (2, 2)), None), ("big", big, {"positions": [1], "dim": 1}), ("c", big[:1], None)]
    p = write_stream(tmp_path / "p.strap", ts, codec=codec, parts=1000)
    with open_stream(p) as r:
        got = r.tensors("big")
        assert len(got) == 1 and len(got[0].packets) == 6
        assert torch.equal(got[0].tensor(), big) and got[0].meta == {"positions": [1], "dim": 1}
        assert [t.name for t in r] == ["a", "big", "c"]
        assert sum(1 for pk in r.packets() if pk.type == 1) == 8
    a = analyze_activations(p)
    assert a["packets"] == 8 and a["tensors"] == 3 and a["per_layer"]["big"]["count"] == 1
    assert a["per_layer"]["big"]["raw_bytes"] == big.numel() * 4


def test_tensors_by_name_and_metadata(tmp_path):
    ts = [("x", torch.full((2,), float(i)), None) if i % 2 else ("y", torch.full((3,), float(i)), None) for i in range(6)]
    for index in (True, False):
        p = write_stream(tmp_path / f"n{index}.strap", ts, index=index)
        with open_stream(p) as r:
            assert r.metadata["client_metadata"]["model_class"] == "X"
            assert [t.seq for t in r.tensors("x")] == [2, 4, 6]
            assert [float(t.numpy()[0]) for t in r.tensors("y")] == [0.0, 2.0, 4.0]
            assert r.names() == ["y", "x"]


def test_ggml_raw_blocks(tmp_path):
    # STREAM_FORMAT.md 4.1: a uint8 tensor with ggml meta names its type and ne; the same meta
    # on another dtype, or a malformed one, is not a ggml tensor.
    q = torch.arange(3 * 36, dtype=torch.uint8).reshape(3, 36)
    ts = [("blk.0.attn_q.weight", q, {"ggml_type": "q4_0", "ggml_ne": [64, 3]}),
          ("l_out-0", torch.zeros(3, 4), {"ggml_type": "q4_0", "ggml_ne": [4, 3]}),
          ("odd", q, {"ggml_type": "q4_0", "ggml_ne": "64"}),
          ("plain", q, None)]
    p = write_stream(tmp_path / "g.strap", ts)
    with open_stream(p) as r:
        got = {t.name: t.ggml for t in r}
        raw = r.tensors("blk.0.attn_q.weight")[0].numpy()
    assert got == {"blk.0.attn_q.weight": ("q4_0", (64, 3)), "l_out-0": None, "odd": None, "plain": None}
    assert raw.shape == (3, 36) and raw.tobytes() == q.numpy().tobytes()


def test_lone_surrogate_escape_in_meta_is_corrupt(tmp_path):
    """As in the Go reader: an escaped surrogate pair reads; an escaped lone surrogate (what
    json.dumps writes for a str holding one) is corrupt, in packet meta and in the header."""
    t = torch.zeros(2)
    p = write_stream(tmp_path / "pair.strap", [("x", t, {"text": "\U0001f600", "k": ["\u00e9"]})])
    with open_stream(p) as r:
        assert [pk.meta for pk in r.tensors("x")] == [{"text": "\U0001f600", "k": ["\u00e9"]}]
    for meta in ({"text": "\udcff"}, {"a": [{"b": "x\ud800"}]}, {"\udcff": 1}):
        p = write_stream(tmp_path / "lone.strap", [("x", t, meta)])
        assert b"\\ud" in p.read_bytes()
        with pytest.raises(StreamFormatError, match="unpaired surrogate"):
            with open_stream(p) as r:
                list(r.tensors("x"))
    p = tmp_path / "head.strap"
    with open(p, "wb") as f:
        StreamWriter(f, {"client_metadata": {"model_class": "\udcff"}})
    with pytest.raises(StreamFormatError, match="unpaired surrogate"):
        open_stream(p)


def test_drops_in_analysis(tmp_path):
    p = write_stream(tmp_path / "d.strap", [("a", torch.ones(4), None)], drops=[("a", 16), ("b", 8)])
    a = analyze_activations(p)
    assert a["drops"] == {"count": 2, "bytes": 24, "by_module": {"a": {"count": 1, "bytes": 16}, "b": {"count": 1, "bytes": 8}}}
    assert a["end_status"] == "complete"
    with open_stream(p) as r:
        kinds = [pk.type_name for pk in r.packets()]
    assert kinds == ["TENSOR", "DROP", "DROP", "END"]


def test_truncated_stream_returns_complete_packets(tmp_path):
    ts = [(f"t{i}", torch.full((64,), float(i)), None) for i in range(5)]
    p = write_stream(tmp_path / "t.strap", ts, finish=None)
    data = p.read_bytes()
    p.write_bytes(data[:-100])  # cut inside the last packet
    with open_stream(p) as r:
        assert [t.name for t in r] == ["t0", "t1", "t2", "t3"]
        assert r.truncated_at is not None and not r.indexed
    a = analyze_activations(p)
    assert a["end_status"] == "missing" and a["packets"] == 4


def _first_packet_offset(p):
    data = p.read_bytes()
    meta_len = struct.unpack_from("<I", data, 12)[0]
    return (24 + meta_len + 7) // 8 * 8


@pytest.mark.parametrize("mutate,match", [
    (lambda d, o: d[:o + 200] + bytes([d[o + 200] ^ 1]) + d[o + 201:], "CRC mismatch"),
    (lambda d, o: d[:o] + b"XPKT" + d[o + 4:], "bad packet magic"),
    (lambda d, o: b"XTRAPSTM" + d[8:], "bad file magic"),
    (lambda d, o: d[:8] + b"\x03\x00" + d[10:], "version 3"),
    (lambda d, o: d[:30] + bytes([d[30] ^ 1]) + d[31:], "header CRC"),
])
def test_corruption_named_with_offset(tmp_path, mutate, match):
    p = write_stream(tmp_path / "c.strap", [("a", torch.arange(100.0), None)], index=False)
    o = _first_packet_offset(p)
    p.write_bytes(mutate(p.read_bytes(), o))
    with pytest.raises(StreamFormatError, match=match) as ei:
        with open_stream(p) as r:
            list(r)
    assert "at offset" in str(ei.value) and isinstance(ei.value.offset, int)


def test_empty_and_foreign_files(tmp_path):
    (tmp_path / "e").write_bytes(b"")
    with pytest.raises(StreamFormatError, match="empty"):
        StreamReader(tmp_path / "e")
    with open_stream(tmp_path / "e") as r:  # 1.3.1 left empty streams behind: no packets
        assert r.legacy and list(r.packets()) == []
    # 1.3.1 format: big-endian !HI + name + payload; read by the legacy reader
    # (test_compat131_stream.py), and a file that is neither is refused
    (tmp_path / "old").write_bytes(struct.pack("!HI", 3, 4) + b"abc" + b"\0" * 4)
    with open_stream(tmp_path / "old") as r:
        assert r.legacy and [(p.name, p.raw_len) for p in r.packets()] == [("abc", 4)]
    (tmp_path / "junk").write_bytes(b"\xff" * 40)
    with pytest.raises(StreamFormatError, match="1.3.1"):
        open_stream(tmp_path / "junk")


def test_unsupported_codec(tmp_path, monkeypatch):
    p = tmp_path / "u.strap"
    with open(p, "wb") as f:
        w = StreamWriter(f, {}, codec="lz4", block_size=64)
        w.packet(1, dtype=1, shape=(64,), name="a", seq=1, raw=bytes(256))
        w.finish("complete", 1, 0)
    data = bytearray(p.read_bytes())
    o = _first_packet_offset(p)
    data[o + 14] = 99  # codec id 99 (not assigned); fix the CRC so only the codec is wrong
    _fix_crc(data, o)
    p.write_bytes(bytes(data))
    with open_stream(p) as r:
        with pytest.raises(UnsupportedCodecError, match="unsupported codec id 99"):
            list(r)[0].numpy()


def test_activation_codec_block_dispatch(tmp_path):
    """Codec ids 16-63 are decoded block by block through _activation_codecs.decode_block."""
    gdir = TESTDATA / "codec" / "activation"
    cases = json.loads((gdir / "manifest.json").read_text())
    for cid in (16, 17, 18):
        case = next(c for c in cases if c["codec_id"] == cid)
        stored = (gdir / f"{case['name']}.stored").read_bytes()
        raw = (gdir / f"{case['name']}.raw").read_bytes()
        dt = DTYPE_IDS[case["dtype"]]
        # two blocks: the codec block, then a raw (bit-31) block of 16 zero bytes
        payload = struct.pack("<III", 2, len(stored), 16 | 0x80000000) + stored + bytes(16)
        raw_len = len(raw) + 16
        p = tmp_path / f"a{cid}.strap"
        with open(p, "wb") as f:
            w = StreamWriter(f, {}, codec="none")
            off = w.packet(1, dtype=dt, shape=(raw_len // dtype_size(dt),),
                           name="a", seq=1, raw=payload, raw_len=raw_len)
        data = bytearray(p.read_bytes())
        data[off + 14] = cid
        struct.pack_into("<I", data, off + 80, len(raw))  # block_size = first block's raw size
        _fix_crc(data, off)
        p.write_bytes(bytes(data))
        with open_stream(p) as r:
            (t,) = list(r)
            assert t.raw() == raw + bytes(16)


def _fix_crc(data, o):
    import google_crc32c

    hl = struct.unpack_from("<I", data, o + 8)[0]
    sl = struct.unpack_from("<Q", data, o + 56)[0]
    pk = bytearray(data[o:o + hl + sl])
    pk[20:24] = b"\0\0\0\0"
    struct.pack_into("<I", data, o + 20, google_crc32c.value(bytes(pk)))


# ----- golden streams from the Go writer --------------------------------------------------------

STREAM_DIR = TESTDATA / "stream"


def _golden_cases():
    if not STREAM_DIR.is_dir():
        return []
    return sorted(p for p in STREAM_DIR.iterdir() if p.suffix == ".strap")


@pytest.mark.skipif(not _golden_cases(), reason="testdata/stream not written yet")
@pytest.mark.parametrize("path", _golden_cases(), ids=lambda p: p.name)
def test_stream_golden(path):
    """Every field the Go writer's expected JSON states is what open_stream reads."""
    import hashlib

    exp = json.loads(path.with_suffix(".json").read_text())
    assert path.stat().st_size == exp["size"]
    with open_stream(path) as r:
        assert r.metadata == exp["header_meta"]
        assert r.first_packet == exp["data_offset"]
        assert r.indexed is (exp["index_offset"] is not None)
        pks = list(r.packets(include_index=True))
        assert len(pks) == len(exp["packets"])
        for pk, e in zip(pks, exp["packets"]):
            assert pk.offset == e["offset"] and pk.type_name == e["type"]
            for k in ("seq", "step", "forward", "name", "flags", "raw_len", "stored_len", "part_offset",
                      "tensor_len", "block_size"):
                assert getattr(pk, k) == e[k], (k, pk.offset)
            assert pk.codec == e["codec_id"]
            assert pk.dtype == (e["dtype"] or None)
            assert list(pk.shape) == (e["shape"] or [])
            assert pk.meta == (e["meta"] or {})
            if e.get("payload_sha256") and pk.type == 1:
                assert hashlib.sha256(pk.decode()).hexdigest() == e["payload_sha256"], pk.offset
            if e.get("payload_hex") is not None and pk.type == 1:
                assert pk.decode().hex() == e["payload_hex"]
        tensors = list(r)
        assert len(tensors) == len(exp["tensors"])
        for t, e in zip(tensors, exp["tensors"]):
            for k in ("name", "seq", "step", "forward", "dtype"):
                assert getattr(t, k) == e[k], (k, t)
            assert list(t.shape) == e["shape"] and len(t.packets) == e["parts"] and t.nbytes == e["bytes"]
            assert hashlib.sha256(t.raw()).hexdigest() == e["sha256"]
            vals = t.numpy().reshape(-1)[: len(e["first_values"])]
            np.testing.assert_array_equal(vals.astype(np.float64), np.array(e["first_values"], dtype=np.float64))
            tt = t.tensor()
            assert str(tt.dtype) == "torch." + t.dtype and tuple(tt.shape) == t.shape
        assert r.truncated_at == exp["truncated_at"]
        assert r.incomplete_tensors == exp["incomplete_tensors"]
        end = r.end()
        assert (end.meta if end else None) == exp["end"]
        if exp["index"] is not None:
            assert [(e[0], e[1], e[2], e[3], e[4], e[5], e[6]) for e in r._index_entries] == [
                (x["name"], {"TENSOR": 1, "DROP": 2, "TOKEN": 3}[x["type"]], x["flags"], x["seq"], x["step"],
                 x["forward"], x["offset"]) for x in exp["index"]]
    a = analyze_activations(path)
    assert a["end_status"] == (exp["end"]["status"] if exp["end"] else "missing")
    assert a["tensors"] == len(exp["tensors"])


def test_index_entry_must_match_packet(tmp_path):
    p = write_stream(tmp_path / "i.strap", [("a", torch.ones(4), None), ("b", torch.ones(2), None)])
    data = bytearray(p.read_bytes())
    idx_off = struct.unpack_from("<Q", data, len(data) - 16)[0]
    hl = struct.unpack_from("<I", data, idx_off + 8)[0]
    pay = idx_off + hl
    n_names = struct.unpack_from("<I", data, pay)[0]
    q = pay + 4
    for _ in range(n_names):
        q += 2 + struct.unpack_from("<H", data, q)[0]
    first_entry = q + 8
    struct.pack_into("<Q", data, first_entry + 8, 99)  # seq of entry 0
    _fix_crc(data, idx_off)
    p.write_bytes(bytes(data))
    with open_stream(p) as r:
        with pytest.raises(StreamFormatError, match="INDEX entry disagrees"):
            list(r)


@pytest.mark.parametrize("name", ["none_basic.strap", "lz4_mixed.strap", "zstd_mixed.strap"])
def test_mutations_give_clear_errors(tmp_path, name):
    """Deterministic fuzzing: any single-byte change either reads or raises StreamFormatError."""
    src = STREAM_DIR / name
    if not src.exists():
        pytest.skip("golden stream missing")
    import random

    base = src.read_bytes()
    rnd = random.Random(1234)
    p = tmp_path / "m.strap"
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        data = bytearray(base)
        i = rnd.randrange(len(data))
        data[i] ^= 1 << rnd.randrange(8)
        p.write_bytes(bytes(data))
        try:
            with open_stream(p) as r:
                for t in r:
                    t.raw()
                list(r.packets(include_index=True))
            outcomes["ok"] += 1
        except StreamFormatError as e:
            assert "offset" in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 100  # CRCs catch nearly every flip


def test_incomplete_parts_counted_not_returned(tmp_path):
    big = torch.arange(300.0)
    raw = _raw(big)
    p = tmp_path / "inc.strap"
    with open(p, "wb") as f:
        w = StreamWriter(f, {})
        dt = DTYPE_IDS["float32"]
        kw = dict(dtype=dt, shape=(300,), name="big", tensor_len=len(raw), flags=1)
        w.packet(1, seq=1, raw=raw[:400], part_offset=0, **kw)           # then a gap: part 400..800 missing
        w.packet(1, seq=2, raw=raw[800:1200], part_offset=800, **kw)
        for i, off in enumerate(range(0, 1200, 400)):                     # a whole one
            w.packet(1, seq=3 + i, raw=raw[off:off + 400], part_offset=off, **kw)
        w.packet(1, seq=6, raw=raw[:400], part_offset=0, **kw)            # cut short at the end
        w.finish("aborted", 6, 0)
    with open_stream(p) as r:
        got = list(r)
        assert len(got) == 1 and torch.equal(got[0].tensor(), big) and got[0].seq == 3
        assert r.incomplete_tensors == 3  # the broken one, its orphan part, the cut one (as the Go reader counts)
