"""The session's per-record fast path (cached header, memmove) writes the bytes of
docs/PROTOCOL.md: the golden records of testdata/ring, written through CaptureSession."""

from __future__ import annotations

import shutil
import socket
import struct

import pytest
import torch
from conftest import TESTDATA

import wire as P
from llm_instrumentation import _ring as R
from llm_instrumentation import _session
from llm_instrumentation._session import CaptureSession

RING = TESTDATA / "ring"


@pytest.fixture
def session():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(a, R.Ring(R.HEADER_SIZE + 64 * 64))
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


@pytest.mark.parametrize("c_ext", [True, False], ids=["c-extension", "python"])
def test_record_writes_what_write_tensor_writes(session, monkeypatch, c_ext):
    """The hooks' callback (``record``: one C call for a known layout) and ``write_tensor``
    give the same records byte for byte: first sight (layout built), cached layout, the PAD
    before the end of the region, a non-contiguous view and a changed shape (general path);
    so does ``record`` without the C extension."""
    if c_ext and _session._c_write_record is None:
        pytest.skip("llm_instrumentation._speedups is not built (test_speedups_built says why)")
    if not c_ext:
        monkeypatch.setattr(_session, "_c_write_record", None)
    s, peer = session
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ref = CaptureSession(a, R.Ring(R.HEADER_SIZE + 64 * 64))
    try:
        tensors = [_f32_2x3(), _f32_2x3() * 2, torch.arange(6, dtype=torch.float32).reshape(3, 2).t(),
                   torch.ones(4, 3), _f32_2x3()]
        for i in range(40):
            t = tensors[i % len(tensors)]
            s.step, s.forward = i // 3, i
            assert s.record("model.layers.0.mlp", t, None)
            assert ref.write_tensor("model.layers.0.mlp", t, i // 3, i)
            assert s.ring.head == ref.ring.head and s.seq == ref.seq == i + 1
            assert bytes(s.ring.mm) == bytes(ref.ring.mm)
            for x in (s, ref):
                x.ring.release(x.ring.head)
        assert (s.packets, s.bytes_in, s.last_tensor_seq) == (ref.packets, ref.bytes_in, ref.last_tensor_seq)
    finally:
        ref.shutdown()
        b.close()
    while peer.recv(0) is not None:
        pass


def test_record_after_an_error_raises(session):
    """A session that failed refuses records on the fast path too."""
    s, _ = session
    s.record("x", _f32_2x3(), None)
    s.error = RuntimeError("daemon said no")
    with pytest.raises(Exception, match="session already failed"):
        s.record("x", _f32_2x3(), None)


def test_speedups_built():
    """Where a C compiler exists, the installed client has its C extension (``make venv``
    builds it; a tree used through PYTHONPATH: ``python setup.py build_ext --inplace`` in
    clients/python)."""
    if _session._c_write_record is None:
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            pytest.skip("no C compiler here: the client runs on its Python path")
        pytest.fail("llm_instrumentation._speedups is not importable although a C compiler exists")


def test_write_record_checks_sizes():
    """The C call refuses sizes that would write outside the record."""
    if _session._c_write_record is None:
        pytest.skip("llm_instrumentation._speedups is not built")
    import ctypes
    import mmap

    wr = _session._c_write_record
    m = mmap.mmap(-1, 4096)
    buf = ctypes.c_char.from_buffer(m)
    try:
        dst = ctypes.addressof(buf)
        src = torch.arange(4, dtype=torch.float32)
        wr(dst, bytes(80), 3, 128, 4, 5, 80, src.data_ptr(), 16)
        assert struct.unpack_from("<QQQQ", m, 8) == (3, 128, 4, 5)
        assert bytes(m[80:96]) == src.numpy().tobytes()
        for args, msg in [((dst, bytes(80), 1, 128, 0, 0, 80, src.data_ptr(), 64), "payload of 64 at 80"),
                          ((dst, bytes(96), 1, 128, 0, 0, 80, src.data_ptr(), 16), "header of 96"),
                          ((dst, bytes(32), 1, 128, 0, 0, 80, src.data_ptr(), 16), "header of 32"),
                          ((0, bytes(80), 1, 128, 0, 0, 80, src.data_ptr(), 16), "header of 80")]:
            with pytest.raises(ValueError, match=msg):
                wr(*args)
        with pytest.raises(ValueError, match="seq must be an int"):
            wr(dst, bytes(80), -1, 128, 0, 0, 80, src.data_ptr(), 16)
        with pytest.raises(TypeError):
            wr(dst, "not bytes", 1, 128, 0, 0, 80, src.data_ptr(), 16)
        with pytest.raises(TypeError, match="9 arguments"):
            wr(dst)
    finally:
        del buf
        m.close()


@pytest.mark.parametrize("c_ext", [True, False], ids=["c-extension", "python"])
def test_no_record_after_shutdown(monkeypatch, c_ext):
    """A hook still running on another thread when the capture ends must not write into the
    unmapped ring, nor into the ring kept for the process's next capture: after shutdown
    records are refused and the ring is left as it was."""
    if c_ext and _session._c_write_record is None:
        pytest.skip("llm_instrumentation._speedups is not built")
    if not c_ext:
        monkeypatch.setattr(_session, "_c_write_record", None)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ring = R.Ring(R.HEADER_SIZE + 64 * 64)
    s = CaptureSession(a, ring)
    t = _f32_2x3()
    assert s.record("model.layers.0.mlp", t, None) and s.record("model.layers.0.mlp", t, None)
    s.closed_summary = P.Closed(packets=2, drops=0, bytes_in=48, bytes_out=48, file_bytes=0)
    s.shutdown()  # a clean end: the ring is kept for the next capture, still mapped
    try:
        before, head = bytes(ring.mm), ring.head
        assert not s.record("model.layers.0.mlp", t, None)
        assert not s.write_tensor("model.layers.0.mlp", t, 0, 0)
        assert bytes(ring.mm) == before and ring.head == head and s.seq == 2
    finally:
        R.release_idle_ring()
        b.close()


def test_no_record_after_close():
    """CLOSE counts every record of the session: from it on records are refused, before the
    session is shut down too."""
    import threading

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ring = R.Ring(R.HEADER_SIZE + 64 * 64)
    s = CaptureSession(a, ring)
    daemon = P.Connection(b)
    got = []

    def answer() -> None:
        while True:
            m = daemon.recv(10.0)
            got.append(m)
            if isinstance(m, P.Close) or m is None:
                daemon.send(P.Closed(packets=1, drops=0, bytes_in=24, bytes_out=24, file_bytes=0))
                return

    th = threading.Thread(target=answer)
    th.start()
    t = _f32_2x3()
    try:
        assert s.record("model.layers.0.mlp", t, None)
        s.close(timeout=10.0)
        th.join()
        assert isinstance(got[-1], P.Close) and got[-1].seq == 1
        head = ring.head
        assert not s.record("model.layers.0.mlp", t, None)
        assert not s.write_tensor("model.layers.0.mlp", t, 0, 0)
        assert ring.head == head and s.seq == 1
    finally:
        s.shutdown()
        R.release_idle_ring()
        b.close()


def test_record_meta_writes_what_write_tensor_writes(session):
    """A tensor-parallel rank's records with a repeating meta (record_meta): the same bytes as
    write_tensor with that meta, from a layout with the meta encoded in, kept while the meta
    object stays the same and made again when another object comes; never in the layouts of
    records without meta."""
    s, peer = session
    t = _f32_2x3()
    meta = {"shard": {"axis": 1, "offset": 3, "full_shape": [2, 6], "tp_rank": 1, "tp_size": 2}}
    s.seq, s.step, s.forward = 0, 5, 2
    pos = s.ring.head
    assert s.write_tensor("m", t, 5, 2, meta)
    want = _record_at(s, pos)
    for seq in (2, 3):
        pos = s.ring.head
        assert s.record_meta("m", t, meta)
        got = _record_at(s, pos)
        assert got[:8] + got[16:] == want[:8] + want[16:] and R.parse_record_header(got)["seq"] == seq
    assert s._meta_layouts["m"][0] is meta and "m" not in s._layouts
    other = {"replica": {"tp_rank": 1, "tp_size": 2}}
    pos = s.ring.head
    assert s.record_meta("m", t, other)
    got = R.parse_record_header(_record_at(s, pos))
    assert got["meta"] == b'{"replica":{"tp_rank":1,"tp_size":2}}' and s._meta_layouts["m"][0] is other
    pos = s.ring.head
    assert s.record("m", t, None)  # a record without meta: its own layout, no meta
    assert R.parse_record_header(_record_at(s, pos))["meta"] == b""
