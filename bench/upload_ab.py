"""Before/after of strapd's CPU for an upload on top of a capture, interleaved: one `strapd
serve` per variant (a binary, and environment switches) against one VersityGW; each round
captures 512 MiB (bench/ingest: Go producer, codec none) on every daemon without and with
--upload, in rotating order, each daemon's CPU read from /proc (docs/PERFORMANCE.md
"Upload to object storage").

Usage::

    go build -o /tmp/ingest ./bench/ingest
    .venv/bin/python bench/upload_ab.py ROUNDS NAME=BINARY[:ENV=VAL,...] ...
    # e.g. bench/upload_ab.py 6 base=/tmp/base/bin/strapd new=bin/strapd

$STRAP_INGEST names the ingest binary (default /tmp/ingest); $STRAP_VERSITYGW the server.
"""
import json, os, subprocess, sys, time, statistics, socket, tempfile
ACCESS, SECRET = "benchaccess", "benchsecret1234"
variants = []
for a in sys.argv[2:]:
    name, rest = a.split("=", 1); b, _, envs = rest.partition(":")
    variants.append((name, b, dict(e.split("=", 1) for e in envs.split(",") if e)))
rounds = int(sys.argv[1])
work = tempfile.mkdtemp(dir="/var/tmp", prefix="s3p-capab-")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
ep = f"http://127.0.0.1:{port}"
os.mkdir(f"{work}/s3")
gw = subprocess.Popen([os.environ.get("STRAP_VERSITYGW", os.path.expanduser("~/.cache/strap-llm/versitygw-1.8.0/versitygw")), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "--quiet", "posix", f"{work}/s3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
ds = {}
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split(); return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
try:
    time.sleep(1)
    import boto3
    boto3.client("s3", endpoint_url=ep, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket="bench")
    for name, b, extra in variants:
        sock = f"{work}/{name}.sock"
        ds[name] = (subprocess.Popen([b, "serve", "--socket", sock, "--no-probes", "--s3-endpoint", ep, "--upload-state-dir", f"{work}/state-{name}"], env=dict(env, **extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), sock, b)
    time.sleep(1.5)
    size = 512 << 20; gb = size / 1e9
    res = {n: {"plain": [], "upload": []} for n, _, _ in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for kind in (["plain", "upload"] if r % 2 == 0 else ["upload", "plain"]):
            for name, _, _ in order:
                d, sock, b = ds[name]
                out = f"{work}/cap-{name}-{kind}-{r}.strap"
                cmd = [os.environ.get("STRAP_INGEST", "/tmp/ingest"), "-socket", sock, "-out", out, "-codec", "none", "-bytes", str(size)]
                if kind == "upload": cmd += ["-upload", f"s3://bench/{name}"]
                c0 = cpu(d.pid)
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                if kind == "upload":
                    obj = f"s3://bench/{name}/{os.path.basename(out)}"
                    while not any(u["object"] == obj and u["state"] == "complete" for u in json.loads(subprocess.run([b, "status", "--json", "--socket", sock], capture_output=True, text=True, check=True).stdout).get("uploads") or []):
                        time.sleep(0.1)
                res[name][kind].append((cpu(d.pid) - c0) / gb)
                os.unlink(out)
    for name, v in res.items():
        extra = [u - p for u, p in zip(v["upload"], v["plain"])]
        print(f"{name:10s} plain {statistics.median(v['plain']):.2f} upload {statistics.median(v['upload']):.2f} CPU-s/GB; on top per round " + " ".join(f"{x:+.2f}" for x in extra) + f"; median {statistics.median(extra):+.3f}, median(upload)-median(plain) {statistics.median(v['upload'])-statistics.median(v['plain']):+.3f}")
    print("load", os.getloadavg())
finally:
    for d, _, _ in ds.values(): d.terminate(); d.wait()
    gw.kill(); gw.wait(); subprocess.run(["rm", "-rf", work])
