"""fp8 coded by the client (``_fp8_device``, FP8 ring records: docs/PROTOCOL.md 2,
docs/COMPRESSION.md 10.1 "Coded on the device") against strapd's own fp8 encoder.

The same tensors go through the real strapd twice: once raw (strapd codes them), once coded
here by the torch function a CUDA tensor is coded with on its GPU, run on the CPU
(``STRAP_FP8_CLIENT=all``). Every packet must be the same: header fields and stored bytes
(block table, fp8 headers, scales, codes) byte for byte, the ``lossy`` report's mode, bound,
blocks, lossless blocks and largest error exactly; its float64 sums are added in another
order, so rel-L2 and cosine are compared to 1e-12 (and how many are exactly equal is
printed). Tensors e4m3 cannot carry (NaN, ±inf, float32-subnormal rows, a part over the
bound) go raw from the client, so strapd stores them losslessly as before."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

from llm_instrumentation import _fp8_device as F
import wire as P
from llm_instrumentation import _ring as R
from llm_instrumentation._session import open_session
from llm_instrumentation.errors import StreamFormatError
from llm_instrumentation.stream import open_stream

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "testdata" / "ring" / "record_fp8_bf16_2x4.bin"


def test_golden_record_is_the_client_encoding() -> None:
    """The golden FP8 record (whose payload strapd's encoder computed) is what the client
    writes for its tensor: header through the ring encoder, payload through encode()."""
    g = GOLDEN.read_bytes()
    x = torch.tensor([[1, -2.5, 3.3, 7], [0, -0.0, 0, 0]], dtype=torch.bfloat16)
    payload = F.encode(x, 524288).numpy().tobytes()
    name = b"model.layers.1.mlp"
    hdr = R.encode_record_header(dtype=3, shape=(2, 4), seq=4, record_len=len(g), step=2, forward=1,
                                 payload_len=len(payload), name=name, tensor_len=16, fp8=True)
    rec = hdr + payload
    rec += bytes(len(g) - len(rec))
    assert rec == g
    assert F.payload_len(8, F.parts(8, 4, 524288)) == len(payload) == 96


def _midpoints() -> torch.Tensor:
    """Rows of scale exactly 1 (max 448) holding every e4m3 midpoint, normal and subnormal,
    and values just beside them: the ties a rounding must send to the even code."""
    vals = torch.arange(0, 0x7E, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    mids = ((vals[1:] + vals[:-1]) / 2)
    row = torch.cat([mids, -mids, mids * (1 + 2 ** -20), mids * (1 - 2 ** -20), torch.tensor([448.0, 460.0, -465.0])])
    row = row[:252]
    return torch.stack([row, row.flip(0)]).float()


def _near_midpoints() -> torch.Tensor:
    """Rows whose scale is not a power of two (max 44.8: scale 0.1) and whose values are the
    float32 nearest to e4m3 midpoints times it: x/scale in float64 then lies a float32 ulp or
    less beside the midpoint, where rounding through float32 to nearest would round twice."""
    vals = torch.arange(0, 0x7E, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    mids = (vals[1:] + vals[:-1]) / 2
    s = float(torch.tensor(44.8 / 448, dtype=torch.float32))
    row = torch.cat([torch.tensor([44.8]), mids * s, -mids * s]).float()
    return torch.stack([row, row.roll(7)])


def test_round_to_odd_is_strapds_rounding() -> None:
    """The float32 round-to-odd path gives the codes of strapd's rounding on the float64 bits
    (``_round_e4m3``, fp8.go's ``e4m3``), also a float64 ulp beside every midpoint, where a
    plain float64 → float32 → e4m3 conversion rounds twice."""
    vals = torch.arange(0, 0x7E, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    mids = (vals[1:] + vals[:-1]) / 2
    g = torch.Generator().manual_seed(3)
    r = torch.cat([mids, mids * (1 + 2.0 ** -40), mids * (1 - 2.0 ** -40), torch.nextafter(mids, mids * 2),
                   torch.nextafter(mids, torch.zeros_like(mids)), vals, torch.randn(20000, generator=g, dtype=torch.float64) * 40,
                   torch.tensor([448.0, 460.0, 464.0, 1e6, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 0.0, 1e-300])])
    r = torch.cat([r, -r])
    assert torch.equal(F._round_e4m3_odd(r), F._round_e4m3(r))
    naive = r.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert not torch.equal(naive, F._round_e4m3(r)), "the test values never round twice"


def _cases(dtype: torch.dtype) -> List[Tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(40)
    heavy = torch.randn(37, 384, generator=g) * torch.exp(torch.randn(37, 1, generator=g) * 2)
    heavy[3] = 0
    heavy[5, :7] = -0.0
    heavy[5, 7:] = 0.0
    heavy[9, 11] = 1e4  # a massive activation
    tiny = torch.randn(4, 64, generator=g)
    tiny[1] *= 1e-39  # float32 subnormals: bfloat16/float32 rows too small for a normal scale
    sub16 = torch.randn(6, 32, generator=g)
    sub16[2, :5] = 3e-8  # float16 subnormal values beside normal ones
    sub16[3] = torch.tensor([1e-42, -1e-40] * 16)
    nan = torch.randn(3, 16, generator=g)
    nan[1, 2] = float("nan")
    inf = torch.randn(3, 16, generator=g)
    inf[2, 0] = float("inf")
    cases = [
        ("heavy", heavy),
        ("midpoints", _midpoints()),
        ("near_midpoints", _near_midpoints()),
        ("subnormal16", sub16),
        ("tiny_row", tiny),
        ("nan", nan),
        ("inf", inf),
        ("long_rows", torch.randn(2, 3000, generator=g)),  # rows longer than a block
        ("vector", torch.randn(1000, generator=g)),
        ("scalar", torch.tensor(-3.7)),
        ("zeros", torch.zeros(4, 8)),
        ("empty", torch.zeros(0, 8)),
        ("three_d", torch.randn(2, 5, 96, generator=g)),
        # coded, over the 256 KiB records of the test's 1 MiB ring: goes raw, as PARTs
        ("big", torch.randn(300, 1024, generator=g)),
    ]
    if dtype == torch.float16:  # keep float16 finite where the case is not about inf
        cases = [(n, t.clamp(-6e4, 6e4) if n != "inf" else t) for n, t in cases]
    return [(n, t.to(dtype)) for n, t in cases]


def _capture(sock: str, path: Path, tensors: List[Tuple[str, torch.Tensor]], mode: str, block_size: int,
             lossy: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("STRAP_FP8_CLIENT", mode)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        req = {"codec": "fp8", "block_size": block_size, **lossy}
        s = open_session(sock, False, 30.0, R.HEADER_SIZE + (1 << 20), "block", fd, None, req)
        try:
            for i, (name, t) in enumerate(tensors):
                assert s.write_tensor(name, t, i, 0)
            coded = s.fp8_records
            s.flush()
            s.close(timeout=30)
        finally:
            s.shutdown()
    finally:
        os.close(fd)
    return coded


def _packets(path: Path) -> Dict[Tuple[str, int], object]:
    with open_stream(path) as r:
        return {(p.name, p.part_offset): (p, bytes(p.stored())) for p in r.packets()
                if p.type_name in ("TENSOR", "DROP")}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bound", [None, 0.03, 0.02])
def test_client_fp8_packets_equal_strapd(real_strapd, tmp_path, monkeypatch, dtype, bound) -> None:
    tensors = _cases(dtype)
    lossy = {"lossy_mode": "fp8", "lossy_value": bound}
    block = 4096  # rows of 384 float32 (1536 bytes) or bfloat16 are cut by blocks
    a, b = tmp_path / "strapd.strap", tmp_path / "client.strap"
    assert _capture(real_strapd.socket, a, tensors, "off", block, lossy, monkeypatch) == 0
    coded = _capture(real_strapd.socket, b, tensors, "all", block, lossy, monkeypatch)
    pa, pb = _packets(a), _packets(b)
    assert pa.keys() == pb.keys() and {n for n, _ in pa} == {n for n, _ in tensors}
    assert sum(n == "big" for n, _ in pa) > 1, "big is not written as PARTs"
    # Every tensor strapd coded without a lossless block the client must have coded itself.
    clean = [n for n, _ in tensors if n != "big" and "lossy" in pa[n, 0][0].meta
             and pa[n, 0][0].meta["lossy"]["lossless_blocks"] == 0]
    assert coded >= len(clean) >= (5 if bound is None else 2), (coded, clean)
    exact = total = 0
    for name in pa:
        (ka, sa), (kb, sb) = pa[name], pb[name]
        for f in ("type", "dtype_id", "codec", "flags", "seq", "step", "raw_len", "tensor_len", "block_size", "shape"):
            assert getattr(ka, f) == getattr(kb, f), (name, f)
        assert sa == sb, f"{name}: stored bytes differ"
        ma, mb = ka.meta.get("lossy"), kb.meta.get("lossy")
        assert (ma is None) == (mb is None), name
        if ma is None:
            continue
        for k in ("mode", "bound", "blocks", "lossless_blocks", "max_abs_err"):
            assert ma[k] == mb[k], (name, k, ma[k], mb[k])
        pairs = [(ma["rel_l2_err"], mb["rel_l2_err"])]
        if "rows" in ma:
            assert ma["rows"]["n"] == mb["rows"]["n"]
            pairs += [(ma["rows"][k], mb["rows"][k]) for k in ma["rows"] if k != "n"]
        for x, y in pairs:
            assert y == pytest.approx(x, rel=1e-12, abs=1e-300), (name, ma, mb)
            exact += x == y
            total += 1
    print(f"{dtype}: {exact}/{total} rel-L2/cosine figures bit-equal, the rest within 1e-12")


def test_nonfinite_cuda_record_becomes_a_drop(real_strapd, tmp_path, monkeypatch) -> None:
    """A payload whose status says NaN (what a CUDA tensor's would, unread by the client)
    becomes a DROP packet naming the reason; the records around it are written."""
    monkeypatch.setenv("STRAP_FP8_CLIENT", "all")
    real = F.status
    monkeypatch.setattr(F, "status", lambda p: 0)  # as on CUDA: the status is not read
    path = tmp_path / "drop.strap"
    t = torch.randn(4, 16)
    bad = t.clone()
    bad[1, 3] = float("nan")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        req = {"codec": "fp8"}
        s = open_session(real_strapd.socket, False, 30.0, R.HEADER_SIZE + (1 << 20), "block", fd, None, req)
        for i, x in enumerate([t, bad, t]):
            s.write_tensor(f"m{i}", x, i, 0)
        s.close(timeout=30)
        s.shutdown()
    finally:
        os.close(fd)
    assert real(F.encode(bad, 1 << 18)) == F.NONFINITE
    with open_stream(path) as r:
        kinds = [(p.name, p.type_name, p.meta.get("reason")) for p in r.packets() if p.type_name != "END"
                 and p.type_name != "INDEX"]
        assert kinds == [("m0", "TENSOR", None), ("m1", "DROP", "fp8_nonfinite"), ("m2", "TENSOR", None)]
        got = r.tensors("m2")[0].tensor()
    assert torch.allclose(got, t, rtol=0.07, atol=0)


def test_bad_fp8_record_fails_the_session_clearly(real_strapd, tmp_path, monkeypatch) -> None:
    """A payload with a NaN code is refused with a message naming the record and the value;
    the record before it is in the stream."""
    monkeypatch.setenv("STRAP_FP8_CLIENT", "all")
    real = F.encode

    def corrupt(t, bv, bound=0.0):
        p = real(t, bv, bound)
        if t.shape[-1] == 8:
            p[-1] = 0x7F
        return p

    monkeypatch.setattr(F, "encode", corrupt)
    path = tmp_path / "bad.strap"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    err = None
    try:
        req = {"codec": "fp8"}
        s = open_session(real_strapd.socket, False, 30.0, R.HEADER_SIZE + (1 << 20), "block", fd, None, req)
        try:
            s.write_tensor("good", torch.randn(2, 16), 0, 0)
            s.write_tensor("bad", torch.randn(2, 8), 1, 0)
            s.close(timeout=30)
        except Exception as e:  # noqa: BLE001 - the daemon's error, whichever call sees it
            err = e
        finally:
            s.shutdown()
    finally:
        os.close(fd)
    assert err is not None and "code 0x7f" in str(err) and "bad" in str(err), err
    # strapd reports the error, then ends the file (END with status error, index, footer):
    # wait for the footer rather than read a file it is still ending.
    deadline = time.monotonic() + 20
    while True:
        try:
            with open_stream(path) as r:
                names = [p.name for p in r.packets() if p.type_name == "TENSOR"]
                end = r.end()
            if end is not None:
                break
        except StreamFormatError:
            pass
        assert time.monotonic() < deadline, "strapd never ended the stream"
        time.sleep(0.05)
    assert names == ["good"] and "code 0x7f" in json.dumps(end.meta), end.meta


def test_strapd_inspect_and_verify_read_client_coded(real_strapd, tmp_path, monkeypatch) -> None:
    """strapd verify and inspect read a client-coded stream unchanged (ordinary fp8 packets)."""
    path = tmp_path / "v.strap"
    _capture(real_strapd.socket, path, [("m", torch.randn(16, 64, dtype=torch.bfloat16))], "all", 1 << 20,
             {"lossy_mode": "fp8"}, monkeypatch)
    b = os.environ.get("STRAPD_BIN", str(REPO / "bin" / "strapd"))
    v = subprocess.run([b, "verify", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    i = subprocess.run([b, "inspect", str(path)], capture_output=True, text=True)
    assert i.returncode == 0 and "fp8" in i.stdout, i.stdout + i.stderr


def test_dropped_fp8_record_is_dropped_once() -> None:
    """Under policy drop, an FP8 record with no room is one DROP notice: not written again raw."""
    import socket

    from llm_instrumentation._session import CaptureSession

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(a, R.Ring(R.HEADER_SIZE + 64 * 64), policy="drop", publish_bytes=1 << 20)
    peer = P.Connection(b)
    try:
        s.fp8_client = "all"
        s._fp8 = (1 << 20, 0.0)
        wrote = [s.write_tensor(f"m{i}", torch.randn(4, 16), i, 0) for i in range(12)]
        assert s.fp8_records == sum(wrote) >= 1 and not all(wrote)
        drops = []
        while (m := peer.recv(0.05)) is not None:
            if isinstance(m, P.Drop):
                drops.append(m.name)
        assert drops == [f"m{i}" for i, w in enumerate(wrote) if not w] and s.drops == len(drops)
        assert s.packets == sum(wrote)
    finally:
        s.shutdown()
        b.close()


def test_which_tensors_are_coded_here() -> None:
    """CUDA tensors of 64 KiB and more are coded on their device by default, smaller ones
    (a decoding step's records) go raw; CPU tensors only under STRAP_FP8_CLIENT=all."""
    import types

    from llm_instrumentation._session import FP8_DEVICE_MIN, CaptureSession

    def fake(nbytes: int, cuda: bool, dtype=torch.bfloat16):  # a CUDA tensor stand-in: no GPU here
        return types.SimpleNamespace(dtype=dtype, is_cuda=cuda, is_cpu=not cuda, numel=lambda: nbytes // 2,
                                     element_size=lambda: 2)

    s = CaptureSession.__new__(CaptureSession)
    s.fp8_client = "cuda"
    s._fp8 = (1 << 18, 0.0)
    assert s._fp8_wanted(fake(FP8_DEVICE_MIN, True)) and not s._fp8_wanted(fake(FP8_DEVICE_MIN - 2, True))
    # under a bound, CUDA tensors go raw: strapd stores a part over it losslessly, where the
    # device's unread status would turn the record into a DROP
    s._fp8 = (1 << 18, 0.03)
    assert not s._fp8_wanted(fake(1 << 20, True))
    s._fp8 = (1 << 18, 0.0)
    assert not s._fp8_wanted(fake(1 << 20, False)) and not s._fp8_wanted(fake(1 << 20, True, torch.int16))
    s.fp8_client = "all"
    assert s._fp8_wanted(fake(64, False))
