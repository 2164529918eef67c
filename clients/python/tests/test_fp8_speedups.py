"""The fp8 block decoder in C (_speedups_fp8.c, both its AVX2 and its portable loop) against the
numpy decoder it replaced, kept here as the reference: the same bytes for every code under
scales of every binade (float32 subnormal scales, products that overflow float16 or float32,
float16 subnormal results, bfloat16 round-half-even ties), for every row layout, and the same
CodecError for bad scales and NaN codes. The golden vectors of the Go encoder are
test_activation_codecs.py's."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from llm_instrumentation import _speedups
from llm_instrumentation._activation_codecs import E4M3, FP8, CodecError, decode_block

DTYPES = ["float32", "float16", "bfloat16"]
KIND = {"float32": 0, "float16": 1, "bfloat16": 2}


def numpy_fp8_rows(codes: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    """The numpy decoder of 2026-12 (_activation_codecs._fp8_rows): float32(E4M3[code] x scale),
    then float16 by astype, bfloat16 by round-half-even on the bits; one row part a row."""
    with np.errstate(over="ignore"):  # scales near float32's top overflow, as they may
        f = np.take(E4M3, codes) * scales[:, None]
        if dtype == "float32":
            return f
        if dtype == "float16":
            return f.astype(np.float16).view(np.uint16)
    u = f.view(np.uint32).copy()
    u += ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return (u >> np.uint32(16)).astype(np.uint16)


def numpy_decode(block: bytes, dtype: str, n: int) -> bytes:
    row_len, first = struct.unpack_from("<II", block, 1)
    groups = 1 + (n - first + row_len - 1) // row_len
    scales = np.frombuffer(block, dtype="<f4", count=groups, offset=9)
    codes = np.frombuffer(block, dtype=np.uint8, count=n, offset=9 + 4 * groups)
    out = []
    lo = 0
    for g in range(groups):
        hi = first if g == 0 else min(n, lo + row_len)
        out.append(numpy_fp8_rows(codes[None, lo:hi], scales[g : g + 1], dtype).ravel())
        lo = hi
    return np.concatenate(out).astype("<f4" if dtype == "float32" else "<u2").tobytes()


def block(codes: np.ndarray, scales: np.ndarray, row_len: int, first: int) -> bytes:
    return struct.pack("<BII", 0, row_len, first) + scales.astype("<f4").tobytes() + codes.astype(np.uint8).tobytes()


def c_decode(b: bytes, dtype: str, n: int, portable: bool) -> bytes:
    row_len, first = struct.unpack_from("<II", b, 1)
    addr = np.frombuffer(b, dtype=np.uint8).__array_interface__["data"][0]
    out: bytes = _speedups.fp8_decode(addr, len(b), KIND[dtype], n, row_len, first, portable)
    return out


def scale_sample(rng: np.random.Generator, k: int) -> np.ndarray:
    """Finite non-negative float32 scales of every binade, subnormals and 0 included, and the
    scales whose products tie under bfloat16 rounding or sit at float16's limits."""
    bits = rng.integers(0, 0x7F800000, size=k, dtype=np.uint32)
    special = np.array([0.0, 1.0, 2.0**-126, 2.0**-149, 3.4e38, 65504 / 448, 65520 / 448, 2.0**-24 / 448,
                        2.0**-25, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 2.0**-14 / 448], dtype=np.float32)
    return np.concatenate([bits.view(np.float32), special])


NON_NAN = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("portable", [False, True])
def test_every_code_under_every_binade(dtype: str, portable: bool) -> None:
    rng = np.random.default_rng(19)
    scales = scale_sample(rng, 6000)
    # One row part of all 254 codes (shuffled) per scale: 254 is not a multiple of 8, so
    # every part ends with the scalar tail.
    codes = np.concatenate([rng.permutation(NON_NAN) for _ in scales])
    n = codes.size
    b = block(codes, scales, 254, 254)
    want = numpy_decode(b, dtype, n)
    assert c_decode(b, dtype, n, portable) == want
    if not portable:
        assert decode_block(FP8, b, dtype, n * (4 if dtype == "float32" else 2)) == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_layouts(dtype: str) -> None:
    rng = np.random.default_rng(40)
    for _ in range(300):
        n = int(rng.integers(1, 3000))
        row_len = int(rng.integers(1, 700))
        first = int(rng.integers(1, min(row_len, n) + 1))
        groups = 1 + (n - first + row_len - 1) // row_len
        codes = rng.choice(NON_NAN, size=n)
        scales = np.abs(rng.normal(size=groups) * 10.0 ** rng.integers(-8, 8, size=groups)).astype(np.float32)
        b = block(codes, scales, row_len, first)
        want = numpy_decode(b, dtype, n)
        for portable in (False, True):
            assert c_decode(b, dtype, n, portable) == want, (n, row_len, first)
        # From a memoryview into a larger buffer, as the stream reader passes blocks.
        mv = memoryview(b"\x99" * 7 + b + b"\x99" * 5)[7 : 7 + len(b)]
        assert decode_block(FP8, mv, dtype, n * (4 if dtype == "float32" else 2)) == want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [-0.0, -1.0, float("inf"), float("nan"), -float("nan")])
def test_bad_scale(dtype: str, bad: float) -> None:
    codes = np.zeros(40, dtype=np.uint8)
    scales = np.array([1.0, bad, 1.0], dtype=np.float32)
    b = block(codes, scales, 16, 8)
    with pytest.raises(CodecError, match="scale negative or not finite"):
        decode_block(FP8, b, dtype, 40 * (4 if dtype == "float32" else 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", [0, 5, 7, 8, 30, 63, 64, 99])
@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_nan_code(dtype: str, where: int, code: int) -> None:
    codes = np.full(100, 0x38, dtype=np.uint8)
    codes[where] = code
    b = block(codes, np.array([2.0, 3.0], dtype=np.float32), 64, 64)
    with pytest.raises(CodecError, match="NaN code in an fp8 block"):
        decode_block(FP8, b, dtype, 100 * (4 if dtype == "float32" else 2))
    for portable in (False, True):
        with pytest.raises(ValueError, match="NaN code"):
            c_decode(b, dtype, 100, portable)


def test_arguments_checked() -> None:
    b = block(np.zeros(8, dtype=np.uint8), np.array([1.0], dtype=np.float32), 8, 8)
    addr = np.frombuffer(b, dtype=np.uint8).__array_interface__["data"][0]
    for args in [(addr, len(b) - 1, 0, 8, 8, 8), (addr, len(b), 3, 8, 8, 8), (addr, len(b), 0, 8, 8, 9),
                 (0, len(b), 0, 8, 8, 8), (addr, len(b), 0, 0, 8, 8), (addr, len(b), 0, 8, 8, 0)]:
        with pytest.raises(ValueError):
            _speedups.fp8_decode(*args)
    with pytest.raises(TypeError):
        _speedups.fp8_decode(addr, len(b), 0, 8)
