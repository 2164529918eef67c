"""Usage: PYTHONPATH=<tree>/clients/python/src python writer_replay.py MINIMAL|DETAILED REPS

Writer-thread CPU per decode step, the tree before issue 23 (resources.py) vs after (resources/): record a prefill and 16 decode
steps of the resource benchmark's Llama once (MINIMAL or DETAILED), then write the decode
steps' records again and again with the writer's own code (templates made: the steady state),
timing the calling thread's CPU. Same records, same model, same process layout per tree."""
import json, sys, time, copy
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from llm_instrumentation.resources import ResourceMonitor

level, reps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)).eval()
new = hasattr(ResourceMonitor, "fast")
sink_lines = []
class Sink:
    path = None
    def write(self, lines): sink_lines.append(len(lines))
    def flush(self): pass
    def close(self): pass
mon = ResourceMonitor(m, level, sink=Sink(), environ={}, flush_interval=None, flush_events=1 << 30)
batches = []
with mon:
    thread = mon.recorder.thread if new else mon._writer
    put = thread.put
    thread.put = lambda recs, *rest: (batches.append(list(recs)), put(recs, *rest))
    ids = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(3))
    past = None
    with torch.no_grad():
        for step in range(17):
            mon.set_step(step)
            r = m(input_ids=ids, cache=past, use_cache=True)
            past = r.cache
            ids = r.logits[:, -1:].argmax(-1)
    mon.flush()
    thread.sync()
    write = mon.writer.write_batch if new else mon._write_batch_inner
    # The records of passes 2..16 (pass 0 is the prefill, pass 1 the first decode step, which
    # makes the decode templates), one batch per pass.
    begin = (lambda r: r[0] == 1) if new else (lambda r: r[0] == mon._w_begin)
    allrecs = [r for b in batches for r in b]
    recs, cur = [], None
    for r in allrecs:
        if begin(r):
            cur = [] if r[2] >= 2 else None
            if cur is not None:
                recs.append(cur)
        if cur is not None:
            cur.append(r)
    n_events = 0
    times = []
    if new:
        from llm_instrumentation.resources import native as mod
        name = "render"
    else:
        from llm_instrumentation import resources as mod
        name = "_render"
    real = getattr(mod, name)
    in_c = [0]
    def timed(*a):
        t = time.thread_time_ns()
        try:
            return real(*a)
        finally:
            in_c[0] += time.thread_time_ns() - t
    setattr(mod, name, timed)
    c_times = []
    for i in range(reps):
        sink_lines.clear()
        in_c[0] = 0
        t0 = time.thread_time_ns()
        for b in recs:
            write(list(b))
        times.append(time.thread_time_ns() - t0)
        c_times.append(in_c[0])
        n_events = sum(sink_lines)
    del thread.put
times.sort()
c_times.sort()
passes = len(recs)
print(json.dumps({"tree": "after" if new else "before", "level": level, "events_per_rep": n_events,
                  "writer_cpu_us_per_token_median": times[len(times)//2] / 1e3 / passes,
                  "min": times[0] / 1e3 / passes, "max": times[-1] / 1e3 / passes,
                  "render_us_per_token_min": c_times[0] / 1e3 / passes, "render_median": c_times[len(c_times)//2] / 1e3 / passes}))
