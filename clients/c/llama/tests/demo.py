"""make demo-llamacpp: the whole llama.cpp path on a small random Llama GGUF, nothing downloaded.

1. a random Llama GGUF with llama.cpp's Llama tokenizer (make_tiny_gguf.py);
2. strapd serving on a socket in OUT;
3. strap-llama: greedy generation, every layer's attn_out, ffn_out and l_out captured, a TOKEN per
   token, checkpoints every 8 tokens, strapd's kernel trace beside the stream, seed 003's resource
   events (DETAILED) in capture.strap.resources.jsonl;
4. the stream read back (strapd inspect; Python open_stream: the per-token map, one tensor);
5. the report (python -m llm_instrumentation.report), an HTML page in OUT/capture.strap.report/.

    python demo.py --out build/demo-llamacpp
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import STRAPD, Strapd, make_model, strap_llama_cmd  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/demo-llamacpp")
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = make_model(out / "tiny-llama.gguf", n_embd=128, n_layer=4, n_head=4, n_head_kv=2, n_ff=256)
    print(f"1. model: {model} (random weights, llama.cpp's Llama SentencePiece vocab)")
    d = Strapd(out)
    try:
        cap = out / "capture.strap"
        cmd = strap_llama_cmd(model, "--output", str(cap), "--tensors", "attn_out,ffn_out,l_out",
                              "--checkpoint-interval-tokens", "8", "--trace", "--overwrite",
                              "--resource-level", "DETAILED",
                              socket_path=d.socket, n=a.tokens, prompt="Once upon a time, in a small town,")
        print("2. strapd serving on", d.socket)
        print("3.", " ".join(cmd[:1] + [c if " " not in c else repr(c) for c in cmd[1:]]))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            print(p.stderr)
            return 1
        res = json.loads(p.stdout)
        print(f"   {len(res['tokens'])} tokens, {res['records']} tensors ({res['bytes']} bytes), "
              f"decode {res['decode_tokens'] / res['decode_s']:.0f} tokens/s, {res['resource_events']} resource events")
    finally:
        d.stop()
    ins = subprocess.run([str(STRAPD), "inspect", str(cap)], capture_output=True, text=True)
    print("4. strapd inspect:\n" + "\n".join("   " + line for line in ins.stdout.splitlines()[-20:]))
    from llm_instrumentation import open_stream

    with open_stream(str(cap)) as r:
        toks = [p for p in r.packets() if p.type_name == "TOKEN"]
        print("   tokens (step: id text):", ", ".join(f"{p.step}: {p.meta['token_id']} {p.meta['text']!r}"
                                                    for p in toks[:8]), "...")
        t = next(iter(r.tensors("model.layers.3")))
        print(f"   {t.name} step {t.step}: {t.dtype} {t.shape}, rows {t.meta['pos']}, node {t.meta['ggml_name']} "
              f"({t.meta['ggml_op']}), mean |x| {abs(t.numpy()).mean():.3f}")
    evs = [json.loads(line) for line in open(str(cap) + ".resources.jsonl")]
    mm = next(e for e in evs if e.get("operation") == "mul_mat" and e.get("layer_id") == 3)
    print(f"   resource event: {mm['module']} step {mm['step']}: {mm['flops']} FLOPs ({mm['flops_source']}), "
          f"{mm['duration_us']} µs measured")
    from llm_instrumentation.report import build_report

    rep = build_report(str(cap), progress=False)
    print(f"5. report: {rep['html']} ({len(rep['figures'])} figures)")
    for n in rep["notes"]:
        print("   note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
