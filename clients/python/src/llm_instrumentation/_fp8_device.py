"""fp8 coding on the tensor's own device: the payload of an FP8 ring record.

With codec ``fp8`` a CUDA tensor is coded on the GPU, on the model's stream, before its
device-to-host copy: e4m3fn codes (1 byte a value) and a float32 scale per row part cross
PCIe and reach strapd instead of the bf16/fp32 values, and strapd writes the blocks its own
fp8 encoder would have written, without coding again (docs/PROTOCOL.md 2, "FP8 records";
docs/COMPRESSION.md 10.1, "Coded on the device").

The arithmetic is strapd's (``internal/codec/fp8.go``), step for step, in torch ops that
give the same bits on a CPU and on a GPU: ``scale = float32(float64(max|x|) / 448)``; each
code is ``x · (1/scale)`` in float64 rounded to e4m3fn by integer operations on its bits
(the rounding of ``e4m3`` in fp8.go: ties to the even mantissa, saturating at ±448), not by
torch's float8 conversion, which goes through float32 (a second rounding) and turns values
over 448 into NaN; the decoded value is ``float32(E4M3[code] × scale)`` rounded to the
tensor's dtype; the error sums are float64. Codes, scales and the largest error of each part
are therefore identical to strapd's; the three sums are the same terms added in another
order (torch's reductions against strapd's AVX2 lanes), so they may differ in their last
bits, and with them the rel-L2 and cosine figures of the packet's ``lossy`` report
(``tests/test_fp8_device.py`` measures it against strapd).

Nothing here waits for the device: what strapd's encoder stores losslessly (a NaN or ±inf,
a row too small for a normal float32 scale, a part over the bound) is found on the device
and written into the payload's status word; a CPU caller reads it and sends the raw tensor
instead, a CUDA caller lets strapd turn the record into a DROP that names the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

from ._speedups import FP8_HEADER

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Status bits of the payload (docs/PROTOCOL.md 2; internal/shm FP8NonFinite, ...).
NONFINITE, TINY_SCALE, OVER_BOUND = 1, 2, 4
#: The smallest normal float32: a part whose scale would be below it is not coded.
MIN_NORMAL_SCALE = 2.0 ** -126

_E4M3: Dict[Tuple[str, int], "torch.Tensor"] = {}
_CUTS: Dict[Tuple[int, int, int], Optional["torch.Tensor"]] = {}


def row_len(shape: Tuple[int, ...], n: int) -> int:
    """The row length fp8 codes a tensor of ``shape`` by: its last dimension, or the whole
    tensor (a 0-d tensor, or an implausible last dimension), as strapd's pipeline does."""
    if shape and 0 < shape[-1] <= 1 << 40:
        return int(shape[-1])
    return n


def part_lengths(n: int, rowlen: int, block_values: int) -> Optional["torch.Tensor"]:
    """The lengths of the row parts of ``n`` values in rows of ``rowlen`` cut into blocks of
    ``block_values``, or None when every part is a whole row (blocks start on row
    boundaries). Kept per layout."""
    import torch

    key = (n, rowlen, block_values)
    if key in _CUTS:
        return _CUTS[key]
    lens = None
    if n and block_values % rowlen and n > block_values:
        starts = torch.unique(torch.cat([torch.arange(0, n, rowlen), torch.arange(0, n, block_values)]))
        lens = torch.diff(starts, append=torch.tensor([n]))
    _CUTS[key] = lens
    return lens


def parts(n: int, rowlen: int, block_values: int) -> int:
    """The number of row parts (internal/shm FP8Parts)."""
    if not n:
        return 0
    lens = part_lengths(n, rowlen, block_values)
    return n // rowlen if lens is None else int(lens.numel())


def payload_len(n: int, nparts: int) -> int:
    """An FP8 payload's length: header, scales padded to 8, four float64 a part, codes."""
    return (FP8_HEADER + 4 * nparts + 7) // 8 * 8 + 32 * nparts + n


def _e4m3(device: "torch.device") -> "torch.Tensor":
    """The float32 value of every e4m3fn code, on ``device`` (torch's own float8 decoding
    is exact: every e4m3fn value is a float32)."""
    import torch

    key = (device.type, device.index or 0)
    t = _E4M3.get(key)
    if t is None:
        t = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().to(device)
        _E4M3[key] = t
    return t


def _round_e4m3_odd(r: "torch.Tensor") -> "torch.Tensor":
    """float64 ``r`` (finite) to e4m3fn codes as uint8, the same codes as
    :func:`_round_e4m3` in fewer passes: ``r`` is rounded to float32 *to odd* (round to
    nearest, then, where inexact and even, one step toward ``r``), which keeps every bit
    the second rounding needs (24 bits ≥ e4m3's 4 + 2), then clamped to ±448 and converted
    by torch's float32 → e4m3fn rounding (to nearest even). Rounding to nearest first would
    round twice: a float64 just off an e4m3 midpoint could land on it."""
    import torch

    r32 = r.float()
    b = r32.view(torch.int32)
    step = torch.where(r.abs() > r32.abs().double(), 1, -1).to(torch.int32)
    b = torch.where((r32.double() != r) & ((b & 1) == 0), b + step, b)
    return b.view(torch.float32).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def _round_e4m3(r: "torch.Tensor") -> "torch.Tensor":
    """float64 ``r`` (finite) to e4m3fn codes as uint8: strapd's ``e4m3`` on the bits."""
    import torch

    u = r.view(torch.int64)
    sign = (u >> 56) & 0x80
    a = u & 0x7FFFFFFFFFFFFFFF
    v = a - ((1023 - 7) << 52)
    v = torch.clamp_max((v + ((1 << 48) - 1) + ((v >> 49) & 1)) >> 49, 0x7E)
    # Subnormal codes m·2⁻⁹: m = round-half-even(|r|·2⁹) by adding 2⁵² (exact: ×512 is).
    f = a.view(torch.float64) * 512.0 + 4503599627370496.0
    sub = f.view(torch.int64) - 0x4330000000000000
    code = torch.where(a >= 0x3F90000000000000, v, sub)
    code = torch.where(a >= 0x407C000000000000, torch.full_like(code, 0x7E), code)
    return (code | sign).to(torch.uint8)


def encode(t: "torch.Tensor", block_values: int, bound: float = 0.0) -> "torch.Tensor":
    """The FP8 record payload of ``t`` (float32, float16 or bfloat16) on ``t``'s device, in
    the current stream's order, without waiting for it.

    Args:
        t: the tensor; its last dimension is the row (the whole tensor when 0-d).
        block_values: values per block of the session (``OPENED.block_size`` / element size).
        bound: the session's fp8 bound (0: none); a part over it sets ``OVER_BOUND``.

    Returns:
        a uint8 tensor of :func:`payload_len` bytes: header (block_values, parts, status,
        0), scales, sums (Σx², Σ(x−y)², Σy², max|x−y| per part), codes.
    """
    import torch

    dev = t.device
    x = t.detach().reshape(-1)
    n = x.numel()
    rl = row_len(tuple(t.shape), n)
    lens = part_lengths(n, rl, block_values)
    np_ = parts(n, rl, block_values)
    out = torch.empty(payload_len(n, np_), dtype=torch.uint8, device=dev)
    so = (FP8_HEADER + 4 * np_ + 7) // 8 * 8
    hdr = out[:FP8_HEADER].view(torch.int32)
    if n == 0:
        hdr.copy_(torch.tensor([block_values, 0, 0, 0], dtype=torch.int32).to(dev, non_blocking=True))
        return out
    xf = x.float()
    if lens is None:
        xr = xf.view(np_, -1)
        amax = xr.abs().amax(dim=1)
    else:
        lens = lens.to(dev, non_blocking=True)
        amax = torch.segment_reduce(xf.abs(), "max", lengths=lens)
    finite = torch.isfinite(amax).all()
    scale = (amax.double() / 448.0).float()
    tiny = ((amax > 0) & (scale < MIN_NORMAL_SCALE)).any()
    inv = torch.where(scale > 0, 1.0 / scale.double(), torch.zeros((), dtype=torch.float64, device=dev))
    if lens is None:  # rows: broadcast the per-row values, nothing per element
        inv_e, scale_e = inv[:, None], scale[:, None]
        x64 = x.double().view(np_, -1)
    else:
        inv_e = torch.repeat_interleave(inv, lens, output_size=n)
        scale_e = torch.repeat_interleave(scale, lens, output_size=n)
        x64 = x.double()
    r = x64 * inv_e
    # NaN/inf parts are flagged by the status: their codes are never used.
    if not bool_finite_known(finite):
        r = torch.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0)
    codes = _round_e4m3_odd(r)
    y = codes.view(torch.float8_e4m3fn).float() * scale_e
    if t.dtype != torch.float32:
        y = y.to(t.dtype)
    y64 = y.double()
    e = x64 - y64
    if lens is None:
        sums = torch.stack([(x64 * x64).sum(dim=1), (e * e).sum(dim=1), (y64 * y64).sum(dim=1),
                            e.abs_().amax(dim=1)], dim=1)
    else:
        sums = torch.stack([torch.segment_reduce(x64 * x64, "sum", lengths=lens),
                            torch.segment_reduce(e * e, "sum", lengths=lens),
                            torch.segment_reduce(y64 * y64, "sum", lengths=lens),
                            torch.segment_reduce(e.abs_(), "max", lengths=lens)], dim=1)
    status = torch.where(finite, 0, NONFINITE) | torch.where(tiny, TINY_SCALE, 0)
    if bound > 0:
        status = status | torch.where((sums[:, 1] > bound * bound * sums[:, 0]).any(), OVER_BOUND, 0)
    hdr.copy_(torch.stack([torch.full((), block_values, dtype=torch.int32, device=dev),
                           torch.full((), np_, dtype=torch.int32, device=dev),
                           status.to(torch.int32), torch.zeros((), dtype=torch.int32, device=dev)]))
    out[FP8_HEADER:FP8_HEADER + 4 * np_].view(torch.float32).copy_(scale)
    out[FP8_HEADER + 4 * np_:so].zero_()
    out[so:so + 32 * np_].view(torch.float64).view(np_, 4).copy_(sums)
    out[so + 32 * np_:].copy_(codes.reshape(-1))
    return out


def bool_finite_known(finite: "torch.Tensor") -> bool:
    """Whether ``finite`` (a 0-d bool tensor) is known True without waiting for a device: on
    the CPU it is read; on a GPU it is not (the NaN/inf guard then always runs)."""
    return finite.device.type == "cpu" and bool(finite)


def status(payload: "torch.Tensor") -> int:
    """The status word of a payload (a read of the device: for CPU payloads)."""
    import torch

    return int(payload[8:12].view(torch.int32).item())
