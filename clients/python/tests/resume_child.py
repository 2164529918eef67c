"""Child process of the resume tests: captures the deterministic generation with per-token
tracking and checkpoints, and SIGKILLs itself at a chosen point (a real SIGKILL: no
finally blocks, no CLOSE).

argv: socket output kill [delay]; kill is one of
  none                 run to the end
  before:K             just before the checkpoint at token K (TOKEN K sent, not yet durable)
  after:K              just after the checkpoint file for token K was replaced
  write:N              inside the N-th tensor write (a random point of a forward pass)
  token:K              just after token K was recorded (its TOKEN sent; any checkpoint
                       for it made)

It prints "token K" after each token, "checkpoint K" as it asks for the checkpoint at token
K and "closing" before the capture is closed, so a parent can kill strapd at those moments.
"""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_llama  # noqa: E402
from genloop import INTERVAL, generate  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402
from llm_instrumentation._session import CaptureSession  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sock, out, kill = sys.argv[1], sys.argv[2], sys.argv[3]
    delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    torch.set_num_threads(1)
    m = tiny_llama()
    what, _, arg = kill.partition(":")
    if what == "write":
        # Patched before the capture starts: its hooks bind the session's record method.
        n = int(arg)
        orig_record = CaptureSession.record
        count = [0]

        def record_then_die(self, *a, **kw):
            count[0] += 1
            if count[0] == n:
                die()
            return orig_record(self, *a, **kw)

        CaptureSession.record = record_then_die
    with capture_activations(m, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                             track_per_token=True, checkpoint_interval_tokens=INTERVAL) as fw:
        orig = fw.checkpoint
        k = int(arg) if arg else -1

        def ck():
            print(f"checkpoint {fw.token_tracker.step}", flush=True)
            if what == "before" and fw.token_tracker.step == k:
                die()
            c = orig()
            if what == "after" and fw.token_tracker.step == k:
                die()
            return c

        fw.checkpoint = ck
        if what == "token":
            tr = fw.token_tracker
            orig_record = tr.record_token

            def record(*a, **kw):
                r = orig_record(*a, **kw)
                if tr.step == k:
                    die()
                return r

            tr.record_token = record
        generate(fw, m, delay=delay, echo=True)
        print("closing", flush=True)
    print("done", flush=True)
