"""Checkpoint cost as a capture grows: time per checkpoint at ~10 tokens vs ~10,000 tokens.

A checkpoint is CHECKPOINT → strapd writes and fdatasyncs what is new → CHECKPOINTED →
atomic replace of the JSON file (docs/CHECKPOINTS.md). No key of a checkpoint made through
``capture_activations(model, ...)``, the form used here, depends on how many tokens came
before (1.3.1's ``tokens`` list is written only by 1.3.1's API form), so the cost should be flat
across the run; ``checkpoint_scaling.py`` compares the forms at 100 to 100,000 tokens.

Runs a real strapd (bin/strapd, or $STRAPD_BIN) on a temp socket and a small MLP whose two
Linear layers are hooked (a fixed amount of new data per token, so the fsync work per
checkpoint is the same at every size). Pure Python script, no pytest-benchmark.

    .venv/bin/python clients/python/benchmarks/checkpoint_cost.py [--tokens 10000] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from llm_instrumentation import InstrumentationConfig, capture_activations

REPO = Path(__file__).resolve().parents[3]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=10, help="checkpoint_interval_tokens")
    ap.add_argument("--width", type=int, default=256, help="MLP width (bytes per token = 2 x 4 x width)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    binary = os.environ.get("STRAPD_BIN", str(REPO / "bin" / "strapd"))
    tmp = tempfile.mkdtemp(prefix="strap-ck-", dir="/tmp")
    sock = os.path.join(tmp, "s.sock")
    daemon = subprocess.Popen([binary, "serve", "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("strapd did not start")
            time.sleep(0.05)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                    torch.nn.Linear(args.width, args.width)).eval()
        cfg = InstrumentationConfig(compression_algorithm="none", modules=("0", "2"))
        x = torch.randn(1, args.width)
        out = Path(tmp) / "bench.strap"
        t0 = time.perf_counter()
        with torch.no_grad(), capture_activations(model, config=cfg, output_path=out, socket_path=sock,
                                                  autostart_daemon=False, track_per_token=True,
                                                  checkpoint_interval_tokens=args.every) as fw:
            for k in range(args.tokens):
                model(x)
                fw.token_tracker.record_token(k % 1000, "t")
            ck_bytes = os.path.getsize(fw.options.checkpoint_file)
        total = time.perf_counter() - t0
        times = fw.checkpoint_times
        n = len(times)
        window = max(1, min(10, n // 10))
        first, last = times[:window], times[-window:]
        res = {
            "tokens": args.tokens, "checkpoint_every": args.every, "checkpoints": n,
            "bytes_per_token": 2 * 4 * args.width, "stream_bytes": os.path.getsize(out),
            "ms_per_checkpoint_first": round(1e3 * statistics.median(first), 3),
            "at_tokens_first": f"{args.every}..{args.every * window}",
            "ms_per_checkpoint_last": round(1e3 * statistics.median(last), 3),
            "at_tokens_last": f"{args.every * (n - window + 1)}..{args.every * n}",
            "ms_per_checkpoint_median_all": round(1e3 * statistics.median(times), 3),
            "ratio_last_over_first": round(statistics.median(last) / statistics.median(first), 2),
            # median ms per checkpoint in each tenth of the run: flat means cost independent of N
            "ms_median_by_decile": [round(1e3 * statistics.median(times[i * n // 10:(i + 1) * n // 10]), 2)
                                    for i in range(10)] if n >= 10 else [],
            "checkpoint_file_bytes_last": ck_bytes,  # flat: no 1.3.1 token list in this form (docs/CHECKPOINTS.md 2)
            "wall_s": round(total, 2),
        }
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            for k, v in res.items():
                print(f"{k:30s} {v}")
        return 0
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
