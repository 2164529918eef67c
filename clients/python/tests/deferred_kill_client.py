"""Child process for the deferred-PUBLISH SIGKILL test: records tokens, runs one more
forward pass (whose PUBLISH is deferred to a TOKEN that never comes) and kills itself.
Mode "ring" writes the tokens into the ring, where no message names them before the kill."""

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
    # "message": one TOKEN message per token; "ring": tokens in the ring, none named by a
    # message before the kill (PROTOCOL.md 1.4, "TOKEN records")
    mode = sys.argv[4] if len(sys.argv) > 4 else "message"
    m = tiny_llama()
    with torch.no_grad():
        with capture_activations(m, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                                 track_per_token=True) as fw:
            s = fw._session
            if mode == "ring":
                assert s._ring_tokens
                s.ring_tokens_seconds = 1e9  # the doorbell by count only: never within n_tokens
            else:
                s._ring_tokens = False
            generate(fw, m, n_tokens=n_tokens)
            ids = list(PROMPT) + [t["token_id"] for t in fw.token_tracker.tokens]
            m(input_ids=torch.tensor([ids]), use_cache=False)
            # what the parent checks: the pass was deferred, not published by message
            print(f"hooks {len(fw.hooked_modules)} cursor {int(s._cursor)} deferred {int(s._deferred)} "
                  f"published {s.published_head} head {s.ring.head} cursor_at {s._cursor_at} "
                  f"unsent_tokens {s._unsent_tokens}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
