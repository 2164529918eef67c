"""InstrumentationConfig: presets, builders, validation and the transport plan."""

from __future__ import annotations

import pytest

from llm_instrumentation import HookGranularity, InstrumentationConfig


@pytest.mark.parametrize("preset,codec,level,gran", [
    ("fast_capture", "none", None, HookGranularity.FULL_TENSOR),
    ("balanced", "shuffle", 0, HookGranularity.FULL_TENSOR),
    ("max", "shuffle", 0, HookGranularity.FULL_TENSOR),
    ("max_compression", "quant", 0, HookGranularity.FULL_TENSOR),
    ("attention_analysis", "shuffle", None, HookGranularity.ATTENTION_ONLY),
    ("mlp_analysis", "shuffle", None, HookGranularity.MLP_ONLY),
])
def test_presets(preset, codec, level, gran):
    cfg = getattr(InstrumentationConfig, preset)()
    assert (cfg.compression_algorithm, cfg.compression_level, cfg.granularity) == (codec, level, gran)
    assert InstrumentationConfig.from_preset(preset) == cfg


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        InstrumentationConfig.from_preset("turbo")


def test_builders_change_the_config_and_return_it():
    """1.3.1's builders mutated and returned self: ``cfg = cfg.with_x()`` and a bare
    ``cfg.with_x()`` both take effect; ``copy()`` gives an independent config."""
    cases = [
        (lambda c: c.with_compression("zstd", 2), dict(compression_algorithm="zstd", compression_level=2)),
        (lambda c: c.with_memory_limit(0.5), dict(max_memory_gb=0.5)),
        (lambda c: c.with_granularity("mlp_only"), dict(granularity=HookGranularity.MLP_ONLY)),
        (lambda c: c.with_modules("model.layers.*.mlp"), dict(modules=("model.layers.*.mlp",))),
        (lambda c: c.with_throughput_target(1.5), dict(target_throughput_gbps=1.5)),
        (lambda c: c.with_throughput(2.5), dict(target_throughput_gbps=2.5)),
        (lambda c: c.with_backpressure("drop"), dict(backpressure="drop")),
        (lambda c: c.with_sampled_positions([0, -1]), dict(sampled_positions=(0, -1))),
    ]
    for build, want in cases:
        base = InstrumentationConfig.balanced()
        keep = base.copy()
        assert build(base) is base
        for k, v in want.items():
            assert getattr(base, k) == v, k
        assert keep == InstrumentationConfig.balanced() and keep != base
    # attribute assignment is validated like the constructor, and all-or-nothing
    cfg = InstrumentationConfig.balanced()
    cfg.max_memory_gb = 0.5
    assert cfg.ring_size == 512 << 20
    with pytest.raises(TypeError, match="number"):
        cfg.max_memory_gb = "1"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="needs a bound"):
        cfg.with_compression("quant")
    assert (cfg.max_memory_gb, cfg.compression_algorithm) == (0.5, "shuffle")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(compression_algorithm="brotli"), ValueError, "not supported"),
    (dict(compression_algorithm="lz4", compression_level=10), ValueError, "out of range"),
    (dict(compression_algorithm="zstd", compression_level=5), ValueError, "out of range"),
    (dict(compression_algorithm="none", compression_level=1), ValueError, "out of range"),
    (dict(compression_level=1.5), TypeError, "int"),
    (dict(target_throughput_gbps=0), ValueError, "positive"),
    (dict(target_throughput_gbps=-1.0), ValueError, "positive"),
    (dict(max_memory_gb=0), ValueError, "ring"),
    (dict(max_memory_gb=1e-6), ValueError, "ring"),
    (dict(max_memory_gb=float("inf")), ValueError, "ring"),
    (dict(max_memory_gb="1"), TypeError, "number"),
    (dict(backpressure="spill"), ValueError, "backpressure"),
    (dict(granularity="everything"), ValueError, "granularity"),
    (dict(sampled_positions=0), ValueError, ">= 1"),
    (dict(sampled_positions=()), ValueError, "non-empty"),
    (dict(sampled_positions=True), TypeError, "stride"),
    (dict(modules=("",)), ValueError, "non-empty"),
])
def test_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        InstrumentationConfig(**kwargs)


def test_granularity_by_name_or_value():
    assert InstrumentationConfig(granularity="MLP_ONLY").granularity is HookGranularity.MLP_ONLY
    assert InstrumentationConfig(granularity="mlp_only").granularity is HookGranularity.MLP_ONLY


def test_builder_validates():
    with pytest.raises(ValueError):
        InstrumentationConfig().with_compression("lzma")
    with pytest.raises(ValueError):
        InstrumentationConfig().with_backpressure("maybe")


def test_ring_size_from_memory_limit():
    plan = InstrumentationConfig().with_memory_limit(0.5).transport_plan(cores=2)
    assert plan.ring_size == 512 << 20 and plan.memory_hint == 512 << 20
    assert (plan.ring_size - 4096) % 64 == 0


# A named codec is kept whatever the target (the note says when it may not keep up); only
# the default codec (compression_algorithm unset: shuffle) is lowered, to none.
@pytest.mark.parametrize("codec,level,target,cores,want_codec,want_level,block,noted", [
    ("lz4", None, None, 2, "lz4", 0, 1 << 20, False),
    ("lz4", None, 0.1, 2, "lz4", 0, 256 << 10, False),
    ("lz4", None, 1.0, 2, "lz4", 0, 1 << 20, True),       # 2 cores x 0.13 GB/s < 1 GB/s: kept, noted
    ("lz4", None, 1.0, 16, "lz4", 0, 1 << 20, False),
    ("zstd", 4, 0.2, 2, "zstd", 4, 256 << 10, True),      # 2 x 0.02 GB/s: kept, noted
    ("zstd", 2, 4.0, 64, "zstd", 2, 4 << 20, False),
    ("lz4", 5, 0.1, 2, "lz4", 5, 256 << 10, True),        # lz4 HC 0.065 GB/s: kept, noted
    ("none", None, 8.0, 2, "none", 0, 4 << 20, False),
    ("shuffle", None, 8.0, 2, "shuffle", 0, 4 << 20, True),  # named shuffle: kept
    (None, None, 8.0, 2, "none", 0, 4 << 20, True),       # the default codec: lowered
    (None, None, 1.0, 2, "shuffle", 0, 1 << 20, False),   # 2 x 0.6 GB/s is enough
])
def test_transport_plan(codec, level, target, cores, want_codec, want_level, block, noted):
    cfg = InstrumentationConfig(compression_algorithm=codec, compression_level=level, target_throughput_gbps=target)
    plan = cfg.transport_plan(cores=cores)
    assert (plan.codec, plan.codec_level, plan.block_size) == (want_codec, want_level, block)
    assert bool(plan.note) == noted


def test_block_size_capped_by_ring():
    plan = InstrumentationConfig(max_memory_gb=1 / 1024).transport_plan(cores=2)  # 1 MiB ring
    assert plan.block_size == 64 << 10  # largest power of two <= (1 MiB - 4096) / 8


def test_to_dict_json_ready():
    import json

    d = InstrumentationConfig.max().with_sampled_positions((1, 2)).to_dict()
    assert json.loads(json.dumps(d))["granularity"] == "FULL_TENSOR"
