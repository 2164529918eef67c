"""The autostart race of test_autostart_race.py: this process builds a tiny GPT-2 from a
config, then forks N processes (one import of torch for all of them) which wait at a barrier
(a pipe the parent closes once all are ready) and then each run one capture with every
default (``preset="balanced"``, the socket from ``STRAPD_SOCKET``, autostart on), no daemon
running. Prints one line per process; exits 1 when any failed.

argv: outdir n
"""

import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_gpt2  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402


def child(i: int, outdir: str, ready: int, go: int) -> int:
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(i))
    os.write(ready, b"r")
    os.read(go, 1)  # EOF for every process at once when the parent closes its end
    try:
        with capture_activations(model, preset="balanced", output_path=os.path.join(outdir, f"cap.{i}.strap")) as fw:
            with torch.no_grad():
                for _ in range(2):
                    model(ids)
    except BaseException:
        print(f"process {i} (pid {os.getpid()}) failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        return 1
    print(f"process {i} (pid {os.getpid()}) wrote {fw.output_path}", flush=True)
    return 0


if __name__ == "__main__":
    outdir, n = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)  # before any op: no intra-op pool threads across the forks
    model = tiny_gpt2()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            os._exit(child(i, outdir, ready_w, go_r))
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    got = 0
    while got < n:
        b = os.read(ready_r, n)
        if not b:
            break
        got += len(b)
    os.close(go_w)  # the barrier opens
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    print(f"{n - failed} of {n} processes captured", flush=True)
    sys.exit(1 if failed or got < n else 0)
