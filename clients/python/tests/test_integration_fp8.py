"""The fp8 codec (docs/COMPRESSION.md 5) through the real strapd: every value read back
equals an independent e4m3 reference (torch's float8_e4m3fn, one scale max|x|/448 per row
part), each packet's per-row error report equals the one recomputed here, and
analyze_activations / strapd inspect / strapd verify agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from test_integration_lossy_trace import capture_with_ref, minilm, run

from llm_instrumentation import InstrumentationConfig, analyze_activations, open_stream
from llm_instrumentation._activation_codecs import E4M3

pytestmark = pytest.mark.integration


def test_e4m3_table_matches_torch() -> None:
    ref = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(np.isnan(ref), np.isnan(E4M3))
    ok = ~np.isnan(ref)
    assert np.array_equal(ref[ok], E4M3[ok]) and np.array_equal(np.signbit(ref[ok]), np.signbit(E4M3[ok]))


def reference_decode(x: np.ndarray, row_len: int, block_elems: int, dtype: torch.dtype) -> np.ndarray:
    """What fp8 must decode to for the flat float64 values x of one packet: parts are rows cut
    where blocks are cut, each with scale float32(max|x|/448); codes are x/scale rounded to
    nearest even at e4m3's spacing (2^(e-3) for |r| in [2^e, 2^(e+1)), e ≥ -6; 2^-9 below),
    saturating at ±448; values float32(code × scale) rounded to the packet's dtype. (Not
    torch's conversion: it rounds float64 through float32 first, a double rounding.)"""
    n = x.size
    cuts = np.union1d(np.arange(0, n, row_len), np.arange(0, n, block_elems))
    amax = np.maximum.reduceat(np.abs(x), cuts)
    scale = (amax / 448).astype(np.float32)
    part = np.repeat(np.arange(cuts.size), np.diff(np.append(cuts, n)))
    s = scale[part].astype(np.float64)
    r = np.divide(x, s, out=np.zeros_like(x), where=s > 0)
    r = np.where(s > 0, r, np.copysign(0.0, x))
    _, e = np.frexp(np.abs(r))  # |r| in [2^(e-1), 2^e)
    q = np.exp2(np.maximum(e - 1, -6) - 3.0)
    code = np.clip(np.round(r / q) * q, -448, 448).astype(np.float32)  # np.round: half to even
    y = code * scale[part]  # float32 × float32
    return torch.from_numpy(y).to(dtype).double().numpy()


def check_fp8_stream(path: Path, ref: Dict[str, List[torch.Tensor]], names: List[str]) -> Dict[str, float]:
    worst = {"rel_l2_max": 0.0, "cos_min": 1.0, "rows": 0}
    with open_stream(path) as r:
        for name in names:
            got = r.tensors(name)
            assert len(got) == len(ref[name]), name
            for g, want_t in zip(got, ref[name]):
                row_len = want_t.shape[-1]
                flat_want = want_t.double().reshape(-1).numpy()
                flat_got = g.tensor().double().reshape(-1).numpy()
                el = want_t.element_size()
                for p in g.packets:
                    rep = p.meta["lossy"]
                    assert rep["mode"] == "fp8" and rep["bound"] == 0 and rep["lossless_blocks"] == 0, rep
                    lo, hi = p.part_offset // el, (p.part_offset + p.raw_len) // el
                    assert lo % row_len == 0, "parts of these small tensors start at a row"
                    want = reference_decode(flat_want[lo:hi], row_len, p.block_size // el, want_t.dtype)
                    assert np.array_equal(flat_got[lo:hi], want), f"{name}: not the e4m3 reference"
                    # The per-row report equals what the rows give here.
                    x = flat_want[lo:hi].reshape(-1, row_len)
                    y = flat_got[lo:hi].reshape(-1, row_len)
                    ss = (x * x).sum(1)
                    rel = np.sqrt(((x - y) ** 2).sum(1) / np.where(ss > 0, ss, 1))
                    cos = np.where(ss > 0, (x * y).sum(1) / np.sqrt(ss * np.maximum((y * y).sum(1), 1e-300)), 1.0)
                    rows = rep["rows"]
                    assert rows["n"] == x.shape[0], (name, rows)
                    assert rows["rel_l2_max"] == pytest.approx(rel.max(), rel=1e-9)
                    assert rows["cos_min"] == pytest.approx(cos.min(), rel=1e-12)
                    k50, k99 = int(np.ceil(0.5 * rel.size)) - 1, int(np.ceil(0.99 * rel.size)) - 1
                    assert rows["rel_l2_p50"] == pytest.approx(np.sort(rel)[k50], rel=1e-9)
                    assert rows["rel_l2_p99"] == pytest.approx(np.sort(rel)[k99], rel=1e-9)
                    worst["rel_l2_max"] = max(worst["rel_l2_max"], float(rel.max()))
                    worst["cos_min"] = min(worst["cos_min"], float(cos.min()))
                    worst["rows"] += x.shape[0]
    return worst


@pytest.mark.parametrize("block_size", [None, 4096])
def test_fp8_trained_minilm(real_strapd, tmp_path, block_size) -> None:
    model, enc = minilm()
    cfg = InstrumentationConfig().with_compression("fp8")
    if block_size:
        cfg.block_size = block_size  # rows of 384/1536 float32 cut across blocks
    out = tmp_path / "fp8.strap"
    fw, ref = capture_with_ref(model, [enc], out, real_strapd.socket, cfg)
    worst = check_fp8_stream(out, ref, fw.hooked_modules)
    # Issue 40's targets on a trained model's fp32 activations.
    assert worst["rel_l2_max"] <= 0.04 and worst["cos_min"] >= 0.999, worst

    a = analyze_activations(out)
    assert a["end_status"] == "complete" and a["metadata"]["codec"] == "fp8"
    lo = a["lossy"]
    assert lo["mode"] == "fp8" and lo["exceeded"] == 0
    assert lo["rows"]["rel_l2_max"] == pytest.approx(worst["rel_l2_max"], rel=1e-9)
    assert lo["rows"]["cos_min"] == pytest.approx(worst["cos_min"], rel=1e-12)
    assert a["compression_ratio"] > 3.9, a["compression_ratio"]
    ins = json.loads(run("inspect", "--json", str(out)))
    assert ins["lossy"]["rows"]["n"] == lo["rows"]["n"] >= worst["rows"]
    assert ins["lossy"]["rows"]["rel_l2_max"] == pytest.approx(worst["rel_l2_max"], rel=1e-9)
    assert "per-row error" in run("inspect", str(out))
    assert "end status complete" in run("verify", str(out))


def test_fp8_bf16_model(real_strapd, tmp_path) -> None:
    model = tiny_llama(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    inputs = [{"input_ids": torch.randint(0, 1000, (2, 11), generator=g)} for _ in range(2)]
    cfg = InstrumentationConfig().with_compression("fp8")
    fw, ref = capture_with_ref(model, inputs, tmp_path / "b.strap", real_strapd.socket, cfg)
    check_fp8_stream(tmp_path / "b.strap", ref, fw.hooked_modules)
    a = analyze_activations(tmp_path / "b.strap")
    assert a["lossy"]["mode"] == "fp8" and a["compression_ratio"] > 1.8, a["compression_ratio"]


def test_fp8_needs_to_be_named() -> None:
    # Lossy is opt-in: no preset or default picks fp8, and other codecs refuse its bound.
    assert InstrumentationConfig().compression_algorithm != "fp8"
    with pytest.raises(ValueError):
        InstrumentationConfig(compression_algorithm="shuffle", lossy="fp8")
    with pytest.raises(ValueError):
        InstrumentationConfig(compression_algorithm="fp8", lossy="rel:1e-3")
