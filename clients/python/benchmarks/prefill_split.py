"""Where a captured prefill pass loses its time: the client's side against strapd's
concurrent work (docs/PERFORMANCE.md, "Prefill fast_capture: where the rest goes").

Each round runs, in a rotating order inside one process on the same model and input:

- ``plain``: the forward pass, no hooks;
- ``captured``: open a session, the forward pass with hooks, close (as overhead_ab.py);
- ``stopped``: the same, but strapd is held with SIGSTOP from just after OPENED until the
  forward pass returns (SIGCONT, then close): the client writes and publishes every record
  into a ring strapd does not read meanwhile (the ring must hold the whole pass; the
  socket buffer holds the PUBLISH messages), so the forward pass pays only the client's
  own cost; strapd's work then runs inside the close.

Needs ``--daemon-pid`` (the strapd serving ``--socket``); strapd's CPU seconds per trial
come from /proc/PID/task/*/schedstat. Prints one line per trial and a summary (medians over rounds, ratios to
the round's plain pass) on stderr; ``--json`` keeps every trial.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, DEFAULT_MODEL, build_model, cpu_seconds  # noqa: E402
from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402


def daemon_cpu(pid: int) -> float:
    """strapd's CPU seconds so far, all its threads, to the nanosecond (/proc/PID/schedstat;
    /proc/PID/stat counts in 10 ms ticks, a third of one trial's daemon CPU)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total / 1e9


def plain(model: Any, x: torch.Tensor) -> Dict[str, float]:
    t0 = time.perf_counter()
    model(input_ids=x)
    t = time.perf_counter() - t0
    return {"s": t, "forward_s": t}


def captured(model: Any, x: torch.Tensor, cfg: InstrumentationConfig, sock: str, path: str, pid: int,
             stop: bool) -> Dict[str, float]:
    d0, c0, t0 = daemon_cpu(pid), cpu_seconds(), time.perf_counter()
    with capture_activations(model, config=cfg, output_path=path, socket_path=sock, autostart_daemon=False) as fw:
        if stop:
            os.kill(pid, signal.SIGSTOP)
        try:
            t1, f0 = time.perf_counter(), cpu_seconds()
            model(input_ids=x)
            t2, f1 = time.perf_counter(), cpu_seconds()
        finally:
            if stop:
                os.kill(pid, signal.SIGCONT)
    t3, c1, d1 = time.perf_counter(), cpu_seconds(), daemon_cpu(pid)
    summ = fw.summary or {}
    if summ.get("drops"):
        raise RuntimeError(f"capture dropped {summ['drops']} tensors")
    os.remove(path)
    return {"s": t3 - t0, "open_s": t1 - t0, "forward_s": t2 - t1, "close_s": t3 - t2, "cpu_s": c1 - c0,
            "forward_cpu_s": f1 - f0, "daemon_cpu_s": d1 - d0, "bytes_in": int(summ.get("bytes_in", 0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--tmpdir", required=True, help="directory for the stream files (deleted after each trial)")
    ap.add_argument("--json", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--preset", default="fast_capture")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = build_model(**DEFAULT_MODEL)
    x = torch.randint(0, DEFAULT_MODEL["vocab"], (1, a.seq), generator=torch.Generator().manual_seed(1))
    cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
    path = os.path.join(a.tmpdir, "split.strap")
    kinds = ["plain", "captured", "stopped"]
    run = {
        "plain": lambda: plain(model, x),
        "captured": lambda: captured(model, x, cfg, a.socket, path, a.daemon_pid, False),
        "stopped": lambda: captured(model, x, cfg, a.socket, path, a.daemon_pid, True),
    }
    log = lambda *m: print("split:", *m, file=sys.stderr, flush=True)  # noqa: E731
    rows: List[Dict[str, Dict[str, float]]] = []
    with torch.no_grad():
        for k in kinds:  # warm-up: allocator, the idle ring, strapd's first session
            run[k]()
        for r in range(a.rounds):
            order = kinds[r % 3:] + kinds[:r % 3]
            row = {k: run[k]() for k in order}
            rows.append(row)
            log(f"round {r}: " + "; ".join(
                f"{k} {row[k]['s']:.3f}s fwd {row[k]['forward_s']:.3f}"
                + (f" close {row[k]['close_s']:.3f} strapd {row[k]['daemon_cpu_s']:.3f}" if k != "plain" else "")
                for k in kinds))
    out: Dict[str, Any] = {"preset": a.preset, "set": a.set, "threads": torch.get_num_threads(), "rounds": rows}
    for k in ("captured", "stopped"):
        kept = [r["plain"]["s"] / r[k]["s"] for r in rows]
        fwd = [r["plain"]["s"] / r[k]["forward_s"] for r in rows]
        s = {"kept": statistics.median(kept), "kept_min": min(kept), "kept_max": max(kept),
             "forward_kept": statistics.median(fwd), "forward_kept_min": min(fwd), "forward_kept_max": max(fwd),
             "open_s": statistics.median(r[k]["open_s"] for r in rows),
             "close_s": statistics.median(r[k]["close_s"] for r in rows),
             "daemon_cpu_s": statistics.median(r[k]["daemon_cpu_s"] for r in rows),
             "forward_cpu_over_plain_s": statistics.median(r[k]["forward_cpu_s"] for r in rows)}
        out[k] = s
        log(f"{k}: kept {s['kept']:.3f} [{s['kept_min']:.3f}..{s['kept_max']:.3f}], forward only "
            f"{s['forward_kept']:.3f} [{s['forward_kept_min']:.3f}..{s['forward_kept_max']:.3f}], open "
            f"{s['open_s'] * 1e3:.1f} ms, close {s['close_s'] * 1e3:.1f} ms, strapd {s['daemon_cpu_s']:.3f} s")
    log(f"plain: {statistics.median(r['plain']['s'] for r in rows):.3f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
