"""Codec and lossy-bound configuration (docs/COMPRESSION.md 7), the trace option, and
what OPEN carries for them."""

from __future__ import annotations

import pytest

from llm_instrumentation import InstrumentationConfig
from llm_instrumentation.config import PRESETS


@pytest.mark.parametrize("codec,lossy,want", [
    ("quant", "rel:1e-3", "rel:0.001"),
    ("quant", " abs:0.01", "abs:0.01"),
    ("quant", {"mode": "rel", "value": 2e-3}, "rel:0.002"),
    ("quant", {"mode": "abs", "value": 1}, "abs:1.0"),
    ("fp16", None, "fp16:0.0"),
    ("fp16", "fp16", "fp16:0.0"),
    ("fp16", "fp16:1e-3", "fp16:0.001"),
    ("shuffle", None, None),
    ("none", None, None),
    ("zstd", None, None),
])
def test_lossy_normalized(codec, lossy, want):
    cfg = InstrumentationConfig(compression_algorithm=codec, lossy=lossy)
    assert cfg.lossy == want
    plan = cfg.transport_plan(cores=2)
    if want is None:
        assert cfg.lossy_bound is None and plan.lossy is None
    else:
        mode, _, value = want.partition(":")
        assert plan.lossy == cfg.lossy_bound == {"mode": mode, "value": float(value)}


@pytest.mark.parametrize("codec,lossy,exc,match", [
    ("quant", None, ValueError, "needs a bound"),
    ("shuffle", "rel:1e-3", ValueError, "needs a lossy codec"),
    ("lz4", {"mode": "abs", "value": 1.0}, ValueError, "needs a lossy codec"),
    ("quant", "fp16", ValueError, "does not fit"),
    ("fp16", "rel:1e-3", ValueError, "does not fit"),
    ("quant", "rel:0", ValueError, "> 0"),
    ("quant", "abs:-1", ValueError, ">= 0"),
    ("quant", "rel:nan", ValueError, "finite"),
    ("quant", "rel:inf", ValueError, "finite"),
    ("quant", "rel:", ValueError, "missing value"),
    ("quant", "rel:abc", ValueError, "not a number"),
    ("quant", {"mode": "rel"}, ValueError, "> 0"),
    ("quant", {"mode": "rel", "value": 1e-3, "extra": 1}, ValueError, "dict must be"),
    ("quant", {"mode": "rel", "value": "1e-3"}, TypeError, "number"),
    ("quant", 0.001, TypeError, "str like"),
    ("quant", "auto", ValueError, "does not fit"),
])
def test_lossy_refused(codec, lossy, exc, match):
    with pytest.raises(exc, match=match):
        InstrumentationConfig(compression_algorithm=codec, lossy=lossy)


def test_with_compression_builder():
    base = InstrumentationConfig.balanced()
    q = base.with_compression("quant", lossy="abs:1e-2")
    assert (q.compression_algorithm, q.compression_level, q.lossy) == ("quant", None, "abs:0.01")
    # Switching back to a lossless codec drops the bound (the builder sets all three).
    assert base.with_compression("zstd", 2).lossy is None
    assert q.with_compression("shuffle", 3).compression_level == 3
    with pytest.raises(ValueError, match="needs a bound"):
        base.with_compression("quant")
    with pytest.raises(ValueError, match="out of range"):
        base.with_compression("shuffle", 5)


def test_only_max_compression_is_lossy():
    lossy = {name for name, f in PRESETS.items() if f().lossy is not None}
    assert lossy == {"max_compression"}
    mc = InstrumentationConfig.max_compression()
    assert mc.lossy_bound == {"mode": "rel", "value": 1e-3}
    assert InstrumentationConfig().compression_algorithm == InstrumentationConfig.balanced().compression_algorithm


def test_lossy_codec_never_swapped_by_throughput_target():
    cfg = InstrumentationConfig.max_compression().with_throughput_target(100.0)
    plan = cfg.transport_plan(cores=2)
    assert (plan.codec, plan.lossy) == ("quant", {"mode": "rel", "value": 1e-3})
    assert "may not sustain" in plan.note
    # The default codec (none named), too slow for the target, falls back to none (lossless
    # either way); a preset names its codec, so balanced() keeps shuffle and only notes it.
    plan = InstrumentationConfig().with_throughput_target(100.0).transport_plan(cores=2)
    assert plan.codec == "none" and plan.lossy is None and plan.note
    plan = InstrumentationConfig.balanced().with_throughput_target(100.0).transport_plan(cores=2)
    assert plan.codec == "shuffle" and "kept because it was named" in plan.note


def test_trace_option():
    assert InstrumentationConfig().trace is False
    assert InstrumentationConfig().with_trace().trace is True
    assert InstrumentationConfig().with_trace().to_dict()["trace"] is True
    with pytest.raises(TypeError, match="bool"):
        InstrumentationConfig(trace="yes")  # type: ignore[arg-type]


def test_open_body_carries_lossy(fake_daemon, tmp_path):
    import torch
    from conftest import tiny_gpt2

    from llm_instrumentation import capture_activations

    m = tiny_gpt2()
    cfg = InstrumentationConfig.max_compression()
    # The fake daemon cannot encode quant; it only records OPEN (and stores packets raw).
    with torch.no_grad():
        with capture_activations(m, config=cfg, output_path=tmp_path / "q.strap", socket_path=fake_daemon.path,
                                 autostart_daemon=False):
            m(input_ids=torch.tensor([[1, 2, 3]]))
    body = fake_daemon.sessions[-1]["open"]
    assert body["codec"] == "quant" and body["lossy"] == {"mode": "rel", "value": 1e-3}
    assert body["metadata"]["capture_config"]["lossy"] == "rel:0.001"
