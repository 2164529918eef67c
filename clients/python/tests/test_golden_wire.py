"""Byte-exact golden tests of the message and ring-record encoders against the Go side's
vectors in testdata/protocol and testdata/ring."""

from __future__ import annotations

import json
import struct

import pytest
from conftest import TESTDATA

import wire as P
from llm_instrumentation import _ring as R
from llm_instrumentation.errors import StrapdProtocolError

PROTO = TESTDATA / "protocol"
RING = TESTDATA / "ring"

MESSAGES = [
    ("hello.bin", P.Hello(protocol=1, client="llm_instrumentation/0.1.0", pid=1234)),
    ("welcome.bin", P.Welcome(protocol=1, daemon="strapd 0.1.0", pid=42, max_message=65536, max_ring_size=1 << 30)),
    ("open.bin", P.Open(ring_size=67108864, codec="zstd", codec_level=3, policy="block", block_size=1048576,
                        metadata={"model_class": "LlamaForCausalLM", "output_path": "/abs/capture.strap"})),
    ("opened.bin", P.Opened(session=7, block_size=1048576)),
    ("publish.bin", P.Publish(head=4096, seq=3)),
    ("release.bin", P.Release(tail=2048)),
    ("drop.bin", P.Drop(seq=4, name="model.layers.3.mlp", step=10, forward=2, bytes=8192, reason="ring_full")),
    ("close.bin", P.Close(seq=4, head=4096, drops=1)),
    ("closed.bin", P.Closed(packets=3, drops=1, bytes_in=12288, bytes_out=12288, file_bytes=13000)),
    ("error_protocol_version.bin", P.Error(code="protocol_version",
                                           message="client speaks protocol 2, strapd speaks protocol 1", fatal=True)),
    ("error_memory_budget.bin", P.Error(
        code="memory_budget",
        message="memory budget exceeded: session needs 541323200 bytes (ring 268435456 + compression buffers "
                "272887744), 4026531840 of 4294967296 in use; a ring of at most 132116480 bytes fits now "
                "(--memory-limit)", fatal=True, fits_ring_size=132116480)),
    ("status.bin", P.Status()),
    ("token.bin", P.Token(seq=5, index=2, token_id=1234, text=" the", position=8)),
    ("token_head.bin", P.Token(seq=9, index=3, token_id=42, text="!", head=8192)),
    ("opened_cursor.bin", P.Opened(session=7, block_size=1048576, published_cursor=True)),
    ("opened_ring_tokens.bin", P.Opened(session=7, block_size=1048576, published_cursor=True, ring_tokens=True)),
    ("checkpoint.bin", P.Checkpoint(seq=5)),
    ("checkpointed.bin", P.Checkpointed(seq=5, offset=40960, packets=5, drops=0, tokens=2, last_offset=40800,
                                        last_crc=3735928559)),
    ("open_resume.bin", P.Open(ring_size=67108864, codec="lz4", policy="block", append_at=40960,
                               resume=P.Resume(last_seq=5, last_crc=3735928559, packets=5))),
    ("open_resources.bin", P.Open(ring_size=67108864, codec="none", policy="block", resources=True)),
    ("resources.bin", P.Resources(events=[
        {"event": "compute_execution", "step": 3, "flops": 65536, "duration_us": 12.5},
        {"event": "kv_cache_update", "step": 3, "cache_bytes": 8192}])),
]

def _need(path):
    if not path.exists():
        pytest.skip(f"golden file {path} not written yet")
    return path.read_bytes()


@pytest.mark.parametrize("fname,body", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_message_golden(fname, body):
    # The typed bodies are what the client sends and parses: encoding one must give Go's
    # bytes exactly, and decoding Go's bytes must give the same dataclass back.
    want = _need(PROTO / fname)
    assert P.encode(body) == want
    assert P.decode(want) == (1, body)


def test_golden_set_covers_every_message():
    # STATUS_REPLY has no vector: its figures grow with the daemon (PROTOCOL.md 4).
    assert {type(b) for _, b in MESSAGES} == set(P.BODIES.values()) - {P.StatusReply}


def test_open_as_the_client_builds_it():
    # OPEN as framework builds it carries memory_hint and the lossy bound: both must be
    # fields Go reads (testdata/protocol/client_bodies.json), in Go's order.
    body = P.Open(ring_size=1 << 26, codec="quant", codec_level=0, policy="drop", block_size=1 << 20,
                  lossy=P.Lossy(mode="rel", value=0.001), memory_hint=1 << 26, metadata={"a": 1})
    assert P.encode(body)[P.HEADER.size:] == (
        b'{"ring_size":67108864,"codec":"quant","codec_level":0,"policy":"drop","block_size":1048576,'
        b'"lossy":{"mode":"rel","value":0.001},"memory_hint":67108864,"metadata":{"a":1}}')
    assert P.decode(P.encode(body)) == (1, body)


@pytest.mark.parametrize("cls,body,why", [
    (P.Release, {}, "without field 'tail'"),
    (P.Release, {"tail": "1"}, "expected an integer"),
    (P.Release, {"tail": True}, "expected an integer"),
    (P.Checkpointed, {"seq": 1, "offset": 2, "packets": 3, "drops": 0, "tokens": 0, "last_offset": 1,
                      "last_crc": None}, "expected an integer"),
    (P.Welcome, {"protocol": 1, "daemon": 7, "pid": 1, "max_message": 1}, "expected a string"),
    (P.Welcome, {"protocol": 1, "daemon": "d", "pid": 1, "max_message": 1, "max_ring_size": "1"}, "expected an integer"),
    (P.StatusReply, {"daemon": {}, "sessions": {}}, "expected a list"),
    (P.Open, {"ring_size": 1, "codec": "x", "policy": "block", "resume": {"last_seq": 1}}, "without field"),
])
def test_typed_decode_rejects(cls, body, why):
    with pytest.raises(StrapdProtocolError, match=why):
        cls.from_body(body)


def test_unknown_fields_are_ignored():
    # A newer daemon may add fields (PROTOCOL.md 4: readers ignore unknown ones).
    assert P.Opened.from_body({"session": 1, "block_size": 2, "later": True}) == P.Opened(session=1, block_size=2)


def test_memory_budget_error_carries_room():
    # The room the daemon reports reaches the exception, where open_session reads it.
    _, body = P.decode(_need(PROTO / "error_memory_budget.bin"))
    err = body.exception()
    assert err.code == "memory_budget" and err.fits_ring_size == 132116480


def test_malformed_error_still_raises():
    err = P.error_from_body({"code": "write_error", "message": 5})
    assert err.code == "write_error" and err.fatal


def test_client_bodies_file_is_current(request):
    # testdata/protocol/client_bodies.json lists every field the client can send; the Go
    # tests check strapd reads each one. Regenerate with --update-client-bodies.
    path = PROTO / "client_bodies.json"
    want = json.dumps(P.client_fields(), indent=1, sort_keys=True) + "\n"
    if request.config.getoption("--update-client-bodies"):
        path.write_text(want)
    assert path.exists(), f"{path} missing: run pytest {__file__} --update-client-bodies"
    assert json.loads(path.read_text()) == json.loads(want), \
        f"{path} is stale: run pytest {__file__} --update-client-bodies"


def test_version_error_is_readable():
    data = _need(PROTO / "error_protocol_version.bin")
    _, mtype, body = P.decode_message(data)
    err = P.error_from_body(body)
    assert err.code == "protocol_version" and "protocol 2" in str(err)


@pytest.mark.parametrize("data,why", [
    (b"STRP\x01\x00", "shorter"),
    (b"XXXX\x01\x00\x01\x00\x02\x00\x00\x00{}", "magic"),
    (b"STRP\x01\x00\x01\x00\x05\x00\x00\x00{}", "length"),
    (b"STRP\x01\x00\x01\x00\x02\x00\x00\x00[]", "not a JSON object"),
    (b"STRP\x01\x00\x01\x00\x02\x00\x00\x00{x", "not JSON"),
])
def test_decode_rejects(data, why):
    with pytest.raises(StrapdProtocolError, match=why):
        P.decode_message(data)


def test_ring_header_golden():
    assert R.encode_ring_header(8256) == _need(RING / "header_8256.bin")


def test_pad_golden():
    want = _need(RING / "pad_128.bin")
    got = R.encode_pad_header(128)
    assert got + bytes(128 - len(got)) == want


def test_token_record_golden():
    # PROTOCOL.md 2, TOKEN records (kind 3): the bytes strapd's shm.AppendToken writes
    got = R.encode_token_record(seq=9, index=4, token_id=-7, position=36, text="héllo".encode())
    assert got == _need(RING / "token_seq9.bin")


def _record(hdr: bytes, payload: bytes, record_len: int) -> bytes:
    b = hdr + payload
    return b + bytes(record_len - len(b))


RECORDS = [
    ("record_f32_2x3.bin", dict(dtype=1, shape=(2, 3), seq=1, step=5, forward=2, name=b"model.layers.0.mlp"),
     b"".join(struct.pack("<I", 0x3F800000 + i) for i in range(6)), {}),
    ("record_bf16_meta.bin", dict(dtype=3, shape=(1, 4), seq=7, step=0, forward=0, name=b"model.layers.3.self_attn",
                                  meta=b'{"positions":[0,4,8],"dim":1}'),
     bytes.fromhex("803f004040408040"), {}),
    ("record_part.bin", dict(dtype=6, shape=(4, 16), seq=12, step=9, forward=3, name=b"lm_head"),
     bytes(range(16)), dict(part=True, part_offset=32, tensor_len=64)),
    ("record_scalar_i64.bin", dict(dtype=9, shape=(), seq=3, step=0, forward=0, name=b"x"),
     struct.pack("<q", 42), {}),
]


@pytest.mark.parametrize("fname,fields,payload,extra", RECORDS, ids=[r[0] for r in RECORDS])
def test_record_golden(fname, fields, payload, extra):
    want = _need(RING / fname)
    hdr_len = R.header_area(len(fields["shape"]), fields["name"], fields.get("meta", b""))
    rec_len = R.align64(hdr_len + len(payload))
    hdr = R.encode_record_header(record_len=rec_len, payload_len=len(payload), **fields, **extra)
    assert len(hdr) == hdr_len
    assert _record(hdr, payload, rec_len) == want
    parsed = R.parse_record_header(want)
    assert parsed["seq"] == fields["seq"] and parsed["shape"] == tuple(fields["shape"])


def test_meta_json_compact():
    # meta written by the client uses the same compact form as the golden record
    assert json.dumps({"positions": [0, 4, 8], "dim": 1}, separators=(",", ":")).encode() == \
        b'{"positions":[0,4,8],"dim":1}'


def test_resources_sent_raw_match_the_golden():
    """The monitor's path (events serialized once, packed and sent by libstrap through
    SessionSink) gives the golden datagram byte for byte."""
    import json

    from conftest import sent_resources

    want = _need(PROTO / "resources.bin")
    events = [{"event": "compute_execution", "step": 3, "flops": 65536, "duration_us": 12.5},
              {"event": "kv_cache_update", "step": 3, "cache_bytes": 8192}]
    assert sent_resources([json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events]) == [want]
