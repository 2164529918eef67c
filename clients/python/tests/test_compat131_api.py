"""1.3.1 compatibility: import paths, InstrumentationConfig, architecture detection, the
token tracker and the hook manager; captures go through the real strapd."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
from conftest import tiny_bert, tiny_gpt2, tiny_llama

from llm_instrumentation import HookGranularity, InstrumentationConfig, TokenTracker, open_stream
from llm_instrumentation.config import DEFAULT_RING_BYTES, MAX_RING_BYTES


def test_131_import_paths():
    from llm_instrumentation import HookConfig, InstrumentationFramework, analyze_activations_with_tokens
    from llm_instrumentation.core import capture_activations
    from llm_instrumentation.core.auto_detect import create_optimized_config, detect_model_architecture
    from llm_instrumentation.core.config import HookGranularity as HG2
    from llm_instrumentation.core.config import InstrumentationConfig as IC2
    from llm_instrumentation.core.framework import InstrumentationFramework as IF2
    from llm_instrumentation.core.framework import _TokenBoundaryTracker
    from llm_instrumentation.core.framework import analyze_activations_with_tokens as awt2
    from llm_instrumentation.core.hooks import HookConfig as HC2
    from llm_instrumentation.core.hooks import HookGranularity as HG3
    from llm_instrumentation.core.hooks import OptimizedHookManager, TensorProcessor
    import llm_instrumentation as li

    assert IC2 is InstrumentationConfig and HG2 is HG3 is HookGranularity and HC2 is HookConfig
    assert IF2 is InstrumentationFramework and awt2 is analyze_activations_with_tokens
    assert capture_activations is li.capture_activations and _TokenBoundaryTracker is TokenTracker
    assert callable(create_optimized_config) and callable(detect_model_architecture)
    assert OptimizedHookManager and TensorProcessor
    with pytest.raises(AttributeError):
        import llm_instrumentation.core as core

        core.not_a_name  # noqa: B018


# ----- InstrumentationConfig -----------------------------------------------------------------

def test_config_131_positional_and_builders():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a large cap is fitted to the daemon when a capture starts
        cfg = InstrumentationConfig(HookGranularity.ATTENTION_ONLY, "zstd", 2.0, 24)
    assert (cfg.granularity, cfg.compression_algorithm, cfg.target_throughput_gbps, cfg.max_memory_gb) == \
        (HookGranularity.ATTENTION_ONLY, "zstd", 2.0, 24)
    assert cfg.ring_size == 24 << 30
    # 1.3.1 style: bare calls take effect, chains return the same object
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg.with_compression("lz4")
        assert cfg.compression_algorithm == "lz4"
        assert cfg.with_compression(algo="none").with_throughput(4.0) is cfg
        assert (cfg.compression_algorithm, cfg.target_throughput_gbps) == ("none", 4.0)
        cfg.with_granularity(HookGranularity.MLP_ONLY)
        assert cfg.granularity is HookGranularity.MLP_ONLY
        cfg.with_memory_limit(None)
        assert cfg.max_memory_gb is None and cfg.ring_size == DEFAULT_RING_BYTES
        # and the reassigning style
        cfg = cfg.with_compression(algorithm="zstd")
        assert cfg.compression_algorithm == "zstd"
    with pytest.raises(TypeError, match="algo"):
        cfg.with_compression()
    with pytest.raises(TypeError, match="not both"):
        cfg.with_compression("lz4", algorithm="zstd")
    # 1.3.1's documented chain
    c2 = InstrumentationConfig.balanced().with_compression("zstd").with_memory_limit(16)
    assert c2.compression_algorithm == "zstd" and c2.ring_size == 16 << 30


@pytest.mark.parametrize("limit,want", [((64 << 20) + 100, 64 << 20), (4096 + 4096, None)],
                         ids=["page-multiple", "below-the-smallest"])
def test_ring_fitted_to_a_daemon_limit(strapd_factory, tmp_path, limit, want):
    """libstrap's open fits the ring to WELCOME's max_ring_size: the largest page multiple
    within it, or an error naming --max-ring-size when not even the smallest ring fits."""
    from llm_instrumentation import capture_activations
    from llm_instrumentation.errors import StrapdProtocolError

    m = tiny_llama()
    d = strapd_factory("--max-ring-size", str(limit))
    cfg = InstrumentationConfig(HookGranularity.FULL_TENSOR, "zstd", None, 1)
    out = tmp_path / "fit.stream"
    kw = dict(config=cfg, output_path=out, socket_path=d.socket, autostart_daemon=False)
    if want is None:
        with pytest.raises(StrapdProtocolError, match="smallest usable ring.*--max-ring-size|--max-ring-size.*smallest"):
            capture_activations(m, **kw).__enter__()
        return
    with pytest.warns(UserWarning, match="more than strapd admits"):
        with torch.no_grad(), capture_activations(m, **kw):
            m(input_ids=torch.tensor([[1, 2, 3]]))
    with open_stream(out) as r:
        assert r.metadata["client_metadata"]["transport"]["ring_size"] == want


@pytest.mark.parametrize("limit", [None, 64 << 20], ids=["default-limit", "max-ring-size-64M"])
def test_1_3_1_memory_caps_capture_through_strapd(strapd_factory, tmp_path, limit, monkeypatch):
    """1.3.1's presets asked for 16–64 GB; strapd refused such a ring (ERROR limit). Now the
    ring is fitted to the limit the daemon's WELCOME tells, with one warning, and the
    capture works."""
    m = tiny_llama()
    from llm_instrumentation import _session, capture_activations

    monkeypatch.setattr(_session, "_FIT_WARNED", set())
    d = strapd_factory(*(["--max-ring-size", str(limit)] if limit else []))
    want = limit or MAX_RING_BYTES
    cfg = InstrumentationConfig(HookGranularity.FULL_TENSOR, "zstd", None, 64)
    out = tmp_path / "big.stream"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("default")
        for _ in range(2):
            with torch.no_grad(), capture_activations(m, config=cfg, output_path=out, socket_path=d.socket,
                                                      autostart_daemon=False) as fw:
                m(input_ids=torch.tensor([[1, 2, 3]]))
    assert [str(x.message) for x in w if "more than strapd admits" in str(x.message)] == [
        f"max_memory_gb asks for a 64 GiB ring, more than strapd admits (--max-ring-size {want / (1 << 30):g} "
        f"GiB); using {want / (1 << 30):g} GiB (max_memory_gb caps host buffering)"]
    assert fw.summary["drops"] == 0 and fw.summary["packets"] == len(fw.hooked_modules)
    with open_stream(out) as r:
        assert r.metadata["client_metadata"]["transport"]["ring_size"] == want
        assert len(r.tensors()) == len(fw.hooked_modules)


# ----- detect_model_architecture / create_optimized_config -----------------------------------

@pytest.mark.parametrize("build,want", [(tiny_llama, "llama"), (tiny_gpt2, "gpt2"), (tiny_bert, "bert")])
def test_detect_model_architecture_131(build, want):
    from llm_instrumentation.core.auto_detect import describe_model, detect_model_architecture

    m = build()
    arch = detect_model_architecture(m)
    assert isinstance(arch, str) and arch == want and f"{arch}.stream" == f"{want}.stream"
    assert type(arch) is str  # a plain str, as in 1.3.1; the structure is describe_model's
    assert describe_model(m)["family"] == want


def test_detect_model_architecture_fallbacks():
    from llm_instrumentation.core.auto_detect import detect_model_architecture

    class Cfg:
        architectures = ["QWen2ForCausalLM"]

    class WithArchs(torch.nn.Module):
        config = Cfg()

    class MyGPTNet(torch.nn.Module):
        pass

    class Plain(torch.nn.Module):
        pass

    assert detect_model_architecture(WithArchs()) == "qwen"
    assert detect_model_architecture(MyGPTNet()) == "gpt"
    assert detect_model_architecture(Plain()) == "unknown"


@pytest.mark.parametrize("arch,purpose,codec,gran", [
    ("llama", "interpretability", "shuffle", HookGranularity.ATTENTION_ONLY),
    ("llama", "debugging", "none", HookGranularity.FULL_TENSOR),
    ("llama", "performance_analysis", "zstd", HookGranularity.FULL_TENSOR),
    ("gpt", "performance_analysis", "zstd", HookGranularity.FULL_TENSOR),
    ("bert", "performance_analysis", "shuffle", HookGranularity.FULL_TENSOR),
    ("bert", "full_capture", "shuffle", HookGranularity.FULL_TENSOR),
])
def test_create_optimized_config_131(arch, purpose, codec, gran):
    from llm_instrumentation.core.auto_detect import create_optimized_config

    cfg = create_optimized_config(arch, purpose)
    assert (cfg.compression_algorithm, cfg.granularity) == (codec, gran)
    assert create_optimized_config(arch, purpose=purpose) == cfg


def test_create_optimized_config_model_and_bad_purpose():
    from llm_instrumentation.core.auto_detect import create_optimized_config

    assert create_optimized_config(tiny_llama(), "performance_analysis").compression_algorithm == "zstd"
    # An unknown purpose: balanced(), as 1.3.1, with a warning (test_compat131_dropin.py).
    with pytest.warns(UserWarning, match="unknown purpose 'speed'"):
        assert create_optimized_config("llama", "speed") == InstrumentationConfig.balanced()


def test_readme_131_auto_config_capture(real_strapd, tmp_path):
    """1.3.1's README: detect, create_optimized_config, capture with config= (real strapd)."""
    from llm_instrumentation import capture_activations
    from llm_instrumentation.core.auto_detect import create_optimized_config, detect_model_architecture

    m = tiny_llama()
    arch = detect_model_architecture(m)
    config = create_optimized_config(arch, purpose="interpretability")
    out = tmp_path / f"{arch}.stream"
    with torch.no_grad(), capture_activations(m, config=config, output_path=str(out),
                                              socket_path=real_strapd.socket, autostart_daemon=False):
        m(input_ids=torch.tensor([[5, 6, 7, 8]]))
    with open_stream(out) as r:
        assert r.names() == [f"model.layers.{i}.self_attn" for i in range(4)]


# ----- token tracker -------------------------------------------------------------------------

def test_tracker_131_surface(tmp_path):
    t0 = time.time()
    tr = TokenTracker()
    assert t0 <= tr.start_time <= time.time() and tr.tokens == []
    tr.record_token(torch.tensor(42), "héllo")
    tr.record_token(7, "b", position=10)
    tr.record_token(token_id=9, token_text="c", position=None)
    p = tmp_path / "toks.json"
    tr.save(str(p))
    doc = json.loads(p.read_text(encoding="utf-8"))
    assert set(doc) == {"total_tokens", "tokens", "capture_duration_seconds"}
    assert doc["total_tokens"] == 3 and [t["token_id"] for t in doc["tokens"]] == [42, 7, 9]
    assert doc["tokens"][0]["token_text"] == "héllo" and "héllo" in p.read_text(encoding="utf-8")
    assert doc["tokens"][1]["position"] == 10
    assert isinstance(doc["capture_duration_seconds"], float) and doc["capture_duration_seconds"] >= 0


def test_tracker_in_131_capture_saves(real_strapd, tmp_path):
    from llm_instrumentation import capture_activations

    m = tiny_llama()
    out = tmp_path / "gen.stream"
    with torch.no_grad(), capture_activations(m, preset="balanced", output_path=out, socket_path=real_strapd.socket,
                                              autostart_daemon=False, track_per_token=True) as fw:
        tracker = fw.token_tracker
        before = time.time()
        assert tracker.start_time <= before
        ids = torch.tensor([[1, 2, 3]])
        for _ in range(3):
            nxt = m(input_ids=ids).logits[:, -1, :].argmax(dim=-1, keepdim=True)
            tracker.record_token(nxt[0].item(), f"tok{nxt[0].item()}")
            ids = torch.cat([ids, nxt], dim=-1)
    tracker.save(tmp_path / "copy.json")
    doc = json.loads((tmp_path / "copy.json").read_text())
    assert doc["total_tokens"] == 3 and doc["tokens"] == tracker.tokens
    assert doc["capture_duration_seconds"] >= time.time() - before - 1


# ----- hook manager --------------------------------------------------------------------------

class _Collect:
    def __init__(self) -> None:
        self.seen = []

    def process(self, tensor, metadata):
        self.seen.append((metadata["layer_name"], tuple(tensor.shape), metadata["sync"], metadata.get("positions")))
        return b""


def test_hook_manager_reaches_nested_modules():
    from llm_instrumentation.core.hooks import HookConfig, OptimizedHookManager

    m = tiny_llama()
    proc = _Collect()
    mgr = OptimizedHookManager(proc)
    mgr.attach_hooks(m, HookConfig(HookGranularity.MLP_ONLY, async_enabled=False))
    with torch.no_grad():
        m(input_ids=torch.tensor([[1, 2, 3]]))
    # 1.3.1 matched "mlp" among the root's children only: nothing on a Llama
    assert [s[0] for s in proc.seen] == [f"model.layers.{i}.mlp" for i in range(4)]
    assert all(s[1] == (1, 3, 256) and s[2] is True for s in proc.seen)
    assert mgr.get_metrics()["tensors"] == 4.0 and mgr.get_metrics()["hooks"] == 4.0
    mgr.detach_hooks()
    with torch.no_grad():
        m(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(proc.seen) == 4


def test_hook_manager_targets_and_sampling():
    from llm_instrumentation.core.hooks import HookConfig, OptimizedHookManager

    m = tiny_llama()
    proc = _Collect()
    mgr = OptimizedHookManager(proc)
    mgr.attach_hooks(m, HookConfig(HookGranularity.SAMPLED_SLICES, sampling_rate=0.5,
                                   target_layers=["model.layers.1", "lm_head"]))
    with torch.no_grad():
        m(input_ids=torch.arange(1, 8).unsqueeze(0))
    got = {s[0]: s for s in proc.seen}
    assert got["lm_head"][1] == (1, 4, 1024) and got["lm_head"][3] == [0, 2, 4, 6]
    assert got["model.layers.1"][1] == (1, 4, 256)
    with pytest.raises(ValueError, match="not modules"):
        OptimizedHookManager(proc).attach_hooks(m, HookConfig(HookGranularity.FULL_TENSOR, target_layers=["nope"]))
    with pytest.raises(ValueError, match="sampling_rate"):
        HookConfig(HookGranularity.SAMPLED_SLICES, sampling_rate=0)
