"""open_stream reads llm_instrumentation 1.3.1 ``.stream`` files (testdata/compat131, written
by tests/compat131/write_v131_streams.py and checked byte for byte against 1.3.1's own
StreamingSerializer), and the analysis runs on them."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TESTDATA

from llm_instrumentation import StreamFormatError, analyze_activations, analyze_activations_with_tokens, open_stream

sys.path.insert(0, str(Path(__file__).parent / "compat131"))
from write_v131_streams import fixture_tensors, stored_values, v131_packet  # noqa: E402

FIX = TESTDATA / "compat131"


@pytest.mark.parametrize("codec", ["lz4", "zstd", "none"])
def test_reads_131_fixture_exactly(codec):
    want = fixture_tensors()
    with open_stream(FIX / f"{codec}.stream") as r:
        assert r.legacy and r.codec == codec and r.metadata["codec"] == codec
        assert r.truncated_at is None and r.end() is None
        assert r.names() == ["embed_tokens", "norm", "lm_head", ""]
        got = r.tensors()
        assert len(got) == len(want)
        for t, (name, arr) in zip(got, want):
            assert t.name == name and t.dtype == "float16" and t.step is None
            exp = stored_values(arr).reshape(-1)
            assert t.shape == exp.shape
            np.testing.assert_array_equal(t.numpy(), exp)  # bit-exact: what 1.3.1 stored
            assert t.tensor().dtype.is_floating_point
        assert [t.name for t in r.tensors("lm_head")] == ["lm_head", "lm_head"]
        assert [p.codec_name for p in r.packets()] == [codec] * len(want)


def test_none_fixture_bytes_are_the_131_layout():
    """The raw fixture is exactly !HI + name + fp16 bytes (no compression to vary)."""
    data = (FIX / "none.stream").read_bytes()
    name, arr = fixture_tensors()[0]
    body = arr.astype(np.float16).tobytes()
    assert data.startswith(struct.pack("!HI", len(name), len(body)) + name.encode() + body)
    assert data == b"".join(v131_packet(n, t, "none") for n, t in fixture_tensors())


def test_torn_131_stream(tmp_path):
    data = (FIX / "lz4.stream").read_bytes()
    p = tmp_path / "torn.stream"
    p.write_bytes(data[:-5])
    with open_stream(p) as r:
        n = len(r.tensors())
        assert n == len(fixture_tensors()) - 1 and r.truncated_at is not None
    a = analyze_activations(p)
    assert a["packets"] == n and a["truncated_at"] is not None and a["end_status"] == "unknown"


def test_corrupt_131_payload_is_an_error(tmp_path):
    data = bytearray((FIX / "zstd.stream").read_bytes())
    name_len, _ = struct.unpack_from("!HI", data, 0)
    data[6 + name_len + 8] ^= 0xFF  # inside the first zstd frame
    p = tmp_path / "bad.stream"
    p.write_bytes(bytes(data))
    with open_stream(p) as r:
        with pytest.raises(StreamFormatError, match="does not decode as zstd"):
            [t.numpy() for t in r]


def test_not_a_stream_at_all(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(struct.pack("!HI", 2, 1 << 30) + b"ab")
    with pytest.raises(StreamFormatError, match="neither a strap stream"):
        open_stream(p)
    p.write_bytes(struct.pack("!HI", 2, 0) + b"\xff\xfe")
    with pytest.raises(StreamFormatError, match="not UTF-8"):
        open_stream(p)
    p.write_bytes(b"STRAP")  # a cut v2 header is reported as one, not read as 1.3.1
    with pytest.raises(StreamFormatError, match="too short for a stream header"):
        open_stream(p)


def test_analyze_131_stream_keys():
    a = analyze_activations(str(FIX / "zstd.stream"))
    assert a["stream_path"] == str(FIX / "zstd.stream") and a["compression"] == "zstd" and a["legacy"]
    assert a["packets"] == 8 and a["forwards"] is None
    assert a["total_compressed_bytes"] == sum(v["bytes"] for v in a["per_layer"].values())
    assert a["total_compressed_bytes"] == (FIX / "zstd.stream").stat().st_size - sum(
        6 + len(n.encode()) for n, _ in fixture_tensors())
    assert a["per_layer"]["lm_head"]["count"] == 2
    assert a["total_raw_bytes"] == sum(stored_values(t).nbytes for _, t in fixture_tensors())


def test_analyze_131_with_its_tokens_file(tmp_path):
    """1.3.1 kept tokens in ``<stem>_tokens.json`` beside ``<stem>.stream``."""
    p = tmp_path / "gen.stream"
    shutil.copy(FIX / "lz4.stream", p)
    toks = {"total_tokens": 2, "tokens": [{"token_index": 0, "token_id": 5, "token_text": "a"},
                                          {"token_index": 1, "token_id": 6, "token_text": "b"}],
            "capture_duration_seconds": 1.5}
    (tmp_path / "gen_tokens.json").write_text(json.dumps(toks))
    a = analyze_activations_with_tokens(str(p), None)
    tm = a["token_metadata"]
    assert tm["source"] == "file" and tm["total_tokens"] == 2 and tm["tokens"] == toks["tokens"]
    assert tm["capture_duration_seconds"] == 1.5
    assert a["packets_per_token"] == 4.0 and isinstance(a["packets_per_token"], float)
    assert a["bytes_per_token"] == a["total_compressed_bytes"] / 2
    assert a["packets_per_step"] == {} and a["per_token_modules"] == {}  # 1.3.1 recorded no steps


def test_random_and_mutated_bytes_fail_cleanly(tmp_path):
    """Whatever the bytes, reading gives tensors or StreamFormatError, nothing else."""
    rng = np.random.default_rng(131)
    seeds = [(FIX / f"{c}.stream").read_bytes() for c in ("lz4", "zstd", "none")]
    p = tmp_path / "f.stream"
    for i in range(400):
        if i % 2:
            data = bytearray(seeds[i % 3])
            for _ in range(rng.integers(1, 4)):
                data[rng.integers(0, len(data))] = rng.integers(0, 256)
            data = bytes(data[: rng.integers(1, len(data) + 1)])
        else:
            data = rng.integers(0, 256, rng.integers(1, 64), dtype=np.uint8).tobytes()
        if data.startswith(b"STRAPSTM"):
            continue
        p.write_bytes(data)
        try:
            with open_stream(p) as r:
                for t in r:
                    t.numpy()
            analyze_activations(p)
        except StreamFormatError:
            pass
