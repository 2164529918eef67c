"""Compare two streams packet for packet (type, name, seq, step, forward, dtype, shape, codec,
raw length, stored bytes, meta), as clients/python/tests/test_resume.py does.

Usage: compare_streams.py A B    (exit 0 when equal)
"""
import json
import sys

from llm_instrumentation import open_stream


def packets(path):
    with open_stream(path) as r:
        return [(p.type, p.name, p.seq, p.step, p.forward, p.dtype_id, p.shape, p.codec, p.raw_len,
                 bytes(p.stored()), json.dumps(p.meta, sort_keys=True)) for p in r.packets()]


a, b = packets(sys.argv[1]), packets(sys.argv[2])
if a == b:
    print(f"equal: {len(a)} packets")
    sys.exit(0)
for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
        print(f"packet {i} differs:\n  {x[:9]} {x[10]}\n  {y[:9]} {y[10]}")
        break
else:
    print(f"{len(a)} packets vs {len(b)}")
sys.exit(1)
