"""Where the client's time goes (docs/PERFORMANCE.md section 5).

Profiles captured forward passes of the benchmark Llama two ways:

* ``torch.profiler`` (CPU activities): aten operators by self CPU time — the model's own
  matmuls next to the capture's ``aten::copy_`` into the ring;
* ``cProfile``: Python functions by own time — the hook path (``write_tensor``, record
  header encoding, ``sendmsg``, waiting for RELEASE) next to the model's Python.

Writes one JSON document with the top rows of each and the share of the forward spent in
the capture path.

Usage::

    python clients/python/benchmarks/hook_profile.py --socket /tmp/s/strapd.sock --tmpdir /tmp/s \\
        --json prof.json [--preset balanced] [--set resid+attn+mlp] [--forwards 3]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from _bench_model import CAPTURE_SETS, DEFAULT_MODEL, build_model  # noqa: E402
from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

#: cProfile rows whose file is in the client package count as the capture path.
CLIENT_PKG = os.sep + "llm_instrumentation" + os.sep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tmpdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--set", default="resid+attn+mlp", choices=list(CAPTURE_SETS))
    ap.add_argument("--forwards", type=int, default=3)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--top", type=int, default=12)
    for k, v in DEFAULT_MODEL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    model = build_model(**{k: getattr(a, k) for k in DEFAULT_MODEL})
    x = torch.randint(0, a.vocab, (1, a.seq), generator=torch.Generator().manual_seed(1))
    cfg = InstrumentationConfig.from_preset(a.preset).with_granularity(CAPTURE_SETS[a.set])
    path = os.path.join(a.tmpdir, "profile.strap")
    out = {"preset": a.preset, "set": a.set, "forwards": a.forwards, "seq": a.seq}
    with torch.no_grad():
        model(input_ids=x)
        with capture_activations(model, config=cfg, output_path=path, socket_path=a.socket,
                                 autostart_daemon=False) as fw:
            model(input_ids=x)  # warm the ring pages and the session
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(a.forwards):
                    model(input_ids=x)
            t0 = time.perf_counter()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.forwards):
                model(input_ids=x)
            pr.disable()
            cp_wall = time.perf_counter() - t0
        out["hooks"] = len(fw.hooked_modules)
        out["bytes_per_forward"] = (fw.summary or {}).get("bytes_in", 0) // (2 * a.forwards + 1)
    os.remove(path)

    ka = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in ka) or 1
    rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[: a.top]
    out["torch_ops"] = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                         "share": e.self_cpu_time_total / total_self} for e in rows]
    out["torch_total_self_cpu_ms"] = total_self / 1e3

    st = pstats.Stats(pr)
    funcs = []
    client_tt = 0.0
    client_ct_hook = 0.0
    for (fn, line, name), (cc, nc, tt, ct, callers) in st.stats.items():  # type: ignore[attr-defined]
        # The capture path: the client package's own code, and built-ins it calls (copy_,
        # sendmsg, recv, ...) — counted only when every caller is in the client package.
        capture = CLIENT_PKG in fn or (fn == "~" and bool(callers)
                                       and all(CLIENT_PKG in c[0] for c in callers))
        funcs.append({"func": f"{os.path.basename(fn)}:{line}({name})", "file": fn, "calls": nc,
                      "own_s": tt, "cum_s": ct, "capture_path": capture})
        if CLIENT_PKG in fn:
            client_tt += tt
        if CLIENT_PKG in fn and name == "hook":
            client_ct_hook += ct
    funcs.sort(key=lambda r: r["own_s"], reverse=True)
    out["cprofile_wall_s"] = cp_wall
    out["cprofile_top"] = [{k: v for k, v in r.items() if k != "file"} for r in funcs[: a.top]]
    out["capture_top"] = [{k: v for k, v in r.items() if k != "file"} for r in funcs if r["capture_path"]][: a.top]
    out["hook_cum_s"] = client_ct_hook
    out["hook_share_of_wall"] = client_ct_hook / cp_wall if cp_wall else None
    # One record per hook per forward for these capture sets (tensor outputs; None skipped).
    out["hook_us_per_record"] = client_ct_hook / (a.forwards * out["hooks"]) * 1e6
    out["client_own_s"] = client_tt
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
