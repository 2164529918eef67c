"""Train a sparse autoencoder data-parallel on captures in object storage (docs/ANALYSIS.md 4).

Each rank streams its own shard of the captures' tensors (byte ranges of the objects, no
download) and DistributedDataParallel averages the gradients::

    export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_ENDPOINT_URL=http://s3.example:7070
    torchrun --nproc_per_node=2 clients/python/examples/train_sae_ddp.py \\
        s3://caps/run-a.strap s3://caps/run-b.strap --module model.layers.2 \\
        --batch-size 256 --tokens 200000 --out sae.safetensors

gloo on CPU, NCCL when every rank has a GPU. Rank 0 writes the SAE and, beside it, the
training report as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from llm_instrumentation.analysis.sparse_autoencoder import train_sae
from llm_instrumentation.data import ActivationDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("streams", nargs="+", help="stream files or object URLs (s3://bucket/key)")
    ap.add_argument("--module", required=True, help="module name or fnmatch pattern")
    ap.add_argument("--batch-size", type=int, default=4096, help="rows per rank and step")
    ap.add_argument("--tokens", type=int, required=True, help="rows to train on, all ranks together")
    ap.add_argument("--expansion", type=int, default=4)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dead-tokens", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: $AWS_ENDPOINT_URL or AWS)")
    ap.add_argument("--out", required=True, help="the SAE (safetensors), written by rank 0")
    a = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    try:
        ds = ActivationDataset(a.streams, modules=a.module, batch_size=a.batch_size, drop_last=True, shuffle=True,
                               seed=a.seed, dtype=torch.float32,
                               storage_options={"endpoint_url": a.endpoint_url} if a.endpoint_url else None)
        sae, report = train_sae(ds, a.tokens, expansion=a.expansion, k=a.k, lr=a.lr, dead_tokens=a.dead_tokens,
                                seed=a.seed, device=device)
        if rank == 0:
            sae.save(a.out)
            with open(a.out + ".report.json", "w") as f:
                json.dump(dict(report.to_dict(), world_size=dist.get_world_size(), rows_per_epoch=ds.rows), f,
                          indent=1)
            print(f"trained on {report.tokens} rows in {report.steps} steps ({report.seconds:.1f} s) on "
                  f"{dist.get_world_size()} ranks: explained variance {report.explained_variance:.3f}, "
                  f"L0 {report.l0:.1f} -> {a.out}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
