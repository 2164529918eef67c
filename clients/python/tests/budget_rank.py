"""One rank of test_budget.py: a tiny GPT-2 captured with the defaults (or with the ring
``max_memory_gb`` given as argv[5]) through the strapd at the socket. Every rank keeps its
session open until all ``nranks`` ranks have theirs (a barrier of files ``live.RANK`` in
outdir), so the sessions share the daemon's budget at once. A rank whose capture is refused
says why on stdout, still meets the barrier, and exits 3. Each rank saves what its hook
saw of one module, for the parent to compare with the stream bit for bit.

argv: socket outdir rank nranks [max_memory_gb]
"""

import glob
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_gpt2  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402
from llm_instrumentation.errors import StrapdProtocolError  # noqa: E402

MODULE = "transformer.h.1.mlp"


def barrier(outdir: str, rank: int, n: int) -> None:
    open(os.path.join(outdir, f"live.{rank}"), "w").close()
    deadline = time.monotonic() + 240
    while len(glob.glob(os.path.join(outdir, "live.*"))) < n:
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: the other ranks never came")
        time.sleep(0.05)


if __name__ == "__main__":
    sock, outdir, rank, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kw = {}
    if len(sys.argv) > 5:
        kw["config"] = InstrumentationConfig(max_memory_gb=float(sys.argv[5]))
    torch.set_num_threads(1)
    model = tiny_gpt2()
    seen = []
    model.get_submodule(MODULE).register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    g = torch.Generator().manual_seed(100 + rank)
    try:
        with capture_activations(model, output_path=os.path.join(outdir, f"cap{rank}.strap"), socket_path=sock,
                                 autostart_daemon=False, **kw):
            with torch.no_grad():
                for _ in range(3):
                    model(torch.randint(0, 1000, (1, 16), generator=g))
            barrier(outdir, rank, n)
    except StrapdProtocolError as e:
        print(f"rank {rank} refused: {e}", flush=True)
        barrier(outdir, rank, n)
        sys.exit(3)
    torch.save(seen, os.path.join(outdir, f"expect.{rank}.pt"))
    print(f"rank {rank} done", flush=True)
