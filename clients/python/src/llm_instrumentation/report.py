"""A capture's report: PNG figures and one self-contained HTML page.

``python -m llm_instrumentation.report CAPTURE`` reads the stream ``CAPTURE``, its kernel
trace (``CAPTURE.trace.jsonl``, docs/TRACE_FORMAT.md) and its resource events
(``CAPTURE.resources.jsonl``, docs/RESOURCE_EVENTS.md), whichever exist, and writes into
``CAPTURE.report/``: the block-I/O and system figures of the original
``analyze_tracepoints.py`` (latency histogram, percentiles, heatmap, queue depth, requests,
correlations with off-CPU time, page faults and PSI, top PIDs), per-layer time / memory /
FLOPs, per-token latency, and a timeline putting the capture's GB/s on the same time axis as
the kernel's off-CPU time, page faults and PSI; then ``report.html`` embedding them (base64)
with a summary naming the three biggest time costs. Nothing is estimated here: every number
is read from the three files, and a figure whose inputs are missing is left out with a note.

matplotlib is needed (``pip install strap-llm[report]``).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import sys
import time
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["build_report", "load_trace", "load_resources", "main"]


# ----- reading, with progress ----------------------------------------------------------------

class Progress:
    """A progress bar on stderr for reads that take longer than half a second."""

    def __init__(self, label: str, total: int, enabled: bool = True, stream: Any = None) -> None:
        self.label = label
        self.total = max(1, total)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.t0 < 0.5 or now - self.last < 0.2:
            return
        self.last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% ({done / 1e6:.1f}/{self.total / 1e6:.1f} MB)")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.update_final()

    def update_final(self) -> None:
        self.stream.write(f"\r{self.label} [{'#' * 30}] 100.0% ({self.total / 1e6:.1f} MB)\n")
        self.stream.flush()


def _read_jsonl(path: str, label: str, progress: bool) -> Tuple[List[Dict[str, Any]], int]:
    """Whole JSON lines of ``path``; a torn last line (no ``\\n``) is ignored, as the trace
    format asks. Returns the objects and the number of lines skipped."""
    out: List[Dict[str, Any]] = []
    skipped = 0
    size = os.path.getsize(path)
    bar = Progress(f"reading {label}", size, progress)
    done = 0
    with open(path, "rb") as f:
        for line in f:
            done += len(line)
            bar.update(done)
            if not line.endswith(b"\n"):
                skipped += 1
                break
            s = line.strip()
            if not s:
                continue
            try:
                obj = json.loads(s)
            except ValueError:
                skipped += 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                skipped += 1
    bar.done()
    return out, skipped


def load_trace(path: str, progress: bool = True) -> List[Dict[str, Any]]:
    """Trace snapshots (docs/TRACE_FORMAT.md) in time order."""
    snaps, _ = _read_jsonl(path, "trace", progress)
    snaps = [s for s in snaps if "timestamp" in s]
    snaps.sort(key=lambda s: s["timestamp"])
    return snaps


def load_resources(path: str, progress: bool = True) -> List[Dict[str, Any]]:
    """Resource events (docs/RESOURCE_EVENTS.md) in file order."""
    evs, _ = _read_jsonl(path, "resources", progress)
    return [e for e in evs if "event" in e]


def load_stream(path: str, progress: bool = True) -> Dict[str, Any]:
    """Per-forward and per-module byte counts of a stream, and its header metadata."""
    from .stream import TENSOR, TOKEN, open_stream

    per_forward: Dict[int, int] = defaultdict(int)
    per_module: Dict[str, int] = defaultdict(int)
    stored = raw = packets = tokens = 0
    with open_stream(path) as r:
        bar = Progress("reading stream", r.size, progress)
        for pk in r.packets():
            bar.update(pk.end)
            if pk.type == TENSOR:
                packets += 1
                raw += pk.raw_len
                stored += pk.stored_len
                per_forward[pk.forward] += pk.raw_len
                per_module[pk.name] += pk.raw_len
            elif pk.type == TOKEN:
                tokens += 1
        bar.done()
        meta = dict(r.metadata)
        size = r.size
    return {"per_forward": dict(per_forward), "per_module": dict(per_module), "raw": raw, "stored": stored,
            "packets": packets, "tokens": tokens, "metadata": meta, "file_bytes": size}


# ----- derived series ------------------------------------------------------------------------

def _percentile_from_buckets(buckets: Sequence[Dict[str, Any]], q: float) -> Optional[float]:
    """Upper bound (µs) of the log2 bucket holding quantile ``q``."""
    total = sum(b["count"] for b in buckets)
    if total == 0:
        return None
    need = q * total
    acc = 0
    for b in sorted(buckets, key=lambda b: b["slot"]):
        acc += b["count"]
        if acc >= need:
            return float(b["bucket_high"])
    return float(sorted(buckets, key=lambda b: b["slot"])[-1]["bucket_high"])


def _client_pids(resources: List[Dict[str, Any]], stream_meta: Dict[str, Any],
                 trace: List[Dict[str, Any]]) -> List[str]:
    pids = set()
    for e in resources:
        if e.get("event") == "resource_session_start" and e.get("pid"):
            pids.add(str(e["pid"]))
    cl = stream_meta.get("client") if isinstance(stream_meta, dict) else None
    if isinstance(cl, dict) and cl.get("pid"):
        pids.add(str(cl["pid"]))
    peer = stream_meta.get("peer") if isinstance(stream_meta, dict) else None
    if not pids and isinstance(peer, dict) and peer.get("pid"):
        pids.add(str(peer["pid"]))
    if not pids:
        for s in trace:
            for sess in s.get("sessions", []):
                if sess.get("pid"):
                    pids.add(str(sess["pid"]))
    return sorted(pids)


def _exclusive_ops(resources: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Compute events with their exclusive time: an attention module's duration includes
    its projections, so their time is taken out; the model's forward pass is excluded."""
    comp = [e for e in resources if e.get("event") == "compute_execution" and e.get("duration_us") is not None]
    by_forward: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = defaultdict(list)
    for e in comp:
        by_forward[(e.get("session_id"), e.get("forward"))].append(e)
    out = []
    for evs in by_forward.values():
        leaf_time: Dict[str, float] = defaultdict(float)
        for e in evs:
            if e.get("operation") not in ("attention", "model_forward"):
                mod = e.get("module") or ""
                parent = mod.rsplit(".", 1)[0] if "." in mod else ""
                leaf_time[parent] += e["duration_us"]
        for e in evs:
            if e.get("operation") == "model_forward" or e.get("elementwise"):
                continue
            x = dict(e)
            if e.get("operation") == "attention":
                x["exclusive_us"] = max(0.0, e["duration_us"] - leaf_time.get(e.get("module") or "", 0.0))
            else:
                x["exclusive_us"] = e["duration_us"]
            out.append(x)
    return out


def _op_label(e: Dict[str, Any]) -> str:
    op = e.get("operation")
    comp = e.get("component_type")
    if op == "mul_mat":
        return {"attention": "attention projections (mul_mat)", "mlp": "MLP projections (mul_mat)"}.get(
            comp or "", f"{comp} (mul_mat)")
    if op == "attention":
        return "attention core (scores, softmax, weighted sum)"
    return f"{op} ({comp})"


def top_costs(resources: List[Dict[str, Any]], trace: List[Dict[str, Any]], pids: List[str],
              wall_s: Optional[float]) -> List[Dict[str, Any]]:
    """Every measured time cost in seconds, biggest first: compute time per kind of
    operation (resource events) and the client's off-CPU time per reason (trace)."""
    costs: Dict[str, float] = defaultdict(float)
    src: Dict[str, str] = {}
    for e in _exclusive_ops(resources):
        k = _op_label(e)
        costs[k] += e["exclusive_us"] / 1e6
        src[k] = "resource events (" + str(e.get("duration_source")) + ")"
    fwd = [e for e in resources if e.get("operation") == "model_forward" and e.get("duration_us") is not None]
    if fwd:
        ops = sum(costs.values())
        rest = sum(e["duration_us"] for e in fwd) / 1e6 - ops
        if rest > 0:
            k = "forward pass outside the recorded operations (norms, adds, hooks, ...)"
            costs[k] = rest
            src[k] = "model_forward duration minus the recorded operations"
    # Interruptible sleep is left out: idle worker threads sleep by design, so it is not a
    # cost of the capture (the timeline shows it).
    names = {"runnable_ns": "client waiting for a CPU (runnable)",
             "io_ns": "client blocked on I/O (D state)"}
    names = {k: v + ", summed over its threads" for k, v in names.items()}
    # A snapshot can cover time before or after the forward passes (the daemon's interval
    # is not the capture's): its share inside them is counted, assuming the time was spread
    # evenly over the interval, and the source says so.
    window = None
    if fwd:
        window = (min(e["timestamp"] - e["duration_us"] for e in fwd) / 1e6, max(e["timestamp"] for e in fwd) / 1e6)
    for s in trace:
        oc = s.get("off_cpu") or {}
        iv = s.get("interval_s") or 0
        share = 1.0
        if window is not None and iv > 0:
            start, end = s["timestamp"] - iv, s["timestamp"]
            share = max(0.0, min(end, window[1]) - max(start, window[0])) / iv
        for pid in pids:
            row = oc.get(pid)
            if not row:
                continue
            for key, label in names.items():
                v = row.get(key)
                if v and share > 0:
                    costs[label] += v / 1e9 * share
                    src[label] = ("kernel trace (off_cpu, summed over threads"
                                  + (", prorated to the forward passes' time)" if window is not None else ")"))
    rows: List[Dict[str, Any]] = [{"label": k, "seconds": v, "source": src.get(k, ""),
             "share": (v / wall_s if wall_s else None)} for k, v in costs.items() if v > 0]
    rows.sort(key=lambda r: -r["seconds"])
    return rows


# ----- figures -------------------------------------------------------------------------------

class Figures:
    """Writes PNGs into ``out_dir`` and remembers each with its caption."""

    def __init__(self, out_dir: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.out_dir = out_dir
        self.items: List[Tuple[str, str, str, str]] = []  # (section, file, title, caption)
        self.notes: List[str] = []

    def save(self, fig: Any, section: str, name: str, title: str, caption: str) -> None:
        path = os.path.join(self.out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        self.plt.close(fig)
        self.items.append((section, name, title, caption))


def _t(ts: float, t0: float) -> float:
    return ts - t0


def fig_block_io(F: Figures, trace: List[Dict[str, Any]], t0: float) -> None:
    plt = F.plt
    hist: Dict[str, Dict[int, int]] = defaultdict(lambda: defaultdict(int))
    pct: Dict[str, List[Tuple[float, Optional[float], Optional[float], Optional[float]]]] = defaultdict(list)
    inflight: Dict[str, List[Tuple[float, int]]] = defaultdict(list)
    iops: Dict[str, List[Tuple[float, float, float]]] = defaultdict(list)
    for s in trace:
        t = _t(s["timestamp"], t0)
        for d in s.get("latency_histogram", []):
            name = d.get("device_name", "?")
            for b in d.get("buckets", []):
                hist[name][b["slot"]] += b["count"]
            bs = d.get("buckets", [])
            pct[name].append((t, _percentile_from_buckets(bs, 0.5), _percentile_from_buckets(bs, 0.95),
                              _percentile_from_buckets(bs, 0.99)))
        for d in s.get("inflight", []):
            inflight[d.get("device_name", "?")].append((t, d.get("count", 0)))
        for d in s.get("block_io", []):
            iops[d.get("device_name", "?")].append((t, d.get("read_iops", 0.0), d.get("write_iops", 0.0)))
    if not hist:
        F.notes.append("No block request completed during the trace: no latency histogram, percentiles or heatmap.")
    else:
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.8 / len(hist)
        for i, (dev, h) in enumerate(sorted(hist.items())):
            slots = sorted(h)
            ax.bar([s + i * width for s in slots], [h[s] for s in slots], width=width, label=dev)
        allslots = sorted({s for h in hist.values() for s in h})
        ax.set_xticks(allslots)
        ax.set_xticklabels([f"{(1 << s) >> 1}-{(1 << s) - 1}" for s in allslots], rotation=45, ha="right", fontsize=7)
        ax.set_xlabel("latency (µs, log2 bucket)")
        ax.set_ylabel("requests")
        ax.legend()
        F.save(fig, "Block I/O", "io_latency_histogram.png", "Block I/O latency histogram",
               "Issue→complete latency of every block request during the capture, log2 buckets (kernel tracepoints).")

        fig, ax = plt.subplots(figsize=(8, 4))
        for dev, rows in sorted(pct.items()):
            ts = [r[0] for r in rows]
            for j, (q, style) in enumerate(((50, "-"), (95, "--"), (99, ":"))):
                ax.plot(ts, [r[j + 1] for r in rows], style, marker=".", label=f"{dev} p{q}")
        ax.set_yscale("log")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("latency (µs, bucket upper bound)")
        ax.legend(fontsize=7)
        F.save(fig, "Block I/O", "io_latency_percentiles.png", "Block I/O latency percentiles",
               "p50/p95/p99 per snapshot interval: the upper bound of the log2 bucket holding the quantile.")

        fig, ax = plt.subplots(figsize=(8, 4))
        dev = max(hist, key=lambda d: sum(hist[d].values()))
        slots = list(range(min(hist[dev]), max(hist[dev]) + 1))
        times: List[float] = []
        grid: List[List[int]] = []
        for s in trace:
            row = [0] * len(slots)
            for d in s.get("latency_histogram", []):
                if d.get("device_name") == dev:
                    for b in d.get("buckets", []):
                        if b["slot"] in slots:
                            row[slots.index(b["slot"])] += b["count"]
            times.append(_t(s["timestamp"], t0))
            grid.append(row)
        import numpy as np

        arr = np.array(grid, dtype=float).T
        im = ax.imshow(arr, aspect="auto", origin="lower", cmap="viridis",
                       extent=(times[0], times[-1] if len(times) > 1 else times[0] + 1, slots[0] - 0.5, slots[-1] + 0.5))
        ax.set_yticks(slots)
        ax.set_yticklabels([f"{(1 << s) >> 1}" for s in slots], fontsize=7)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("latency bucket low (µs)")
        fig.colorbar(im, ax=ax, label="requests")
        F.save(fig, "Block I/O", "io_latency_heatmap.png", f"Block I/O latency heatmap ({dev})",
               "Requests per latency bucket per snapshot interval, for the busiest disk.")
    if inflight:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for dev, depth in sorted(inflight.items()):
            ax.step([r[0] for r in depth], [r[1] for r in depth], where="post", label=dev)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests in flight")
        ax.legend()
        F.save(fig, "Block I/O", "io_queue_depth.png", "Block queue depth",
               "Requests issued and not completed at each snapshot (gauge).")
    else:
        F.notes.append("No disk had requests in flight or completions: no queue-depth figure.")
    if iops:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for dev, rates in sorted(iops.items()):
            ax.plot([r[0] for r in rates], [r[1] for r in rates], marker=".", label=f"{dev} read")
            ax.plot([r[0] for r in rates], [r[2] for r in rates], marker=".", label=f"{dev} write")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests / s")
        ax.legend(fontsize=7)
        F.save(fig, "Block I/O", "io_requests.png", "Block requests per second",
               "Completed read and write requests per second per disk.")
    else:
        F.notes.append("No block_io rows in the trace: no requests figure.")


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def fig_system(F: Figures, trace: List[Dict[str, Any]], pids: List[str]) -> None:
    plt = F.plt
    # Correlations: per snapshot, the worst disk's p95 against the client's off-CPU time,
    # page faults and I/O pressure.
    rows: List[Tuple[float, float, float, Optional[float]]] = []
    for s in trace:
        p95s = [p for d in s.get("latency_histogram", [])
                if (p := _percentile_from_buckets(d.get("buckets", []), 0.95)) is not None]
        iv = s.get("interval_s") or 0
        if not p95s or iv <= 0:
            continue
        off = sum((s.get("off_cpu_ns") or {}).get(p, 0) for p in pids) / 1e6 / iv
        faults = sum((s.get("page_faults") or {}).get(p, 0) for p in pids) / iv
        psi = (((s.get("pressure") or {}).get("io") or {}).get("some") or {}).get("avg10")
        rows.append((max(p95s), off, faults, psi))
    if len(rows) >= 2:
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
        for ax, j, label in zip(axes, (1, 2, 3), ("client off-CPU (ms/s)", "client page faults / s",
                                                  "PSI io some avg10 (%)")):
            pts = [(x, r[0]) for r in rows if (x := r[j]) is not None]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14)
            r = _pearson([p[0] for p in pts], [p[1] for p in pts])
            ax.set_title(f"r = {r:+.2f}" if r is not None else "r = n/a", fontsize=9)
            ax.set_xlabel(label)
            ax.set_ylabel("p95 block latency (µs)")
        F.save(fig, "System", "correlations.png", "Block latency against off-CPU time, page faults and PSI",
               "One point per snapshot interval with completions; r is Pearson's correlation (n/a: fewer than "
               "3 points or a constant series).")
    else:
        F.notes.append("Fewer than two snapshots with block completions: no latency correlation figure.")
    off_tot: Dict[str, int] = defaultdict(int)
    flt_tot: Dict[str, int] = defaultdict(int)
    for s in trace:
        for p, v in (s.get("off_cpu_ns") or {}).items():
            off_tot[p] += v
        for p, v in (s.get("page_faults") or {}).items():
            flt_tot[p] += v
    if off_tot or flt_tot:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for ax, tot, label, scale in ((axes[0], off_tot, "off-CPU (s)", 1e9), (axes[1], flt_tot, "page faults", 1)):
            top = sorted(tot.items(), key=lambda kv: -kv[1])[:10]
            names = [f"{p}{' (client)' if p in pids else ''}" for p, _ in top]
            ax.barh(names[::-1], [v / scale for _, v in top][::-1],
                    color=["tab:red" if p in pids else "tab:blue" for p, _ in top][::-1])
            ax.set_xlabel(label)
        F.save(fig, "System", "top_pids.png", "Top watched processes",
               "Off-CPU time and user page faults per watched process over the trace (client in red).")
    else:
        F.notes.append("The trace has no per-process off-CPU or page-fault data: no top-PIDs figure.")


def fig_layers(F: Figures, resources: List[Dict[str, Any]]) -> None:
    plt = F.plt
    ops = _exclusive_ops(resources)
    time_by: Dict[Any, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    flops_by: Dict[Any, float] = defaultdict(float)
    for e in ops:
        lid = e.get("layer_id")
        key = lid if lid is not None else (e.get("module") or "model")
        time_by[key][e.get("component_type") or "?"] += e["exclusive_us"] / 1e3
        if e.get("flops"):
            flops_by[key] += e["flops"]
    if not time_by:
        F.notes.append("No compute events with durations: no per-layer figures.")
        return

    def order(keys: Iterable[Any]) -> List[Any]:
        return sorted(keys, key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, str(k)))

    keys = order(time_by)
    labels = [f"L{k}" if isinstance(k, int) else str(k) for k in keys]
    comps = sorted({c for v in time_by.values() for c in v})
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(keys)), 4))
    bottom = [0.0] * len(keys)
    for c in comps:
        vals = [time_by[k].get(c, 0.0) for k in keys]
        ax.bar(labels, vals, bottom=bottom, label=c)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("measured time (ms, all forwards)")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.legend(fontsize=7)
    F.save(fig, "Model", "layer_time.png", "Time per layer",
           "Measured duration of the recorded operations per layer, split by component (attention counts its "
           "core only; its projections are under their own bars).")

    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(keys)), 4))
    ax.bar(labels, [flops_by.get(k, 0) / 1e9 for k in keys], color="tab:purple")
    ax.set_ylabel("GFLOP (all forwards)")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    F.save(fig, "Model", "layer_flops.png", "FLOPs per layer",
           "Computed from tensor shapes (2·M·K·N per matmul, 4·B·H·Sq·Skv·D per attention core).")

    params: Dict[Any, int] = defaultdict(int)
    acts: Dict[Any, int] = defaultdict(int)
    kv: Dict[Any, int] = {}
    for e in resources:
        lid = e.get("layer_id")
        if e.get("event") == "memory_allocation":
            key = lid if lid is not None else "other"
            if e.get("allocation_kind") == "parameters":
                params[key] += e.get("allocation_size_bytes", 0)
            else:
                acts[key] = max(acts[key], e.get("allocation_size_bytes", 0))
        elif e.get("event") == "kv_cache_update" and lid is not None:
            kv[lid] = max(kv.get(lid, 0), e.get("cache_bytes", 0))
    mkeys = order(set(params) | set(acts) | set(kv))
    if mkeys:
        fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(mkeys)), 4))
        import numpy as np

        x = np.arange(len(mkeys))
        for i, (name, src) in enumerate((("parameters", params), ("largest output", acts), ("KV cache (peak)", kv))):
            ax.bar(x + (i - 1) * 0.27, [src.get(k, 0) / (1 << 20) for k in mkeys], width=0.27, label=name)
        ax.set_xticks(x)
        ax.set_xticklabels([f"L{k}" if isinstance(k, int) else str(k) for k in mkeys], rotation=45, fontsize=7)
        ax.set_ylabel("MiB")
        ax.legend(fontsize=7)
        F.save(fig, "Model", "layer_memory.png", "Memory per layer",
               "Parameter bytes, the largest module output and the KV cache's peak per layer (tensor sizes; "
               "at MINIMAL only allocations over 1 MiB are reported).")
    else:
        F.notes.append("No memory_allocation or kv_cache_update events: no per-layer memory figure.")

    fwd = [e for e in resources if e.get("operation") == "model_forward" and e.get("duration_us") is not None]
    if fwd:
        per_step: Dict[int, float] = defaultdict(float)
        for e in fwd:
            per_step[int(e.get("step", 0))] += e["duration_us"] / 1e3
        steps = sorted(per_step)
        fig, ax = plt.subplots(figsize=(8, 3.6))
        ax.plot(steps, [per_step[s] for s in steps], marker="o", ms=3)
        ax.set_xlabel("token step")
        ax.set_ylabel("forward time (ms)")
        F.save(fig, "Model", "token_latency.png", "Per-token latency",
               "Measured duration of the model's forward passes per token step (step 0 includes the prompt).")


def fig_timeline(F: Figures, resources: List[Dict[str, Any]], trace: List[Dict[str, Any]],
                 stream: Optional[Dict[str, Any]], pids: List[str], t0: float) -> None:
    plt = F.plt
    fwd = [e for e in resources if e.get("operation") == "model_forward" and e.get("duration_us")]
    cap: List[Tuple[float, float]] = []
    for e in fwd:
        nbytes = None
        if stream is not None and e.get("forward") in stream["per_forward"]:
            nbytes = stream["per_forward"][e["forward"]]
        elif e.get("capture_bytes") is not None:
            nbytes = e["capture_bytes"]
        if nbytes is not None:
            cap.append((_t(e["timestamp"] / 1e6, t0), nbytes / (e["duration_us"] * 1e3)))
    if not cap and not trace:
        F.notes.append("Neither capture timings nor a trace: no timeline.")
        return
    fig, axes = plt.subplots(4, 1, figsize=(9, 8.5), sharex=True)
    ax = axes[0]
    if cap:
        ax.plot([c[0] for c in cap], [c[1] for c in cap], marker=".", lw=0.8, label="capture (stream bytes / forward time)")
    disk = [(_t(s["timestamp"], t0), s["interval_s"],
             sum(d.get("write_bytes", 0) for d in s.get("block_io", [])) / s["interval_s"] / 1e9)
            for s in trace if s.get("interval_s")]
    if disk:
        xs: List[float] = []
        ys: List[float] = []
        for end, iv, v in disk:
            xs += [end - iv, end]
            ys += [v, v]
        ax.plot(xs, ys, label="disk writes (block_io, per trace interval)")
    if any(c[1] > 0 for c in cap) or any(d[2] > 0 for d in disk):
        # The two rates differ by orders of magnitude on small models; zeros drop out.
        ax.set_yscale("log")
    ax.set_ylabel("GB/s (log)")
    ax.legend(fontsize=7)
    snaps = [s for s in trace if s.get("interval_s")]

    def per_interval(ax: Any, values: List[float], **kw: Any) -> None:
        # A snapshot's counters cover [timestamp - interval_s, timestamp]: draw them there.
        xs: List[float] = []
        ys: List[float] = []
        for s, v in zip(snaps, values):
            end = _t(s["timestamp"], t0)
            xs += [end - s["interval_s"], end]
            ys += [v, v]
        ax.plot(xs, ys, **kw)

    ax = axes[1]
    for key, label in (("runnable_ns", "runnable"), ("sleep_ns", "sleep"), ("io_ns", "io")):
        per_interval(ax, [sum(((s.get("off_cpu") or {}).get(p) or {}).get(key, 0) for p in pids) / 1e6 / s["interval_s"]
                          for s in snaps], label=label)
    ax.set_ylabel("client off-CPU\n(ms per s)")
    ax.legend(fontsize=7)
    ax = axes[2]
    per_interval(ax, [sum((s.get("page_faults") or {}).get(p, 0) for p in pids) / s["interval_s"] for s in snaps],
                 color="tab:orange")
    ax.set_ylabel("client page\nfaults / s")
    ax = axes[3]
    for res in ("cpu", "io", "memory"):
        per_interval(ax, [((((s.get("pressure") or {}).get(res) or {}).get("some") or {}).get("avg10") or 0)
                          for s in snaps], label=f"{res} some avg10")
    ax.set_ylabel("PSI (%)")
    ax.set_xlabel("time since the first event (s)")
    ax.legend(fontsize=7)
    if not trace:
        F.notes.append("No trace: the timeline's kernel rows are empty.")
    F.save(fig, "Timeline", "timeline.png", "Capture rate beside the kernel",
           "One time axis: capture GB/s per forward pass (raw bytes of that forward's stream packets over its "
           "measured duration) and disk write GB/s; the client's off-CPU time, page faults; PSI. Kernel rows "
           "are per trace interval.")


# ----- the page ------------------------------------------------------------------------------

def _fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _html(title: str, summary_rows: List[Tuple[str, str]], costs: List[Dict[str, Any]], F: Figures,
          sources: List[Tuple[str, str]]) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
             "img{max-width:100%;border:1px solid #ccc}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}figure{margin:1.5em 0}"
             "figcaption{color:#444;font-size:90%}</style></head><body>",
             f"<h1>{e(title)}</h1>", "<h2>Three biggest costs</h2><ol id='costs'>"]
    for c in costs[:3]:
        share = f" ({c['share'] * 100:.1f} % of the capture's wall time)" if c.get("share") else ""
        parts.append(f"<li><b>{e(c['label'])}</b>: {c['seconds']:.3f} s{share} <small>— {e(c['source'])}</small></li>")
    if not costs:
        parts.append("<li>No measured time costs: neither resource events with durations nor a trace.</li>")
    parts.append("</ol><h2>Summary</h2><table>")
    for k, v in summary_rows:
        parts.append(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>")
    parts.append("</table>")
    section = None
    for sec, name, t, cap in F.items:
        if sec != section:
            parts.append(f"<h2>{e(sec)}</h2>")
            section = sec
        with open(os.path.join(F.out_dir, name), "rb") as f:
            b64 = base64.b64encode(f.read()).decode()
        parts.append(f"<figure><h3>{e(t)}</h3><img alt='{e(t)}' src='data:image/png;base64,{b64}'>"
                     f"<figcaption>{e(cap)}</figcaption></figure>")
    if F.notes:
        parts.append("<h2>Left out</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in F.notes) + "</ul>")
    parts.append("<h2>Sources</h2><ul>" + "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in sources) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(capture: str, out_dir: Optional[str] = None, trace_path: Optional[str] = None,
                 resources_path: Optional[str] = None, progress: bool = True) -> Dict[str, Any]:
    """Write the figures and ``report.html`` for one capture.

    Args:
        capture: the stream file (it may be missing when only the JSONL files exist).
        out_dir: where to write (default ``CAPTURE.report``).
        trace_path: the trace (default ``CAPTURE.trace.jsonl`` when it exists).
        resources_path: the resource events (default ``CAPTURE.resources.jsonl`` when it exists).
        progress: progress bars on stderr for long reads.

    Returns:
        ``{"html", "out_dir", "figures" [file names], "costs" [biggest first], "notes"}``.

    Raises:
        FileNotFoundError: none of the three inputs exists.
    """
    capture = os.path.abspath(capture)
    trace_path = trace_path or (capture + ".trace.jsonl")
    resources_path = resources_path or (capture + ".resources.jsonl")
    have_stream = os.path.isfile(capture)
    have_trace = os.path.isfile(trace_path)
    have_res = os.path.isfile(resources_path)
    if not (have_stream or have_trace or have_res):
        raise FileNotFoundError(f"none of {capture}, {trace_path}, {resources_path} exists")
    out_dir = out_dir or capture + ".report"
    os.makedirs(out_dir, exist_ok=True)
    stream = load_stream(capture, progress) if have_stream else None
    trace = load_trace(trace_path, progress) if have_trace else []
    resources = load_resources(resources_path, progress) if have_res else []
    header = stream["metadata"] if stream else {}
    client_meta = header.get("client_metadata")
    meta: Dict[str, Any] = client_meta if isinstance(client_meta, dict) else header
    pids = _client_pids(resources, meta, trace)

    stamps = [e["timestamp"] / 1e6 for e in resources if isinstance(e.get("timestamp"), (int, float))]
    # A trace line's timestamp ends its interval; its start is what shares the axis.
    stamps += [s["timestamp"] - (s.get("interval_s") or 0) for s in trace]
    t0 = min(stamps) if stamps else 0.0
    fwd = [e for e in resources if e.get("operation") == "model_forward" and e.get("duration_us")]
    if fwd:
        wall = (max(e["timestamp"] for e in fwd) - min(e["timestamp"] - e["duration_us"] for e in fwd)) / 1e6
    elif trace:
        wall = trace[-1]["timestamp"] - t0
    else:
        wall = None

    F = Figures(out_dir)
    if trace:
        fig_block_io(F, trace, t0)
        fig_system(F, trace, pids)
    else:
        F.notes.append(f"No trace at {trace_path}: block I/O and system figures left out (capture with "
                       f"trace_path=True under a strapd with probes).")
    if resources:
        fig_layers(F, resources)
    else:
        F.notes.append(f"No resource events at {resources_path}: per-layer and per-token figures left out.")
    fig_timeline(F, resources, trace, stream, pids, t0)

    costs = top_costs(resources, trace, pids, wall)
    summary: List[Tuple[str, str]] = []
    if stream:
        summary += [("stream", capture), ("model", str(meta.get("model_class", "?"))),
                    ("packets / tokens", f"{stream['packets']} / {stream['tokens']}"),
                    ("captured (raw / on disk)", f"{_fmt_bytes(stream['raw'])} / {_fmt_bytes(stream['stored'])}"),
                    ("file", _fmt_bytes(stream["file_bytes"]))]
    starts = [e for e in resources if e.get("event") == "resource_session_start"]
    sums = [e for e in resources if e.get("event") == "resource_session_summary"]
    if starts:
        summary.append(("resource level / timing", f"{starts[0].get('level')} / {starts[0].get('timing')}"))
    if sums:
        s = sums[-1]
        summary += [("forward passes", str(s.get("forwards"))),
                    ("computed FLOPs", f"{s.get('total_compute_gflops', 0):.3f} GFLOP"),
                    ("parameters", _fmt_bytes(s.get("parameter_bytes"))),
                    ("peak memory", f"{_fmt_bytes(s.get('total_memory_bytes'))} ({s.get('total_memory_source')})")]
    kv = [e for e in resources if e.get("event") == "kv_cache_update"]
    if kv:
        last: Dict[Any, int] = {}
        for e in kv:
            last[e.get("layer_id")] = e.get("cache_bytes", 0)
        summary.append(("KV cache at the end (all layers)", _fmt_bytes(sum(last.values()))))
    if wall is not None:
        summary.append(("capture wall time", f"{wall:.3f} s"))
    if trace:
        summary.append(("trace snapshots", f"{len(trace)} (client pids {', '.join(pids) or '?'})"))
    sources = [("stream", capture if have_stream else "missing"), ("trace", trace_path if have_trace else "missing"),
               ("resource events", resources_path if have_res else "missing")]
    page = _html(f"STRAP-LLM capture report — {os.path.basename(capture)}", summary, costs, F, sources)
    html_path = os.path.join(out_dir, "report.html")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    return {"html": html_path, "out_dir": out_dir, "figures": [i[1] for i in F.items], "costs": costs[:3],
            "notes": list(F.notes)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llm_instrumentation.report",
                                 description="Figures and an HTML report for one capture (stream, trace, resources).")
    ap.add_argument("capture", help="the stream file (CAPTURE); CAPTURE.trace.jsonl and CAPTURE.resources.jsonl are read when present")
    ap.add_argument("--out", help="output directory (default CAPTURE.report)")
    ap.add_argument("--trace", help="trace JSONL (default CAPTURE.trace.jsonl)")
    ap.add_argument("--resources", help="resource events JSONL (default CAPTURE.resources.jsonl)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    try:
        r = build_report(a.capture, a.out, a.trace, a.resources, progress=not a.no_progress)
    except (FileNotFoundError, ImportError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(f"report: {r['html']} ({len(r['figures'])} figures)")
    for i, c in enumerate(r["costs"], 1):
        share = f", {c['share'] * 100:.1f} %" if c.get("share") else ""
        print(f"  {i}. {c['label']}: {c['seconds']:.3f} s{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
