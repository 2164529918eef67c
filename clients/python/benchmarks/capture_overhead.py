"""Forward-pass time with and without capture, and capture throughput, on a small Llama.

Usage:
    python clients/python/benchmarks/capture_overhead.py --socket /tmp/x/strapd.sock \
        [--preset fast_capture] [--seq 512] [--forwards 10] [--layers 4] [--hidden 1024]

Prints one JSON line: baseline and captured seconds per forward (best of 3 rounds), the
overhead ratio, captured bytes per forward and the achieved GB/s (bytes / captured time).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llm_instrumentation import analyze_activations, capture_activations


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--preset", default="fast_capture")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--forwards", type=int, default=10)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--memory-gb", type=float, default=0.25)
    a = ap.parse_args()
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(hidden_size=a.hidden, intermediate_size=a.hidden * 8 // 3 // 64 * 64,
                                     num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                                     num_key_value_heads=a.hidden // 128, vocab_size=2048)).eval()
    x = torch.randint(0, 2048, (1, a.seq))

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(a.forwards):
            m(input_ids=x)
        return (time.perf_counter() - t0) / a.forwards

    with torch.no_grad():
        run()
        base = min(run() for _ in range(3))
        out = os.path.join(tempfile.mkdtemp(prefix="bench-"), "b.strap")
        cap = []
        for _ in range(3):
            with capture_activations(m, preset=a.preset, output_path=out, socket_path=a.socket,
                                     autostart_daemon=False) as fw:
                t0 = time.perf_counter()
                for _ in range(a.forwards):
                    m(input_ids=x)
                t1 = time.perf_counter()
            cap.append((t1 - t0) / a.forwards)
            closed_t = time.perf_counter() - t0
        r = analyze_activations(out)
        os.remove(out)
    per_fwd = r["total_raw_bytes"] / a.forwards
    print(json.dumps({
        "preset": a.preset, "seq": a.seq, "hidden": a.hidden, "layers": a.layers, "hooks": len(fw.hooked_modules),
        "threads": torch.get_num_threads(), "baseline_s": round(base, 5), "captured_s": round(min(cap), 5),
        "overhead": round(min(cap) / base, 3), "bytes_per_forward": int(per_fwd),
        "capture_gbps": round(per_fwd / min(cap) / 1e9, 3),
        "end_to_end_gbps_incl_close": round(r["total_raw_bytes"] / closed_t / 1e9, 3),
        "compression_ratio": round(r["compression_ratio"], 3), "drops": r["drops"]["count"],
    }))


if __name__ == "__main__":
    main()
