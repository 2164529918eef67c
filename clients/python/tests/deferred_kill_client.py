"""Child process for the deferred-PUBLISH SIGKILL test: records tokens, runs one more
forward pass (whose PUBLISH is deferred to a TOKEN that never comes) and kills itself."""

import os
import signal
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import tiny_llama  # noqa: E402
from genloop import PROMPT, generate  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402

if __name__ == "__main__":
    sock, out, n_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = tiny_llama()
    with torch.no_grad():
        with capture_activations(m, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                                 track_per_token=True) as fw:
            generate(fw, m, n_tokens=n_tokens)
            ids = list(PROMPT) + [t["token_id"] for t in fw.token_tracker.tokens]
            m(input_ids=torch.tensor([ids]), use_cache=False)
            s = fw._session
            # what the parent checks: the pass was deferred, not published by message
            print(f"hooks {len(fw.hooked_modules)} cursor {int(s._cursor)} deferred {int(s._deferred)} "
                  f"published {s.published_head} head {s.ring.head}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
