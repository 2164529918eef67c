"""The C extension's CUDA record path (``Session.put_cuda``, ``_cuda.raw_memcpy``) on the CPU.

A GPU cannot exist here, so the CUDA runtime is a stand-in: a shared library built by the
test that exports ``cudaMemcpyAsync`` as a ``memcpy`` remembering its kind and stream, and
fails with a chosen code on one stream. What runs is everything of ours: the lookup of the
runtime in ``/proc/self/maps``, the binding by address, the header and bounds checks and the
call. On a GPU, ``bench/gpu_check.py`` runs the real one (docs/GPU.md)."""

from __future__ import annotations

import ctypes
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import TESTDATA

from llm_instrumentation import _cuda
from llm_instrumentation import _ring as R

_speedups = pytest.importorskip("llm_instrumentation._speedups")

STAND_IN = r"""
#include <stddef.h>
#include <string.h>
int last_kind = -1;
void *last_stream;
size_t calls;
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    calls++;
    last_kind = kind;
    last_stream = stream;
    if ((size_t)stream == 0xbad) return 700; /* cudaErrorIllegalAddress */
    memcpy(dst, src, n);
    return 0;
}
"""


@pytest.fixture(scope="module")
def cudart(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on PATH to build the stand-in CUDA runtime")
    d = tmp_path_factory.mktemp("cudart")
    (d / "stand_in.c").write_text(STAND_IN)
    so = d / "libcudart.so.13"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(d / "stand_in.c")], check=True)
    lib = ctypes.CDLL(str(so))
    assert _cuda.bind_raw_memcpy(str(so))
    yield so, lib
    _speedups.bind_cuda_memcpy(0)


def _golden() -> tuple[bytes, dict, int, ctypes.Array]:
    """The golden f32 2x3 record (its bytes, header fields and header area's length) and a
    source buffer holding its 24-byte payload."""
    want = (TESTDATA / "ring" / "record_f32_2x3.bin").read_bytes()
    hdr_area = len(want) - 24
    return want, R.parse_record_header(want), hdr_area, ctypes.create_string_buffer(want[hdr_area:], 24)


class _Session:
    """libstrap's session (``_speedups.Session``) over a ring and one end of a socket pair."""

    def __init__(self, seq: int = 0) -> None:
        self.ring = R.Ring(R.HEADER_SIZE + 64 * 64)
        self.ring.populate(self.ring.data_size)
        self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s = _speedups.Session(self.a.fileno(), self.ring, "block", 5.0, 1024, 1 << 20, seq, 0, False, False,
                                   16, 0.25)

    def close(self) -> None:
        self.s = None
        self.a.close()
        self.b.close()
        self.ring.close()


def test_put_cuda_writes_the_golden_record(cudart):
    so, lib = cudart
    want, h, hdr_area, src = _golden()
    header = bytearray(want[:hdr_area])
    header[8:40] = bytes(32)  # seq, record_len, step, forward: written by the call
    x = _Session(seq=h["seq"] - 1)
    ring = x.ring
    calls = ctypes.c_size_t.in_dll(lib, "calls").value
    assert x.s.put_cuda(bytes(header), h["record_len"], h["step"], h["forward"], hdr_area,
                        ctypes.addressof(src), 24, 0x5eed) == h["seq"]
    assert bytes(ring.mm[R.HEADER_SIZE:R.HEADER_SIZE + len(want)]) == want
    assert ring.head == h["record_len"]
    assert x.s.state()[7] == 0  # published_head: put_cuda publishes nothing (the copy is not complete)
    assert ctypes.c_size_t.in_dll(lib, "calls").value == calls + 1
    assert ctypes.c_int.in_dll(lib, "last_kind").value == 2  # cudaMemcpyDeviceToHost
    assert ctypes.c_void_p.in_dll(lib, "last_stream").value == 0x5eed
    x.close()


def test_put_cuda_errors(cudart):
    so, lib = cudart
    want, h, hdr_area, src = _golden()
    x = _Session()
    ring = x.ring
    args = [want[:hdr_area], h["record_len"], 0, 0, hdr_area, ctypes.addressof(src), 24]
    with pytest.raises(RuntimeError, match="cudaError 700"):
        x.s.put_cuda(*args, 0xbad)
    assert ring.head == 0 and x.s.state()[0] == 0  # nothing written, the head and seq stay
    calls = ctypes.c_size_t.in_dll(lib, "calls").value
    # a payload reaching past the record, a payload from address 0, past the record: refused before any call
    for bad in ({6: 25}, {5: 0}, {4: h["record_len"] + 1}):
        a = list(args)
        for i, v in bad.items():
            a[i] = v
        with pytest.raises(ValueError):
            x.s.put_cuda(*a, 1)
    with pytest.raises(TypeError):
        x.s.put_cuda(*args)
    # a record the ring has no space for now: 0, no call, the head stays
    assert not x.s.put_cuda(want[:hdr_area], ring.data_size + 64, 0, 0, hdr_area, ctypes.addressof(src), 24, 1)
    assert ctypes.c_size_t.in_dll(lib, "calls").value == calls and ring.head == 0
    _speedups.bind_cuda_memcpy(0)
    try:
        with pytest.raises(RuntimeError, match="no cudaMemcpyAsync bound"):
            x.s.put_cuda(*args, 1)
    finally:
        assert _cuda.bind_raw_memcpy(str(so))
        x.close()


def test_cudart_paths(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f10-7f11 r--p 00000000 08:01 2 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n"
        "7f11-7f12 r-xp 00001000 08:01 2 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n"
        "7f20-7f21 rw-p 00000000 00:00 0 \n")
    assert _cuda.cudart_paths(str(maps)) == {"/opt/venv/nvidia/cu13/lib/libcudart.so.13"}
    assert _cuda.cudart_paths(str(tmp_path / "absent")) == set()


def test_bind_raw_memcpy_refuses_what_is_not_a_runtime(tmp_path):
    assert not _cuda.bind_raw_memcpy(str(tmp_path / "libcudart.so.13"))  # no such file
    assert not _cuda.bind_raw_memcpy("libc.so.6")  # loads, but has no cudaMemcpyAsync
