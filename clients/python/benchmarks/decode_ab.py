"""Greedy decoding with and without capture, as interleaved A/B pairs (docs/PERFORMANCE.md 1).

Token-by-token generation is where the client's fixed cost per record shows: every forward
pass is one token, so each hooked module writes a ``1 x 1 x hidden`` record per token. This
runs greedy decoding with the KV cache on a small Llama (default hidden 512, 8 layers) plain
and under capture (``record_token`` for every generated token), alternating the order inside
each pair, and checks that the generated ids are identical.

Two ratios per pair, plain time / captured time:

* *kept*: the captured trial includes opening and closing the session (what a user pays);
* *loop only*: the decoding loop inside the open session (what each token pays).

On a shared, overloaded machine wall time swings by whole factors between trials (torch's
intra-op threads wait on each other at every operator when other processes hold the cores),
so each trial also records CPU seconds: this process's, and, when the script started strapd
itself, the daemon's (from ``/proc``). *CPU kept* = plain CPU / (captured CPU + daemon CPU):
what the capture would cost if model and daemon took turns on one core, a load-independent
lower bound of the wall-time ratio on an idle machine (there the daemon runs beside the model).
``--threads 1`` keeps torch to one intra-op thread.

``--record-time`` also times the callback the capture gives its hooks (the per-record write)
with ``time.thread_time_ns`` around each call, inside the decoding: there, between kernels
that stream the weights through the caches, a record costs more than in ``record_cost.py``'s
warm loop. The two clock reads and the wrapper are part of the figure (a few µs cold), and
the captured trials are slower by them: use it for the per-record figure, not for *kept*.

Usage::

    python clients/python/benchmarks/decode_ab.py [--socket S | --strapd bin/strapd] \\
        [--pairs 7] [--new 64] [--prompt 32] [--preset balanced] [--set resid+attn+mlp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, build_model, cpu_seconds, pid_cpu_seconds, threads  # noqa: E402
from overhead_ab import greedy  # noqa: E402
from record_cost import REPO, start_strapd  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

#: The decode benchmark's model: small enough that per-record cost, not matmuls, shows.
DECODE_MODEL: Dict[str, int] = {"hidden": 512, "layers": 8, "intermediate": 1408, "vocab": 32000, "heads": 8}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="a running strapd (default: start --strapd)")
    ap.add_argument("--strapd", default=str(REPO / "bin" / "strapd"))
    ap.add_argument("--sched-idle", action="store_true", help="start strapd with `serve --sched-idle`")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--new", type=int, default=64, help="generated tokens per trial")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--json")
    ap.add_argument("--record-time", action="store_true",
                    help="time each call of the hooks' record callback (µs per record inside decoding)")
    for k, v in DECODE_MODEL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    rec_ns: List[int] = []
    if a.record_time:
        _time_record_calls(rec_ns)
    tmp = tempfile.mkdtemp(prefix="strap-dec-", dir="/tmp")
    proc = None
    log = lambda *m: print("decode:", *m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        sock = a.socket
        if sock is None:
            proc, sock = start_strapd(a.strapd, tmp, extra=["--sched-idle"] if a.sched_idle else [])
        model_cfg = {k: getattr(a, k) for k in DECODE_MODEL}
        model = build_model(**model_cfg)
        cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
        prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=torch.Generator().manual_seed(1))
        path = os.path.join(tmp, "decode.strap")

        def daemon_cpu() -> float:
            if proc is None:
                return 0.0
            return pid_cpu_seconds(proc.pid)

        def plain() -> Dict[str, Any]:
            c0, t0 = cpu_seconds(), time.perf_counter()
            ids = greedy(model, prompt, a.new)
            return {"s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0, "ids": ids}

        def captured() -> Dict[str, Any]:
            d0, c0 = daemon_cpu(), cpu_seconds()
            t0 = time.perf_counter()
            with capture_activations(model, config=cfg, output_path=path, socket_path=sock,
                                     autostart_daemon=False, track_per_token=True) as fw:
                t1, l0 = time.perf_counter(), cpu_seconds()
                ids = greedy(model, prompt, a.new, fw)
                t2, l1 = time.perf_counter(), cpu_seconds()
            t3 = time.perf_counter()
            cpu, dcpu = cpu_seconds() - c0, daemon_cpu() - d0
            summ = fw.summary or {}
            if summ.get("drops"):
                raise RuntimeError(f"capture dropped {summ['drops']} tensors under policy block")
            os.remove(path)
            return {"s": t3 - t0, "loop_s": t2 - t1, "cpu_s": cpu, "loop_cpu_s": l1 - l0, "daemon_cpu_s": dcpu,
                    "ids": ids, "packets": int(summ.get("packets", 0)),
                    "bytes_in": int(summ.get("bytes_in", 0))}

        rows: List[Dict[str, Any]] = []
        with torch.no_grad():
            plain()
            captured()
            for pair in range(a.pairs):
                if pair % 2 == 0:
                    p = plain()
                    c = captured()
                else:
                    c = captured()
                    p = plain()
                if p.pop("ids") != c.pop("ids"):
                    raise RuntimeError("greedy generation differs with capture on: hooks changed the model")
                rows.append({"pair": pair, "plain": p, "captured": c})
                log(f"pair {pair}: plain {p['s']:.3f}s captured {c['s']:.3f}s (loop {c['loop_s']:.3f}s) "
                    f"kept {p['s'] / c['s']:.3f}; CPU plain {p['cpu_s']:.3f}s captured {c['cpu_s']:.3f}s "
                    f"+ daemon {c['daemon_cpu_s']:.3f}s")
        kept = [r["plain"]["s"] / r["captured"]["s"] for r in rows]
        loop = [r["plain"]["s"] / r["captured"]["loop_s"] for r in rows]
        cpu_kept = [r["plain"]["cpu_s"] / (r["captured"]["cpu_s"] + r["captured"]["daemon_cpu_s"]) for r in rows]
        client_cpu_kept = [r["plain"]["cpu_s"] / r["captured"]["cpu_s"] for r in rows]
        loop_cpu_kept = [r["plain"]["cpu_s"] / r["captured"]["loop_cpu_s"] for r in rows]
        extra = [(r["captured"]["loop_s"] - r["plain"]["s"]) / a.new * 1e3 for r in rows]
        res = {"model": model_cfg, "torch_threads": threads(), "load": os.getloadavg(),
               "preset": a.preset, "set": a.set,
               "prompt_tokens": a.prompt, "new_tokens": a.new, "pairs": a.pairs,
               "plain_tok_s": a.new / statistics.median(r["plain"]["s"] for r in rows),
               "captured_tok_s": a.new / statistics.median(r["captured"]["s"] for r in rows),
               "kept": statistics.median(kept), "kept_min": min(kept), "kept_max": max(kept),
               "loop_kept": statistics.median(loop), "loop_kept_min": min(loop), "loop_kept_max": max(loop),
               "extra_ms_per_token": statistics.median(extra),
               "cpu_kept": statistics.median(cpu_kept), "cpu_kept_min": min(cpu_kept), "cpu_kept_max": max(cpu_kept),
               "client_cpu_kept": statistics.median(client_cpu_kept),
               "loop_client_cpu_kept": statistics.median(loop_cpu_kept),
               "daemon_cpu_s": statistics.median(r["captured"]["daemon_cpu_s"] for r in rows),
               "packets_per_trial": rows[0]["captured"]["packets"], "identical_ids": True, "trials": rows}
        print(f"decode {a.preset}/{a.set}: plain {res['plain_tok_s']:.1f} tok/s, captured {res['captured_tok_s']:.1f} "
              f"tok/s, kept {res['kept']:.3f} [{min(kept):.3f}..{max(kept):.3f}], loop only {res['loop_kept']:.3f} "
              f"[{min(loop):.3f}..{max(loop):.3f}], +{res['extra_ms_per_token']:.2f} ms/token; "
              f"CPU kept {res['cpu_kept']:.3f} [{min(cpu_kept):.3f}..{max(cpu_kept):.3f}] (client only "
              f"{res['client_cpu_kept']:.3f}, loop only {res['loop_client_cpu_kept']:.3f}, "
              f"daemon {res['daemon_cpu_s']:.3f} s/trial); {a.pairs} pairs, "
              f"torch threads {threads()}, ids identical")
        if rec_ns:
            res["record_us"] = statistics.median(rec_ns) / 1e3
            res["record_us_mean"] = sum(rec_ns) / len(rec_ns) / 1e3
            print(f"record callback inside decoding: median {res['record_us']:.1f} µs, mean "
                  f"{res['record_us_mean']:.1f} µs over {len(rec_ns)} calls (thread CPU, wrapper included)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def _time_record_calls(out: List[int]) -> None:
    """Make every capture's hooks call their record callback through a timer appending
    the thread CPU ns of each call to ``out``."""
    from llm_instrumentation import _hooks

    install = _hooks.Hooks.install
    clock = time.thread_time_ns

    def timed_install(self: Any, started: Any, ended: Any, record: Any, *rest: Any) -> None:
        def timed(name: str, t: Any, meta: Any) -> Any:
            t0 = clock()
            r = record(name, t, meta)
            out.append(clock() - t0)
            return r

        install(self, started, ended, timed, *rest)

    _hooks.Hooks.install = timed_install  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
