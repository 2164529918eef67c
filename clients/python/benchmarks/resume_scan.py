"""Time checkpoint.resume_point over a stream of N forward passes, each one TENSOR packet of SIZE
bytes and one TOKEN packet, no checkpoint (the whole stream walked and CRC-checked), in the page
cache: best of 3 by CPU time. SRC is the llm_instrumentation source tree to import (compare two
checkouts, each with its _speedups built).

    python clients/python/benchmarks/resume_scan.py clients/python/src 100000 1024
    python clients/python/benchmarks/resume_scan.py /tmp/old/clients/python/src 100000 1024
"""
import json
import os
import struct
import sys
import tempfile
import time

sys.path.insert(0, sys.argv[1])
from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation.stream import crc32c, PACKET
path = os.path.join(tempfile.gettempdir(), "strap-resume-scan-%s-%s.strap" % (sys.argv[2], sys.argv[3]))
N, SZ = int(sys.argv[2]), int(sys.argv[3])
if not os.path.exists(path) or os.path.getsize(path) < N * SZ:
    meta = json.dumps({"client_metadata": {"fingerprint": "fp"}}).encode()
    hdr = bytearray(struct.pack("<8sHHII4x", b"STRAPSTM", 2, 0, len(meta), 0) + meta)
    struct.pack_into("<I", hdr, 16, crc32c(bytes(hdr[:16]) + meta))
    hdr += b"\0" * ((-len(hdr)) % 8)
    payload = os.urandom(SZ)
    with open(path, "wb") as f:
        f.write(hdr)
        seq = 1
        for k in range(N):
            name = b"m"
            h = bytearray(PACKET.pack(b"SPKT", 1, 6, 1, 96 + 8 + 1, 1, 0, 0, 0, 0, seq, k, k, SZ, SZ, 0, SZ, 0))
            h += struct.pack("<Q", SZ) + name
            struct.pack_into("<I", h, 20, crc32c(payload, crc32c(bytes(h))))
            f.write(h); f.write(payload); seq += 1
            tm = json.dumps({"token_id": k, "text": "t%d" % k}).encode()
            t = bytearray(PACKET.pack(b"SPKT", 3, 0, 0, 96 + len(tm), 0, 0, 0, len(tm), 0, seq, k, 0, 0, 0, 0, 0, 0)) + tm
            struct.pack_into("<I", t, 20, crc32c(bytes(t)))
            f.write(t); seq += 1
fd = os.open(path, os.O_RDONLY)
best = None
for _ in range(3):
    w, c = time.perf_counter(), time.process_time()
    rp = ckpt.resume_point(fd, None, path, "fp", refuse_complete=False)
    w, c = time.perf_counter() - w, time.process_time() - c
    best = (w, c) if best is None or c < best[1] else best
print(sys.argv[1], "tokens", rp.point.token_count, "bytes", os.path.getsize(path),
      "wall %.3f s cpu %.3f s -> %.2f GB/s per CPU-s" % (best[0], best[1], os.path.getsize(path) / best[1] / 1e9))
