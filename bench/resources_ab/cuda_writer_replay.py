"""Usage: PYTHONPATH=<tree>/clients/python/src python cuda_writer_replay.py MINIMAL|DETAILED REPS

The resource writer thread's CPU per decoding step, and per CUDA-timed record, for the records
a GPU's monitor hands it (cuda_writer_ab.sh runs it on two trees, alternating). No GPU here: a
Llama of a 1B model's depth (16 layers, narrow so that it decodes fast on the CPU) decodes
17 steps under the general wrappers a GPU's modules get; its records are then made a GPU's
(every timing a CUDA event pair, the allocator's memory readings, the device's memory use on
the handoffs) and the writer writes decoding steps 2..16 again and again (templates made: the
steady state), timed by the calling thread's CPU clock.

The event pairs are stand-ins: ``query`` and ``elapsed_time`` are Python methods returning at
once (a float32's value in ms, as CUDA gives it). On a GPU each is a call into torch's C
bindings (cudaEventQuery, cudaEventElapsedTime) and the end event may not have completed:
those costs are the same in both trees and not in these figures."""
import json
import struct
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llm_instrumentation.resources import ResourceMonitor

level, reps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=16,
                                 num_attention_heads=8, num_key_value_heads=4, vocab_size=1024)).eval()


class Sink:
    path = None

    def __init__(self):
        self.lines = 0

    def write(self, lines):
        self.lines += len(lines)

    def flush(self):
        pass

    def close(self):
        pass


class End:
    def query(self):
        return True


class Start:
    def __init__(self, ms):
        self.ms = ms

    def elapsed_time(self, end):
        return self.ms


def f32(x):
    """x as CUDA's elapsed time gives it: a float32, widened."""
    return struct.unpack("f", struct.pack("f", x))[0]


#: Durations in ms as a decoding step's kernels take them on a GPU (a few µs to a few ms).
DURATIONS = [f32(x) for x in (0.0123, 0.00716, 0.0411, 0.00302, 0.1337, 0.0089, 0.02575, 1.9)]
CUDA_MEM = {"device_memory_allocated_bytes": 2_471_000_064, "device_memory_reserved_bytes": 2_600_468_480,
            "device_memory_peak_bytes": 2_500_000_000, "memory_source": "torch.cuda.memory_stats"}
LINEAR, MODULE, ALLOC, HANDOFF, ATTENTION, FORWARD = 2, 3, 5, 7, 8, 10

sink = Sink()
mon = ResourceMonitor(m, level, sink=sink, environ={}, flush_interval=None, flush_events=1 << 30)
mon.recorder.fast = False  # the general wrappers: a GPU's modules get them
mon.start()
mon.flush()
thread = mon.recorder.thread
recorded = []
thread.put = lambda recs, *rest: recorded.extend(recs)
ids = torch.randint(0, 1024, (1, 32), generator=torch.Generator().manual_seed(3))
past = None
with torch.no_grad():
    for step in range(17):
        mon.set_step(step)
        r = m(input_ids=ids, cache=past, use_cache=True)
        past = r.cache
        ids = r.logits[:, -1:].argmax(-1)
mon.recorder.hand_off()
del thread.put
thread.sync()

# One batch per pass from pass 1 on (pass 0 is the prefill), as a GPU's: pairs, the allocator's readings.
passes, cur, k = [], None, 0
cells = {}
for r in recorded:
    r = list(r)
    if r[0] == 1:  # BEGIN
        cur = [] if r[2] >= 1 else None
        if cur is not None:
            passes.append(cur)
    if cur is None:
        continue
    if r[0] in (LINEAR, MODULE, HANDOFF, ATTENTION, FORWARD):
        r[3] = (Start(DURATIONS[k % len(DURATIONS)]), End())
        k += 1
    if r[0] == HANDOFF:
        r[6], r[7], r[8] = True, 0.3125, "cuda_allocated_over_total"
    if r[0] == ALLOC:
        r[7] = True
        r[9] = cells.setdefault(id(r[9]), [dict(CUDA_MEM)])
    if r[0] == FORWARD:
        r[7] = cells.setdefault(id(r[7]), [dict(CUDA_MEM)])
    cur.append(tuple(r))
mon.writer.state.cuda = True
write = mon.writer.write_batch
for b in passes[:1]:  # the first decoding step makes the decode templates
    write(list(b))
steady = passes[1:]
cuda_recs = sum(1 for b in steady for r in b if len(r) > 3 and type(r[3]) is tuple)
times = []
for _ in range(reps):
    sink.lines = 0
    t0 = time.thread_time_ns()
    for b in steady:
        write(list(b))
    times.append(time.thread_time_ns() - t0)
lines = sink.lines
mon.close()
times.sort()
tokens = len(steady)
med = times[len(times) // 2]
tree = "after" if hasattr(__import__("llm_instrumentation.resources.events", fromlist=["x"]), "cuda_duration_us") \
    else "before"
print(json.dumps({"tree": tree, "level": level, "tokens": tokens, "events_per_token": lines / tokens,
                  "cuda_timed_records_per_token": cuda_recs / tokens,
                  "writer_cpu_us_per_token_median": round(med / 1e3 / tokens, 1),
                  "min": round(times[0] / 1e3 / tokens, 1), "max": round(times[-1] / 1e3 / tokens, 1),
                  "writer_cpu_us_per_cuda_record_median": round(med / 1e3 / cuda_recs, 2)}))
