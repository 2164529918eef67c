"""Child process of test_integration_transform's resume test: the deterministic generation
of test_resume captured with codec ``transform`` (per-token tracking, checkpoints), SIGKILLed
inside its N-th tensor write (a real SIGKILL: no finally blocks, no CLOSE).

argv: socket output N
"""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_llama  # noqa: E402
from genloop import INTERVAL, generate  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402
from llm_instrumentation._session import CaptureSession  # noqa: E402

#: The capture's config, shared with the parent test.
CONFIG = InstrumentationConfig.balanced().with_compression("transform", lossy="transform:0.05")

if __name__ == "__main__":
    sock, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    m = tiny_llama()
    orig_record = CaptureSession.record
    count = [0]

    def record_then_die(self, *a, **kw):
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return orig_record(self, *a, **kw)

    CaptureSession.record = record_then_die
    with capture_activations(m, config=CONFIG, output_path=out, socket_path=sock, autostart_daemon=False,
                             track_per_token=True, checkpoint_interval_tokens=INTERVAL) as fw:
        generate(fw, m)
