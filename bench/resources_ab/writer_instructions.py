"""Instructions per token of the resource monitor's threads, for the before/after of the
resources/ split (docs/PERFORMANCE.md): DETAILED decoding of the benchmark Llama (a small
shape: valgrind runs it ~50x slower), warmed by 8 tokens, then TOKENS more; run under
callgrind by writer_instructions.sh, which takes the difference of two token counts so
start-up, template making and close cancel out.

Prints the writer thread's native id (callgrind numbers threads in creation order; the
script matches its per-thread file by that order) and the writer's CPU per token.
"""

import os
import sys
import tempfile
import threading

import torch

torch.set_num_threads(1)
_run = threading.Thread.run


def run(self: threading.Thread) -> None:
    if self.name == "strap-resources":
        print("WRITER_TID", threading.get_native_id(), file=sys.stderr, flush=True)
    _run(self)


threading.Thread.run = run  # type: ignore[method-assign]
sys.path.insert(0, os.path.join(os.environ["SRC"], "..", "benchmarks"))
from _bench_model import DEFAULT_MODEL, build_model  # noqa: E402

from llm_instrumentation.resources import ResourceMonitor  # noqa: E402

m = dict(DEFAULT_MODEL, hidden=256, intermediate=704, vocab=4000, heads=4)
model = build_model(m["hidden"], m["layers"], m["intermediate"], m["vocab"], m["heads"])
mon = ResourceMonitor(model, "DETAILED", os.path.join(tempfile.mkdtemp(), "x.jsonl"), environ={})
mon.start()
prompt = torch.randint(0, m["vocab"], (1, 16), generator=torch.Generator().manual_seed(1))


def decode(n: int) -> None:
    ids, past = prompt, None
    with torch.no_grad():
        for step in range(n):
            mon.set_step(step)
            r = model(input_ids=ids, cache=past, use_cache=True)
            past = r.cache
            ids = torch.tensor([[int(r.logits[0, -1].argmax())]])


decode(8)
mon.flush()
w0 = mon.writer_cpu_ns
tokens = int(os.environ.get("TOKENS", "16"))
decode(tokens)
mon.flush()
print("writer cpu us/token", (mon.writer_cpu_ns - w0) / 1000 / tokens, file=sys.stderr)
mon.close()
