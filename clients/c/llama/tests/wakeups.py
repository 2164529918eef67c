"""strapd's wake-ups per generated token for two strap-llama builds, interleaved.

For each build in turn (alternating which goes first), one strap-llama run of N greedy tokens
capturing ``--tensors`` through one strapd; between runs, strapd's voluntary context switches
(every thread, /proc/PID/task/*/status: each is a wake-up of one of its threads) and CPU time
(/proc/PID/stat) are read, and divided by N. Prints per-run values and medians.

    python wakeups.py MODEL.gguf STRAPD BASE_STRAP_LLAMA NEW_STRAP_LLAMA [--rounds 8] [--tokens 256]

(docs/C_CLIENT.md, "Publication": the deferred PUBLISH measured with it.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Dict, List, Tuple


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("strapd")
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--tensors", default="attn_out,ffn_out,l_out")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="strap-wakeups-")
    sock = os.path.join(d, "strapd.sock")
    daemon = subprocess.Popen([a.strapd, "serve", "--socket", sock, "--no-probes"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("strapd did not start")
            time.sleep(0.05)
        tick = os.sysconf("SC_CLK_TCK")

        def snap() -> Tuple[int, float]:
            switches = 0
            for t in glob.glob(f"/proc/{daemon.pid}/task/*/status"):
                try:
                    with open(t) as f:
                        for line in f:
                            if line.startswith("voluntary_ctxt_switches"):
                                switches += int(line.split()[1])
                except FileNotFoundError:  # a thread that just ended
                    pass
            with open(f"/proc/{daemon.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return switches, (int(fields[11]) + int(fields[12])) / tick

        bins = {"base": a.base, "new": a.new}
        res: Dict[str, Dict[str, List[float]]] = {k: {"switches": [], "cpu_ms": [], "tps": []} for k in bins}
        out = os.path.join(d, "x.strap")
        for r in range(a.rounds):
            for k in (("base", "new") if r % 2 == 0 else ("new", "base")):
                c0, u0 = snap()
                p = subprocess.run([bins[k], "-m", a.model, "-p", "Hello world", "-n", str(a.tokens), "--ignore-eos",
                                    "--socket", sock, "--output", out, "--tensors", a.tensors, "--overwrite",
                                    "-t", "1"], capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"{k}: strap-llama exited {p.returncode}: {p.stderr[-2000:]}")
                time.sleep(0.3)  # the session's end (CLOSE handled, stream ended)
                c1, u1 = snap()
                j = json.loads(p.stdout)
                res[k]["switches"].append((c1 - c0) / a.tokens)
                res[k]["cpu_ms"].append((u1 - u0) / a.tokens * 1e3)
                res[k]["tps"].append(j["decode_tokens"] / j["decode_s"])
        print(f"load average {os.getloadavg()[0]:.1f}; {a.rounds} rounds of {a.tokens} tokens, --tensors {a.tensors}")
        for k, v in res.items():
            print(f"{k}: strapd voluntary switches/token {[round(x, 1) for x in v['switches']]} "
                  f"(median {statistics.median(v['switches']):.1f}); strapd CPU ms/token "
                  f"{[round(x, 2) for x in v['cpu_ms']]}; decode tokens/s median {statistics.median(v['tps']):.1f}")
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
