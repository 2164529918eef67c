"""strapd's CPU priority during greedy decoding, every variant side by side in one run
(docs/PERFORMANCE.md, "Compression workers under SCHED_IDLE").

Three daemons run at once, the same binary with different flags:

* ``normal``: the default (every thread at the priority strapd started with);
* ``idle-workers``: ``--idle-workers`` (compression workers under SCHED_IDLE, normal-priority
  rescuers for starved jobs);
* ``sched-idle``: ``--sched-idle`` (every thread under SCHED_IDLE).

``--mode decode`` (default) decodes greedily with per-token tracking (decode_ab.py's model);
``--mode prefill`` runs ``--passes`` forward passes over a ``--seq``-token prompt of a Llama
768 x 6 (issue 27's prefill shape), the captured trial including the session's close (the
drain). Each round runs plain and then captured under each daemon, plain right before each
captured trial, the daemons in a rotating order; *kept* is plain time / captured time of
those adjacent trials, so a load change between rounds touches both sides of a ratio. The
generated ids must be identical in every trial.

Usage::

    python clients/python/benchmarks/priority_ab.py [--strapd bin/strapd] [--rounds 10] [--new 48] \\
        [--threads 0] [--json out.json]
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

from _bench_model import CAPTURE_SETS, build_model, threads  # noqa: E402
from decode_ab import DECODE_MODEL  # noqa: E402
from overhead_ab import greedy  # noqa: E402
from record_cost import REPO, start_strapd  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

#: Issue 27's prefill shape: a Llama 768 x 6.
PREFILL_MODEL: Dict[str, int] = {"hidden": 768, "layers": 6, "intermediate": 2048, "vocab": 32000, "heads": 12}

VARIANTS: Dict[str, List[str]] = {
    "normal": [],
    "idle-workers": ["--idle-workers"],
    "sched-idle": ["--sched-idle"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strapd", default=str(REPO / "bin" / "strapd"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--new", type=int, default=48, help="generated tokens per trial")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--seq", type=int, default=384, help="prefill: prompt tokens")
    ap.add_argument("--passes", type=int, default=3, help="prefill: forward passes per trial")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    tmp = tempfile.mkdtemp(prefix="strap-prio-", dir="/tmp")
    procs = []
    try:
        socks = {}
        for name, flags in VARIANTS.items():
            proc, sock = start_strapd(a.strapd, tmp, name=name, extra=["--no-probes", *flags])
            procs.append(proc)
            socks[name] = sock
        shape = dict(DECODE_MODEL) if a.mode == "decode" else dict(PREFILL_MODEL)
        model = build_model(**shape)
        cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
        n_in = a.prompt if a.mode == "decode" else a.seq
        prompt = torch.randint(0, shape["vocab"], (1, n_in), generator=torch.Generator().manual_seed(1))
        path = os.path.join(tmp, "trial.strap")

        def run(fw: Any) -> Any:
            if a.mode == "decode":
                return greedy(model, prompt, a.new, fw)
            for _ in range(a.passes):
                model(input_ids=prompt)
            return None

        def plain() -> tuple:
            t0 = time.perf_counter()
            ids = run(None)
            return time.perf_counter() - t0, ids

        def captured(name: str) -> tuple:
            t0 = time.perf_counter()
            with capture_activations(model, config=cfg, output_path=path, socket_path=socks[name],
                                     autostart_daemon=False, track_per_token=a.mode == "decode") as fw:
                ids = run(fw)
            s = time.perf_counter() - t0
            if (fw.summary or {}).get("drops"):
                raise RuntimeError("the capture dropped tensors under policy block")
            os.remove(path)
            return s, ids

        names = list(VARIANTS)
        kept: Dict[str, List[float]] = {n: [] for n in names}
        with torch.no_grad():
            ref = plain()[1]
            for n in names:
                captured(n)  # warm each daemon
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    p, pids = plain()
                    c, cids = captured(n)
                    if pids != ref or cids != ref:
                        raise RuntimeError("greedy generation differs between trials")
                    kept[n].append(p / c)
                print(f"round {r}: " + ", ".join(f"{n} {kept[n][-1]:.3f}" for n in names)
                      + f" (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        res = {"mode": a.mode, "model": shape, "torch_threads": threads(), "preset": a.preset, "set": a.set,
               "new_tokens": a.new if a.mode == "decode" else 0, "seq": n_in, "passes": a.passes, "rounds": a.rounds, "load_end": os.getloadavg(),
               "kept": {n: {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
                        for n, v in kept.items()}}
        print(f"priority A/B, {a.mode} {a.preset}/{a.set} (kept = plain / captured, adjacent trials): " + "; ".join(
            f"{n} {statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]" for n, v in kept.items())
            + f"; {a.rounds} rounds, torch threads {threads()}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
