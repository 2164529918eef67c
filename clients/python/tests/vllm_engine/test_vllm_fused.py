"""The plugin's fused ring writes (``CaptureSession.record_sum`` and ``tokens_to_ring`` in
_session.py, ``_speedups.write_record_sum``): a decoder layer's ``hidden + residual`` summed straight into the ring must be, bit for bit, the tensor
torch's ``hidden + residual`` gives, for float32, bfloat16 and float16; and a stream written
through strapd with the fused sum and the batched TOKENs must hold the same records and
tokens as one written the way the plugin did before (torch's sum, ``session.record``, one
``session.token`` per token). No vLLM needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Tuple

import pytest

torch = pytest.importorskip("torch")

DTYPES = {"float32": (torch.float32, 0), "bfloat16": (torch.bfloat16, 1), "float16": (torch.float16, 2)}


def operands(dtype: Any, n: int, seed: int) -> Tuple[Any, Any]:
    """Two vectors of ``n`` values over the dtype's whole range (subnormals to overflow of
    the sum), signed zeros, infinities and values whose sum is a rounding tie in the
    reduced types."""
    g = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    lo, hi = torch.log10(torch.tensor(info.smallest_normal / 64)), torch.log10(torch.tensor(info.max))
    mag = 10 ** (lo + (hi - lo) * torch.rand(2, n, generator=g, dtype=torch.float64))
    sign = torch.where(torch.rand(2, n, generator=g) < 0.5, -1.0, 1.0).double()
    x = (mag * sign).to(dtype)
    a, b = x[0].clone(), x[1].clone()
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), info.max, -info.max, info.tiny, 1.0, 1.0, 3.0],
                           dtype=torch.float64).to(dtype)
    other = torch.tensor([-0.0, -0.0, 1.0, float("-inf"), info.max, 1.0, -info.tiny, info.eps / 2, info.eps,
                          info.eps * 1.5], dtype=torch.float64).to(dtype)
    k = min(n, len(special))
    a[:k], b[:k] = special[:k], other[:k]
    return a, b


def record_bytes(fn: str, a: Any, b: Any, dtype: Any, code: int) -> Any:
    """A whole record written by ``write_record_sum`` (fn "sum") or by ``write_record`` of
    torch's sum (fn "torch") into a zeroed buffer, as a uint8 tensor."""
    from llm_instrumentation import _speedups

    payload_off = 256
    n = a.numel() * a.element_size()
    rec_len = (payload_off + n + 63) // 64 * 64
    header = bytes(range(_speedups.RECORD_FIXED)) + b"name"
    buf = torch.zeros(rec_len + 64, dtype=torch.uint8)
    if fn == "sum":
        _speedups.write_record_sum(buf.data_ptr(), header, 7, rec_len, 3, 2, payload_off, a.data_ptr(), b.data_ptr(),
                                   a.numel(), code)
    else:
        want = (a + b).contiguous()
        _speedups.write_record(buf.data_ptr(), header, 7, rec_len, 3, 2, payload_off, want.data_ptr(), n)
    return buf


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("n", [1, 7, 8, 9, 4096 + 13, 1 << 17])
def test_sum_is_torch_bit_for_bit(name: str, n: int) -> None:
    dtype, code = DTYPES[name]
    a, b = operands(dtype, n, seed=n)
    got, want = record_bytes("sum", a, b, dtype, code), record_bytes("torch", a, b, dtype, code)
    assert torch.equal(got, want), (
        f"{name} x{n}: {(got != want).sum().item()} bytes differ from torch's a + b written by write_record")


@pytest.mark.parametrize("name", list(DTYPES))
def test_nan_sums_are_nan(name: str) -> None:
    # NaN payload bits are the one thing not promised equal (torch's own vectorized and
    # scalar conversions differ there): a NaN sum must be a NaN, the rest bit for bit.
    from llm_instrumentation import _speedups

    dtype, code = DTYPES[name]
    a, b = operands(dtype, 37, seed=5)
    a[3], b[20], a[30], b[30] = float("nan"), float("nan"), float("inf"), float("-inf")
    want = a + b
    out = torch.empty_like(want)
    n = out.numel() * out.element_size()
    rec = torch.zeros(128 + n, dtype=torch.uint8)
    _speedups.write_record_sum(rec.data_ptr(), bytes(_speedups.RECORD_FIXED), 1, rec.numel(), 0, 0, 128,
                               a.data_ptr(), b.data_ptr(), a.numel(), code)
    out.view(torch.uint8).copy_(rec[128:])
    nan = torch.isnan(want)
    assert nan.tolist() == torch.isnan(out).tolist() and nan.sum().item() == 3
    assert torch.equal(out[~nan].view(torch.uint8), want[~nan].view(torch.uint8))


def test_write_record_sum_refuses_bad_arguments() -> None:
    from llm_instrumentation import _speedups

    a = torch.ones(16)
    buf = torch.zeros(1024, dtype=torch.uint8)
    hdr = bytes(_speedups.RECORD_FIXED)
    with pytest.raises(ValueError, match="type 3"):
        _speedups.write_record_sum(buf.data_ptr(), hdr, 1, 512, 0, 0, 256, a.data_ptr(), a.data_ptr(), 16, 3)
    with pytest.raises(ValueError, match="record of 512"):  # 64 float32 past offset 256 of 512 bytes
        _speedups.write_record_sum(buf.data_ptr(), hdr, 1, 512, 0, 0, 256, a.data_ptr(), a.data_ptr(), 65, 0)
    with pytest.raises(ValueError, match="b is 0"):
        _speedups.write_record_sum(buf.data_ptr(), hdr, 1, 512, 0, 0, 256, a.data_ptr(), 0, 16, 0)
    with pytest.raises(TypeError, match="11 arguments"):
        _speedups.write_record_sum(buf.data_ptr(), hdr, 1, 512)
    assert int(buf.sum()) == 0  # nothing written by a refused call


def open_capture(socket: str, path: Path, names: List[str], ring_size: int) -> Any:
    from llm_instrumentation import _open
    from llm_instrumentation._session import open_session
    from llm_instrumentation.config import InstrumentationConfig

    cfg = InstrumentationConfig.fast_capture()
    plan = cfg.transport_plan()
    req = _open.open_request(torch.nn.Linear(1, 1), cfg, plan, names, str(path), "sha256:x", None)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        return open_session(socket, False, 30.0, ring_size, "block", fd, None, req)
    finally:
        os.close(fd)


@pytest.mark.integration
def test_fused_stream_equals_the_unfused_one(real_strapd: Any, tmp_path: Path) -> None:
    """Steps of varying row counts, a 4 MiB ring that wraps (PADs) many times, the three
    dtypes, index-tensor rows (not fused: the caller's path), and sampled tokens: the fused
    session's stream has the unfused one's packets, tensors and tokens, and every layer
    record is ``h[rows] + r[rows]`` bit for bit."""
    from llm_instrumentation.stream import TOKEN, open_stream
    
    g = torch.Generator().manual_seed(0)
    width, layers = 320, 3
    names = [f"model.layers.{i}" for i in range(layers)]
    steps = []
    for k in range(40):
        dtype = list(DTYPES.values())[k % 3][0]
        n = int(torch.randint(40, 700, (1,), generator=g))
        lo = int(torch.randint(0, 30, (1,), generator=g))
        rows: Any = slice(lo, n) if k % 7 != 6 else torch.tensor([0, 3, 4, n - 1])
        outs = [(torch.randn(n, width, generator=g).to(dtype) * 50, torch.randn(n, width, generator=g).to(dtype))
                for _ in range(layers)]
        toks = [(1000 * k + j, int(torch.randint(0, 32000, (1,), generator=g))) for j in range(k % 5 + 1)]
        steps.append((rows, outs, toks))

    fused = {"sum": 0, "not": 0, "tokens": 0}
    for mode in ("fused", "plain"):
        s = open_capture(real_strapd.socket, tmp_path / f"{mode}.strap", names, 4 << 20)
        try:
            for fwd, (rows, outs, toks) in enumerate(steps):
                s.step, s.forward = s.tokens, fwd
                for name, (h, r) in zip(names, outs):
                    if mode == "fused" and s.record_sum(name, h, r, rows):
                        fused["sum"] += 1
                        continue
                    fused["not"] += mode == "fused"
                    s.record(name, h[rows] + r[rows], None)
                s.flush()
                done = s.tokens_to_ring(toks) if mode == "fused" else 0
                fused["tokens"] += done
                for p, t in toks[done:]:
                    s.token(s.tokens, t, "", p)
            assert s.drops == 0
            s.close()
        finally:
            s.shutdown()
    wrapped = sum(sum(h[rows].numel() * h.element_size() for h, _ in outs) for rows, outs, _ in steps) > 3 * (4 << 20)
    assert wrapped
    # Every slice-rows record was fused except where the ring had no room yet; index rows never.
    assert fused["sum"] >= 0.8 * layers * sum(type(rows) is slice for rows, _, _ in steps)
    assert fused["not"] >= layers * sum(type(rows) is not slice for rows, _, _ in steps)
    with open_stream(tmp_path / "fused.strap") as a, open_stream(tmp_path / "plain.strap") as b:
        pa, pb = list(a.packets()), list(b.packets())
        key = lambda p: (p.type, p.seq, p.step, p.forward, p.part_offset, p.name, p.shape, p.dtype_id, p.tensor_len)  # noqa: E731
        assert [key(p) for p in pa] == [key(p) for p in pb]
        assert sum(p.type == TOKEN for p in pa) == sum(len(t) for _, _, t in steps)
        ta, tb = a.tensors(), b.tensors()
        assert len(ta) == len(tb) == layers * len(steps)
        for i, (x, y) in enumerate(zip(ta, tb)):
            rows, outs, _ = steps[i // layers]
            h, r = outs[i % layers]
            want = (h[rows] + r[rows]).view(torch.uint8)
            assert torch.equal(x.tensor().view(torch.uint8), want), (i, x.name, h.dtype)
            assert torch.equal(y.tensor().view(torch.uint8), want)
    if s._ring_tokens:
        assert fused["tokens"] == sum(len(t) for _, _, t in steps)
