"""Capture overhead on a real model, as interleaved A/B pairs (docs/PERFORMANCE.md section 1).

For every (preset, capture set) configuration and every pair index, one *plain* trial (a
512-token forward pass, no hooks) and one *captured* trial (open a capture session, the same
forward pass with hooks, close the session: the daemon has written, indexed and fdatasync'ed
the file) run back to back. The order inside a pair alternates (plain first on even pairs,
captured first on odd ones) and the pair loop is outermost, so load drift on a shared
machine hits every configuration alike. Same model, same input ids, every trial.

The kept-throughput ratio of a pair is plain time / captured time; the configuration's figure
is the median over pairs. A captured trial's time includes session open and close, so it
counts everything the capture costs, not only the hooks; the hook-only ratio (forward pass
inside the open session) is reported next to it.

Then a greedy generation loop (KV cache, one token per forward, ``record_token`` per token)
plain versus captured under one preset, same interleaving; the generated ids must match.

Besides the presets, ``--presets`` takes ``fp8_strapd`` and ``fp8_client``: ``fast_capture``
with codec ``fp8``, coded by strapd (``STRAP_FP8_CLIENT=off``) or by the client's torch
function on the CPU tensors (``STRAP_FP8_CLIENT=all``, the code a CUDA tensor is coded with on
its GPU; docs/COMPRESSION.md 10.1, "Coded on the device").

Usage::

    python clients/python/benchmarks/overhead_ab.py --socket /tmp/s/strapd.sock \\
        --tmpdir /tmp/s --json out.json [--pairs 5] [--seq 512] [--quick]

Prints progress on stderr and writes one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, DEFAULT_MODEL, build_model, cpu_seconds, pid_cpu_seconds, threads  # noqa: E402
from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402
from llm_instrumentation.config import PRESETS  # noqa: E402

#: fp8 variants of fast_capture (not presets): the STRAP_FP8_CLIENT each trial runs under.
FP8_VARIANTS = {"fp8_strapd": "off", "fp8_client": "all"}

#: Presets whose granularity is fixed by the preset itself (one capture set each).
OWN_SET = {"attention_analysis": "attention_only", "mlp_analysis": "mlp_only"}


def same_as(presets: List[str]) -> Dict[str, str]:
    """Presets whose whole config equals an earlier preset's (e.g. ``max`` when it is
    ``balanced``'s codec): measured once, under the first name."""
    seen: Dict[Any, str] = {}
    alias = {}
    for p in presets:
        if p in FP8_VARIANTS:
            continue
        c = InstrumentationConfig.from_preset(p)
        key = json.dumps(c.to_dict(), sort_keys=True, default=str)
        if key in seen:
            alias[p] = seen[key]
        else:
            seen[key] = p
    return alias


def configurations(presets: List[str], sets: List[str]) -> List[Tuple[str, str, InstrumentationConfig]]:
    """(preset, capture set label, config) for every preset × set; the granularity presets
    keep their own set; a preset identical to an earlier one is left out (see same_as)."""
    out = []
    alias = same_as(presets)
    for p in presets:
        if p in alias:
            continue
        if p in OWN_SET:
            out.append((p, OWN_SET[p], InstrumentationConfig.from_preset(p)))
            continue
        if p in FP8_VARIANTS:
            for s in sets:
                out.append((p, s, InstrumentationConfig.from_preset("fast_capture").with_compression("fp8")
                            .with_granularity(CAPTURE_SETS[s])))
            continue
        for s in sets:
            # A fresh config per set: with_granularity changes the config it is called on
            # (1.3.1's builders do), so one base shared by the sets would end up with the
            # last set's granularity in every entry.
            out.append((p, s, InstrumentationConfig.from_preset(p).with_granularity(CAPTURE_SETS[s])))
    for p, s, cfg in out:
        want = CAPTURE_SETS.get(s, OWN_SET.get(p))
        if cfg.granularity.value != want:
            raise RuntimeError(f"{p}/{s}: configured granularity {cfg.granularity.value}, expected {want}")
    return out


#: strapd's pid (``--daemon-pid``): its CPU seconds are read from /proc around each captured trial.
DAEMON_PID = 0


def daemon_cpu() -> float:
    """strapd's user + system CPU seconds so far (0 without ``--daemon-pid``)."""
    if not DAEMON_PID:
        return 0.0
    return pid_cpu_seconds(DAEMON_PID)


def plain_trial(model: Any, x: torch.Tensor) -> Dict[str, float]:
    c0, t0 = cpu_seconds(), time.perf_counter()
    model(input_ids=x)
    return {"s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}


def captured_trial(model: Any, x: torch.Tensor, cfg: InstrumentationConfig, sock: str, path: str,
                   fp8_client: str = "cuda") -> Dict[str, Any]:
    os.environ["STRAP_FP8_CLIENT"] = fp8_client  # read as the session is made
    d0, c0, t0 = daemon_cpu(), cpu_seconds(), time.perf_counter()
    with capture_activations(model, config=cfg, output_path=path, socket_path=sock,
                             autostart_daemon=False) as fw:
        t1, f0 = time.perf_counter(), cpu_seconds()
        model(input_ids=x)
        t2, f1 = time.perf_counter(), cpu_seconds()
    t3, c1, d1 = time.perf_counter(), cpu_seconds(), daemon_cpu()
    summ = fw.summary or {}
    if summ.get("drops"):
        raise RuntimeError(f"capture dropped {summ['drops']} tensors under policy block")
    os.remove(path)
    return {"s": t3 - t0, "open_s": t1 - t0, "forward_s": t2 - t1, "close_s": t3 - t2,
            "cpu_s": c1 - c0, "forward_cpu_s": f1 - f0, "daemon_cpu_s": d1 - d0,
            "bytes_in": int(summ.get("bytes_in", 0)), "file_bytes": int(summ.get("file_bytes", 0)),
            "packets": int(summ.get("packets", 0)), "hooks": len(fw.hooked_modules),
            "codec": fw.plan.codec, "codec_level": fw.plan.codec_level, "lossy": cfg.lossy}


def greedy(model: Any, prompt: torch.Tensor, n: int, fw: Any = None) -> List[int]:
    """Greedy decoding with the KV cache; records each token when ``fw`` is given."""
    out = model(input_ids=prompt, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ids = []
    for _ in range(n):
        tid = int(nxt)
        ids.append(tid)
        if fw is not None:
            fw.record_token(tid, str(tid))
        out = model(input_ids=nxt, use_cache=True, **_cache_kw(out))
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return ids


def _cache_kw(out: Any) -> Dict[str, Any]:
    """The KV cache of a previous output as the next call's keyword (transformers 5 renamed
    ``past_key_values`` to ``cache``)."""
    if "cache" in out:
        return {"cache": out["cache"]}
    return {"past_key_values": out.past_key_values}


def summarise(rows: List[Dict[str, Any]], tokens: int) -> Dict[str, Any]:
    """Medians over pairs; ratio = plain time / captured time per pair, then the median."""
    plain = [r["plain"]["s"] for r in rows]
    cap = [r["captured"]["s"] for r in rows]
    fwd = [r["captured"]["forward_s"] for r in rows]
    ratios = [p / c for p, c in zip(plain, cap)]
    hook_ratios = [p / f for p, f in zip(plain, fwd)]
    c0 = rows[0]["captured"]
    med_cap = statistics.median(cap)
    cpu_kept = [r["plain"]["cpu_s"] / (r["captured"]["cpu_s"] + r["captured"]["daemon_cpu_s"]) for r in rows]
    return {
        "cpu_kept": statistics.median(cpu_kept), "cpu_kept_min": min(cpu_kept), "cpu_kept_max": max(cpu_kept),
        "client_cpu_kept": statistics.median(r["plain"]["cpu_s"] / r["captured"]["cpu_s"] for r in rows),
        "forward_client_cpu_kept": statistics.median(r["plain"]["cpu_s"] / r["captured"]["forward_cpu_s"]
                                                     for r in rows),
        "daemon_cpu_s": statistics.median(r["captured"]["daemon_cpu_s"] for r in rows),
        "pairs": len(rows),
        "plain_tok_s": tokens / statistics.median(plain),
        "captured_tok_s": tokens / med_cap,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "hook_only_ratio": statistics.median(hook_ratios),
        "open_s": statistics.median(r["captured"]["open_s"] for r in rows),
        "close_s": statistics.median(r["captured"]["close_s"] for r in rows),
        "bytes_per_trial": c0["bytes_in"],
        "file_bytes_per_trial": c0["file_bytes"],
        "file_ratio": c0["bytes_in"] / c0["file_bytes"] if c0["file_bytes"] else None,
        "captured_bytes_per_s": c0["bytes_in"] / med_cap,
        "hooks": c0["hooks"], "packets": c0["packets"],
        "codec": c0["codec"], "codec_level": c0["codec_level"], "lossy": c0.get("lossy"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tmpdir", required=True, help="directory for the stream files (deleted after each trial)")
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--presets", default="fast_capture,balanced,max,max_compression,attention_analysis,mlp_analysis")
    ap.add_argument("--sets", default=",".join(CAPTURE_SETS))
    ap.add_argument("--gen-preset", default="balanced")
    ap.add_argument("--gen-set", default="resid+attn+mlp")
    ap.add_argument("--gen-prompt", type=int, default=128)
    ap.add_argument("--gen-new", type=int, default=32)
    ap.add_argument("--gen-pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--daemon-pid", type=int, default=0,
                    help="strapd's pid: report its CPU seconds per captured trial and the CPU-time ratios")
    for k, v in DEFAULT_MODEL.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    presets = [p for p in a.presets.split(",") if p]
    unknown = [p for p in presets if p not in PRESETS and p not in FP8_VARIANTS]
    if unknown:
        ap.error(f"unknown presets {unknown} (known: {sorted(PRESETS)})")
    sets = [s for s in a.sets.split(",") if s]
    if any(s not in CAPTURE_SETS for s in sets):
        ap.error(f"capture sets must be among {list(CAPTURE_SETS)}")
    if a.pairs < 1 or a.gen_pairs < 0:
        ap.error("--pairs must be >= 1 and --gen-pairs >= 0")

    global DAEMON_PID
    DAEMON_PID = a.daemon_pid
    if a.threads:
        torch.set_num_threads(a.threads)
    model_cfg = {k: getattr(a, k) for k in DEFAULT_MODEL}
    model = build_model(**model_cfg)
    x = torch.randint(0, a.vocab, (1, a.seq), generator=torch.Generator().manual_seed(1))
    confs = configurations(presets, sets)
    path = os.path.join(a.tmpdir, "overhead.strap")
    log = lambda *m: print("overhead:", *m, file=sys.stderr, flush=True)  # noqa: E731
    results: Dict[str, Any] = {"model": dict(model_cfg, params=sum(p.numel() for p in model.parameters()),
                                             dtype="float32", batch=1, seq=a.seq),
                               "torch_threads": threads(), "configs": [], "same_as": same_as(presets)}
    with torch.no_grad():
        # Warm-up: allocator, kernels, the daemon's first session.
        plain_trial(model, x)
        captured_trial(model, x, confs[0][2], a.socket, path)
        rows: Dict[int, List[Dict[str, Any]]] = {i: [] for i in range(len(confs))}
        for pair in range(a.pairs):
            for i, (p, s, cfg) in enumerate(confs):
                fp8 = FP8_VARIANTS.get(p, "cuda")
                if pair % 2 == 0:
                    pl = plain_trial(model, x)
                    cp = captured_trial(model, x, cfg, a.socket, path, fp8)
                else:
                    cp = captured_trial(model, x, cfg, a.socket, path, fp8)
                    pl = plain_trial(model, x)
                rows[i].append({"pair": pair, "plain": pl, "captured": cp})
                log(f"pair {pair} {p}/{s}: plain {pl['s']:.3f}s captured {cp['s']:.3f}s "
                    f"(fwd {cp['forward_s']:.3f} close {cp['close_s']:.3f}) {cp['bytes_in'] / 2**20:.0f} MiB; "
                    f"CPU plain {pl['cpu_s']:.3f}s captured {cp['cpu_s']:.3f}s + daemon {cp['daemon_cpu_s']:.3f}s")
        for i, (p, s, cfg) in enumerate(confs):
            summ = summarise(rows[i], a.seq)
            results["configs"].append({"preset": p, "set": s, "granularity": cfg.granularity.value,
                                       "summary": summ, "trials": rows[i]})
            log(f"{p}/{s}: kept {summ['ratio']:.3f} [{summ['ratio_min']:.3f}..{summ['ratio_max']:.3f}], "
                f"forward only {summ['hook_only_ratio']:.3f}; CPU kept {summ['cpu_kept']:.3f} "
                f"[{summ['cpu_kept_min']:.3f}..{summ['cpu_kept_max']:.3f}] (client {summ['client_cpu_kept']:.3f}, "
                f"forward only {summ['forward_client_cpu_kept']:.3f}, daemon {summ['daemon_cpu_s']:.3f} s/trial)")

        if a.gen_pairs:
            gen_cfg = InstrumentationConfig.from_preset(a.gen_preset).with_granularity(CAPTURE_SETS[a.gen_set])
            prompt = x[:, : a.gen_prompt]
            greedy(model, prompt, 2)
            gens = []
            for pair in range(a.gen_pairs):
                order = ("plain", "captured") if pair % 2 == 0 else ("captured", "plain")
                row: Dict[str, Any] = {"pair": pair}
                for kind in order:
                    t0 = time.perf_counter()
                    if kind == "plain":
                        ids = greedy(model, prompt, a.gen_new)
                        row["plain"] = {"s": time.perf_counter() - t0}
                    else:
                        with capture_activations(model, config=gen_cfg, output_path=path, socket_path=a.socket,
                                                 autostart_daemon=False, track_per_token=True) as fw:
                            ids = greedy(model, prompt, a.gen_new, fw)
                        summ = fw.summary or {}
                        row["captured"] = {"s": time.perf_counter() - t0, "bytes_in": int(summ.get("bytes_in", 0)),
                                           "file_bytes": int(summ.get("file_bytes", 0)),
                                           "packets": int(summ.get("packets", 0)), "tokens": len(fw.tokens)}
                        os.remove(path)
                    row[kind + "_ids"] = ids
                if row["plain_ids"] != row["captured_ids"]:
                    raise RuntimeError("greedy generation differs with capture on: hooks changed the model")
                del row["plain_ids"], row["captured_ids"]
                gens.append(row)
                log(f"generation pair {pair}: plain {row['plain']['s']:.3f}s captured {row['captured']['s']:.3f}s")
            ratios = [r["plain"]["s"] / r["captured"]["s"] for r in gens]
            med_cap = statistics.median(r["captured"]["s"] for r in gens)
            results["generation"] = {
                "preset": a.gen_preset, "set": a.gen_set, "prompt_tokens": a.gen_prompt, "new_tokens": a.gen_new,
                "plain_tok_s": a.gen_new / statistics.median(r["plain"]["s"] for r in gens),
                "captured_tok_s": a.gen_new / med_cap,
                "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                "bytes_per_trial": gens[0]["captured"]["bytes_in"],
                "captured_bytes_per_s": gens[0]["captured"]["bytes_in"] / med_cap,
                "identical_ids": True, "trials": gens,
            }
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
