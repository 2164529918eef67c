"""How fast the client's one copy into the ring is, and with what (docs/PERFORMANCE.md 5).

The hook path copies each output into a ``torch.frombuffer`` view of the memfd ring with
``dst.copy_(src)``. This measures that copy for activation-sized float32 tensors, steady
state (the ring's pages already touched once) and on the first lap (page faults), with:

* ``torch copy_`` at torch's default intra-op threads (what the client does),
* ``torch copy_`` with one intra-op thread,
* ``numpy.copyto`` on the same memory (one thread, no torch dispatch),

the three variants interleaved round by round. Prints one JSON document.

Usage::

    python clients/python/benchmarks/ring_copy.py [--ring-mib 256] [--rounds 5] [--sizes-kib 4,2048,5632]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import time
from typing import Callable, Dict, List

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes-kib", default="4,2048,5632", help="tensor sizes: a decode-step hidden state, "
                    "a 512x1024 fp32 output, a 512x2816 MLP intermediate")
    a = ap.parse_args()
    n = a.ring_mib << 20
    fd = os.memfd_create("strap-bench-ring", os.MFD_CLOEXEC)
    os.ftruncate(fd, n)
    m = mmap.mmap(fd, n)
    ring_t = torch.frombuffer(m, dtype=torch.uint8)
    ring_np = np.frombuffer(m, dtype=np.uint8)
    default_threads = torch.get_num_threads()
    out: Dict[str, object] = {"ring_mib": a.ring_mib, "torch_threads": default_threads, "rounds": a.rounds,
                              "sizes": []}

    def lap(size: int, fn: Callable[[int], None]) -> float:
        count = n // size
        t0 = time.perf_counter()
        for i in range(count):
            fn(i * size)
        return count * size / (time.perf_counter() - t0) / 1e9

    for kib in [int(x) for x in a.sizes_kib.split(",") if x]:
        size = kib << 10
        src = torch.randn(size // 4)
        src_np = src.numpy()

        def torch_copy(off: int) -> None:
            ring_t[off:off + size].view(torch.float32).copy_(src)

        def numpy_copy(off: int) -> None:
            np.copyto(ring_np[off:off + size].view(np.float32), src_np)

        first = lap(size, torch_copy)  # fresh pages: the first lap faults them in
        res: Dict[str, List[float]] = {"torch_copy_default_threads": [], "torch_copy_1_thread": [], "numpy_copyto": []}
        for _ in range(a.rounds):
            torch.set_num_threads(default_threads)
            res["torch_copy_default_threads"].append(lap(size, torch_copy))
            torch.set_num_threads(1)
            res["torch_copy_1_thread"].append(lap(size, torch_copy))
            torch.set_num_threads(default_threads)
            res["numpy_copyto"].append(lap(size, numpy_copy))
        out["sizes"].append({"kib": kib, "first_lap_gbps": first,  # type: ignore[union-attr]
                             **{k: statistics.median(v) for k, v in res.items()},
                             "all": res})
        # Give the pages back so the next size starts with a fresh first lap too.
        m.madvise(mmap.MADV_REMOVE)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
