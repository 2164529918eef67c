"""Engine-thread CPU per call of the vLLM plugin's two fused writes, through a real strapd
(docs/VLLM.md 9): a 16-row float32 layer record (1024 wide) summed into the ring, and a
step's 16 TOKEN records; medians over 1800 steps of 8 layers.

Usage: .venv/bin/python bench/vllm_fused_cost.py bin/strapd new
       PYTHONPATH=<a tree before 2026-12-07>/clients/python/src .venv/bin/python \
           bench/vllm_fused_cost.py bin/strapd base   (the writes as vllm/_fused.py had them)
"""
import os, sys, tempfile, time, subprocess, socket as so
import torch
from llm_instrumentation import _open
from llm_instrumentation._session import open_session
from llm_instrumentation.config import InstrumentationConfig
base = sys.argv[2] == "base"
if base:
    from llm_instrumentation.vllm._fused import record_sum, record_tokens
    rs = lambda s, n, h, r, rows: record_sum(s, n, h, r, rows)
    rt = lambda s, t: record_tokens(s, t)
else:
    rs = lambda s, n, h, r, rows: s.record_sum(n, h, r, rows)
    rt = lambda s, t: s.tokens_to_ring(t)
d = tempfile.mkdtemp(prefix="fb-", dir="/tmp")
sock = os.path.join(d, "s.sock")
p = subprocess.Popen([sys.argv[1], "serve", "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(200):
    try:
        c = so.socket(so.AF_UNIX, so.SOCK_SEQPACKET); c.connect(sock); c.close(); break
    except OSError:
        time.sleep(0.05)
cfg = InstrumentationConfig.fast_capture(); plan = cfg.transport_plan()
names = [f"model.layers.{i}" for i in range(8)]
path = os.path.join(d, "b.strap")
req = _open.open_request(torch.nn.Linear(1, 1), cfg, plan, names, path, "sha256:x", None)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
s = open_session(sock, False, 30.0, 64 << 20, "block", fd, None, req); os.close(fd)
h = torch.randn(16, 1024); r = torch.randn(16, 1024); rows = slice(0, 16)
toks = [(100 + j, 7 + j) for j in range(16)]
sums, tks = [], []
skipped = 0
for step in range(2000):
    s.step, s.forward = s.tokens, step
    c0 = time.thread_time()
    ok = all([rs(s, n, h, r, rows) for n in names])
    c1 = time.thread_time()
    ok = rt(s, toks) == 16 and ok
    c2 = time.thread_time()
    s.flush()
    if step % 100 == 99:
        s.checkpoint()  # strapd caught up: the next steps find the ring free
    if not ok:
        skipped += 1
        continue  # a step the ring had no room for (the plugin then records the old way): not timed
    if step >= 200:
        sums.append((c1 - c0) / 8); tks.append((c2 - c1) / 16)
s.close(); s.shutdown(); p.terminate(); p.wait()
sums.sort(); tks.sort()
print(f"{sys.argv[2]}: record_sum {sums[len(sums)//2]*1e6:.2f} us/record (p90 {sums[int(len(sums)*.9)]*1e6:.2f}), "
      f"tokens {tks[len(tks)//2]*1e6:.2f} us/token (p90 {tks[int(len(tks)*.9)]*1e6:.2f}); {len(sums)} steps timed, {skipped} without room")
