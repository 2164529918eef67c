"""Compare two streams packet for packet (type, name, seq, step, forward, dtype, shape, codec,
raw length, stored bytes, meta), as clients/python/tests/test_resume.py does.

Usage: compare_streams.py A B    (exit 0 when equal)
       compare_streams.py --killed REF KILLED TENSORS TOKENS
           (exit 0 when KILLED's TENSOR and TOKEN packets are exactly REF's first TENSORS
           tensors and TOKENS tokens, in REF's order, and KILLED ended "aborted")
"""
import json
import sys

from llm_instrumentation import open_stream
from llm_instrumentation.stream import TENSOR, TOKEN


def packets(path, types=None):
    with open_stream(path) as r:
        return [(p.type, p.name, p.seq, p.step, p.forward, p.dtype_id, p.shape, p.codec, p.raw_len,
                 bytes(p.stored()), json.dumps(p.meta, sort_keys=True)) for p in r.packets()
                if types is None or p.type in types]


def differ(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"packet {i} differs:\n  {x[:9]} {x[10]}\n  {y[:9]} {y[10]}"
    return f"{len(a)} packets vs {len(b)}"


if sys.argv[1] == "--killed":
    ref, killed, tensors, tokens = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    got = packets(killed, (TENSOR, TOKEN))
    want, n_t, n_k = [], 0, 0
    for p in packets(ref, (TENSOR, TOKEN)):
        if p[0] == TENSOR and n_t < tensors:
            want.append(p)
            n_t += 1
        elif p[0] == TOKEN and n_k < tokens:
            want.append(p)
            n_k += 1
    with open_stream(killed) as r:
        end = r.end()
        status = end.meta.get("status") if end is not None else None
    if got == want and status == "aborted":
        print(f"killed stream: {tensors} tensors, {tokens} tokens, aborted")
        sys.exit(0)
    print(f"killed stream ended {status!r}; " + differ(got, want))
    sys.exit(1)

a, b = packets(sys.argv[1]), packets(sys.argv[2])
if a == b:
    print(f"equal: {len(a)} packets")
    sys.exit(0)
print(differ(a, b))
sys.exit(1)
