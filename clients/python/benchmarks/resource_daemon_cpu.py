"""strapd's CPU for a client's resource events: greedy decoding captured with and without
resource events ``MINIMAL``, each strapd binary given in turn, rounds interleaved.

A Llama 512×8 built from a config (random weights), a 32-token prompt and 48 greedy tokens
with the KV cache, per-token tracking, ``balanced``, every layer's residual, attention and MLP;
torch threads 1. Per capture: the decode loop's wall time, the process's CPU and strapd's CPU
(/proc/PID/stat, 10 ms ticks: a median over rounds). Reading: what resource events add to
strapd's CPU is the MINIMAL row's strapd CPU minus the plain row's.

    python resource_daemon_cpu.py --strapd A=/path/strapd [--strapd B=/other/strapd] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_model import build_model, pid_cpu_seconds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strapd", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    import torch

    from llm_instrumentation import capture_activations

    torch.set_num_threads(1)
    model = build_model(hidden=512, layers=8, intermediate=1408, vocab=32000, heads=8)
    names = [f"model.layers.{i}{s}" for i in range(8) for s in ("", ".self_attn", ".mlp")]
    ids = torch.randint(0, 32000, (1, 32))

    def decode(step=None) -> None:
        with torch.no_grad():
            out = model(ids, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            cache = out.past_key_values
            for _ in range(a.tokens):
                if step is not None:
                    step(int(tok))
                out = model(tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)

    tmp = tempfile.mkdtemp(prefix="strap-resdaemon-")
    daemons = {}
    for spec in a.strapd:
        name, _, path = spec.partition("=")
        sock = os.path.join(tmp, name + ".sock")
        daemons[name] = (subprocess.Popen([path, "serve", "--socket", sock, "--no-probes"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL), sock)
    try:
        for p, sock in daemons.values():
            while not os.path.exists(sock):
                if p.poll() is not None:
                    raise SystemExit("strapd did not start")
                time.sleep(0.05)
        decode()  # warm
        rows: Dict[str, List[List[float]]] = {}
        for r in range(a.rounds):
            order = list(daemons) if r % 2 == 0 else list(reversed(daemons))
            for name in order:
                p, sock = daemons[name]
                for level in (None, "MINIMAL"):
                    out = os.path.join(tmp, "x.strap")
                    d0, c0 = pid_cpu_seconds(p.pid), time.process_time()
                    with capture_activations(model, preset="balanced", output_path=out, modules=names,
                                             track_per_token=True, resource_level=level, socket_path=sock,
                                             autostart_daemon=False) as fw:
                        t0 = time.perf_counter()
                        decode(lambda tid: fw.record_token(tid, str(tid)))
                        loop = time.perf_counter() - t0
                    c1 = time.process_time()
                    time.sleep(0.2)  # the session's end in strapd
                    rows.setdefault(f"{name} {level or 'plain'}", []).append([loop, c1 - c0, pid_cpu_seconds(p.pid) - d0])
                    for f in os.listdir(tmp):
                        if f.startswith("x.strap"):
                            os.remove(os.path.join(tmp, f))
        print(f"load average {os.getloadavg()[0]:.1f}; {a.rounds} rounds; medians (s per capture of {a.tokens} tokens)")
        for k, v in rows.items():
            med = [statistics.median(x) for x in zip(*v)]
            print(f"{k:>24}: decode loop {med[0]:.3f}  process CPU {med[1]:.3f}  strapd CPU {med[2]:.3f} "
                  f"(each round: {[round(x[2], 3) for x in v]})")
    finally:
        for p, _ in daemons.values():
            p.terminate()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
