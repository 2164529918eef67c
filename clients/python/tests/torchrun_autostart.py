"""One rank of the torchrun autostart test (test_autostart_race.py): a gloo process group on
CPU, a tiny GPT-2 built from a config, and ``capture_activations(model, preset="balanced",
output_path=DIR/cap.strap)`` with every other default on every rank (the socket from
``STRAPD_SOCKET``, autostart on), no daemon running at launch: the ranks reach the capture
together and one of them starts strapd. They meet at a barrier while all captures are live.

argv: outdir
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_gpt2  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402

if __name__ == "__main__":
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = tiny_gpt2()
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(rank))
    dist.barrier()  # every rank at the capture at once: the autostart race of issue 37
    with capture_activations(model, preset="balanced", output_path=os.path.join(outdir, "cap.strap")) as fw:
        with torch.no_grad():
            for _ in range(2):
                model(ids)
        dist.barrier()  # all sessions live at once
    print(f"rank {rank} wrote {fw.output_path}", flush=True)
    dist.destroy_process_group()
