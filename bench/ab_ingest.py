"""Interleaved A/B of strapd ingest between two builds (Go producer, 512 MiB to tmpfs, codecs none
and shuffle): reads /tmp/ab/{old,new}-{strapd,ingest}; see docs/PERFORMANCE.md for how they are built."""
import json, os, subprocess, sys, time, statistics
R = int(sys.argv[1]) if len(sys.argv) > 1 else 5
TCK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK
def run(side, codec):
    sock = f"/tmp/ab/{side}.sock"
    if os.path.exists(sock): os.unlink(sock)
    d = subprocess.Popen([f"/tmp/ab/{side}-strapd", "serve", "--socket", sock, "--memory-limit", "1GiB", "--no-probes"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(sock): break
        time.sleep(0.05)
    out = f"/dev/shm/ab-{side}.strap"
    c0 = cpu(d.pid); t0 = time.monotonic()
    r = subprocess.run([f"/tmp/ab/{side}-ingest", "-socket", sock, "-out", out, "-codec", codec, "-bytes", "512MiB"],
                       capture_output=True, text=True)
    t = time.monotonic() - t0; c = cpu(d.pid) - c0
    d.terminate(); d.wait()
    os.unlink(out)
    if r.returncode: raise SystemExit(r.stderr)
    return 512 * 2**20 / t / 1e9, c / (512 * 2**20 / 1e9)
res = {}
for i in range(R):
    for codec in ("none", "shuffle"):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for side in order:
            res.setdefault((side, codec), []).append(run(side, codec))
for codec in ("none", "shuffle"):
    for side in ("old", "new"):
        g = [x[0] for x in res[(side, codec)]]; c = [x[1] for x in res[(side, codec)]]
        print(f"{codec:8s} {side}: GB/s median {statistics.median(g):.3f} [{min(g):.3f}-{max(g):.3f}]  daemon CPU-s/GB median {statistics.median(c):.2f} [{min(c):.2f}-{max(c):.2f}]")
