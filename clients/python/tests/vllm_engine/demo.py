"""`make demo-vllm`: vLLM serves three concurrent requests with the strap plugin on, then the
capture is read back by request and checked against transformers.

Steps: a random Llama saved with save_pretrained; strapd started on a private socket; vLLM
(in a child process, exactly as a user's script: only STRAP_VLLM_OUTPUT set) generates
greedily; then list_requests/load_request, each request's layers compared with
transformers' outputs on the same ids, and `strapd inspect` of the stream.

Usage: demo.py --out DIR [--strapd bin/strapd]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def start_strapd(binary: str, sock: str) -> subprocess.Popen:
    p = subprocess.Popen([binary, "serve", "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(sock)
            return p
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise SystemExit(f"strapd did not start on {sock}")
            time.sleep(0.05)
        finally:
            s.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/demo-vllm")
    ap.add_argument("--strapd", default="bin/strapd")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(a.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    caps = out / "caps"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                                         max_position_embeddings=256)).eval()
    model.save_pretrained(out / "model")
    sockdir = tempfile.mkdtemp(prefix="strap-", dir="/tmp")
    sock = os.path.join(sockdir, "strapd.sock")
    daemon = start_strapd(os.path.abspath(a.strapd), sock)
    try:
        env = dict(os.environ, STRAPD_SOCKET=sock, STRAP_VLLM_OUTPUT=str(caps), VLLM_ENABLE_V1_MULTIPROCESSING="0")
        print(f"== vLLM with STRAP_VLLM_OUTPUT={caps}: three concurrent requests, prompts of 5, 11, 17 tokens, "
              f"8 generated each")
        t0 = time.monotonic()
        subprocess.run([sys.executable, str(HERE / "run_vllm.py"), str(out / "model"), str(out / "generated.json")],
                       env=env, check=True, stderr=subprocess.DEVNULL)
        gen = json.loads((out / "generated.json").read_text())
        print(f"   vLLM start-up {gen['startup_s']:.1f} s, generate {gen['generate_s']:.2f} s "
              f"(whole run {time.monotonic() - t0:.0f} s)")
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(sockdir, ignore_errors=True)

    from llm_instrumentation.vllm import list_requests, load_request

    print(f"== list_requests: {list_requests(caps)}")
    worst = 0.0
    for req in gen["requests"]:
        r = load_request(caps, req["request_id"])
        ids = r.token_ids.tolist()
        assert ids == req["prompt"] + req["generated"]
        ref = {}
        hooks = [layer.register_forward_hook(
            lambda m, i, o, n=f"model.layers.{k}": ref.__setitem__(n, (o[0] if isinstance(o, tuple) else o)[0]))
            for k, layer in enumerate(model.model.layers)]
        with torch.no_grad():
            model(torch.tensor([ids]))
        for h in hooks:
            h.remove()
        errs = []
        for name, x in r.items():
            want = ref[name][r.positions]
            errs.append((x - want).abs().max().item() / want.abs().max().item())
        worst = max(worst, *errs)
        print(f"   request {r.request_id!r} (engine id {r.engine_request_id}): prompt {r.prompt_len} tokens, "
              f"{len(ids) - r.prompt_len} generated; {len(r)} modules of shape {tuple(next(iter(r.values())).shape)} "
              f"at positions {r.positions[0].item()}..{r.positions[-1].item()}; "
              f"max error vs transformers {max(errs):.2e} of max|x|")
    print(f"== worst error {worst:.2e} of max|x| (float32)")
    for p in sorted(caps.glob("*.strap")):
        print(f"== strapd inspect {p.name}")
        subprocess.run([a.strapd, "inspect", str(p)], check=True)


if __name__ == "__main__":
    main()
