"""Writes a small random Llama GGUF with a real tokenizer, without downloading anything.

The tokenizer (every ``tokenizer.*`` key) is copied from one of the vocab-only GGUF files that
llama.cpp ships under ``models/`` (``ggml-vocab-llama-spm.gguf``: Llama's 32 000-token
SentencePiece vocabulary); the weights are seeded N(0, std²) draws (norm weights 1), so the same
arguments always give the same file. Written with llama.cpp's own ``gguf-py`` (put
``<llama.cpp>/gguf-py`` on PYTHONPATH), which matches the reader of the library we test.

    python make_tiny_gguf.py --vocab models/ggml-vocab-llama-spm.gguf --out tiny.gguf \
        [--n-embd 64 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 128 --dtype f32 --seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import gguf


def copy_tokenizer(reader: gguf.GGUFReader, w: gguf.GGUFWriter) -> int:
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            vals = [field.parts[i] for i in field.data]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(v).decode("utf-8") for v in vals]
            else:
                vals = [v.tolist()[0] for v in vals]
            w.add_key_value(key, vals, vtype, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[field.data[0]]).decode("utf-8"), vtype)
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vtype)
    if n_vocab == 0:
        raise SystemExit("the vocab file has no tokenizer.ggml.tokens")
    return n_vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", required=True, help="a vocab-only GGUF (llama.cpp models/ggml-vocab-*.gguf)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32", help="the matrices' type (norms stay f32)")
    ap.add_argument("--std", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.n_embd % a.n_head or a.n_head % a.n_head_kv:
        raise SystemExit("n_embd must divide by n_head, n_head by n_head_kv")

    reader = gguf.GGUFReader(a.vocab)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("strap-tiny-llama")
    n_vocab = copy_tokenizer(reader, w)
    head_dim = a.n_embd // a.n_head
    w.add_context_length(a.n_ctx)
    w.add_embedding_length(a.n_embd)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if a.dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)

    rng = np.random.default_rng(a.seed)
    mat_dtype = np.float32 if a.dtype == "f32" else np.float16

    def mat(name: str, rows: int, cols: int) -> None:
        # numpy (rows, cols) is ggml ne = [cols, rows]: a matrix mapping cols inputs to rows outputs
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * a.std).astype(mat_dtype))

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    mat("token_embd.weight", n_vocab, a.n_embd)
    norm("output_norm.weight", a.n_embd)
    kv = head_dim * a.n_head_kv
    for i in range(a.n_layer):
        norm(f"blk.{i}.attn_norm.weight", a.n_embd)
        mat(f"blk.{i}.attn_q.weight", a.n_embd, a.n_embd)
        mat(f"blk.{i}.attn_k.weight", kv, a.n_embd)
        mat(f"blk.{i}.attn_v.weight", kv, a.n_embd)
        mat(f"blk.{i}.attn_output.weight", a.n_embd, a.n_embd)
        norm(f"blk.{i}.ffn_norm.weight", a.n_embd)
        mat(f"blk.{i}.ffn_gate.weight", a.n_ff, a.n_embd)
        mat(f"blk.{i}.ffn_up.weight", a.n_ff, a.n_embd)
        mat(f"blk.{i}.ffn_down.weight", a.n_embd, a.n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
