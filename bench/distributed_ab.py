"""Same-run A/B of a tensor-parallel rank's capture cost (docs/DISTRIBUTED.md, "Cost on the
model's path"): the hand-written decoder of the tests as tp rank 1 of 2 (its own shard of
every weight), captured four ways, interleaved, in one process:

- ``none``: no capture;
- ``single``: a single process capturing the same modules (every output local, no meta);
- ``tp_every``: rank 1 of 2 (``RANK``/``WORLD_SIZE``), tp_size 2, ``replicated="every_rank"``:
  the same records, each with its shard or replica meta;
- ``tp``: rank 1 of 2, default: the replicated outputs not hooked, the pieces stored.

The row-parallel all-reduce is a no-op (one process), so the model's arithmetic is the
shard's alone. Prints microseconds per forward pass (median and min of the repetitions).

    STRAPD_SOCKET=/tmp/s.sock python bench/distributed_ab.py [--seq 16] [--reps 7] [--forwards 300]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python", "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import parallel_models as pm  # noqa: E402
from llm_instrumentation import capture_activations  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=300)
    a = ap.parse_args()
    sock = os.environ["STRAPD_SOCKET"]
    dist.all_reduce = lambda t, group=None: None  # one process: the shard's own arithmetic
    torch.set_num_threads(1)
    model = pm.Decoder(tp=2, rank=1).eval()
    x = pm.inputs(0, 1, seq=a.seq)[0]
    out = tempfile.mkdtemp(prefix="dist_ab")

    def timed() -> float:
        for _ in range(20):
            model(x)
        t0 = time.perf_counter()
        for _ in range(a.forwards):
            model(x)
        return (time.perf_counter() - t0) / a.forwards

    def run(tag: str, rank_env: bool, **kw) -> float:
        for k in ("RANK", "WORLD_SIZE"):
            os.environ.pop(k, None)
        if rank_env:
            os.environ.update(RANK="1", WORLD_SIZE="2")
        if tag == "none":
            return timed()
        path = os.path.join(out, f"{tag}.strap")
        with capture_activations(model, output_path=path, preset="fast_capture", modules=pm.MODULES, socket_path=sock,
                                 autostart_daemon=False, overwrite_checkpoint=True, **kw) as fw:
            dt = timed()
        packets[tag] = fw.stats["packets"]
        return dt

    tp = dict(parallel_layout={"tp_size": 2}, sharding=pm.SHARDING)
    ways = [("none", False, {}), ("single", False, {}), ("tp_every", True, dict(tp, replicated="every_rank")),
            ("tp", True, tp)]
    res = {w[0]: [] for w in ways}
    packets = {}
    with torch.no_grad():
        for _ in range(a.reps):
            for tag, env, kw in ways:
                res[tag].append(run(tag, env, **kw))
    print(f"tp rank 1 of 2, seq {a.seq}, {a.forwards} forwards × {a.reps} repetitions, torch {torch.__version__}")
    for tag, ts in res.items():
        rec = packets.get(tag, 0) / (a.forwards + 20) if tag != "none" else 0
        print(f"{tag:>9}: median {statistics.median(ts) * 1e6:7.0f} us/forward, min {min(ts) * 1e6:7.0f}"
              f"  ({rec:.0f} records/forward)")


if __name__ == "__main__":
    main()
