"""One rank of the torchrun test (test_torchrun.py): a gloo process group on CPU, a tiny
GPT-2 built from a config, and the same ``capture_activations(output_path=DIR/cap.strap)``
call on every rank, each rank on its own inputs. The ranks meet at a barrier while both
captures are live, so the two sessions overlap. Each rank saves what its hook saw of one
module, for the parent to compare with the stream bit for bit. With STRAP_RANK_STREAMS=0 both
ranks name the one file: the rank refused (StreamInUseError) says so, still meets the
barrier so the other rank finishes, and exits 3. With STRAP_TEST_RANK1_DIES=SECONDS rank 1
dies (os._exit) inside its capture after the barrier, and rank 0 waits that many seconds for
it at the end of its own capture (capture_set.WAIT_FOR_RANKS).

argv: socket outdir
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_gpt2  # noqa: E402

from llm_instrumentation import StreamInUseError, capture_activations, capture_set  # noqa: E402

MODULE = "transformer.h.1.mlp"

if __name__ == "__main__":
    sock, outdir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dies = os.environ.get("STRAP_TEST_RANK1_DIES")
    if dies:
        capture_set.WAIT_FOR_RANKS = float(dies)
    model = tiny_gpt2()
    seen = []
    model.get_submodule(MODULE).register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    g = torch.Generator().manual_seed(100 + rank)
    try:
        with capture_activations(model, output_path=os.path.join(outdir, "cap.strap"), preset="fast_capture",
                                 socket_path=sock, autostart_daemon=False) as fw:
            with torch.no_grad():
                for _ in range(3 + rank):  # a different number of passes per rank: streams tell apart
                    model(torch.randint(0, 1000, (1, 5), generator=g))
            dist.barrier()  # both sessions live at once
            if dies and rank == 1:
                os._exit(9)
    except StreamInUseError as e:
        print(f"rank {rank} refused: {e}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        sys.exit(3)
    torch.save(seen, os.path.join(outdir, f"expect.{rank}.pt"))
    print(f"rank {rank} wrote {fw.output_path}", flush=True)
    dist.destroy_process_group()
