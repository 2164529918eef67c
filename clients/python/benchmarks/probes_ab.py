"""Cost of strapd's kernel probes on a capture, as interleaved A/B pairs (docs/PERFORMANCE.md).

Three arms, each the same captured greedy decoding (``record_token`` per generated token,
the decode benchmark's model), in an order rotating with the pair; all must generate the
same ids:

* ``noprobes``: through ``strapd serve --no-probes`` (no collector), up for the whole run;
* ``probes``: through ``strapd serve`` (the eBPF collector attached; the session's client
  is watched from OPEN to its end): the default daemon with a default capture;
* ``trace``: the same, with the session asking for its kernel trace (``trace_path``), so
  the daemon also reads the client's kernel totals at every TOKEN.

The probing daemon is started for each of its trials and stopped after, so its programs are
not attached during the ``noprobes`` trials (its start is outside the timed region).

Per pair, for each probing arm against ``noprobes``:

* *kept* (wall): tokens/s with probes / tokens/s without, the session's open and close
  included;
* *loop only*: the same over the decoding loop inside the open session (what each token
  pays, without the session's fixed open/close cost);
* *CPU kept*: (client CPU + daemon CPU) without probes / the same with probes. The eBPF
  programs run in the context of the task that fires the event, so their time lands in the
  client's system time (its syscalls, page faults, context switches) or in whichever task
  the event belongs to; the collector's snapshots land in the daemon. Load-independent,
  unlike wall time on a shared machine. Events other processes fire on the machine are not
  in either figure (the per-program cost per event is the ``probes`` step's table).

With ``--strapd-old OTHER`` two more arms, ``probes_old`` and ``trace_old``, run the same
trials through that binary (an older build, say), interleaved with the rest: an A/B of two
builds' probes against one shared no-probes baseline.

Target: kept ≥ 0.99 for ``probes`` (≤ 1 % of tokens/s). Must run as root (or with CAP_BPF+CAP_PERFMON):
the script fails when the probing daemon reports its collector did not attach.

Usage::

    python clients/python/benchmarks/probes_ab.py --strapd bin/strapd [--pairs 7] [--new 64] \\
        [--prompt 32] [--preset balanced] [--set resid+attn+mlp] [--threads 1] [--json out.json] \\
        [--strapd-old /tmp/old-strapd]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, build_model, cpu_seconds, threads  # noqa: E402
from decode_ab import DECODE_MODEL  # noqa: E402
from overhead_ab import greedy  # noqa: E402
from record_cost import REPO, start_strapd  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

TARGET = 0.01


def start(binary: str, d: str, name: str, extra: List[str]) -> Tuple[subprocess.Popen, str]:
    return start_strapd(binary, d, name, ["--memory-limit", "1GiB", *extra])


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_sys() -> float:
    return os.times().system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strapd", default=str(REPO / "bin" / "strapd"))
    ap.add_argument("--strapd-old", help="a second strapd whose probes run as arms probes_old and trace_old")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--new", type=int, default=64, help="generated tokens per trial")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between the probing daemon's start and its trial")
    ap.add_argument("--json")
    for k, v in DECODE_MODEL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    # Terminated (bench/run.py's timeout, a user): stop the daemons this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="strap-probes-ab-", dir="/tmp")
    procs: Dict[str, subprocess.Popen] = {}
    log = lambda *m: print("probes_ab:", *m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        socks: Dict[str, str] = {}
        procs["noprobes"], socks["noprobes"] = start(a.strapd, tmp, "noprobes", ["--no-probes"])
        model_cfg = {k: getattr(a, k) for k in DECODE_MODEL}
        model = build_model(**model_cfg)
        cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
        prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=torch.Generator().manual_seed(1))
        path = os.path.join(tmp, "decode.strap")

        def trial(arm: str) -> Dict[str, Any]:
            if arm != "noprobes":
                # Attached only for its own trials: the programs fire on every event of the
                # machine (and filter by pid inside), so a collector left attached would tax
                # the no-probes trials too.
                procs[arm], socks[arm] = start(a.strapd_old if arm.endswith("_old") else a.strapd, tmp, arm, [])
                # Its collector's first snapshot of the machine runs just after the socket
                # answers: a start-up cost, not the probes' cost per token.
                time.sleep(a.settle)
                try:
                    return one(arm)
                finally:
                    procs[arm].terminate()
                    procs[arm].wait(30)
                    del procs[arm]
            return one(arm)

        def one(arm: str) -> Dict[str, Any]:
            d0, c0, s0 = proc_cpu(procs[arm].pid), cpu_seconds(), self_sys()
            t0 = time.perf_counter()
            with capture_activations(model, config=cfg, output_path=path, socket_path=socks[arm],
                                     autostart_daemon=False, track_per_token=True,
                                     trace_path=arm.startswith("trace")) as fw:
                t1 = time.perf_counter()
                ids = greedy(model, prompt, a.new, fw)
                loop = time.perf_counter() - t1
            dt = time.perf_counter() - t0
            cpu, sys_s, dcpu = cpu_seconds() - c0, self_sys() - s0, proc_cpu(procs[arm].pid) - d0
            summ = fw.summary or {}
            if summ.get("drops"):
                raise RuntimeError(f"capture dropped {summ['drops']} tensors under policy block")
            trace = path + ".trace.jsonl"
            lines = 0
            if arm.startswith("trace"):
                if not os.path.exists(trace):
                    raise RuntimeError("the probing daemon wrote no trace: its collector did not start "
                                       f"(root or CAP_BPF+CAP_PERFMON needed; see {tmp}/trace.log)")
                with open(trace) as f:
                    lines = sum(1 for _ in f)
                os.remove(trace)
            os.remove(path)
            return {"s": dt, "loop_s": loop, "cpu_s": cpu, "sys_s": sys_s, "daemon_cpu_s": dcpu, "ids": ids, "trace_lines": lines}

        arms: Tuple[str, ...] = ("noprobes", "probes", "trace")
        if a.strapd_old:
            arms += ("probes_old", "trace_old")
        rows: List[Dict[str, Any]] = []
        with torch.no_grad():
            for arm in arms:
                trial(arm)
            for pair in range(a.pairs):
                order = arms[pair % len(arms):] + arms[:pair % len(arms)]
                r: Dict[str, Any] = {arm: trial(arm) for arm in order}
                ids = r["noprobes"].pop("ids")
                if any(r[arm].pop("ids") != ids for arm in arms[1:]):
                    raise RuntimeError("greedy generation differs between the daemons")
                r["pair"] = pair
                rows.append(r)
                log(f"pair {pair}: " + ", ".join(f"{arm} {r[arm]['s']:.3f}s" for arm in arms))
        res: Dict[str, Any] = {
            "model": model_cfg, "torch_threads": threads(), "load": os.getloadavg(),
            "preset": a.preset, "set": a.set, "prompt_tokens": a.prompt, "new_tokens": a.new, "pairs": a.pairs,
            "target": TARGET, "identical_ids": True, "trials": rows,
            "tok_s": {arm: a.new / statistics.median(r[arm]["s"] for r in rows) for arm in arms},
            "client_sys_s": {arm: statistics.median(r[arm]["sys_s"] for r in rows) for arm in arms},
            "daemon_cpu_s": {arm: statistics.median(r[arm]["daemon_cpu_s"] for r in rows) for arm in arms},
            "trace_lines_per_trial": rows[0]["trace"]["trace_lines"], "arms": {}}
        for arm in arms[1:]:
            kept = [r["noprobes"]["s"] / r[arm]["s"] for r in rows]
            loop = [r["noprobes"]["loop_s"] / r[arm]["loop_s"] for r in rows]
            cpu = [(r["noprobes"]["cpu_s"] + r["noprobes"]["daemon_cpu_s"]) /
                   (r[arm]["cpu_s"] + r[arm]["daemon_cpu_s"]) for r in rows]
            med, cmed = statistics.median(kept), statistics.median(cpu)
            # Met when both medians keep >= 99 %; a wall median under it with the CPU median
            # over it is load noise the A/B cannot resolve, said as such.
            if med >= 1 - TARGET and cmed >= 1 - TARGET:
                verdict = "met"
            elif cmed >= 1 - TARGET:
                verdict = "met by CPU time; wall A/B too noisy to confirm"
            else:
                verdict = "NOT met"
            res["arms"][arm] = {"kept": med, "kept_min": min(kept), "kept_max": max(kept),
                                "loop_kept": statistics.median(loop), "loop_kept_min": min(loop),
                                "loop_kept_max": max(loop),
                                "cpu_kept": cmed, "cpu_kept_min": min(cpu), "cpu_kept_max": max(cpu),
                                "verdict": verdict}
            print(f"probes A/B {a.preset}/{a.set}, {arm} vs no probes: {res['tok_s'][arm]:.1f} vs "
                  f"{res['tok_s']['noprobes']:.1f} tok/s, kept {med:.3f} [{min(kept):.3f}..{max(kept):.3f}], "
                  f"loop only {statistics.median(loop):.3f}, CPU kept {cmed:.3f} [{min(cpu):.3f}..{max(cpu):.3f}]; "
                  f"{a.pairs} pairs; target <= {TARGET:.0%}: {verdict}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
