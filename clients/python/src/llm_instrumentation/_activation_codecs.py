"""Decoders for the activation codecs (ids 16–63) of the stream format.

The stored formats are specified in ``docs/COMPRESSION.md``; the Go encoder/decoder lives in
``internal/codec`` (``shuffle.go``, ``lossy.go``, ``activation.go``, ``fp8.go``, ``transform.go``).
Both decoders are held to the golden vectors in ``testdata/codec/activation`` (``transform``: in
``testdata/codec/transform``). Every entropy-coded plane is a
standard zstd frame, so this module needs only numpy, zstandard and, for fp8's loop, the
package's ``_speedups`` extension.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import Any

import numpy as np
import zstandard

# The fp8 decoder's loop (_speedups_fp8.c): the package needs the extension anyway (the ring,
# the protocol, checkpoints), so there is no numpy copy of it here.
from . import _speedups

__all__ = [
    "CodecError", "SHUFFLE", "QUANT", "FP16", "FP8", "TRANSFORM", "E4M3", "SharedBasis", "decode_block",
]

SHUFFLE = 16
QUANT = 17
FP16 = 18
FP8 = 19
TRANSFORM = 20

_WIDTH = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_FLOATS = {"float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2"}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_QUANTIZABLE = {"float32", "float64", "float16", "bfloat16"}

# Largest block a stream may use (internal/codec.MaxBlockSize): bounds what a corrupt
# block can make the decoder allocate.
MAX_BLOCK_SIZE = 64 << 20

_FLAG_ZERO_MAP = 1

_MODE_LOSSY = 0
_MODE_LOSSLESS = 1

_local = threading.local()


def _e4m3_table() -> np.ndarray:
    """The float32 value of every e4m3fn code (0x7F/0xFF NaN), as internal/codec.E4M3."""
    c = np.arange(256)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
    v = np.where(c & 0x80, -v, v)
    v[(c & 0x7F) == 0x7F] = np.nan
    return v.astype(np.float32)


#: Value of each e4m3fn code (fp8 codec 19), float32.
E4M3 = _e4m3_table()
_FP8_DTYPES = {"float32", "float16", "bfloat16"}
# dtype codes of _speedups.fp8_decode (the extension has no stub: Any).
_FP8_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
_c: Any = _speedups


class CodecError(ValueError):
    """A stored block is corrupt or does not match its codec, dtype or length."""


def _dctx() -> zstandard.ZstdDecompressor:
    # ZstdDecompressor objects must not be shared between threads.
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def _read_planes(src: memoryview, k: int, n: int) -> tuple[np.ndarray, memoryview]:
    """Decode k plane frames of n bytes each; return a (k, n) uint8 array and the rest."""
    if len(src) < 4 * k:
        raise CodecError("plane table overruns block")
    sizes = struct.unpack_from(f"<{k}I", src, 0)
    off = 4 * k
    planes = np.empty((k, n), dtype=np.uint8)
    for j, fl in enumerate(sizes):
        if fl > len(src) - off:
            raise CodecError(f"plane {j} overruns block")
        frame = src[off : off + fl]
        try:
            params = zstandard.get_frame_parameters(frame)
            if params.content_size != n:
                raise CodecError(f"plane {j} declares {params.content_size} bytes, want {n}")
            data = _dctx().decompress(frame, max_output_size=n, allow_extra_data=False)
        except zstandard.ZstdError as e:
            raise CodecError(f"plane {j}: {e}") from e
        if len(data) != n:
            raise CodecError(f"plane {j} gave {len(data)} bytes, want {n}")
        planes[j] = np.frombuffer(data, dtype=np.uint8)
        off += fl
    return planes, src[off:]


def _decode_shuffled(src: memoryview, dtype: str, raw_len: int) -> bytes:
    w = _WIDTH[dtype]
    n = raw_len // w
    if len(src) < 1 or src[0] & ~_FLAG_ZERO_MAP:
        raise CodecError("shuffle flags")
    flags, src = src[0], src[1:]
    m, mask = n, None
    if flags & _FLAG_ZERO_MAP:
        if len(src) < 4:
            raise CodecError("zero map header")
        (m,) = struct.unpack_from("<I", src, 0)
        if m > n:
            raise CodecError(f"{m} non-zero elements of {n}")
        bm, src = _read_planes(src[4:], 1, (n + 7) // 8)
        bits = np.unpackbits(bm[0], bitorder="little")
        if bits[n:].any() or int(bits.sum()) != n - m:
            raise CodecError("zero map does not match its count")
        mask = bits[:n].astype(bool)
    planes, rest = _read_planes(src, w, m)
    if len(rest) != raw_len - n * w:
        raise CodecError(f"tail is {len(rest)} bytes, want {raw_len - n * w}")
    if w == 1:
        v = planes.reshape(m)
    else:
        v = np.ascontiguousarray(planes.T).view(np.dtype(_UINT[w]).newbyteorder("<")).reshape(m)
        if dtype in _FLOATS:  # undo the sign rotation (sign bit was moved to bit 0)
            v = (v >> 1) | ((v & 1) << np.array(8 * w - 1, dtype=v.dtype))
    if mask is not None:
        full = np.zeros(n, dtype=v.dtype)
        full[~mask] = v
        v = full
    return v.astype(v.dtype.newbyteorder("<"), copy=False).tobytes() + bytes(rest)


def _dequant(k: np.ndarray, q: float, dtype: str) -> np.ndarray:
    """The decoded values of quantized integers k at step q, as the Go decoder computes them."""
    v = k.astype(np.float64) * q
    if dtype == "float64":
        return v.astype("<f8")
    f = v.astype(np.float32)
    if dtype == "float32":
        return f.astype("<f4")
    if dtype == "float16":
        return f.astype("<f2")
    u = f.view(np.uint32)  # bfloat16: round to nearest even on the bit pattern
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype("<u2")


def _decode_quant(src: memoryview, dtype: str, raw_len: int) -> bytes:
    if dtype not in _QUANTIZABLE or raw_len % _WIDTH[dtype]:
        raise CodecError(f"lossy block of {dtype}, {raw_len} bytes")
    w = _WIDTH[dtype]
    n = raw_len // w
    if len(src) < 14:
        raise CodecError("short quant header")
    (q,) = struct.unpack_from("<d", src, 1)
    b = src[9]
    (nexc,) = struct.unpack_from("<I", src, 10)
    if not (0 < q < float("inf")) or not 1 <= b <= 4 or nexc > n:
        raise CodecError(f"step {q}, width {b}, {nexc} exceptions")
    p = src[14:]
    if len(p) < nexc * (4 + w):
        raise CodecError("exceptions overrun block")
    idx = np.frombuffer(p[: 4 * nexc], dtype="<u4").astype(np.int64)
    vals = np.frombuffer(p[4 * nexc : nexc * (4 + w)], dtype=np.uint8).reshape(nexc, w)
    planes, rest = _read_planes(p[nexc * (4 + w) :], b, n)
    if len(rest):
        raise CodecError(f"{len(rest)} trailing bytes")
    zz = planes[0].astype(np.uint32)
    for j in range(1, b):
        zz |= planes[j].astype(np.uint32) << np.uint32(8 * j)
    k = (zz >> np.uint32(1)).astype(np.int32) ^ -(zz & np.uint32(1)).astype(np.int32)
    out = _dequant(k, q, dtype)
    if nexc:
        if idx[-1] >= n or (nexc > 1 and not np.all(idx[1:] > idx[:-1])):
            raise CodecError("exception indices not increasing or out of range")
        out.view(np.uint8).reshape(n, w)[idx] = vals
    return out.tobytes()


def _decode_fp16(src: memoryview, dtype: str, raw_len: int) -> bytes:
    if dtype not in ("float32", "float64") or raw_len % _WIDTH[dtype]:
        raise CodecError(f"fp16 block of {dtype}, {raw_len} bytes")
    n = raw_len // _WIDTH[dtype]
    half = np.frombuffer(_decode_shuffled(src, "float16", 2 * n), dtype="<f2")
    return half.astype("<f4" if dtype == "float32" else "<f8").tobytes()


def _decode_fp8(src: memoryview, dtype: str, raw_len: int) -> bytes:
    if dtype not in _FP8_DTYPES or raw_len % _WIDTH[dtype] or raw_len == 0:
        raise CodecError(f"fp8 block of {dtype}, {raw_len} bytes")
    n = raw_len // _WIDTH[dtype]
    if len(src) < 9:
        raise CodecError("short fp8 header")
    row_len, first = struct.unpack_from("<II", src, 1)
    if not (1 <= first <= row_len and first <= n):
        raise CodecError(f"row length {row_len}, first part {first} of {n} values")
    groups = 1 + (n - first + row_len - 1) // row_len
    if len(src) != 9 + 4 * groups + n:
        raise CodecError(f"{len(src)} bytes for {groups} rows of {n} values")
    # One C pass (_speedups_fp8.c) checks the scales and codes and writes the result: numpy's
    # gather and rounding passes gave 1.3 GB/s of float32 and 0.5 GB/s of bfloat16 output.
    addr = np.frombuffer(src, dtype=np.uint8).__array_interface__["data"][0]
    try:
        out: bytes = _c.fp8_decode(addr, len(src), _FP8_KIND[dtype], n, row_len, first)
    except ValueError as e:
        raise CodecError(str(e)) from None
    return out


# transform (codec 20, docs/COMPRESSION.md 5.2): header mode, row_len, first, k, shift, width.
_TRANSFORM_HEADER = struct.Struct("<BIIHBB")
_PART_DIRECT, _PART_BASIS, _PART_ZERO = 0, 1, 2
_MAX_BASIS = 1024
# Mode 2: mode 0's integers with a Huffman table per channel group (header byte G after width).
_MODE_GROUPED = 2
_MAX_GROUPS = 16


_ZIGZAG8 = np.array([(z >> 1) ^ -(z & 1) for z in range(256)], dtype=np.float64)


def _zigzag_decode(z: np.ndarray) -> np.ndarray:
    """Zigzag integers (below 2**24; uint8 through a table) to their signed values, as float64
    (exact)."""
    if z.dtype == np.uint8:
        return np.take(_ZIGZAG8, z)
    zi = z.view(np.int32)
    return np.bitwise_xor(zi >> 1, -(zi & 1)).astype(np.float64)


def _round_dtype(f: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values to the packet's dtype, round to nearest even (as the Go decoder)."""
    if dtype == "float32":
        return f
    if dtype == "float16":
        return f.astype(np.float16)
    u = f.view(np.uint32).astype(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def _read_z(p: memoryview, width: int, m: int) -> tuple[np.ndarray, memoryview]:
    """One plane table of `width` planes of m zigzag integers: uint8 (width 1) or uint32."""
    pl, p = _read_planes(p, width, m)
    if width == 1:
        return pl[0], p
    z = pl[0].astype(np.uint32)
    for j in range(1, width):
        z |= pl[j].astype(np.uint32) << np.uint32(8 * j)
    return z, p


def _read_ints(p: memoryview, width: int, m: int) -> tuple[np.ndarray, memoryview]:
    """One plane table of `width` planes of m zigzag integers; the integers as float64."""
    z, p = _read_z(p, width, m)
    return _zigzag_decode(z), p


def _grouped_ints(
    p: memoryview, width: int, nc: int, m: int, grp: np.ndarray, ng: int,
    direct_p: np.ndarray, lens: np.ndarray, row_len: int,
) -> tuple[np.ndarray, memoryview]:
    """Mode 2's integer runs (coefficients; per channel group, its channels' values over the
    whole directly coded rows, channel by channel; the edge parts' values) back in mode 0's
    order: coefficients, then every direct part's values in part order. The zigzag codes are
    moved (one byte each where width is 1) and decoded once, in place."""
    dlens = lens[direct_p]
    whole = dlens == row_len
    nw = int(whole.sum())
    z = np.empty(m, dtype=np.uint8 if width == 1 else np.uint32)
    if nc:
        z[:nc], p = _read_z(p, width, nc)
    # Only the first and the last part can be shorter than a row, so in part order the whole
    # direct rows are one run of nw·row_len values, after the first part's if it is short.
    head = int(dlens[0]) if len(dlens) and not whole[0] else 0
    if nw:
        cols = np.empty((row_len, nw), dtype=z.dtype)  # channel by channel
        for g in range(ng):
            ch = np.flatnonzero(grp == g)
            if len(ch):
                v, p = _read_z(p, width, len(ch) * nw)
                cols[ch] = v.reshape(len(ch), nw)
        z[nc + head : nc + head + nw * row_len].reshape(nw, row_len)[...] = cols.T
    ne = m - nc - nw * row_len
    if ne:
        v, p = _read_z(p, width, ne)
        z[nc : nc + head] = v[:head]
        z[nc + head + nw * row_len :] = v[head:]
    return _zigzag_decode(z), p


def _row_parts(
    kinds: np.ndarray, steps32: np.ndarray, groups: int, first: int, row_len: int, n: int
) -> tuple[np.ndarray, ...]:
    """A transform block's row parts (docs/COMPRESSION.md 5.2): each part's bounds and length
    (first the ``first`` values that finish a row, then whole rows, the last possibly short),
    its kind as three masks (basis, direct, zero); kinds and steps checked."""
    lo = np.empty(groups, dtype=np.int64)
    lo[0] = 0
    lo[1:] = first + row_len * np.arange(groups - 1, dtype=np.int64)
    hi = np.minimum(n, lo + row_len)
    hi[0] = first
    lens = hi - lo
    if np.any(kinds > _PART_ZERO):
        raise CodecError(f"row part kind {int(kinds.max())}")
    basis_p, direct_p, zero_p = kinds == _PART_BASIS, kinds == _PART_DIRECT, kinds == _PART_ZERO
    with np.errstate(invalid="ignore"):
        if np.any((basis_p | direct_p) & ~(np.isfinite(steps32) & (steps32 > 0))):
            raise CodecError("row part step not finite and > 0")
    if np.any(steps32.view(np.uint32)[zero_p] != 0):
        raise CodecError("zero row part with a step")
    return lo, hi, lens, basis_p, direct_p, zero_p


def _decode_transform(src: memoryview, dtype: str, raw_len: int) -> bytes:
    """A mode-0 or mode-2 transform block: a basis of k integer vectors (value B·2**-shift),
    the rows' mean, one step and kind per row part, coefficients and direct values as plane
    frames (mode 2: kinds and steps in plane frames, the direct rows' values by channel group).
    A basis row decodes to float32(mean + (step·2**-shift)·(K @ B)): every product and sum of
    K @ B is an integer below 2**48, so float64 BLAS computes it exactly, in any order."""
    w = _WIDTH.get(dtype, 0)
    if dtype not in _FP8_DTYPES or raw_len % w or raw_len == 0:
        raise CodecError(f"transform block of {dtype}, {raw_len} bytes")
    n = raw_len // w
    if len(src) < _TRANSFORM_HEADER.size:
        raise CodecError("short transform header")
    mode, row_len, first, k, shift, width = _TRANSFORM_HEADER.unpack_from(src, 0)
    grouped = mode == _MODE_GROUPED
    if not (1 <= first <= row_len and first <= n):
        raise CodecError(f"row length {row_len}, first part {first} of {n} values")
    if k > _MAX_BASIS or k > row_len or k * row_len > n or shift > 15 or (k == 0 and shift != 0) or width > 3:
        raise CodecError(f"basis of {k} vectors, shift {shift}, width {width}")
    groups = 1 + (n - first + row_len - 1) // row_len
    hl = _TRANSFORM_HEADER.size + (1 if grouped else 0)
    if len(src) < hl:
        raise CodecError("short transform header")
    p = src[hl:]
    mean_len = 4 * row_len if k else 0
    grp = None
    ng = 1
    if grouped:
        ng = src[_TRANSFORM_HEADER.size]
        if not (1 <= ng <= _MAX_GROUPS) or (ng > 1 and row_len < ng):
            raise CodecError(f"{ng} channel groups for rows of {row_len}")
        map_len = (row_len + 1) // 2 if ng > 1 else 0
        if len(p) < mean_len + map_len:
            raise CodecError(f"{len(p)} bytes for the mean and the channel groups")
        grp = np.zeros(row_len, dtype=np.uint8)
        if ng > 1:
            nib = np.frombuffer(p[mean_len : mean_len + map_len], dtype=np.uint8)
            both = np.empty(2 * map_len, dtype=np.uint8)
            both[0::2], both[1::2] = nib & 15, nib >> 4
            if row_len % 2 and both[-1]:
                raise CodecError("channel group padding")
            grp = both[:row_len]
            if np.any(grp >= ng):
                raise CodecError("channel group out of range")
        mean = np.frombuffer(p[:mean_len], dtype="<f4").astype(np.float64)
        ks, p = _read_planes(p[mean_len + map_len :], 5, groups)
        kinds = ks[0]
        steps32 = np.ascontiguousarray(ks[1:].T).view("<f4").reshape(groups)
    else:
        if len(p) < mean_len + 5 * groups:
            raise CodecError(f"{len(p)} bytes for the mean and {groups} row parts")
        mean = np.frombuffer(p[:mean_len], dtype="<f4").astype(np.float64)
        kinds = np.frombuffer(p[mean_len : mean_len + groups], dtype=np.uint8)
        steps32 = np.frombuffer(p[mean_len + groups : mean_len + 5 * groups], dtype="<f4")
        p = p[mean_len + 5 * groups :]
    if not np.all(np.isfinite(mean)):
        raise CodecError("non-finite mean")
    lo, hi, lens, basis_p, direct_p, zero_p = _row_parts(kinds, steps32, groups, first, row_len, n)
    if np.any(basis_p) and (k == 0 or np.any(lens[basis_p] != row_len)):
        raise CodecError("basis row part without a basis or not a whole row")
    nb = int(basis_p.sum())
    m = nb * k + int(lens[direct_p].sum())
    basis = None
    if k:
        pl, p = _read_planes(p, 2, k * row_len)
        z = pl[0].astype(np.uint32) | (pl[1].astype(np.uint32) << np.uint32(8))
        if np.any(z == 0xFFFF):
            raise CodecError("basis value out of range")
        basis = _zigzag_decode(z).reshape(k, row_len)
    if (m > 0) != (width > 0):
        raise CodecError(f"{m} integers of width {width}")
    ints = np.zeros(0, dtype=np.float64)
    if m and grouped:
        assert grp is not None
        ints, p = _grouped_ints(p, width, nb * k, m, grp, ng, direct_p, lens, row_len)
    elif m:
        ints, p = _read_ints(p, width, m)
    if len(p):
        raise CodecError(f"{len(p)} trailing bytes")
    steps = steps32.astype(np.float64)
    if direct_p.all():  # the common block: every part coded directly
        q = np.repeat(steps, lens)
        np.multiply(q, ints, out=q)
        return _round_dtype(q.astype(np.float32), dtype).tobytes()
    f = np.zeros(n, dtype=np.float32)
    if nb:
        assert basis is not None
        coefs = ints[: nb * k].reshape(k, nb).T  # component-major in the block
        acc = coefs @ basis  # exact: integers below 2**48
        qs = np.ldexp(steps[basis_p], -shift)
        rows = (mean + qs[:, None] * acc).astype(np.float32)
        f[np.repeat(basis_p, lens)] = rows.reshape(-1)
    if np.any(direct_p):
        # Every directly coded value times its part's step, in part order.
        q = np.repeat(steps[direct_p], lens[direct_p])
        f[np.repeat(direct_p, lens)] = (q * ints[nb * k :]).astype(np.float32)
    return _round_dtype(f, dtype).tobytes()


# Modes 3 and 4 (docs/COMPRESSION.md 5.3): a module's shared basis packet, and blocks coded on it.
_MODE_BASIS, _MODE_SHARED = 3, 4
_BASIS_HEADER = struct.Struct("<BIHB")  # mode, d, k, shift
_SHARED_HEADER = struct.Struct("<BIIHBI")  # mode, row_len, first, k, groups, crc32 of the basis packet
_MAX_SHARED_BASIS = 2048
_MAX_SHARED_ENTRIES = 1 << 22
_SHARED_BAND = 16


class SharedBasis:
    """A module's transform basis (mode-3 packet): k integer vectors of d (value B·2**-shift)
    and the rows' mean; the mode-4 blocks coded on it name it by the packet's crc32.

    Args:
        packet: the basis packet's bytes, as strapd stored them.

    Raises:
        CodecError: the packet is corrupt.

    Example:
        >>> sb = SharedBasis(packet)
        >>> raw = decode_block(TRANSFORM, stored, "bfloat16", raw_len, basis=sb)
    """

    def __init__(self, packet: bytes) -> None:
        src = memoryview(packet).cast("B")
        if len(src) < _BASIS_HEADER.size or src[0] != _MODE_BASIS:
            raise CodecError("basis packet header")
        _, d, k, shift = _BASIS_HEADER.unpack_from(src, 0)
        if d < 1 or k < 1 or k > d or k > _MAX_SHARED_BASIS or k * d > _MAX_SHARED_ENTRIES or shift > 15:
            raise CodecError(f"basis of {k} vectors of {d}, shift {shift}")
        hl = _BASIS_HEADER.size
        if len(src) < hl + 4 * d:
            raise CodecError("basis mean")
        with np.errstate(invalid="ignore"):
            mean = np.frombuffer(src[hl : hl + 4 * d], dtype="<f4").astype(np.float64)
        if not np.all(np.isfinite(mean)):
            raise CodecError("non-finite basis mean")
        pl, rest = _read_planes(src[hl + 4 * d :], 2, k * d)
        if len(rest):
            raise CodecError(f"{len(rest)} bytes after the basis")
        z = pl[0].astype(np.uint32) | (pl[1].astype(np.uint32) << np.uint32(8))
        if np.any(z == 0xFFFF):
            raise CodecError("basis value out of range")
        #: Row length, number of vectors, scale exponent.
        self.d, self.k, self.shift = d, k, shift
        self.mean = mean
        self.basis = _zigzag_decode(z).reshape(k, d)
        #: crc32 of the packet (what a mode-4 block names).
        self.crc = zlib.crc32(packet) & 0xFFFFFFFF


def _read_run(p: memoryview, r: int) -> tuple[np.ndarray, memoryview]:
    """One run of mode 4: u8 width (0: all zeros), then a plane table; r integers as float64."""
    if len(p) < 1:
        raise CodecError("run width")
    width = p[0]
    if width > 3 or (r == 0 and width):
        raise CodecError(f"run of {r} integers of width {width}")
    if width == 0:
        return np.zeros(r, dtype=np.float64), p[1:]
    return _read_ints(p[1:], width, r)


def _decode_shared(src: memoryview, dtype: str, raw_len: int, sb: SharedBasis | None) -> bytes:
    """A mode-4 transform block: rows coded on the module's shared basis sb (coefficients in
    bands of 16 components), the others as mode 2's directly coded rows. A basis row decodes to
    float32(mean + (step·2**-shift)·(K @ B)), exact as in mode 0."""
    w = _WIDTH.get(dtype, 0)
    if dtype not in _FP8_DTYPES or raw_len % w or raw_len == 0:
        raise CodecError(f"transform block of {dtype}, {raw_len} bytes")
    n = raw_len // w
    if len(src) < _SHARED_HEADER.size:
        raise CodecError("short transform header")
    _, row_len, first, k, ng, crc = _SHARED_HEADER.unpack_from(src, 0)
    if sb is None or sb.crc != crc:
        have = "none" if sb is None else f"{sb.crc:08x}"
        raise CodecError(f"block coded on basis packet crc32 {crc:08x}, given {have}")
    if row_len != sb.d or k > sb.k or not (1 <= first <= row_len and first <= n):
        raise CodecError(f"rows of {row_len} (basis {sb.d}), k {k} of {sb.k}, first part {first} of {n} values")
    if not (1 <= ng <= _MAX_GROUPS) or (ng > 1 and row_len < ng):
        raise CodecError(f"{ng} channel groups for rows of {row_len}")
    groups = 1 + (n - first + row_len - 1) // row_len
    p = src[_SHARED_HEADER.size :]
    grp = np.zeros(row_len, dtype=np.uint8)
    if ng > 1:
        map_len = (row_len + 1) // 2
        if len(p) < map_len:
            raise CodecError("channel groups")
        nib = np.frombuffer(p[:map_len], dtype=np.uint8)
        both = np.empty(2 * map_len, dtype=np.uint8)
        both[0::2], both[1::2] = nib & 15, nib >> 4
        if row_len % 2 and both[-1]:
            raise CodecError("channel group padding")
        grp = both[:row_len]
        if np.any(grp >= ng):
            raise CodecError("channel group out of range")
        p = p[map_len:]
    ks, p = _read_planes(p, 5, groups)
    kinds = ks[0]
    steps32 = np.ascontiguousarray(ks[1:].T).view("<f4").reshape(groups)
    lo, hi, lens, basis_p, direct_p, zero_p = _row_parts(kinds, steps32, groups, first, row_len, n)
    if np.any(lens[basis_p] != row_len):
        raise CodecError("basis row part not a whole row")
    whole = direct_p & (lens == row_len)
    edge_p = direct_p & ~whole
    nb, nw = int(basis_p.sum()), int(whole.sum())
    coefs = np.empty(nb * k, dtype=np.float64)  # component-major
    for b0 in range(0, k, _SHARED_BAND):
        a, b = b0 * nb, min(k, b0 + _SHARED_BAND) * nb
        coefs[a:b], p = _read_run(p, b - a)
    cols = np.empty((row_len, nw), dtype=np.float64)  # channel by channel
    for g in range(ng):
        ch = np.flatnonzero(grp == g)
        v, p = _read_run(p, len(ch) * nw)
        if len(ch):
            cols[ch] = v.reshape(len(ch), nw)
    edge, p = _read_run(p, int(lens[edge_p].sum()))
    if len(p):
        raise CodecError(f"{len(p)} trailing bytes")
    steps = steps32.astype(np.float64)
    f = np.zeros(n, dtype=np.float32)
    if nb:
        acc = coefs.reshape(k, nb).T @ sb.basis[:k]  # exact: integers below 2**49
        qs = np.ldexp(steps[basis_p], -sb.shift)
        f[np.repeat(basis_p, lens)] = (sb.mean + qs[:, None] * acc).astype(np.float32).reshape(-1)
    if nw:
        f[np.repeat(whole, lens)] = (cols.T * steps[whole][:, None]).astype(np.float32).reshape(-1)
    if len(edge):
        f[np.repeat(edge_p, lens)] = (np.repeat(steps[edge_p], lens[edge_p]) * edge).astype(np.float32)
    return _round_dtype(f, dtype).tobytes()


def decode_block(
    codec_id: int, data: bytes, dtype: str, raw_len: int, basis: SharedBasis | None = None,
) -> bytes:
    """Decode one stored block of an activation codec.

    Args:
        codec_id: the packet's codec number (16 shuffle, 17 quant, 18 fp16, 19 fp8, 20 transform).
        data: the stored block (one entry of the packet's block table).
        dtype: the packet's dtype name (docs/STREAM_FORMAT.md section 4), e.g. "float32".
        raw_len: the block's decoded size in bytes.
        basis: for a transform block coded on its module's shared basis (mode 4), that basis
            (``SharedBasis`` of the module's basis packet); other blocks ignore it.

    Returns:
        The raw little-endian element bytes, bit-identical to the Go decoder's output.

    Raises:
        CodecError: the block is corrupt, or the codec id or dtype is unknown.

    Example:
        >>> raw = decode_block(16, stored, "float32", 4096)
    """
    if dtype not in _WIDTH:
        raise CodecError(f"unknown dtype {dtype!r}")
    if not 0 <= raw_len <= MAX_BLOCK_SIZE:
        raise CodecError(f"raw length {raw_len} not in 0..{MAX_BLOCK_SIZE}")
    src = memoryview(data).cast("B")
    if codec_id == SHUFFLE:
        return _decode_shuffled(src, dtype, raw_len)
    if codec_id not in (QUANT, FP16, FP8, TRANSFORM):
        raise CodecError(f"unknown activation codec {codec_id}")
    if len(src) < 1:
        raise CodecError("empty block")
    mode = src[0]
    if mode == _MODE_LOSSLESS:
        return _decode_shuffled(src[1:], dtype, raw_len)
    if codec_id == TRANSFORM and mode == _MODE_GROUPED:
        return _decode_transform(src, dtype, raw_len)
    if codec_id == TRANSFORM and mode == _MODE_SHARED:
        return _decode_shared(src, dtype, raw_len, basis)
    if codec_id == TRANSFORM and mode == _MODE_BASIS:
        raise CodecError("a transform basis packet is not a data block (read it with SharedBasis)")
    if mode != _MODE_LOSSY:
        raise CodecError(f"mode {mode}")
    if codec_id == QUANT:
        return _decode_quant(src, dtype, raw_len)
    if codec_id == FP8:
        return _decode_fp8(src, dtype, raw_len)
    if codec_id == TRANSFORM:
        return _decode_transform(src, dtype, raw_len)
    return _decode_fp16(src[1:], dtype, raw_len)
