"""`make bench-upload`: strapd's upload of a capture to a real S3 server
(VersityGW, posix backend on this disk) against boto3's ``upload_file`` of the same file to
the same server, and strapd's CPU for it per GB (docs/PERFORMANCE-DATA.md "Upload").

Each round runs both, alternating which goes first, each in its own process so that its
CPU time (user + system, from ``wait4``) is its own; the file is read once before the
rounds so both read it from the page cache. The median round is reported.

Usage::

    .venv/bin/python bench/upload.py --strapd bin/strapd --versitygw PATH [--mib 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
ACCESS, SECRET = "benchaccess", "benchsecret1234"
BOTO_SCRIPT = r"""
import sys, time, boto3
from boto3.s3.transfer import TransferConfig
path, endpoint, key = sys.argv[1:4]
c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
t = time.perf_counter()
c.upload_file(path, "bench", key, Config=TransferConfig())
print(time.perf_counter() - t)
"""


def run_timed(cmd: List[str], env: Dict[str, str]) -> Dict[str, float]:
    """Run cmd; its wall time and its own CPU seconds (user + system)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    out, err = p.stdout.read(), p.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed: {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
            "stdout": out}  # type: ignore[dict-item]


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def make_capture(a: argparse.Namespace, work: Path, path: Path, size: int, env: Dict[str, str]) -> None:
    """A real capture of about size bytes (bench/ingest: Go producer, codec none,
    activation-like float32 tensors) at path, through a strapd serve of its own: what `strapd upload` is for (its
    parts' CRC32C then come from the packets' stored CRCs, not from reading them back)."""
    ingest = work / "ingest"
    subprocess.run([a.go, "build", "-o", str(ingest), "./bench/ingest"], cwd=ROOT, check=True)
    sock = work / "mk.sock"
    d = subprocess.Popen([a.strapd, "serve", "--socket", str(sock), "--no-probes"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        subprocess.run([str(ingest), "-socket", str(sock), "-out", str(path), "-codec", "none", "-bytes", f"{size}"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        d.terminate()
        d.wait()


def capture_ab(a: argparse.Namespace, work: Path, endpoint: str, env: Dict[str, str], size: int) -> Dict[str, Any]:
    """strapd's CPU for a capture of size bytes (Go producer, codec none) without and with
    --upload to the same server, the upload waited for: the upload's cost on top of the
    capture (its parts, and the writer's fdatasync every part)."""
    ingest = work / "ingest"
    subprocess.run([a.go, "build", "-o", str(ingest), "./bench/ingest"], cwd=ROOT, check=True)
    sock = work / "s.sock"
    serve = [a.strapd, "serve", "--socket", str(sock), "--no-probes", "--s3-endpoint", endpoint,
             "--upload-state-dir", str(work / "state")]
    d = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.05)
        rounds = []
        for r in range(a.rounds):
            res: Dict[str, Any] = {}
            for name in (["plain", "upload"] if r % 2 == 0 else ["upload", "plain"]):
                out = work / f"cap-{name}-{r}.strap"  # a new object each round
                cmd = [str(ingest), "-socket", str(sock), "-out", str(out), "-codec", "none", "-bytes", f"{size}"]
                if name == "upload":
                    cmd += ["-upload", "s3://bench/capture"]
                c0, t0 = proc_cpu(d.pid), time.perf_counter()
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                if name == "upload":
                    obj = f"s3://bench/capture/{out.name}"
                    while not any(u["object"] == obj and u["state"] == "complete" for u in json.loads(
                            subprocess.run([a.strapd, "status", "--json", "--socket", str(sock)], capture_output=True,
                                           text=True, check=True).stdout).get("uploads") or []):
                        time.sleep(0.1)
                res[name] = {"cpu_s": proc_cpu(d.pid) - c0, "wall_s": time.perf_counter() - t0,
                             "file_bytes": out.stat().st_size}
                out.unlink()
            gb = size / 1e9
            res["plain_cpu_s_per_gb"] = res["plain"]["cpu_s"] / gb
            res["upload_cpu_s_per_gb"] = res["upload"]["cpu_s"] / gb
            res["extra_cpu_s_per_gb"] = res["upload_cpu_s_per_gb"] - res["plain_cpu_s_per_gb"]
            rounds.append(res)
            print(f"capture round {r + 1}: strapd {res['plain_cpu_s_per_gb']:.2f} CPU-s/GB without upload, "
                  f"{res['upload_cpu_s_per_gb']:.2f} with (+{res['extra_cpu_s_per_gb']:.2f})", flush=True)
        return {"serve_command": shlex.join(serve).replace(str(work), "$TMP").replace(endpoint, "http://127.0.0.1:$PORT"),
                "ingest_command": f"go run ./bench/ingest -socket $TMP/s.sock -out $TMP/cap.strap -codec none -bytes {size} "
                                  "[-upload s3://bench/capture]",
                "bytes": size, "rounds": rounds,
                "extra_cpu_s_per_gb_median": statistics.median(x["extra_cpu_s_per_gb"] for x in rounds)}
    finally:
        d.terminate()
        d.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strapd", default=str(ROOT / "bin" / "strapd"))
    ap.add_argument("--versitygw", default=os.environ.get("STRAP_VERSITYGW", ""))
    ap.add_argument("--mib", type=int, default=512, help="file size in MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "upload.json"))
    ap.add_argument("--go", default="go", help="builds bench/ingest for the capture A/B")
    a = ap.parse_args()
    import boto3  # noqa: F401  (fail early when missing: make venv installs it)

    work = Path(tempfile.mkdtemp(prefix="strap-bench-upload-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    data_dir = work / "s3"
    data_dir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    gw = subprocess.Popen([a.versitygw, "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}",
                           "--quiet", "posix", str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        import boto3 as b3

        b3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                  region_name="us-east-1").create_bucket(Bucket="bench")
        path = work / "capture.strap"
        size = a.mib << 20
        make_capture(a, work, path, size, env)
        fsize = path.stat().st_size  # the capture's file: size raw bytes, its headers and index
        with open(path, "rb") as f:  # into the page cache for both
            while f.read(8 << 20):
                pass
        strapd_cmd = [a.strapd, "upload", "--json", "--s3-endpoint", endpoint, str(path), "s3://bench/strapd"]
        boto_cmd = [sys.executable, "-c", BOTO_SCRIPT, str(path), endpoint, "boto3/capture.strap"]
        rounds: List[Dict[str, Any]] = []
        for r in range(a.rounds):
            order = [("strapd", strapd_cmd), ("boto3", boto_cmd)]
            if r % 2:
                order.reverse()
            res: Dict[str, Any] = {}
            for name, cmd in order:
                m = run_timed(cmd, env)
                res[name] = {"wall_s": m["wall_s"], "cpu_s": m["cpu_s"], "user_s": m["user_s"], "sys_s": m["sys_s"],
                             "mb_s": fsize / m["wall_s"] / 1e6}
            res["ratio"] = res["strapd"]["mb_s"] / res["boto3"]["mb_s"]
            res["strapd_cpu_s_per_gb"] = res["strapd"]["cpu_s"] / (fsize / 1e9)
            res["boto3_cpu_s_per_gb"] = res["boto3"]["cpu_s"] / (fsize / 1e9)
            rounds.append(res)
            gb = fsize / 1e9
            print(f"round {r + 1}: strapd {res['strapd']['mb_s']:.0f} MB/s ({res['strapd_cpu_s_per_gb']:.2f} CPU-s/GB: "
                  f"user {res['strapd']['user_s'] / gb:.2f}, system {res['strapd']['sys_s'] / gb:.2f}), "
                  f"boto3 {res['boto3']['mb_s']:.0f} MB/s ({res['boto3_cpu_s_per_gb']:.2f} CPU-s/GB), "
                  f"ratio {res['ratio']:.2f}", flush=True)
        capture = capture_ab(a, work, endpoint, env, size)
        med = sorted(rounds, key=lambda x: x["ratio"])[len(rounds) // 2]
        summary = {
            "command": shlex.join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
            # The temporary directory and port of this run, as the other sections write them.
            "strapd_command": shlex.join(strapd_cmd).replace(str(work), "$TMP").replace(endpoint, "http://127.0.0.1:$PORT"), "boto3": "boto3.client('s3').upload_file(path, bucket, key) "
            "with TransferConfig() defaults (8 MiB parts, 10 threads)",
            "bytes": fsize, "file": "capture", "rounds": rounds, "median_round": med,
            "ratio_median": statistics.median(r["ratio"] for r in rounds),
            "strapd_cpu_s_per_gb_median": statistics.median(r["strapd_cpu_s_per_gb"] for r in rounds),
            "capture": capture,
            # The A/B switches of the daemon's upload path (docs/OBJECT_STORAGE.md), when set:
            # STRAP_UPLOAD_SENDFILE=0 STRAP_UPLOAD_CRC=readback is the path before sendfile
            # and the writer's CRC record.
            "upload_env": {k: os.environ[k] for k in ("STRAP_UPLOAD_SENDFILE", "STRAP_UPLOAD_CRC") if k in os.environ},
            "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"median ratio strapd/boto3 {summary['ratio_median']:.2f} (target >= 0.9); strapd "
              f"{summary['strapd_cpu_s_per_gb_median']:.3f} CPU-s/GB alone, +{capture['extra_cpu_s_per_gb_median']:.3f} "
              f"CPU-s/GB on top of a capture (target <= 0.1); load {os.getloadavg()[0]:.1f}; "
              f"written {a.out}")
    finally:
        gw.kill()
        gw.wait()
        subprocess.run(["rm", "-rf", str(work)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
