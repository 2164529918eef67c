"""Before/after of `strapd upload` of one file (a capture: bench/ingest), interleaved: a base
binary, this checkout's bin/strapd, and bin/strapd with STRAP_UPLOAD_CRC=readback (the parts'
CRC32C read back, not taken from the packets); each in its own process against one VersityGW,
the file in the page cache; CPU from wait4 (docs/PERFORMANCE.md "Upload to object storage").

Usage::

    .venv/bin/python bench/upload_file_ab.py ROUNDS FILE [BASE_STRAPD]   # default base /tmp/base-s3/bin/strapd
"""
import os, subprocess, sys, time, statistics, socket, tempfile
ACCESS, SECRET = "benchaccess", "benchsecret1234"
work = tempfile.mkdtemp(dir="/var/tmp", prefix="s3p-upab-")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
ep = f"http://127.0.0.1:{port}"
os.mkdir(f"{work}/s3")
gw = subprocess.Popen([os.environ.get("STRAP_VERSITYGW", os.path.expanduser("~/.cache/strap-llm/versitygw-1.8.0/versitygw")), "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "--quiet", "posix", f"{work}/s3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
try:
    time.sleep(1)
    import boto3
    boto3.client("s3", endpoint_url=ep, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket="bench")
    path = sys.argv[2]; mib = os.path.getsize(path) >> 20
    with open(path, "rb") as f:
        while f.read(8 << 20): pass
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bin", "strapd")
    base = sys.argv[3] if len(sys.argv) > 3 else "/tmp/base-s3/bin/strapd"
    variants = [("base", base, {}), ("new", here, {}), ("new-readback", here, {"STRAP_UPLOAD_CRC": "readback"})]
    res = {v[0]: [] for v in variants}
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for name, b, extra in order:
            t = time.perf_counter()
            p = subprocess.Popen([b, "upload", "--json", "--s3-endpoint", ep, path, f"s3://bench/{name}{r}"], env=dict(env, **extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            _, st, ru = os.wait4(p.pid, 0)
            assert os.waitstatus_to_exitcode(st) == 0, p.stderr.read()
            gb = (mib << 20) / 1e9
            res[name].append(((ru.ru_utime + ru.ru_stime) / gb, ru.ru_utime / gb, ru.ru_stime / gb, (mib << 20) / (time.perf_counter() - t) / 1e6))
    for k, v in res.items():
        print(f"{k:10s} CPU-s/GB " + " ".join(f"{x[0]:.2f}" for x in v) + f"  median {statistics.median(x[0] for x in v):.3f} (user {statistics.median(x[1] for x in v):.2f}, sys {statistics.median(x[2] for x in v):.2f}); MB/s median {statistics.median(x[3] for x in v):.0f}")
    print("load", os.getloadavg())
finally:
    gw.kill(); gw.wait(); subprocess.run(["rm", "-rf", work])
