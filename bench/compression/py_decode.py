"""Time the Python decoder (llm_instrumentation._activation_codecs) on blocks the Go
benchmark dumped, and check it agrees bit for bit with the Go decoder's output. Speeds are
raw (decoded) bytes per second of wall time and per CPU-second of this thread (numpy runs
these decoders on the calling thread; set OMP/OPENBLAS threads to 1 to be sure).

    go run ./bench/compression -corpus /tmp/strap-corpus -dump /tmp/strap-dump
    PYTHONPATH=clients/python/src .venv/bin/python bench/compression/py_decode.py /tmp/strap-dump
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from llm_instrumentation._activation_codecs import SharedBasis, decode_block


def main() -> None:
    root = Path(sys.argv[1])
    print("| codec | blocks | MiB | Python decode MB/s (1 thread, wall) | MB/s per CPU-second |")
    print("|---|---:|---:|---:|---:|")
    for d in sorted(p for p in root.iterdir() if (p / "manifest.json").exists()):
        entries = json.loads((d / "manifest.json").read_text())
        blocks = [((d / e["file"]).read_bytes(), e) for e in entries]
        raw = sum(e["raw_len"] for _, e in blocks)
        # Transform mode 4: the module's basis packet, parsed once (as a reader holds it), not timed.
        bases = {e["basis"]: SharedBasis((d / e["basis"]).read_bytes()) for e in entries if "basis" in e}
        for data, e in blocks:  # bit-identical to the Go decoder (checked outside the timing)
            out = decode_block(e["codec_id"], data, e["dtype"], e["raw_len"], basis=bases.get(e.get("basis", "")))
            assert hashlib.sha256(out).hexdigest() == e["go_sha256"], e["file"]
        best = best_cpu = float("inf")
        for _ in range(5):
            t, c = time.perf_counter(), time.thread_time()
            for data, e in blocks:
                decode_block(e["codec_id"], data, e["dtype"], e["raw_len"], basis=bases.get(e.get("basis", "")))
            best = min(best, time.perf_counter() - t)
            best_cpu = min(best_cpu, time.thread_time() - c)
        print(f"| {d.name} | {len(blocks)} | {raw / 2**20:.1f} | {raw / 1e6 / best:.0f} | {raw / 1e6 / best_cpu:.0f} |")


if __name__ == "__main__":
    main()
