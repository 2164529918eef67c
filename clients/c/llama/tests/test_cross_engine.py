"""One random Hugging Face model, two engines: captured through PyTorch (the Python client) and,
converted to GGUF by llama.cpp's own convert_hf_to_gguf.py, through llama.cpp (strap-llama).
Both generate greedily from the same prompt tokens, one forward pass per token with a KV cache;
the captured module outputs must agree row for row and token for token to float32 rounding:
max |diff| <= 1e-4 * max |x|. A LlamaForCausalLM (each decoder layer's output), and a
Qwen2ForCausalLM and a Qwen3ForCausalLM (each layer's output, its self_attn and its mlp: the
record names of docs/LLAMA_CPP.md's name table, attn_out found by its weight). Nothing is
downloaded: the tokenizer is a SentencePiece model trained here on the repository's docs (both
Qwen converters take a SentencePiece tokenizer.model before a BPE one, so no pre-tokenizer hash
is involved; the tokenizer is not what is compared: llama.cpp's prompt token ids are fed to
PyTorch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import LLAMA_CPP, REPO, run_llama

N_LAYER, N_EMBD, N_NEW = 4, 64, 6
PROMPT = "The capture stream holds every tensor"


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory) -> Path:
    """A 512-piece SentencePiece model (unigram, byte fallback) trained on docs/*.md."""
    spm = pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(p.read_text(errors="replace") for p in sorted((REPO / "docs").glob("*.md"))))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(d / "tokenizer"), vocab_size=512,
                                   model_type="unigram", character_coverage=1.0, byte_fallback=True,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
                                   minloglevel=2)
    return d / "tokenizer.model"


def save_and_convert(model, tokenizer: Path, d: Path) -> Path:
    """Saves an HF model with the tokenizer and converts it with llama.cpp's converter (f32)."""
    model_dir = d / "model"
    model_dir.mkdir()
    model.save_pretrained(model_dir, safe_serialization=True)
    (model_dir / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    gguf = d / "model.gguf"
    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "src/gguf-py")}
    p = subprocess.run([sys.executable, str(LLAMA_CPP / "src/convert_hf_to_gguf.py"), str(model_dir), "--outfile",
                        str(gguf), "--outtype", "f32"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return gguf


def generate_in_pytorch(model, prompt, out: Path, socket_path: str, modules):
    """Greedy generation of N_NEW tokens from the prompt's ids, one forward pass per token with a
    KV cache, captured by the Python client; the tokens."""
    import torch

    from llm_instrumentation import capture_activations

    gen = []
    with torch.no_grad(), capture_activations(model, output_path=str(out), socket_path=socket_path,
                                              autostart_daemon=False, modules=modules):
        ids = torch.tensor([prompt])
        past = None
        for _ in range(N_NEW):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            tok = int(res.logits[0, -1].argmax())
            gen.append(tok)
            ids = torch.tensor([[tok]])
    return gen


def compare(lc: Path, pt: Path, names, prompt) -> float:
    """Every record of each name, row for row and pass for pass; the worst max|diff| / max|x|."""
    from llm_instrumentation import open_stream

    worst = 0.0
    with open_stream(str(lc)) as a, open_stream(str(pt)) as b:
        for name in names:
            la, tb = a.tensors(name), b.tensors(name)
            assert len(la) == len(tb) == N_NEW, (name, len(la), len(tb))
            for f, (x, y) in enumerate(zip(la, tb)):
                xa, ya = x.numpy(), y.numpy().reshape(-1, N_EMBD)
                rows = len(prompt) if f == 0 else 1
                assert xa.shape == ya.shape == (rows, N_EMBD), (name, f, xa.shape, ya.shape)
                assert x.meta["pos"] == {"from": 0 if f == 0 else len(prompt) + f - 1, "n": rows}
                rel = float(np.abs(xa - ya).max() / np.abs(ya).max())
                worst = max(worst, rel)
                assert rel <= 1e-4, (name, f, rel)
    return worst


@pytest.fixture(scope="module")
def hf_and_gguf(tokenizer_model, tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=N_EMBD, intermediate_size=128,
                                   num_hidden_layers=N_LAYER, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   tie_word_embeddings=False, initializer_range=0.3, bos_token_id=1,
                                   eos_token_id=2, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, save_and_convert(model, tokenizer_model, tmp_path_factory.mktemp("hf"))


def test_layer_outputs_agree_between_pytorch_and_llama_cpp(strapd, hf_and_gguf, tmp_path):
    model, gguf = hf_and_gguf
    lc = tmp_path / "llama.strap"
    # --f32-attention: llama.cpp's defaults (an f16 KV cache, flash attention) round attention
    # to f16; with them this model's layers differ from PyTorch's by up to 7.9e-3 of max |x|
    res = run_llama(gguf, "--output", str(lc), "--tensors", "l_out", "--f32-attention", socket_path=strapd.socket, n=N_NEW,
                    prompt=PROMPT)
    prompt = res["prompt_tokens"]

    layers = [f"model.layers.{i}" for i in range(N_LAYER)]
    pt = tmp_path / "torch.strap"
    gen = generate_in_pytorch(model, prompt, pt, strapd.socket, layers)
    # token for token: the same greedy choices
    assert gen == res["tokens"]
    worst = compare(lc, pt, layers, prompt)
    print(f"worst max|diff| / max|x| over {N_LAYER} layers x {N_NEW} forward passes: {worst:.2e}")


def random_qwen(arch: str):
    """A random Qwen2ForCausalLM or Qwen3ForCausalLM, fp32, tied embeddings (as the small Qwen
    checkpoints are), GQA 4/2. HF initialises biases to 0 and norm weights to 1; they are drawn
    at random too, so a bias or norm lost or misplaced in the conversion shows."""
    import torch
    import transformers

    torch.manual_seed(1)
    common = dict(vocab_size=512, hidden_size=N_EMBD, intermediate_size=128, num_hidden_layers=N_LAYER,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=True, initializer_range=0.3, bos_token_id=1,
                  eos_token_id=2, torch_dtype="float32")
    if arch == "qwen2":  # q, k, v with biases, o_proj without
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(use_sliding_window=False, **common))
    else:  # no biases; RMS norms of q and k per head (head_dim given: Qwen3's default is 128)
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=N_EMBD // 4, **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.3)
            elif "norm" in name:
                p.normal_(1.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_layers_attention_and_mlp_agree_between_pytorch_and_llama_cpp(strapd, tokenizer_model, tmp_path,
                                                                          arch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_instrumentation import open_stream

    model = random_qwen(arch)
    gguf = save_and_convert(model, tokenizer_model, tmp_path)
    lc = tmp_path / "llama.strap"
    res = run_llama(gguf, "--output", str(lc), "--tensors",
                    "embd,attn_norm,attn_out,ffn_norm,ffn_out,l_out,result_norm", "--f32-attention",
                    socket_path=strapd.socket, n=N_NEW, prompt=PROMPT)
    prompt = res["prompt_tokens"]
    assert len(prompt) > 3
    # no two nodes answered one name in a pass (the weight names one MUL_MAT per layer)
    assert res["duplicates_skipped"] == 0, res

    # the name table: per layer (module suffix: graph name, op), then the model's own
    kinds = {"": ("l_out", "ADD"), ".self_attn": ("attn_out", "MUL_MAT"), ".mlp": ("ffn_out", "MUL_MAT"),
             ".input_layernorm": ("attn_norm", "MUL"), ".post_attention_layernorm": ("ffn_norm", "MUL")}
    whole = {"model.embed_tokens": ("embd", "GET_ROWS"), "model.norm": ("result_norm", "MUL")}
    names = [f"model.layers.{i}{m}" for i in range(N_LAYER) for m in kinds] + list(whole)
    with open_stream(str(lc)) as a:
        assert a.metadata["client_metadata"]["model_class"] == arch
        assert sorted(a.names()) == sorted(names)
        for name, (graph, op) in whole.items():
            for x in a.tensors(name):
                assert (x.meta["ggml_name"], x.meta["ggml_op"]) == (graph, op), x.meta
        for i in range(N_LAYER):
            for m, (graph, op) in kinds.items():
                for x in a.tensors(f"model.layers.{i}{m}"):
                    assert x.meta["ggml_op"] == op, (i, m, x.meta)
                    if graph == "attn_out":
                        # found by its weight: ggml's own name for an unnamed node, "node_<index>"
                        assert x.meta["ggml_name"].startswith("node_"), x.meta
                        assert x.meta["ggml_weight"] == f"blk.{i}.attn_output.weight", x.meta
                    else:
                        assert x.meta["ggml_name"] == f"{graph}-{i}", x.meta
                        assert "ggml_weight" not in x.meta

    # --raw-names: the attention output found by its weight keeps the graph-style name it stands
    # for, "attn_out-N" (its own "node_<index>" only numbers it in one graph). With logits on the
    # last prompt row only, the last layer is pruned to that row after its attention output
    # (trap 2): attn_out of the last layer keeps every row, with the mapped capture's values.
    raw = tmp_path / "raw.strap"
    last = N_LAYER - 1
    run_llama(gguf, "--output", str(raw), "--tensors", f"attn_out-{last},l_out", "--raw-names", "--last-logits-only",
              "--f32-attention", socket_path=strapd.socket, n=2, prompt=PROMPT)
    with open_stream(str(raw)) as r, open_stream(str(lc)) as a:
        assert sorted(r.names()) == [f"attn_out-{last}"] + [f"l_out-{i}" for i in range(N_LAYER)]
        assert r.tensors(f"l_out-{last}")[0].numpy().shape == (1, N_EMBD)
        got, want = r.tensors(f"attn_out-{last}"), a.tensors(f"model.layers.{last}.self_attn")[:2]
        assert len(got) == 2 and got[0].numpy().shape == (len(prompt), N_EMBD)
        for x, y in zip(got, want):
            assert x.meta["ggml_weight"] == f"blk.{last}.attn_output.weight"
            assert x.meta["pos"] == y.meta["pos"]
            assert np.array_equal(x.numpy(), y.numpy())

    pt = tmp_path / "torch.strap"
    gen = generate_in_pytorch(model, prompt, pt, strapd.socket, names)
    assert gen == res["tokens"]
    worst = compare(lc, pt, names, prompt)
    print(f"{arch}: worst max|diff| / max|x| over {len(names)} module outputs x {N_NEW} forward passes: {worst:.2e}")
