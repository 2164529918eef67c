"""Usage: PYTHONPATH=<tree>/clients/python/src python hook_cost.py MINIMAL|DETAILED TRIALS

Model-thread cost of the monitor's wrappers and hooks per decode token (its own clock,
hook_ns), the tree before issue 23 (resources.py) vs after (resources/): the resource benchmark's Llama (hidden 1024, 8 layers,
vocab 32000, fp32, 1 torch thread), 16 decode steps per trial after a 128-token prefill,
records dropped instead of written (the writer thread does not compete: the wrappers alone).
Min and median over trials: preemption on a loaded machine only adds."""
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from llm_instrumentation.resources import ResourceMonitor

level, trials = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)).eval()
new = hasattr(ResourceMonitor, "fast")
class Sink:
    path = None
    def write(self, lines): pass
    def flush(self): pass
    def close(self): pass
mon = ResourceMonitor(m, level, sink=Sink(), environ={}, flush_interval=None, flush_events=1 << 30)
per_tok, cpu_tok = [], []
with mon:
    thread = mon.recorder.thread if new else mon._writer
    thread.put = lambda recs, *rest: None
    rec = mon.recorder if new else mon
    for t in range(trials + 1):
        ids = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(3))
        past = None
        with torch.no_grad():
            r = m(input_ids=ids, cache=past, use_cache=True)
            past, ids = r.cache, r.logits[:, -1:].argmax(-1)
            h0 = mon.hook_ns
            for step in range(16):
                r = m(input_ids=ids, cache=past, use_cache=True)
                past, ids = r.cache, r.logits[:, -1:].argmax(-1)
            if t:  # the first trial makes what later ones reuse
                per_tok.append((mon.hook_ns - h0) / 16 / 1e3)
        (rec._records if not new else rec.records).clear()
    del thread.put
per_tok.sort()
print(json.dumps({"tree": "after" if new else "before", "level": level, "hook_us_per_token_min": per_tok[0],
                  "median": per_tok[len(per_tok)//2], "max": per_tok[-1], "trials": len(per_tok)}))
