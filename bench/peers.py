"""Ours beside what a user would otherwise reach for, interleaved in one run (docs/PERFORMANCE.md).

Same model config, same modules (every decoder layer's residual output, attention output and
MLP output), same inputs, for:

* ``plain``: no capture (the baseline of every *kept* ratio);
* ``hooks``: ``register_forward_hook`` that ``.cpu().clone()`` into a list (what most people write);
* ``nnsight``: ``NNsight(model).trace(...)`` with ``.save()`` of the same outputs, one trace per
  forward pass (prefill pass or decoding step);
* ``tlens``: TransformerLens 4's ``TransformerBridge`` around the same HF module,
  ``run_with_cache`` with the equivalent ``names_filter`` (prefill) and its ``generate`` under
  ``hooks`` that keep each tensor, as ``run_with_cache`` does (decoding);
* ``v131``: the ``llm-instrumentation`` 1.3.1 wheel, ``capture_activations(preset="balanced")``,
  on what it can capture (its hooks reach only the root's direct children);
* ``fast_capture``, ``balanced``, ``balanced+res``: ours through strapd, the last with
  resource events ``MINIMAL``.

Each trial is its own process (so its peak RSS is its own), builds the model (seed 0), runs one
untimed warm-up pass, then the timed workload, then checks exactness and, for the in-RAM peers,
times ``torch.save`` of what they kept to the same disk our stream goes to. A round runs every
variant once in an order that rotates from round to round; kept = plain seconds / variant
seconds within a round, the median over rounds. On a shared machine wall time swings with
other load, so each trial also records CPU seconds (the process's, every thread, and the
daemon's for ours): *CPU kept* = plain CPU / (variant CPU + daemon CPU), a load-independent
figure of the work each variant adds (it cannot show waits). Two thread regimes: torch's default
intra-op threads (every core) and one thread fewer (a core left free).

Phases (issue 27's shapes): ``decode``: Llama 512×8 (inter 1408, vocab 32000), 32-token
prompt, 48 greedy tokens with the KV cache (ours: ``record_token`` per token); ``prefill``:
Llama 768×6 (inter 2048), 3 passes of 384 tokens, the drain at close included.

Usage::

    .venv/bin/python bench/peers.py [--rounds 3] [--phases decode,prefill] [--regimes all,free]
        [--v131 build/peers/li131] [--json bench/results/peers.json] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("plain", "hooks", "nnsight", "tlens", "v131", "fast_capture", "balanced", "balanced+res")
PEERS_IN_RAM = ("hooks", "nnsight", "tlens")
PHASES: Dict[str, Dict[str, int]] = {
    "decode": {"hidden": 512, "layers": 8, "intermediate": 1408, "vocab": 32000, "heads": 8,
               "prompt": 32, "new": 48},
    "prefill": {"hidden": 768, "layers": 6, "intermediate": 2048, "vocab": 32000, "heads": 12,
                "tokens": 384, "passes": 3},
}
QUICK: Dict[str, Dict[str, int]] = {
    "decode": {"hidden": 64, "layers": 2, "intermediate": 128, "vocab": 512, "heads": 4, "prompt": 8, "new": 6},
    "prefill": {"hidden": 64, "layers": 2, "intermediate": 128, "vocab": 512, "heads": 4, "tokens": 16, "passes": 2},
}


def log(*m: Any) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}]", *m, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The worker: one variant, one phase, one process


def build(p: Dict[str, int]) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=p["hidden"], intermediate_size=p["intermediate"], num_hidden_layers=p["layers"],
                      num_attention_heads=p["heads"], num_key_value_heads=p["heads"], vocab_size=p["vocab"],
                      max_position_embeddings=4096)
    return LlamaForCausalLM(cfg).eval()


def module_names(layers: int) -> List[str]:
    """The captured modules, in execution order within each layer."""
    out = []
    for i in range(layers):
        out += [f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp", f"model.layers.{i}"]
    return out


def cache_kw(out: Any) -> Dict[str, Any]:
    if "cache" in out:
        return {"cache": out["cache"]}
    return {"past_key_values": out.past_key_values}


def first_tensor(o: Any) -> Any:
    return o[0] if isinstance(o, (tuple, list)) else o


def vmhwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(a: argparse.Namespace) -> Dict[str, Any]:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    p = json.loads(a.shape)
    model = build(p)
    L = p["layers"]
    names = module_names(L)
    last = f"model.layers.{L - 1}"
    gen = torch.Generator().manual_seed(1)
    if a.phase == "decode":
        inputs = torch.randint(0, p["vocab"], (1, p["prompt"]), generator=gen)
        tokens = p["new"]
    else:
        inputs = torch.randint(0, p["vocab"], (1, p["tokens"]), generator=gen)
        tokens = p["tokens"] * p["passes"]
    tmp = Path(a.tmp)
    res: Dict[str, Any] = {"variant": a.worker, "phase": a.phase, "torch_threads": torch.get_num_threads(),
                           "tokens": tokens}

    # The uncaptured reference, untimed: the last layer's output of the first pass and the
    # generated ids (decode) or the last pass's logits (prefill).
    ref: List[Any] = []
    h = model.get_submodule(last).register_forward_hook(lambda m, i, o: ref.append(first_tensor(o).detach().clone()))
    with torch.no_grad():
        if a.phase == "decode":
            ref_ids = greedy(model, inputs, tokens)
        else:
            ref_logits = model(input_ids=inputs, use_cache=False).logits
    h.remove()
    ref_first = ref[0]
    res["rss_model_bytes"] = vmhwm()

    run = VARIANT_RUNNERS[a.worker]
    with torch.no_grad():
        kept_tensors, t, extra = run(model, a, p, inputs, tmp, names, warm=True)   # warm-up
        _clean(tmp)
        # A full collection now, not inside the timed run: after importing torch and
        # transformers and building the model a fresh process holds ~430 k objects, and
        # the collector's next full pass (0.28 s here) fell inside whichever variant's
        # timed run allocated past its threshold first — 48-token decodes of ~1.3 s read
        # as 0.78 kept for ours in one make bench (docs/PERFORMANCE.md, "Peers").
        gc.collect()
        passes: List[List[float]] = [[], [], []]  # collections inside the timed run, per generation
        started = [0.0]

        def gc_seen(phase: str, info: Dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                passes[info["generation"]].append(time.perf_counter() - started[0])

        gc.callbacks.append(gc_seen)
        c0, d0 = cpu_self(), cpu_of(a.daemon_pid)
        try:
            kept_tensors, t, extra = run(model, a, p, inputs, tmp, names, warm=False)
        finally:
            gc.callbacks.remove(gc_seen)
        res["cpu_s"], res["daemon_cpu_s"] = cpu_self() - c0, cpu_of(a.daemon_pid) - d0
        res["gc"] = {"collections": [len(x) for x in passes], "seconds": round(sum(map(sum, passes)), 4)}
    res["s"] = t
    res["tok_s"] = tokens / t
    res.update(extra)
    res["peak_rss_bytes"] = vmhwm()
    # exactness against the uncaptured run
    got_first = extra.pop("_first_last_layer", None)
    if got_first is None and kept_tensors is not None:
        got_first = kept_tensors.get(last)
    if got_first is None:
        res["exact"] = "n/a"
    else:
        same = got_first.dtype == ref_first.dtype and got_first.shape == ref_first.shape and \
            torch.equal(got_first, ref_first)
        res["exact"] = "bit-exact" if same else \
            f"differs (max |Δ| {float((got_first.float() - ref_first.float()).abs().max()):.3g})"
    if a.phase == "decode":
        ids = extra.pop("_ids", None)
        res["ids_identical"] = None if ids is None else ids == ref_ids
    else:
        logits = extra.pop("_logits", None)
        res["logits_identical"] = None if logits is None else bool(torch.equal(logits, ref_logits))
    # in-RAM peers: what persisting their cache would cost, to the same disk
    keep = extra.pop("_keep", None)
    if keep is not None:
        path = tmp / "cache.pt"
        t0 = time.perf_counter()
        torch.save(keep, path)
        os.sync()
        res["save_s"] = time.perf_counter() - t0
        res["saved_bytes"] = path.stat().st_size
        path.unlink()
    res = {k: v for k, v in res.items() if not k.startswith("_")}
    return res


def cpu_self() -> float:
    """User + system CPU seconds of this process, every thread."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of another process (the shared strapd), 0 without one."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _clean(tmp: Path) -> None:
    for f in glob.glob(str(tmp / "*")):
        if os.path.isfile(f):
            os.unlink(f)


def greedy(model: Any, prompt: Any, n: int, step: Optional[Callable[[int], None]] = None) -> List[int]:
    out = model(input_ids=prompt, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ids = []
    for _ in range(n):
        tid = int(nxt)
        ids.append(tid)
        if step is not None:
            step(tid)
        out = model(input_ids=nxt, use_cache=True, **cache_kw(out))
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return ids


def workload(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any,
             step: Optional[Callable[[int], None]] = None) -> Tuple[float, Dict[str, Any]]:
    """The timed part common to the variants that wrap a plain HF forward."""
    t0 = time.perf_counter()
    if a.phase == "decode":
        ids = greedy(model, inputs, p["new"], step)
        return time.perf_counter() - t0, {"_ids": ids}
    for _ in range(p["passes"]):
        logits = model(input_ids=inputs, use_cache=False).logits
    return time.perf_counter() - t0, {"_logits": logits}


def run_plain(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
              warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
    t, extra = workload(model, a, p, inputs)
    return None, t, extra


def run_hooks(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
              warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
    kept: Dict[str, List[Any]] = {n: [] for n in names}
    hs = [model.get_submodule(n).register_forward_hook(
        lambda m, i, o, n=n: kept[n].append(first_tensor(o).cpu().clone())) for n in names]
    try:
        t, extra = workload(model, a, p, inputs)
    finally:
        for h in hs:
            h.remove()
    extra["_keep"] = kept
    extra["bytes_persisted"] = 0
    return {n: v[0] for n, v in kept.items()}, t, extra


def run_nnsight(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
                warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
    import nnsight
    from nnsight import NNsight

    nm = NNsight(model)
    L = p["layers"]
    passes: List[List[Any]] = []

    def trace(**kw: Any) -> Any:
        with nm.trace(**kw):
            s = nnsight.save(list())
            for i in range(L):
                s.append(nm.model.layers[i].self_attn.output[0])
                s.append(nm.model.layers[i].mlp.output)
                s.append(nm.model.layers[i].output)
            o = nm.output.save()
        passes.append(s)
        return o

    t0 = time.perf_counter()
    extra: Dict[str, Any] = {}
    if a.phase == "decode":
        o = trace(input_ids=inputs, use_cache=True)
        ids = []
        for _ in range(p["new"]):
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
            ids.append(int(nxt))
            o = trace(input_ids=nxt, use_cache=True, **cache_kw(o))
        extra["_ids"] = ids
    else:
        for _ in range(p["passes"]):
            o = trace(input_ids=inputs, use_cache=False)
        extra["_logits"] = o.logits
    t = time.perf_counter() - t0
    kept = {n: [first_tensor(s[k]) for s in passes] for k, n in enumerate(names)}
    extra["_keep"] = kept
    extra["bytes_persisted"] = 0
    return {n: v[0] for n, v in kept.items()}, t, extra


_BRIDGE: Dict[int, Any] = {}


def run_tlens(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
              warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
    import torch
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    if id(model) not in _BRIDGE:  # built once, outside the timing: it rewires the module in place
        _BRIDGE[id(model)] = build_bridge_from_module(model, "LlamaForCausalLM", hf_config=model.config)
    b = _BRIDGE[id(model)]
    L = p["layers"]
    suffix = ("hook_attn_out", "hook_mlp_out", "hook_resid_post")
    tl_names = [f"blocks.{i}.{s}" for i in range(L) for s in suffix]
    want = set(tl_names)
    extra: Dict[str, Any] = {}
    t0 = time.perf_counter()
    if a.phase == "decode":
        kept: Dict[str, List[Any]] = {n: [] for n in tl_names}

        def keeper(name: str) -> Callable[[Any, Any], Any]:
            def keep(x: Any, hook: Any) -> Any:  # hook.name is the canonical name, not the alias asked for
                kept[name].append(x.detach())
                return x
            return keep

        with b.hooks(fwd_hooks=[(n, keeper(n)) for n in tl_names]):
            out = b.generate(inputs, max_new_tokens=p["new"], do_sample=False, verbose=False,
                             use_past_kv_cache=True)
        t = time.perf_counter() - t0
        extra["_ids"] = [int(x) for x in out[0, inputs.shape[1]:]]
    else:
        caches = []
        for _ in range(p["passes"]):
            logits, cache = b.run_with_cache(inputs, names_filter=lambda n: n in want)
            caches.append(cache)
        t = time.perf_counter() - t0
        extra["_logits"] = logits
        kept = {n: [c[n] for c in caches] for n in tl_names}
    ours = dict(zip(names, tl_names))
    extra["_keep"] = {n: kept[ours[n]] for n in names}
    extra["bytes_persisted"] = 0
    first = {n: torch.as_tensor(kept[ours[n]][0]) for n in names}
    return first, t, extra


def run_v131(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
             warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
    import llm_instrumentation as li
    from llm_instrumentation.core import capture_activations  # 1.3.1's home of the context manager

    assert a.v131 and str(Path(li.__file__).resolve()).startswith(str(Path(a.v131).resolve())), li.__file__
    path = tmp / "v131.stream"
    t0 = time.perf_counter()
    with capture_activations(model, preset="balanced", output_path=str(path)):
        t, extra = workload(model, a, p, inputs)
    t = time.perf_counter() - t0  # its writer's drain at exit included, as for ours
    files = [f for f in glob.glob(str(tmp / "*")) if os.path.isfile(f)]
    extra["bytes_persisted"] = sum(os.path.getsize(f) for f in files)
    extra["note"] = "1.3.1 stores no dtype or shape: its packets cannot be read back as tensors"
    return None, t, extra


def run_ours(preset: str, level: Optional[str]) -> Callable[..., Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]]:
    def run(model: Any, a: argparse.Namespace, p: Dict[str, int], inputs: Any, tmp: Path, names: List[str],
            warm: bool) -> Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]:
        from llm_instrumentation import capture_activations, open_stream

        path = tmp / "ours.strap"
        t0 = time.perf_counter()
        with capture_activations(model, preset=preset, output_path=str(path), modules=names,
                                 track_per_token=a.phase == "decode", resource_level=level,
                                 socket_path=a.socket, autostart_daemon=False) as fw:
            step = (lambda tid: fw.record_token(tid, str(tid))) if a.phase == "decode" else None
            t, extra = workload(model, a, p, inputs, step)
        t = time.perf_counter() - t0  # session open and close (the drain) included
        summ = fw.summary or {}
        if summ.get("drops"):
            raise RuntimeError(f"{preset}: dropped {summ['drops']} tensors")
        files = [f for f in glob.glob(str(tmp / "*")) if os.path.isfile(f)]
        extra["bytes_persisted"] = sum(os.path.getsize(f) for f in files)
        first = None
        if not warm:
            with open_stream(str(path)) as r:
                last = names[-1]
                first = {last: next(iter(r.tensors(last))).tensor()}
        return first, t, extra

    return run


VARIANT_RUNNERS: Dict[str, Callable[..., Tuple[Optional[Dict[str, Any]], float, Dict[str, Any]]]] = {
    "plain": run_plain, "hooks": run_hooks, "nnsight": run_nnsight, "tlens": run_tlens, "v131": run_v131,
    "fast_capture": run_ours("fast_capture", None), "balanced": run_ours("balanced", None),
    "balanced+res": run_ours("balanced", "MINIMAL"),
}


# ---------------------------------------------------------------------------------------------
# The driver


def trial(variant: str, phase: str, shape: Dict[str, int], threads: int, a: argparse.Namespace, sock: str,
          tmp: Path) -> Dict[str, Any]:
    out = tmp / "trial.json"
    work = tmp / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    env = dict(os.environ)
    if variant == "v131":
        # 1.3.1's package and its one extra dependency (aiofiles) first on the path: our own
        # llm_instrumentation must not be the one imported
        env["PYTHONPATH"] = os.pathsep.join([a.v131, a.v131 + "_deps"])
    cmd = [sys.executable, __file__, "--worker", variant, "--phase", phase, "--shape", json.dumps(shape),
           "--threads", str(threads), "--socket", sock, "--tmp", str(work), "--out", str(out),
           "--daemon-pid", str(a.daemon_pid)]
    if variant == "v131":
        cmd += ["--v131", a.v131]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return {"variant": variant, "error": (r.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(out.read_text())


def summarise(rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for v in VARIANTS:
        rows = [r for r in rounds if v in r and "s" in r[v] and "s" in r.get("plain", {})]
        errs = [r[v]["error"] for r in rounds if v in r and "error" in r[v]]
        if not rows:
            if errs:
                out[v] = {"error": errs[0]}
            continue
        ratios = [r["plain"]["s"] / r[v]["s"] for r in rows]
        cpu = [r["plain"]["cpu_s"] / (r[v]["cpu_s"] + r[v]["daemon_cpu_s"]) for r in rows]
        s = {"kept": statistics.median(ratios), "kept_min": min(ratios), "kept_max": max(ratios),
             "cpu_kept": statistics.median(cpu), "cpu_kept_min": min(cpu), "cpu_kept_max": max(cpu),
             "daemon_cpu_s": statistics.median(r[v]["daemon_cpu_s"] for r in rows),
             "tok_s": statistics.median(r[v]["tok_s"] for r in rows),
             "peak_rss_bytes": statistics.median(r[v]["peak_rss_bytes"] for r in rows),
             "rss_model_bytes": statistics.median(r[v]["rss_model_bytes"] for r in rows),
             "bytes_persisted": rows[-1][v].get("bytes_persisted", 0),
             "exact": sorted({r[v]["exact"] for r in rows}),
             "rounds": len(rows), "torch_threads": rows[-1][v]["torch_threads"]}
        for k in ("ids_identical", "logits_identical"):
            if k in rows[-1][v]:
                s[k] = all(r[v][k] for r in rows) if all(r[v][k] is not None for r in rows) else None
        if "save_s" in rows[-1][v]:
            sr = [r["plain"]["s"] / (r[v]["s"] + r[v]["save_s"]) for r in rows]
            s["kept_with_save"] = statistics.median(sr)
            s["save_s"] = statistics.median(r[v]["save_s"] for r in rows)
            s["saved_bytes"] = rows[-1][v]["saved_bytes"]
        if "note" in rows[-1][v]:
            s["note"] = rows[-1][v]["note"]
        if errs:
            s["errors"] = errs
        out[v] = s
    return out


def driver(a: argparse.Namespace) -> Dict[str, Any]:
    import torch

    shapes = QUICK if a.quick else PHASES
    default_threads = torch.get_num_threads()
    regimes = {"all": default_threads, "free": max(1, default_threads - 1)}
    tmp = Path(tempfile.mkdtemp(prefix="strap-peers-", dir=a.tmpdir))
    sys.path.insert(0, str(ROOT / "clients" / "python" / "benchmarks"))
    from record_cost import start_strapd  # the benchmarks' one way to start a private strapd

    proc, sock = start_strapd(a.strapd, str(tmp))
    a.daemon_pid = proc.pid
    variants = [v for v in VARIANTS if (v == "plain" or v in a.variants) and (v != "v131" or a.v131)]
    res: Dict[str, Any] = {"command": " ".join([os.path.relpath(sys.executable, ROOT)] + sys.argv),
                           "load_start": os.getloadavg(), "cpu_count": os.cpu_count(), "variants": variants,
                           "phases": {}, "shapes": {k: shapes[k] for k in a.phases}}
    try:
        for phase in a.phases:
            res["phases"][phase] = {}
            for reg in a.regimes:
                threads = regimes[reg]
                rounds: List[Dict[str, Dict[str, Any]]] = []
                for k in range(a.rounds):
                    order = variants[k % len(variants):] + variants[:k % len(variants)]
                    row = {}
                    for v in order:
                        row[v] = trial(v, phase, shapes[phase], threads, a, sock, tmp)
                    rounds.append(row)
                    log(f"{phase}/{reg} (torch threads {threads}) round {k + 1}: " +
                        " ".join(f"{v}={row[v]['s']:.2f}s" if "s" in row[v] else f"{v}=ERR" for v in variants))
                    for v in variants:
                        if "error" in row[v]:
                            log(f"  {v}: {row[v]['error']}")
                res["phases"][phase][reg] = {"torch_threads": threads, "summary": summarise(rounds),
                                             "rounds": rounds}
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_end"] = os.getloadavg()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="decode")
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--socket")
    ap.add_argument("--daemon-pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tmp")
    ap.add_argument("--out")
    ap.add_argument("--v131", default=str(ROOT / "build" / "peers" / "li131"),
                    help="the unpacked 1.3.1 wheel (its deps beside it in <dir>_deps); '' leaves it out")
    ap.add_argument("--strapd", default=str(ROOT / "bin" / "strapd"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--regimes", default="all,free")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="which of them to run (comma-separated; plain is always run: the others' kept is against it)")
    ap.add_argument("--tmpdir", default="/var/tmp", help="where streams and torch.save files go (one disk)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker:
        r = worker(a)
        Path(a.out).write_text(json.dumps(r))
        return
    a.phases = [p for p in a.phases.split(",") if p]
    a.regimes = [r for r in a.regimes.split(",") if r]
    a.variants = [v for v in a.variants.split(",") if v]
    unknown = sorted(set(a.variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"peers: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if a.v131 and not (Path(a.v131) / "llm_instrumentation").is_dir():
        raise SystemExit(f"peers: no unpacked 1.3.1 wheel at {a.v131} (make peers-deps), or pass --v131 ''")
    res = driver(a)
    for phase, regs in res["phases"].items():
        for reg, r in regs.items():
            print(f"{phase} / torch threads {r['torch_threads']} ({reg}):")
            for v, s in r["summary"].items():
                if "error" in s:
                    print(f"  {v:13s} error: {s['error']}")
                    continue
                extra = f" +save {s['kept_with_save']:.3f}" if "kept_with_save" in s else ""
                print(f"  {v:13s} kept {s['kept']:.3f} [{s['kept_min']:.3f}..{s['kept_max']:.3f}]{extra} "
                      f"CPU kept {s['cpu_kept']:.3f} "
                      f"peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB persisted {s['bytes_persisted'] / 2**20:.1f} MiB "
                      f"exact {','.join(s['exact'])}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
