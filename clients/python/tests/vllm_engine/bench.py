"""A first, rough measurement of the plugin's cost (docs/VLLM.md 6): vLLM's generate time for
one batch (after a warm-up batch of other prompts), plain and with every decoder layer's output
captured to disk, alternating, each in a fresh vLLM process (run_vllm.py). Not the issue's benchmark (no hooks-into-a-list or
extract_hidden_states comparison, no `make bench`).

Usage: bench.py --strapd bin/strapd [--requests 16] [--rounds 2] [--preset fast_capture]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strapd", default="bin/strapd")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--preset", default="fast_capture")
    ap.add_argument("--out", default="build/bench-vllm")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    from demo import start_strapd

    out = Path(a.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                 max_position_embeddings=256)).eval().save_pretrained(out / "model")
    rng = random.Random(1)
    prompts = ",".join(str(rng.randint(32, 128)) for _ in range(a.requests))
    sockdir = tempfile.mkdtemp(prefix="strap-", dir="/tmp")
    sock = os.path.join(sockdir, "strapd.sock")
    daemon = start_strapd(os.path.abspath(a.strapd), sock)
    times: dict = {"plain": [], "capture": []}
    try:
        for rnd in range(a.rounds):
            for mode in ("plain", "capture"):
                env = {k: v for k, v in os.environ.items() if not k.startswith("STRAP_VLLM_")}
                env.update(STRAPD_SOCKET=sock, VLLM_ENABLE_V1_MULTIPROCESSING="0")
                caps = out / f"caps-{rnd}"
                if mode == "capture":
                    env.update(STRAP_VLLM_OUTPUT=str(caps), STRAP_VLLM_PRESET=a.preset)
                res = out / f"{mode}-{rnd}.json"
                subprocess.run([sys.executable, str(HERE / "run_vllm.py"), str(out / "model"), str(res), "--prompts",
                                prompts, "--max-tokens", str(a.max_tokens), "--warmup"], env=env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                took = json.loads(res.read_text())["generate_s"]
                size = sum(p.stat().st_size for p in caps.glob("*.strap")) if mode == "capture" else 0
                times[mode].append(took)
                print(f"round {rnd} {mode:7s}: generate {took:.2f} s" + (f", stream {size / 2**20:.1f} MiB" if size else ""),
                      flush=True)
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)
    p, c = statistics.median(times["plain"]), statistics.median(times["capture"])
    print(f"{a.requests} requests, prompts {prompts}, {a.max_tokens} generated each; preset {a.preset}")
    print(f"median generate: plain {p:.2f} s, capture {c:.2f} s, kept {p / c:.3f} of plain throughput")


if __name__ == "__main__":
    main()
