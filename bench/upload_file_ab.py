"""Before/after of `strapd upload` of one file (a capture: bench/ingest), interleaved: a base
binary, this checkout's bin/strapd, and bin/strapd with STRAP_UPLOAD_CRC=readback (the parts'
CRC32C read back, not taken from the packets); each in its own process against one VersityGW
(its data under /var/tmp, on disk), the file in the page cache; CPU from wait4
(docs/PERFORMANCE.md "Upload to object storage").

Usage::

    .venv/bin/python bench/upload_file_ab.py ROUNDS FILE BASE_STRAPD
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))
from s3server import S3Server, versitygw_bin  # noqa: E402


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    rounds, path, base = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    here = str(REPO / "bin" / "strapd")
    variants = [("base", base, {}), ("new", here, {}), ("new-readback", here, {"STRAP_UPLOAD_CRC": "readback"})]
    work = tempfile.mkdtemp(dir="/var/tmp", prefix="strap-upab-")
    s3 = S3Server(versitygw_bin(), root=work)
    try:
        s3.bucket("bench")
        env = dict(os.environ, **s3.env, AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        size = os.path.getsize(path)
        gb = size / 1e9
        with open(path, "rb") as f:  # into the page cache
            while f.read(8 << 20):
                pass
        res: dict[str, list[tuple[float, float, float, float]]] = {v[0]: [] for v in variants}
        for r in range(rounds):
            for name, binary, extra in (variants if r % 2 == 0 else variants[::-1]):
                t = time.perf_counter()
                p = subprocess.Popen([binary, "upload", "--json", "--s3-endpoint", s3.endpoint, path,
                                      f"s3://bench/{name}{r}"], env=dict(env, **extra), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
                _, status, ru = os.wait4(p.pid, 0)
                assert p.stderr is not None
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"{name}: strapd upload failed: {p.stderr.read().decode()}")
                cpu = ru.ru_utime + ru.ru_stime
                res[name].append((cpu / gb, ru.ru_utime / gb, ru.ru_stime / gb, size / (time.perf_counter() - t) / 1e6))
        for k, v in res.items():
            print(f"{k:12s} CPU-s/GB " + " ".join(f"{x[0]:.2f}" for x in v) +
                  f"  median {statistics.median(x[0] for x in v):.3f} (user {statistics.median(x[1] for x in v):.2f},"
                  f" sys {statistics.median(x[2] for x in v):.2f}); MB/s median {statistics.median(x[3] for x in v):.0f}")
        print("load", os.getloadavg())
    finally:
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
