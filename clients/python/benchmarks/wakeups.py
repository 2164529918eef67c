"""strapd's wake-ups per generated token: greedy decoding under capture with per-token
tracking, counting the daemon's context switches (every thread's voluntary and involuntary
switches, from ``/proc/<pid>/task/*/status``) and its CPU over the decoding loop.

A load-independent companion of ``decode_ab.py``: its wall-time ratios swing with whatever
else holds the cores, while the number of times strapd is woken per token depends only on
the protocol flow (docs/PERFORMANCE.md, "Fewer wake-ups per token"). Run it once per tree::

    PYTHONPATH=<tree>/clients/python/src python <tree>/clients/python/benchmarks/wakeups.py \\
        --strapd <tree>/bin/strapd [--trials 3] [--new 64]

``--per-thread`` adds each strapd thread's switches per token; ``--perf-record OUT`` runs
``perf record -g`` on strapd over the measured trials (``--perf-event context-switches``
for where the switches are, ``cpu-clock`` for the CPU); ``--strapd-arg=--debug-trace=F``
writes a Go execution trace of strapd (``go tool trace -d=parsed F``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, build_model  # noqa: E402
from decode_ab import DECODE_MODEL  # noqa: E402
from overhead_ab import greedy  # noqa: E402
from record_cost import start_strapd  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402


def switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far."""
    n = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        n += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return n


def thread_switches(pid: int) -> Dict[int, int]:
    """Context switches of each thread of ``pid`` so far, by thread id."""
    out: Dict[int, int] = {}
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                n = sum(int(line.split()[1]) for line in f
                        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        except FileNotFoundError:
            continue
        out[int(path.split("/")[4])] = n
    return out


def split_switches(pid: int) -> Dict[str, int]:
    """Voluntary (the thread blocked: a wake-up follows) and involuntary (preempted)
    switches of every thread of ``pid`` so far."""
    out = {"voluntary": 0, "nonvoluntary": 0}
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                for line in f:
                    k = line.split(":")[0]
                    if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                        out[k.split("_")[0]] += int(line.split()[1])
        except FileNotFoundError:
            pass
    return out


def cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of every thread of ``pid`` (schedstat: finer than the clock
    ticks of ``cpu``)."""
    n = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                n += int(f.read().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            pass
    return n


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strapd", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--per-thread", action="store_true",
                    help="also report each strapd thread's switches per token (summed over the trials)")
    ap.add_argument("--strapd-arg", action="append", default=[],
                    help="an extra flag for strapd serve, e.g. --strapd-arg=--debug-trace=/tmp/t.out")
    ap.add_argument("--perf-record", metavar="OUT",
                    help="run `perf record -g` on strapd over the measured trials (events: --perf-event)")
    ap.add_argument("--perf-event", default="cpu-clock")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="strap-wake-", dir="/tmp")
    proc, sock = start_strapd(a.strapd, tmp, extra=a.strapd_arg)
    perf = None
    per_thread: Dict[int, int] = {}
    try:
        model = build_model(**DECODE_MODEL)
        cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
        prompt = torch.randint(0, DECODE_MODEL["vocab"], (1, 32), generator=torch.Generator().manual_seed(1))
        path = os.path.join(tmp, "w.strap")
        rows = []
        with torch.no_grad():
            for trial in range(a.trials + 1):  # the first warms up
                with capture_activations(model, config=cfg, output_path=path, socket_path=sock,
                                         autostart_daemon=False, track_per_token=True) as fw:
                    if trial and a.perf_record and perf is None:
                        perf = subprocess.Popen(["perf", "record", "-q", "-g", "-e", a.perf_event, "-p", str(proc.pid),
                                                 "-o", a.perf_record], stdout=subprocess.DEVNULL)
                        time.sleep(0.5)  # perf attaches
                    t0 = thread_switches(proc.pid)
                    s0, c0, v0, n0 = switches(proc.pid), cpu(proc.pid), split_switches(proc.pid), cpu_ns(proc.pid)
                    greedy(model, prompt, a.new, fw)
                    s1, c1, v1, n1 = switches(proc.pid), cpu(proc.pid), split_switches(proc.pid), cpu_ns(proc.pid)
                    if trial:
                        for tid, n in thread_switches(proc.pid).items():
                            per_thread[tid] = per_thread.get(tid, 0) + n - t0.get(tid, 0)
                os.remove(path)
                if trial:
                    rows.append({"switches_per_token": (s1 - s0) / a.new, "daemon_cpu_ms_per_token": 1e3 * (c1 - c0) / a.new,
                                 "voluntary_per_token": (v1["voluntary"] - v0["voluntary"]) / a.new,
                                 "nonvoluntary_per_token": (v1["nonvoluntary"] - v0["nonvoluntary"]) / a.new,
                                 "daemon_cpu_ms_per_token_schedstat": (n1 - n0) / 1e6 / a.new})
        res: Dict[str, object] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        res["trials"] = rows
        if a.per_thread:
            res["per_thread_switches_per_token"] = {
                str(t): round(n / (a.new * a.trials), 2)
                for t, n in sorted(per_thread.items(), key=lambda kv: -kv[1]) if n}
        print(json.dumps(res))
    finally:
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
