"""Interleaved A/B of strapd ingest between two builds, Go producer (bench/ingest).

Reads BIN/{old,new}-{strapd,ingest} (BIN is --bin, default /tmp/ab; docs/PERFORMANCE.md says
how they are built). Each trial starts the side's daemon, pushes --bytes of float32 with the
side's producer to a file in --dir (default /dev/shm: tmpfs, the disk taken out; a directory
on a block device measures the disk path), and reports GB/s (the producer's clock, from
connecting until the stream is closed and fdatasynced) and the daemon's CPU seconds per GB. With --dd,
`dd if=/dev/zero of=DIR/ab-dd bs=4M count=N oflag=direct conv=fdatasync` (the same bytes, the
same directory, durable at the end like the stream: the device's own pace for large direct
writes) runs before the first trial and after every trial, so each trial sits between two dd
runs; its ratio to dd is its GB/s over the geometric mean of those two, and the figure is the
median of these per-trial ratios. A virtio disk's pace swings by 2x between seconds (its
host's cache), so a ratio of medians taken minutes apart says little; neighbours share the
swing.

    python3 bench/ab_ingest.py 5                              # tmpfs, codecs none and shuffle
    python3 bench/ab_ingest.py 5 --dir /var/tmp --codecs none --bytes 1GiB --dd
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time

TCK = os.sysconf("SC_CLK_TCK")
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size(s):
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"size {s!r}: want N, NKiB, NMiB or NGiB")
    return int(m.group(1)) * UNITS.get(m.group(2), 1)


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK


def run(a, side, codec):
    sock = f"{a.bin}/{side}.sock"
    if os.path.exists(sock):
        os.unlink(sock)
    d = subprocess.Popen([f"{a.bin}/{side}-strapd", "serve", "--socket", sock, "--memory-limit", "1GiB", "--no-probes"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        out = os.path.join(a.dir, f"ab-{side}.strap")
        c0 = cpu(d.pid)
        t0 = time.monotonic()
        r = subprocess.run([f"{a.bin}/{side}-ingest", "-socket", sock, "-out", out, "-codec", codec,
                            "-bytes", str(a.bytes)], capture_output=True, text=True)
        t = time.monotonic() - t0
        c = cpu(d.pid) - c0
    finally:
        d.terminate()
        d.wait()
    os.unlink(out)
    if r.returncode:
        raise SystemExit(f"{side} {codec}: {r.stderr}")
    # The producer's own clock, from connecting to the stream closed and fdatasynced:
    # without its start-up (generating the tensors takes a good part of a second).
    t = json.loads(r.stdout).get("seconds", t)
    return a.bytes / t / 1e9, c / (a.bytes / 1e9)


def dd(a):
    out = os.path.join(a.dir, "ab-dd")
    n = max(1, a.bytes // (4 << 20))
    t0 = time.monotonic()
    r = subprocess.run(["dd", "if=/dev/zero", f"of={out}", "bs=4M", f"count={n}", "oflag=direct", "conv=fdatasync"],
                       capture_output=True, text=True)
    t = time.monotonic() - t0
    os.unlink(out)
    if r.returncode:
        raise SystemExit(f"dd: {r.stderr}")
    return n * (4 << 20) / t / 1e9, float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rounds", type=int, nargs="?", default=5)
    p.add_argument("--bin", default="/tmp/ab", help="directory of {old,new}-{strapd,ingest}")
    p.add_argument("--dir", default="/dev/shm", help="where the streams are written")
    p.add_argument("--codecs", default="none,shuffle", help="comma-separated codecs")
    p.add_argument("--bytes", type=size, default=512 << 20, help="raw bytes per trial (512MiB)")
    p.add_argument("--dd", action="store_true", help="also time dd oflag=direct on --dir each round")
    a = p.parse_args()
    codecs = a.codecs.split(",")
    res = {}
    ratios = {}
    last_dd = dd(a) if a.dd else None
    if a.dd:
        res.setdefault(("dd", "-"), []).append(last_dd)
    for i in range(a.rounds):
        for codec in codecs:
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for side in order:
                r = run(a, side, codec)
                res.setdefault((side, codec), []).append(r)
                if a.dd:
                    after = dd(a)
                    res[("dd", "-")].append(after)
                    ratios.setdefault((side, codec), []).append(r[0] / (last_dd[0] * after[0]) ** 0.5)
                    last_dd = after
    print(f"{a.rounds} rounds, {a.bytes >> 20} MiB per trial to {a.dir}, load average {os.getloadavg()}")
    keys = [(s, c) for c in codecs for s in ("old", "new")] + ([("dd", "-")] if a.dd else [])
    for side, codec in keys:
        g = [x[0] for x in res[(side, codec)]]
        c = [x[1] for x in res[(side, codec)]]
        line = f"{codec:8s} {side}: GB/s median {statistics.median(g):.3f} [{min(g):.3f}-{max(g):.3f}]"
        if side != "dd":
            line += f"  daemon CPU-s/GB median {statistics.median(c):.2f} [{min(c):.2f}-{max(c):.2f}]"
            if a.dd:
                q = ratios[(side, codec)]
                line += f"  x dd (per trial, neighbours) median {statistics.median(q):.2f} [{min(q):.2f}-{max(q):.2f}]"
        print(line)

if __name__ == "__main__":
    main()
