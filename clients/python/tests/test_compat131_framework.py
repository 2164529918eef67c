"""1.3.1's framework API in 1.3.1's call forms: ``InstrumentationFramework(config)`` +
``instrument_model``, the module-level ``capture_activations`` with 1.3.1's parameter order
and default file names, the tokens file name, and the README's snippets run as written
against the real strapd, with a small config-built Llama instead of a 7B download.

The snippets reach the test's daemon through ``STRAPD_SOCKET`` (the default socket
resolution), so their calls are 1.3.1's exactly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import tiny_gpt2, tiny_llama

from llm_instrumentation import (InstrumentationConfig, InstrumentationFramework, analyze_activations_with_tokens,
                                 capture_activations, open_stream)
from llm_instrumentation.analysis.visualization import load_stream_packets
from llm_instrumentation.framework import default_output_path, tokens_path
from llm_instrumentation.stream import DROP, TENSOR, TOKEN
from llm_instrumentation.tracking import TokenMap


class _Tokenizer:
    """Stands in for the README's Hugging Face tokenizer (no download): the two members the
    snippets use."""

    eos_token_id = 2

    def decode(self, ids) -> str:  # noqa: ANN001
        ids = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else [int(ids)]
        return "".join(f"<{i}>" for i in ids)


tokenizer = _Tokenizer()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, real_strapd):
    """Run in tmp_path (the snippets use relative paths) with the real strapd as default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STRAPD_SOCKET", real_strapd.socket)
    return tmp_path


# ----- InstrumentationFramework: constructor forms and instrument_model ---------------------

def test_framework_131_form_and_instrument_model():
    cfg = InstrumentationConfig.balanced()
    m = tiny_llama()
    fw = InstrumentationFramework(cfg)
    assert fw.model is None and fw.hooked_modules == [] and fw.config is cfg
    # A capture before instrument_model runs without tensors (test_compat131_dropin.py);
    # the framework is left without a model, so instrument_model still takes one.
    fw.instrument_model(m)
    hooked = list(fw.hooked_modules)
    assert fw.model is m and "model.layers.0.self_attn" in hooked
    fw.instrument_model(m)  # the same model again: nothing changes
    assert fw.model is m and fw.hooked_modules == hooked
    with pytest.raises(ValueError, match="one framework per model"):
        fw.instrument_model(tiny_gpt2())
    assert fw.model is m


@pytest.mark.parametrize("make", [
    lambda m, c: InstrumentationFramework(m, c),
    lambda m, c: InstrumentationFramework(c, m),
    lambda m, c: InstrumentationFramework(model=m, config=c),
    lambda m, c: InstrumentationFramework(c, model=m),
], ids=["model-config", "config-model", "keywords", "config-model-kw"])
def test_framework_model_given_up_front(make):
    m, cfg = tiny_llama(), InstrumentationConfig.attention_analysis()
    fw = make(m, cfg)
    assert fw.model is m and fw.config is cfg
    assert fw.hooked_modules == [f"model.layers.{i}.self_attn" for i in range(4)]


def test_framework_rejects_non_config():
    m = tiny_llama()
    with pytest.raises(TypeError, match="InstrumentationConfig"):
        InstrumentationFramework(m)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        InstrumentationFramework(InstrumentationConfig()).instrument_model(object())


# ----- default output path and tokens file ---------------------------------------------------

def test_default_output_path_131_names(tmp_path):
    m, cfg = tiny_llama(), InstrumentationConfig.balanced()
    d = tmp_path / "a" / "caps"  # made, parents too
    name = lambda **kw: Path(default_output_path(m, cfg, output_dir=d, auto_timestamp=False, **kw)).name  # noqa: E731
    assert name(preset="balanced") == "llama_balanced.stream"
    assert name(preset="balanced") == "llama_balanced_1.stream"  # 1.3.1 overwrote; we add a suffix
    assert name(preset="balanced") == "llama_balanced_2.stream"
    assert name() == f"llama_{cfg.compression_algorithm}.stream"
    assert name(prefix="run") == f"run_llama_{cfg.compression_algorithm}.stream"
    assert name(include_metadata=False) == "capture.stream"
    assert name(include_metadata=False, prefix="p") == "p.stream"
    assert all(p.stat().st_size == 0 for p in d.iterdir())  # reserved, empty until a capture writes
    stamped = Path(default_output_path(m, cfg, "fast_capture", d)).name
    assert re.fullmatch(r"llama_fast_capture_\d{8}_\d{6}\.stream", stamped)
    assert re.fullmatch(r"\d{8}_\d{6}\.stream", Path(default_output_path(m, cfg, None, d, True, "", False)).name)

    class Cfg:
        model_type = "gpt-neo x/2"

    class OddNet(torch.nn.Module):
        config = Cfg()

    class TinyNet(torch.nn.Module):
        pass

    assert Path(default_output_path(OddNet(), cfg, "max", d, False)).name == "gpt-neo_x_2_max.stream"
    assert Path(default_output_path(TinyNet(), cfg, "max", d, False)).name == "tinynet_max.stream"


@pytest.mark.parametrize("stream,tokens", [
    ("gen.stream", "gen_tokens.json"),  # 1.3.1's name
    ("runs/gen.stream", "runs/gen_tokens.json"),
    ("run.strap", "run.strap_tokens.json"),  # 1.3.1 would have written the tokens over the stream
    ("noext", "noext_tokens.json"),
    ("a.stream.d/run", "a.stream.d/run_tokens.json"),  # 1.3.1 replaced inside directory names
    (".stream", ".stream_tokens.json"),
])
def test_tokens_path_names(stream, tokens):
    assert tokens_path(stream) == tokens and tokens_path(Path(stream)) == tokens and tokens != stream


# ----- token map ------------------------------------------------------------------------------

def _token_map(events):
    """events: "F" a forward pass (two TENSOR packets), "D" one with a DROP, "T" a token."""
    tm, fwd, tok, step, out = TokenMap(), 0, 0, 0, []
    for e in events:
        if e in "FD":
            for ptype in ((TENSOR, TENSOR) if e == "F" else (TENSOR, DROP)):
                tm.feed(ptype, step, fwd)
            out.append((step, fwd))
            fwd += 1
        else:
            tm.feed(TOKEN, tok, 0)
            tok += 1
            step = tok
    tm.finish()
    return [tm.token_of(s, f) for s, f in out]


@pytest.mark.parametrize("events,want", [
    ("FTFTFT", [0, 1, 2]),  # tokens recorded as they are made: the step
    ("FFFTTT", [0, 1, 2]),  # generate(), then record its tokens
    ("FDFTTT", [0, 1, 2]),  # a forward pass with a dropped tensor still counts
    ("FFTTTTT", [3, 4]),  # generate(); prompt (3) and new tokens (2) recorded after
    ("TTFTFT", [2, 3]),  # prompt tokens recorded first, then a loop: the step
    ("FFTFFT", [0, 0, 1, 1]),  # two forward passes per token (e.g. a draft and a check)
    ("FFFFTT", [0, 0, 0, 1]),  # more forward passes than tokens: the last ones are matched
    ("TTFF", [2, 2]),  # forward passes no token follows keep their step
    ("FFFTTTFFTT", [0, 1, 2, 3, 4]),  # two generate() calls, each recorded after
], ids=lambda v: v if isinstance(v, str) else None)
def test_token_map(events, want):
    assert _token_map(events) == want


# ----- module-level capture_activations, against the real strapd ------------------------------

def test_readme_131_quick_usage(in_tmp):
    model = tiny_llama()
    # 1.3.1 README, "Quick Usage", as written
    with capture_activations(model, preset="balanced", output_path="output.stream") as framework:
        _ = model(torch.randint(0, 100, (1, 16)))

    analysis = framework.analyze_activations("output.stream")
    assert analysis["packets"] == len(framework.hooked_modules) > 0
    assert set(analysis["per_layer"]) == set(framework.hooked_modules)
    assert framework.output_path == str(in_tmp / "output.stream")


def test_positional_output_path_is_a_path(in_tmp):
    m = tiny_llama()
    with torch.no_grad(), capture_activations(m, "pos.stream", "unused_dir", "attention_analysis") as fw:
        m(input_ids=torch.tensor([[1, 2, 3]]))
    assert fw.output_path == str(in_tmp / "pos.stream") and not (in_tmp / "unused_dir").exists()
    with open_stream(in_tmp / "pos.stream") as r:
        assert r.names() == [f"model.layers.{i}.self_attn" for i in range(4)]


def test_default_path_capture(in_tmp):
    m = tiny_llama()
    with torch.no_grad(), capture_activations(m, preset="mlp_analysis", auto_timestamp=False, prefix="exp") as fw:
        m(input_ids=torch.tensor([[1, 2, 3]]))
    assert fw.output_path == str(in_tmp / "captures" / "exp_llama_mlp_analysis.stream")
    with open_stream(fw.output_path) as r:
        assert r.end() is not None and len(r.tensors()) == len(fw.hooked_modules)


def test_default_path_removed_when_capture_cannot_start(tmp_path, monkeypatch):
    monkeypatch.setenv("STRAPD_SOCKET", str(tmp_path / "none.sock"))
    with pytest.raises(Exception):
        with capture_activations(tiny_llama(), output_dir=tmp_path / "caps", autostart_daemon=False):
            pass
    assert list((tmp_path / "caps").iterdir()) == []


def test_preset_wins_over_config_with_warning(in_tmp):
    m = tiny_llama()
    with pytest.warns(UserWarning, match="using the preset"):
        with torch.no_grad(), capture_activations(m, "p.stream", preset="attention_analysis",
                                                  config=InstrumentationConfig.mlp_analysis()) as fw:
            m(input_ids=torch.tensor([[1, 2]]))
    assert fw.config == InstrumentationConfig.attention_analysis()
    assert fw.hooked_modules == [f"model.layers.{i}.self_attn" for i in range(4)]


# ----- InstrumentationFramework.capture_activations: the README's per-token snippets ----------

def test_readme_131_per_token_tracking_and_resume(in_tmp):
    model = tiny_llama()
    framework = InstrumentationFramework(InstrumentationConfig.balanced())
    framework.instrument_model(model)
    n_hooked = len(framework.hooked_modules)

    # 1.3.1 README, "Per-token Tracking & Checkpointing", as written
    with framework.capture_activations("gen.stream", track_per_token=True) as tracker:
        ids = torch.randint(0, 100, (1, 8))
        for _ in range(32):
            with torch.no_grad():
                out = model(ids)
                next_tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            tracker.record_token(next_tok[0].item(), tokenizer.decode(next_tok[0]))
            ids = torch.cat([ids, next_tok], dim=-1)
            if next_tok[0].item() == tokenizer.eos_token_id:
                break

    analysis = analyze_activations_with_tokens("gen.stream", framework)
    n = analysis["token_metadata"]["total_tokens"]
    assert 0 < n <= 32 and analysis["bytes_per_token"] == analysis["total_compressed_bytes"] / n
    assert analysis["packets_per_step"] == {k: n_hooked for k in range(n)}
    doc = json.loads((in_tmp / "gen_tokens.json").read_text())  # 1.3.1's tokens file name
    assert doc["total_tokens"] == n and [t["token_index"] for t in doc["tokens"]] == list(range(n))
    assert not (in_tmp / "gen.stream.ckpt.json").exists()

    # "Persist checkpoints every 64 tokens": here every 4, and the block fails after 10
    # tokens, as a long generation might; the checkpoint after token 8 is kept.
    def generate(tracker, n_tokens):
        ids = torch.tensor([[5, 6, 7]])
        for _ in range(n_tokens):
            with torch.no_grad():
                nxt = model(ids).logits[:, -1, :].argmax(dim=-1, keepdim=True)
            tracker.record_token(nxt[0].item(), tokenizer.decode(nxt[0]))
            ids = torch.cat([ids, nxt], dim=-1)

    with pytest.raises(KeyboardInterrupt):
        with framework.capture_activations("gen.stream", track_per_token=True,
                                           checkpoint_interval_tokens=4) as tracker:
            generate(tracker, 10)
            raise KeyboardInterrupt
    ck = json.loads((in_tmp / "gen.stream.ckpt.json").read_text())
    assert ck["token_count"] == 8

    # "Resume the same capture later (appends to the existing stream file)". The checkpoint
    # (token 8) is the durable floor; past it the stream's own intact prefix counts, and the
    # interrupted block closed its stream cleanly, so all 10 tokens are kept.
    with framework.capture_activations(
        "gen.stream",
        track_per_token=True,
        checkpoint_interval_tokens=4,
        resume_from_checkpoint=True,
    ) as tracker:
        assert len(tracker.tokens) == 10
        generate(tracker, 5)
    a = analyze_activations_with_tokens("gen.stream")
    assert a["token_metadata"]["total_tokens"] == 15
    assert a["packets_per_step"] == {k: n_hooked for k in range(15)}
    assert json.loads((in_tmp / "gen_tokens.json").read_text())["total_tokens"] == 15
    assert not (in_tmp / "gen.stream.ckpt.json").exists()


def test_basic_usage_131_generate(in_tmp):
    """The 1.3.1 examples/basic_usage.py flow (framework, instrument_model, a generate()
    inside the capture, analyze_activations with the path)."""
    model = tiny_llama()
    config = InstrumentationConfig.balanced()
    framework = InstrumentationFramework(config)
    framework.instrument_model(model)
    inputs = torch.tensor([[5, 6, 7, 8]])
    with framework.capture_activations("activations.stream") as tracker:
        assert tracker is None
        outputs = model.generate(inputs, max_length=10, min_length=10, do_sample=False, pad_token_id=0)
    assert outputs.shape == (1, 10)
    analysis = framework.analyze_activations("activations.stream")
    assert analysis["packets"] == 6 * len(framework.hooked_modules)  # 6 forward passes
    assert framework.forward_count == 6


@pytest.mark.parametrize("record_prompt", [False, True], ids=["new-tokens", "prompt-and-new"])
def test_record_tokens_after_generate(in_tmp, record_prompt):
    """The pattern of recording generate()'s tokens after it returns: each token gets the
    packets of the forward pass that chose it, not all packets token 0."""
    model = tiny_llama()
    framework = InstrumentationFramework(InstrumentationConfig.balanced())
    framework.instrument_model(model)
    n_hooked, prompt, n_new = len(framework.hooked_modules), torch.tensor([[5, 6, 7, 8]]), 6
    with framework.capture_activations("after.stream", track_per_token=True) as tracker:
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                 pad_token_id=0)
        first = 0 if record_prompt else prompt.shape[1]
        for pos in range(first, out.shape[1]):
            tracker.record_token(out[0, pos], tokenizer.decode(out[0, pos]), position=pos)
    p = prompt.shape[1] if record_prompt else 0
    new = list(range(p, p + n_new))  # the generated tokens' indices
    a = analyze_activations_with_tokens("after.stream")
    assert a["token_metadata"]["total_tokens"] == p + n_new
    assert a["packets_per_step"] == {k: n_hooked for k in new}
    # the first forward pass covered the whole prompt: its outputs are 4x a later one's
    raw = [a["bytes_per_step"][k]["raw"] for k in new]
    assert raw[0] == prompt.shape[1] * raw[1] and len(set(raw[1:])) == 1
    rows = load_stream_packets("after.stream")
    assert [r["token_index"] for r in rows] == [k for k in new for _ in range(n_hooked)]
    assert sorted({r["forward"] for r in rows}) == list(range(n_new))
