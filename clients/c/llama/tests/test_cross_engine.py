"""One random Hugging Face Llama, two engines: captured through PyTorch (the Python client) and,
converted to GGUF by llama.cpp's own convert_hf_to_gguf.py, through llama.cpp (strap-llama).
Both generate greedily from the same prompt tokens, one forward pass per token with a KV cache;
each decoder layer's output (the residual stream) must agree row for row and token for token to
float32 rounding: max |diff| <= 1e-4 * max |x|. Nothing is downloaded: the tokenizer is a
SentencePiece model trained here on the repository's docs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import LLAMA_CPP, REPO, run_llama

N_LAYER, N_EMBD, N_NEW = 4, 64, 6


@pytest.fixture(scope="module")
def hf_and_gguf(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("hf")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(p.read_text(errors="replace") for p in sorted((REPO / "docs").glob("*.md"))))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(d / "tokenizer"), vocab_size=512,
                                   model_type="unigram", character_coverage=1.0, byte_fallback=True,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
                                   minloglevel=2)
    model_dir = d / "model"
    model_dir.mkdir()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=N_EMBD, intermediate_size=128,
                                   num_hidden_layers=N_LAYER, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   tie_word_embeddings=False, initializer_range=0.3, bos_token_id=1,
                                   eos_token_id=2, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    (model_dir / "tokenizer.model").write_bytes((d / "tokenizer.model").read_bytes())
    gguf = d / "model.gguf"
    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "src/gguf-py")}
    p = subprocess.run([sys.executable, str(LLAMA_CPP / "src/convert_hf_to_gguf.py"), str(model_dir), "--outfile",
                        str(gguf), "--outtype", "f32"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return model, gguf


def test_layer_outputs_agree_between_pytorch_and_llama_cpp(strapd, hf_and_gguf, tmp_path):
    import torch

    from llm_instrumentation import capture_activations, open_stream

    model, gguf = hf_and_gguf
    lc = tmp_path / "llama.strap"
    # --f32-attention: llama.cpp's defaults (an f16 KV cache, flash attention) round attention
    # to f16; with them this model's layers differ from PyTorch's by up to 7.9e-3 of max |x|
    res = run_llama(gguf, "--output", str(lc), "--tensors", "l_out", "--f32-attention", socket_path=strapd.socket, n=N_NEW,
                    prompt="The capture stream holds every tensor")
    prompt = res["prompt_tokens"]

    layers = [f"model.layers.{i}" for i in range(N_LAYER)]
    pt = tmp_path / "torch.strap"
    gen = []
    with torch.no_grad(), capture_activations(model, output_path=str(pt), socket_path=strapd.socket,
                                              autostart_daemon=False, modules=layers):
        ids = torch.tensor([prompt])
        past = None
        for _ in range(N_NEW):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
            ids = torch.tensor([[tok]])
    # token for token: the same greedy choices
    assert gen == res["tokens"]

    with open_stream(str(lc)) as a, open_stream(str(pt)) as b:
        worst = 0.0
        for name in layers:
            la, tb = a.tensors(name), b.tensors(name)
            assert len(la) == len(tb) == N_NEW, name
            for f, (x, y) in enumerate(zip(la, tb)):
                xa, ya = x.numpy(), y.numpy().reshape(-1, N_EMBD)
                rows = len(prompt) if f == 0 else 1
                assert xa.shape == ya.shape == (rows, N_EMBD), (name, f, xa.shape, ya.shape)
                assert x.meta["pos"] == {"from": 0 if f == 0 else len(prompt) + f - 1, "n": rows}
                rel = float(np.abs(xa - ya).max() / np.abs(ya).max())
                worst = max(worst, rel)
                assert rel <= 1e-4, (name, f, rel)
    print(f"worst max|diff| / max|x| over {N_LAYER} layers x {N_NEW} forward passes: {worst:.2e}")
