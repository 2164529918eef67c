"""Python synthetic producer for the daemon-ingest benchmark (docs/PERFORMANCE.md section 2).

The counterpart of ``bench/ingest`` (Go): a module whose forward pass returns one of a few
precomputed float32 tensors (activation-like: N(0,1), a quarter exact zeros), hooked through
the public ``capture_activations`` API, so every tensor goes the real client path — forward
hook, one ``copy_`` into the ring, PUBLISH, wait for RELEASE — until ``--bytes`` have gone
in. Prints one JSON line: daemon's CLOSED counters, wall time, GB/s, this process's CPU
seconds and its resident memory before the session and at its peak.

Usage::

    python clients/python/benchmarks/ingest.py --socket /tmp/s/strapd.sock --out /tmp/s/x.strap \\
        --codec none --bytes 2GiB [--tensor-mib 4] [--ring-mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _bench_model import cpu_seconds, rss_bytes  # noqa: E402
from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(s: str) -> int:
    """4096, 64KiB, 2GiB."""
    for suf, m in _UNITS.items():
        if s.endswith(suf):
            return int(float(s[: -len(suf)]) * m)
    return int(s)


class Source(torch.nn.Module):
    """Returns precomputed tensors in turn; its output is what the hook captures."""

    def __init__(self, tensors: "list[torch.Tensor]") -> None:
        super().__init__()
        self.tensors = tensors
        self.n = 0

    def forward(self) -> torch.Tensor:  # noqa: D102
        t = self.tensors[self.n % len(self.tensors)]
        self.n += 1
        return t


class Producer(torch.nn.Module):
    """Root module with one hooked child named ``src``."""

    def __init__(self, tensors: "list[torch.Tensor]") -> None:
        super().__init__()
        self.src = Source(tensors)

    def forward(self) -> torch.Tensor:  # noqa: D102
        return self.src()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--codec", default="none")
    ap.add_argument("--level", type=int, default=None)
    ap.add_argument("--lossy", default=None, help="bound of a lossy codec, e.g. rel:1e-3")
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--tensor-mib", type=int, default=4)
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--distinct", type=int, default=8)
    a = ap.parse_args()
    want = parse_size(a.bytes)
    if want <= 0 or a.tensor_mib <= 0 or a.ring_mib <= 0 or a.distinct <= 0:
        ap.error("sizes and counts must be positive")
    g = torch.Generator().manual_seed(1)
    elems = (a.tensor_mib << 20) // 4
    tensors = []
    for _ in range(a.distinct):
        # Like the Go producer's data (pipelinetest.Activations): N(0,1), a quarter of the
        # elements exactly zero at random places, one in a thousand scaled by 100.
        t = torch.randn(1, elems // 1024, 1024, generator=g)
        u = torch.rand(t.shape, generator=g)
        t[u < 0.25] = 0
        t[u > 0.999] *= 100
        tensors.append(t)
    model = Producer(tensors)
    kw = {"lossy": a.lossy} if a.lossy else {}
    cfg = InstrumentationConfig(granularity="all_modules", compression_algorithm=a.codec,
                                compression_level=a.level, max_memory_gb=(a.ring_mib << 20) / (1 << 30), **kw)
    before = rss_bytes()
    cpu0 = cpu_seconds()
    pushed = 0
    n = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        with capture_activations(model, config=cfg, output_path=a.out, socket_path=a.socket,
                                 autostart_daemon=False) as fw:
            while pushed < want:
                model()
                pushed += elems * 4
                n += 1
            t1 = time.perf_counter()
    secs = time.perf_counter() - t0
    s = fw.summary or {}
    if s.get("bytes_in") != pushed or s.get("drops"):
        print(f"ingest: daemon took {s.get('bytes_in')} bytes with {s.get('drops')} drops, pushed {pushed}",
              file=sys.stderr)
        sys.exit(1)
    after = rss_bytes()
    print(json.dumps({
        "producer": "python", "codec": fw.plan.codec, "level": fw.plan.codec_level, "lossy": a.lossy or "", "tensor_mib": a.tensor_mib,
        "ring_mib": a.ring_mib, "block_size": fw.plan.block_size, "tensors": n, "packets": s["packets"],
        "drops": s["drops"], "bytes_in": s["bytes_in"], "bytes_out": s["bytes_out"], "file_bytes": s["file_bytes"],
        "seconds": secs, "put_seconds": t1 - t0, "gbps": s["bytes_in"] / secs / 1e9,
        "client_cpu_s": cpu_seconds() - cpu0, "client_rss_before_bytes": before["rss"],
        "client_maxrss_bytes": after["hwm"],
    }))


if __name__ == "__main__":
    main()
