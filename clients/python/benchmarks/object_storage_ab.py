"""Before/after of the object-storage epoch in one process, alternating: the code as it is
("new") against the reader before 2026-11-27 15:00 UTC ("old": a large payload fetched apart
from its header's bytes and joined to them), reproduced by the module constant that changed,
and "new-pf2" (prefetch=2: two tensors ahead, two range requests at once); local epochs beside
them (docs/OBJECT_STORAGE.md "Performance of reading"). The capture is object_storage_bench.py's (made once, kept at
--capture).

Usage::

    .venv/bin/python clients/python/benchmarks/object_storage_ab.py --strapd bin/strapd [--rounds 8]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import object_storage_bench as ob  # noqa: E402  (puts src/ and tests/ on the path)
from s3server import S3Server, versitygw_bin  # noqa: E402

import llm_instrumentation.stream as sm  # noqa: E402

#: name: (ActivationDataset's prefetch, stream.REFETCH_PREFIX_RATIO)
VARIANTS = {"old": (8, 1 << 62), "new": (8, 64), "new-pf2": (2, 64)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strapd", default=str(HERE.parents[2] / "bin" / "strapd"))
    ap.add_argument("--capture", default="/var/tmp/strap-objstore-ab/cap.strap")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--variants", default="old,new,new-pf2")
    a = ap.parse_args()
    cap = Path(a.capture)
    if not cap.exists():
        cap.parent.mkdir(parents=True, exist_ok=True)
        ob.capture(a.strapd, str(cap.parent), cap, 8, 4, 1024, 512, 4)
    names = a.variants.split(",")
    srv = S3Server(versitygw_bin())

    def server_cpu() -> float:
        f = Path(f"/proc/{srv.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    try:
        url = srv.upload(cap, "bench", "cap.strap")
        so = srv.storage_options
        res: dict = {}
        for i in range(a.rounds + 1):  # round 0 warms (page cache, imports, clients)
            for name in ["local"] + (names if i % 2 else names[::-1]):
                if name == "local":
                    p, kw = str(cap), {}
                else:
                    pf, sm.REFETCH_PREFIX_RATIO = VARIANTS[name]
                    p, kw = url, {"storage_options": so, "prefetch": pf}
                c0, s0 = time.process_time(), server_cpu()
                e = ob.epoch(p, "model.layers.1", 4096, **kw)
                if i:
                    res.setdefault(name, []).append((e["iterate_s"], e["epoch_s"], time.process_time() - c0,
                                                     server_cpu() - s0, e["bytes_fetched"]))
        local = statistics.median(x[0] for x in res["local"])
        for k, v in res.items():
            def m(j: int) -> float:
                return statistics.median(x[j] for x in v)
            print(f"{k:6s} iterate {m(0) * 1e3:5.0f} ms (ratio {local / m(0):.2f}), with construction {m(1) * 1e3:5.0f} ms, "
                  f"client CPU {m(2) * 1e3:5.0f} ms, server CPU {m(3) * 1e3:4.0f} ms, fetched {m(4):.0f} B")
        print("load", os.getloadavg())
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
