"""Hook selection on real small Hugging Face models, output splitting, sampling, tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_bert, tiny_gpt2, tiny_llama

from llm_instrumentation import HookGranularity, InstrumentationConfig, capture_activations
from llm_instrumentation.core.auto_detect import config_for_model, describe_model, select_modules
from llm_instrumentation.framework import TokenTracker, sample_positions, split_output


@pytest.fixture(scope="module")
def models():
    return {"llama": tiny_llama(), "gpt2": tiny_gpt2(), "bert": tiny_bert()}


@pytest.mark.parametrize("family,n,blocks,attn,mlp,hidden", [
    ("llama", 4, "model.layers.{}", ["model.layers.{}.self_attn"], ["model.layers.{}.mlp"], 256),
    ("gpt2", 3, "transformer.h.{}", ["transformer.h.{}.attn"], ["transformer.h.{}.mlp"], 128),
    ("bert", 2, "encoder.layer.{}", ["encoder.layer.{}.attention"],
     ["encoder.layer.{}.intermediate", "encoder.layer.{}.output"], 128),
])
def test_detect(models, family, n, blocks, attn, mlp, hidden):
    arch = describe_model(models[family])
    assert arch["family"] == family
    assert arch["num_layers"] == n and arch["hidden_size"] == hidden
    assert arch["blocks"] == [blocks.format(i) for i in range(n)]
    assert arch["attention"] == [a.format(i) for i in range(n) for a in attn]
    assert arch["mlp"] == [m.format(i) for i in range(n) for m in mlp]


def test_detect_bert_prefix_when_wrapped():
    from transformers import BertConfig, BertForMaskedLM

    m = BertForMaskedLM(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=128, vocab_size=100))
    arch = describe_model(m)
    assert arch["blocks"] == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    assert arch["mlp"][:2] == ["bert.encoder.layer.0.intermediate", "bert.encoder.layer.0.output"]


@pytest.mark.parametrize("gran,count", [
    (HookGranularity.FULL_TENSOR, 12),
    (HookGranularity.SAMPLED_SLICES, 12),
    (HookGranularity.ATTENTION_ONLY, 4),
    (HookGranularity.MLP_ONLY, 4),
    (HookGranularity.RESIDUAL_ONLY, 4),
])
def test_select_llama(models, gran, count):
    names = select_modules(models["llama"], gran)
    assert len(names) == count
    # nested modules are reached (the 1.3.1 defect was root-children only)
    assert all(n.startswith("model.layers.") for n in names)
    assert "lm_head" not in names


def test_select_all_and_patterns(models):
    m = models["llama"]
    allm = select_modules(m, HookGranularity.ALL_MODULES)
    assert len(allm) == len(list(m.named_modules())) - 1
    got = select_modules(m, HookGranularity.ATTENTION_ONLY, ["model.layers.*.mlp.down_proj", "lm_head"])
    assert got[-1] == "lm_head" and "model.layers.2.mlp.down_proj" in got and len(got) == 9
    with pytest.raises(ValueError, match="matches no module"):
        select_modules(m, HookGranularity.MLP_ONLY, ["nope.*"])


def test_split_output_names():
    a, b = torch.zeros(2), torch.ones(3)
    assert [n for n, _ in split_output("m", a)] == ["m"]
    assert [n for n, _ in split_output("m", (a, None, b))] == ["m", "m.out2"]
    assert [n for n, _ in split_output("m", (None, a))] == ["m"]
    from transformers.modeling_outputs import BaseModelOutput

    out = BaseModelOutput(last_hidden_state=a, hidden_states=None, attentions=(b,))
    assert [n for n, _ in split_output("m", out)] == ["m"]
    assert split_output("m", "text") == []


@pytest.mark.parametrize("n,spec,want", [
    (10, 4, [0, 4, 8, 9]),
    (9, 4, [0, 4, 8]),
    (1, 8, [0]),
    (0, 8, []),
    (10, (0, -1, 3, 99, -50), [0, 3, 9]),
])
def test_sample_positions(n, spec, want):
    assert sample_positions(n, spec) == want


def test_token_tracker():
    tr = TokenTracker()
    assert tr.step == 0
    assert tr.record_token(5, "a") == 0
    tr.record_token(torch.tensor(7).item(), "b", position=10)
    assert tr.step == 2 and tr.tokens[1] == {"token_index": 1, "token_id": 7, "token_text": "b", "position": 10}


def test_config_for_model(models):
    cfg = config_for_model(models["llama"], target_throughput_gbps=0.1)
    assert isinstance(cfg, InstrumentationConfig)
    assert cfg.ring_size == 64 << 20  # 8 x 2048 x 256 x 4 bytes = 16 MiB -> min 64 MiB
    assert config_for_model(models["llama"], max_memory_gb=0.125).max_memory_gb == 0.125


@pytest.mark.parametrize("kw,exc", [
    (dict(checkpoint_interval_tokens=10), ValueError),          # checkpoints need tracking
    (dict(checkpoint_path="/tmp/x", track_per_token=True), ValueError),  # a path but no interval
    (dict(resume_from_checkpoint=True), ValueError),
    (dict(checkpoint_interval_tokens=0, track_per_token=True), ValueError),
    (dict(checkpoint_interval_tokens=-3, track_per_token=True), ValueError),
    (dict(checkpoint_interval_tokens=2.5, track_per_token=True), ValueError),
    (dict(resume_from_checkpoint=True, overwrite_checkpoint=True, track_per_token=True), ValueError),
    (dict(track_per_token="yes"), TypeError),
    (dict(preset="nope"), ValueError),
    (dict(config={"compression_algorithm": "lz4"}), TypeError),
])
def test_capture_argument_checks(models, kw, exc, sockdir):
    with pytest.raises(exc):
        with capture_activations(models["llama"], socket_path=sockdir + "/none.sock", autostart_daemon=False, **kw):
            pass
