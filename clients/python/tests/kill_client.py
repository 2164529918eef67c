"""Child process for the SIGKILL test: captures forever, printing a line after each forward."""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import tiny_llama  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402

if __name__ == "__main__":
    sock, out = sys.argv[1], sys.argv[2]
    m = tiny_llama()
    x = torch.randint(0, 1024, (1, 8))
    with torch.no_grad():
        with capture_activations(m, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False) as fw:
            n = 0
            while True:
                m(input_ids=x)
                n += 1
                print(f"forward {n} hooks {len(fw.hooked_modules)}", flush=True)
