"""Checkpoint cost against the capture's length: time per checkpoint at 100, 1,000, 10,000
and 100,000 recorded tokens (docs/CHECKPOINTS.md 2).

One real strapd (bin/strapd, or $STRAPD_BIN) on a temp socket; per form of the API, one capture
without a model (tokens only, so the stream grows by one TOKEN packet a token and strapd's
fdatasync work per checkpoint is the same at every size). Tokens are recorded up to each size,
then ``--reps`` checkpoints are made there (``fw.checkpoint()``: CHECKPOINT, strapd's
fdatasync, CHECKPOINTED, the file's atomic replace) and timed: wall time and this process's
CPU time (``time.process_time``, less sensitive to other jobs on the machine). The forms:

- ``new``: ``capture_activations(model, ...)`` — the checkpoint's own keys only;
- ``131``: 1.3.1's ``InstrumentationFramework(config).capture_activations(path, ...)`` — its
  checkpoints carry 1.3.1's ``tokens`` list too (the one part that grows with the capture);
- ``log``: ``new`` as a capture that uploads makes them: the token log beside the checkpoint
  is appended (the tokens since the last checkpoint) and fdatasynced first. The capture is
  taken for an uploading one only while the checkpoints are timed (no object store needed:
  the log is the client's own file).

    .venv/bin/python clients/python/benchmarks/checkpoint_scaling.py [--sizes 100,1000,10000,100000] [--reps 20]
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
import warnings
from pathlib import Path
from typing import Any, Dict, List

import torch

from llm_instrumentation import InstrumentationConfig, InstrumentationFramework, capture_activations

REPO = Path(__file__).resolve().parents[3]


def _measure(fw: Any, sizes: List[int], reps: int, step: int = 0) -> List[Dict[str, Any]]:
    """``step``: tokens recorded before each timed checkpoint (the log's append per checkpoint)."""
    rows = []
    tr = fw.token_tracker
    for n in sizes:
        while tr.step < n:
            tr.record_token(tr.step % 1000, "tok")
        walls, cpus = [], []
        for _ in range(reps):
            for _ in range(step):
                tr.record_token(tr.step % 1000, "tok")
            c0, w0 = time.process_time(), time.perf_counter()
            fw.checkpoint()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        rows.append({"tokens": n, "ms_wall_median": round(1e3 * statistics.median(walls), 3),
                     "ms_cpu_median": round(1e3 * statistics.median(cpus), 3),
                     "checkpoint_bytes": os.path.getsize(fw.options.checkpoint_file)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000,100000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--forms", default="new,131,log")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    binary = os.environ.get("STRAPD_BIN", str(REPO / "bin" / "strapd"))
    tmp = tempfile.mkdtemp(prefix="strap-cks-", dir=os.environ.get("STRAP_BENCH_DIR", "/tmp"))
    sock = os.path.join(tmp, "s.sock")
    daemon = subprocess.Popen([binary, "serve", "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res: Dict[str, Any] = {"cpu": _cpu(), "reps": args.reps}
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("strapd did not start")
            time.sleep(0.05)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
        cfg = InstrumentationConfig(compression_algorithm="none")
        big = 1 << 40  # no automatic checkpoint: every one is made and timed here
        for form in args.forms.split(","):
            out = os.path.join(tmp, f"{form}.strap")
            if form in ("new", "log"):
                with capture_activations(model, config=cfg, output_path=out, socket_path=sock, autostart_daemon=False,
                                         track_per_token=True, checkpoint_interval_tokens=big) as fw:
                    if form == "log":
                        cls = type(fw)
                        saved = cls.__dict__["upload_target"] if "upload_target" in cls.__dict__ else None
                        cls.upload_target = property(lambda self: "s3://bench/only-the-token-log")  # type: ignore
                        try:
                            res[form] = _measure(fw, sizes, args.reps, step=10)
                            res[form + "_file_bytes"] = os.path.getsize(fw._token_log.path)
                        finally:
                            if saved is None:
                                del cls.upload_target
                            else:
                                cls.upload_target = saved
                    else:
                        res[form] = _measure(fw, sizes, args.reps)
            elif form == "131":
                fw = InstrumentationFramework(cfg, socket_path=sock, autostart_daemon=False)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # no model: tokens only, as 1.3.1 allowed
                    with fw.capture_activations(out, track_per_token=True, checkpoint_interval_tokens=big):
                        res[form] = _measure(fw, sizes, args.reps)
            else:
                raise SystemExit(f"unknown form {form!r}")
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"cpu: {res['cpu']}; median of {args.reps} checkpoints at each size")
        for form in args.forms.split(","):
            for r in res[form]:
                print(f"{form:4s} tokens={r['tokens']:>7d}  wall {r['ms_wall_median']:8.3f} ms  "
                      f"cpu {r['ms_cpu_median']:8.3f} ms  file {r['checkpoint_bytes']:>9d} B")
    return 0


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
