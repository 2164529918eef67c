"""Before/after of strapd's CPU for an upload on top of a capture, interleaved: one `strapd
serve` per variant (a binary, and environment switches) against one VersityGW (its data under
/var/tmp, on disk); each round captures 512 MiB (bench/ingest: Go producer, codec none) on
every daemon without and with --upload, in rotating order, each daemon's CPU read from /proc
(docs/PERFORMANCE.md "Upload to object storage").

Usage::

    go build -o /tmp/ingest ./bench/ingest
    .venv/bin/python bench/upload_ab.py ROUNDS NAME=BINARY[:ENV=VAL,...] ...
    # e.g. bench/upload_ab.py 6 base=/tmp/base/bin/strapd new=bin/strapd

$STRAP_INGEST names the ingest binary (default /tmp/ingest); $STRAP_VERSITYGW the server.
"""
from __future__ import annotations

import json
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

SIZE = 512 << 20


def daemon_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upload_done(binary: str, sock: str, obj: str) -> bool:
    out = subprocess.run([binary, "status", "--json", "--socket", sock], capture_output=True, text=True, check=True)
    return any(u["object"] == obj and u["state"] == "complete" for u in json.loads(out.stdout).get("uploads") or [])


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    rounds = int(sys.argv[1])
    variants = []
    for arg in sys.argv[2:]:
        name, rest = arg.split("=", 1)
        binary, _, envs = rest.partition(":")
        variants.append((name, binary, dict(e.split("=", 1) for e in envs.split(",") if e)))
    ingest = os.environ.get("STRAP_INGEST", "/tmp/ingest")
    work = tempfile.mkdtemp(dir="/var/tmp", prefix="strap-capab-")
    s3 = S3Server(versitygw_bin(), root=work)
    daemons: dict[str, tuple[subprocess.Popen, str, str]] = {}
    try:
        s3.bucket("bench")
        env = dict(os.environ, **s3.env, AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        for name, binary, extra in variants:
            sock = f"{work}/{name}.sock"
            daemons[name] = (subprocess.Popen([binary, "serve", "--socket", sock, "--no-probes", "--s3-endpoint",
                                               s3.endpoint, "--upload-state-dir", f"{work}/state-{name}"],
                                              env=dict(env, **extra), stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL), sock, binary)
        for d, sock, _ in daemons.values():
            while not os.path.exists(sock):
                if d.poll() is not None:
                    raise SystemExit("a strapd did not start")
                time.sleep(0.05)
        gb = SIZE / 1e9
        res: dict[str, dict[str, list[float]]] = {n: {"plain": [], "upload": []} for n, _, _ in variants}
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for kind in (["plain", "upload"] if r % 2 == 0 else ["upload", "plain"]):
                for name, _, _ in order:
                    d, sock, binary = daemons[name]
                    out = f"{work}/cap-{name}-{kind}-{r}.strap"
                    cmd = [ingest, "-socket", sock, "-out", out, "-codec", "none", "-bytes", str(SIZE)]
                    if kind == "upload":
                        cmd += ["-upload", f"s3://bench/{name}"]
                    c0 = daemon_cpu(d.pid)
                    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                    if kind == "upload":
                        obj = f"s3://bench/{name}/{os.path.basename(out)}"
                        while not upload_done(binary, sock, obj):
                            time.sleep(0.1)
                    res[name][kind].append((daemon_cpu(d.pid) - c0) / gb)
                    os.unlink(out)
        for name, v in res.items():
            extra = [u - p for u, p in zip(v["upload"], v["plain"])]
            print(f"{name:10s} plain {statistics.median(v['plain']):.2f} upload {statistics.median(v['upload']):.2f} "
                  "CPU-s/GB; on top per round " + " ".join(f"{x:+.2f}" for x in extra) +
                  f"; median {statistics.median(extra):+.3f}, median(upload)-median(plain) "
                  f"{statistics.median(v['upload']) - statistics.median(v['plain']):+.3f}")
        print("load", os.getloadavg())
    finally:
        for d, _, _ in daemons.values():
            d.terminate()
            d.wait()
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
