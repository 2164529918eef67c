"""What freeing the local disk behind an upload costs (docs/OBJECT_STORAGE.md "Freeing the
local disk"): the same capture uploaded to a local VersityGW with and without
``upload_free_local``, alternating, on one strapd; per capture the wall time of the capture,
the time until its object is complete, strapd's CPU time (user + kernel, from
/proc/PID/stat, so 10 ms ticks) and the bytes freed.

The capture is the freeing tests' (``tests/test_upload_free.py``): the tiny Llama decoding
greedily without a KV cache over a 200-token prompt, codec none, a checkpoint every token
(~3 MB a token).

Usage::

    .venv/bin/python clients/python/benchmarks/free_local_cost.py [--tokens 80] [--rounds 3] \\
        [--part-size 16MiB] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' VersityGW runner, strapd and model

import torch  # noqa: E402
from conftest import Daemon, strapd_bin, tiny_llama  # noqa: E402
from s3server import ACCESS, SECRET, S3Server, versitygw_bin  # noqa: E402
from test_upload_free import CAPTURE_KW, generate, prompt  # noqa: E402

from llm_instrumentation import capture_activations  # noqa: E402


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def status(sock: str) -> Dict[str, Any]:
    r = subprocess.run([str(strapd_bin()), "status", "--json", "--socket", sock], capture_output=True, text=True,
                       timeout=20, check=True)
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part-size", default="16MiB")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="freecost")
    srv = S3Server(versitygw_bin(), root)
    srv.client().create_bucket(Bucket="caps")
    d = Daemon(strapd_bin(), tempfile.mkdtemp(prefix="d", dir="/tmp"), "--no-probes", "--s3-endpoint", srv.endpoint,
               "--upload-part-size", a.part_size, "--upload-state-dir", os.path.join(root, "state"))
    model = tiny_llama()
    rows: List[Dict[str, Any]] = []
    try:
        for rnd in range(a.rounds):
            for free in (False, True):
                name = f"r{rnd}f{int(free)}"
                out = os.path.join(root, name + ".strap")
                obj = f"s3://caps/{name}/{name}.strap"
                c0, t0 = cpu_s(d.proc.pid), time.monotonic()
                with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://caps/{name}",
                                         upload_free_local=free, **CAPTURE_KW) as fw:
                    generate(fw, model, prompt(), a.tokens)
                t1 = time.monotonic()
                while True:
                    u = [x for x in status(d.socket).get("uploads") or [] if x["object"] == obj]
                    if u and u[0]["state"] == "complete":
                        break
                    time.sleep(0.05)
                row = {"free_local": free, "round": rnd, "bytes": fw.summary["file_bytes"],
                       "capture_s": round(t1 - t0, 3), "until_complete_s": round(time.monotonic() - t0, 3),
                       "strapd_cpu_s": round(cpu_s(d.proc.pid) - c0, 2), "freed_bytes": u[0].get("freed_bytes", 0)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if os.path.exists(out):
                    os.unlink(out)
    finally:
        d.stop()
        srv.stop()
    for free in (False, True):
        sel = [r for r in rows if r["free_local"] == free]
        gb = sel[0]["bytes"] / 1e9
        print(f"free_local={free}: capture {statistics.median(r['capture_s'] for r in sel):.2f} s (median), "
              f"strapd CPU {statistics.median(r['strapd_cpu_s'] for r in sel) / gb:.2f} CPU-s/GB (median)")
    diffs = [b["strapd_cpu_s"] - a_["strapd_cpu_s"] for a_, b in zip(rows[::2], rows[1::2])]
    print(f"freeing's extra strapd CPU per pair: {diffs} s, median {statistics.median(diffs) / gb:+.2f} CPU-s/GB")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
