"""The session's per-record fast path (cached header, memmove) writes the bytes of
docs/PROTOCOL.md: the golden records of testdata/ring, written through CaptureSession."""

from __future__ import annotations

import socket
import struct

import pytest
import torch
from conftest import TESTDATA

from llm_instrumentation import _protocol as P
from llm_instrumentation import _ring as R
from llm_instrumentation._session import CaptureSession

RING = TESTDATA / "ring"


@pytest.fixture
def session():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(P.Connection(a), R.Ring(R.HEADER_SIZE + 64 * 64))
    yield s, P.Connection(b)
    s.shutdown()
    b.close()


def _record_at(s: CaptureSession, pos: int) -> bytes:
    off = R.HEADER_SIZE + pos % s.ring.data_size
    rec_len = R.parse_record_header(s.ring.mm, off)["record_len"]
    return bytes(s.ring.mm[off:off + rec_len])


def _f32_2x3() -> torch.Tensor:
    raw = b"".join(struct.pack("<I", 0x3F800000 + i) for i in range(6))
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(2, 3)


def test_fast_path_writes_the_golden_record(session):
    s, peer = session
    t = _f32_2x3()
    want = (RING / "record_f32_2x3.bin").read_bytes()
    for seq in (1, 2):
        s.seq = seq - 1
        pos = s.ring.head
        assert s.write_tensor("model.layers.0.mlp", t, 5, 2)
        got = _record_at(s, pos)
        if seq == 1:
            assert got == want
        else:  # the second record comes from the cached layout: only seq differs
            assert got[:8] + got[16:] == want[:8] + want[16:]
            assert R.parse_record_header(got)["seq"] == 2
    assert "model.layers.0.mlp" in s._layouts
    s.flush()
    pub = peer.recv(1.0)
    assert isinstance(pub, P.Publish) and pub.head == s.ring.head and pub.seq == 2


def test_fast_path_scalar_and_non_contiguous(session):
    s, _ = session
    s.seq = 2
    pos = s.ring.head
    assert s.write_tensor("x", torch.tensor(42, dtype=torch.int64), 0, 0)
    assert _record_at(s, pos) == (RING / "record_scalar_i64.bin").read_bytes()
    # a transposed view is not contiguous: copied by torch into the same layout
    t = torch.arange(6, dtype=torch.float32).reshape(3, 2).t()
    pos = s.ring.head
    assert s.write_tensor("model.layers.0.mlp", t, 5, 2)
    r = R.parse_record_header(_record_at(s, pos))
    off = R.HEADER_SIZE + pos + r["payload_off"]
    got = torch.frombuffer(bytearray(s.ring.mm[off:off + 24]), dtype=torch.float32).reshape(2, 3)
    assert torch.equal(got, t) and r["shape"] == (2, 3)


def test_fast_path_yields_to_pad_and_wraps(session):
    s, peer = session
    t = _f32_2x3()
    rec_len = R.align64(R.header_area(2, b"model.layers.0.mlp", b"") + 24)
    per_lap = s.ring.data_size // rec_len
    seen = []
    for i in range(3 * per_lap):
        pos = s.ring.head
        assert s.write_tensor("model.layers.0.mlp", t, i, i)
        # the daemon's part: release everything written so far
        s.ring.release(s.ring.head)
        r = R.parse_record_header(_record_at(s, s.ring.head - rec_len))
        seen.append((r["seq"], r["step"]))
        assert r["kind"] == R.KIND_TENSOR and pos <= s.ring.head - rec_len
    assert seen == [(i + 1, i) for i in range(3 * per_lap)]
    assert s.ring.head > 2 * s.ring.data_size
    while peer.recv(0) is not None:
        pass
