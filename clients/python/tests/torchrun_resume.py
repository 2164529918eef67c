"""One rank of the job-wide resume tests (test_job_resume.py): every rank captures its own
greedy generation (data parallel: a prompt of its own) with per-token tracking and
checkpoints, always with ``resume_from_checkpoint=True`` (a restart script's call). On the
job's first start one chosen rank SIGKILLs itself at a chosen point; torchrun then stops the
other ranks and starts the whole job again, and every rank resumes from the point all ranks
reached (docs/DISTRIBUTED.md D3).

argv: socket outdir exchange kill
  exchange  "pg": a gloo process group is initialised (the counts go through its store);
            "files": none (the counts go through files beside the streams)
  kill      "none", or "R:token:K" (rank R dies just after recording token K), or
            "R:write:N" (rank R dies inside its N-th tensor write)
Each rank prints "rank R start S resumed M from SOURCE" when its capture has started.
"""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_llama  # noqa: E402
from genloop import INTERVAL, N_TOKENS, PROMPT  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402
from llm_instrumentation._session import CaptureSession  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sock, outdir, exchange, kill = sys.argv[1:5]
    torch.set_num_threads(1)
    start = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if exchange == "pg":
        import torch.distributed as dist
        # A file rendezvous per start of the job: with torchrun's own store (env://) this
        # torch's gloo fails to connect on a restarted job (stale keys of the first start;
        # seen with torch 2.11 on CPU), which is torchrun's business, not the capture's.
        where = os.path.join(outdir, f"pg.{os.environ['TORCHELASTIC_RUN_ID']}.{start}")
        dist.init_process_group("gloo", init_method=f"file://{where}", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    what, k = None, -1
    if kill != "none" and start == 0:
        r, what, arg = kill.split(":")
        if int(r) != rank:
            what = None
        k = int(arg)
    if what == "write":
        orig_record, count = CaptureSession.record, [0]

        def record_then_die(self, *a, **kw):
            count[0] += 1
            if count[0] == k:
                die()
            return orig_record(self, *a, **kw)

        CaptureSession.record = record_then_die
    model = tiny_llama()
    with capture_activations(model, preset="balanced", output_path=os.path.join(outdir, "cap.strap"),
                             socket_path=sock, autostart_daemon=False, track_per_token=True,
                             checkpoint_interval_tokens=INTERVAL, resume_from_checkpoint=True) as fw:
        tr = fw.token_tracker
        print(f"rank {rank} start {start} resumed {fw.resume_step} from {fw.resumed_from}", flush=True)
        ids = PROMPT + [rank] + [t["token_id"] for t in tr.tokens]
        with torch.no_grad():
            while tr.step < N_TOKENS:
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
                nxt = int(logits[0, -1].argmax())
                tr.record_token(nxt, f"<{nxt}>")
                ids.append(nxt)
                if what == "token" and tr.step == k:
                    die()
    print(f"rank {rank} done {fw.output_path}", flush=True)
    if exchange == "pg":
        dist.destroy_process_group()
