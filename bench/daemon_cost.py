"""strapd's cost per record and wake-ups per token over whole decode captures (issue 38).

Greedy decoding of the decode benchmark's random Llama (hidden 512 x 8 layers, built from a
config, no download) with the real Python client, which autostarts the real strapd on a
private socket (``STRAPD_BIN``, ``STRAPD_SOCKET``: the path a new user takes, default
settings), capturing resid+attn+mlp (24 records of 2 KiB fp32 per token) with per-token
tracking. For each preset it runs one warm-up capture, then ``--trials`` captures, and reads
strapd's counters from /proc around each whole capture (OPEN to CLOSED included):

- strapd CPU: utime+stime of every thread (``/proc/PID/task/*/schedstat``, ns; the 10 ms
  ticks of ``/proc/PID/stat`` are printed beside it), per record and per token;
- strapd wake-ups: voluntary + involuntary context switches of every thread
  (``/proc/PID/task/*/status``), per token;
- the client's own CPU per record: this process's CPU over the captured decode minus over
  a plain decode of the same tokens (alternating, so both see the same machine), divided by
  the records.

Usage::

    make bin/strapd
    .venv/bin/python bench/daemon_cost.py --strapd bin/strapd [--trials 3] [--new 128] \\
        [--presets balanced,fast_capture] [--threads 1] [--idle S] [--json OUT] \\
        [--strapd-arg=--narrow-procs=false]

Prints one line per preset and, with ``--json``, every trial. Each preset gets its own
freshly started strapd (killed at the end), so its counters belong to that preset alone.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
#: --client SRC: the Python client to measure (a tree's clients/python/src; default this one's)
_CLIENT = sys.argv[sys.argv.index("--client") + 1] if "--client" in sys.argv[:-1] else str(ROOT / "clients" / "python" / "src")
sys.path.insert(0, _CLIENT)
sys.path.insert(0, str(ROOT / "clients" / "python" / "benchmarks"))

import torch  # noqa: E402

from _bench_model import CAPTURE_SETS, build_model  # noqa: E402

from llm_instrumentation import InstrumentationConfig, capture_activations  # noqa: E402

#: The decode benchmark's model (decode_ab.py's DECODE_MODEL).
MODEL: Dict[str, int] = {"hidden": 512, "layers": 8, "intermediate": 1408, "vocab": 32000, "heads": 8}



#: The environment each capture sets for the client and puts back after.
STRAPD_ENV = ("STRAPD_BIN", "STRAPD_SOCKET", "STRAPD_EXIT_IDLE")


def end_capture(pid: int, env_keep: Dict[str, Optional[str]], tmp: Path) -> None:
    """After a capture: stops its autostarted strapd (``pid``, 0 if it never started), puts the
    environment back and removes the capture's directory."""
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    restore_env(env_keep)
    shutil.rmtree(tmp, ignore_errors=True)


def restore_env(keep: Dict[str, Optional[str]]) -> None:
    """Puts back the variables saved in ``keep`` (None: it was unset)."""
    for k, v in keep.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def daemon_counters(pid: int) -> Dict[str, int]:
    """CPU ns (schedstat), clock ticks (stat) and context switches of every thread of ``pid``."""
    out = {"cpu_ns": 0, "voluntary": 0, "nonvoluntary": 0, "threads": 0}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(task + "/schedstat") as f:
                out["cpu_ns"] += int(f.read().split()[0])
            with open(task + "/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out["voluntary"] += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        out["nonvoluntary"] += int(line.split()[1])
            out["threads"] += 1
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            pass  # a thread that ended meanwhile: its counts are lost with it (rare: Go keeps its Ms)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    out["ticks"] = int(fields[11]) + int(fields[12])
    out["minflt"] = int(fields[7])
    return out


def thread_switches(pid: int) -> Dict[int, int]:
    """Context switches of each thread of ``pid``, by thread id."""
    out: Dict[int, int] = {}
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                out[int(path.split("/")[4])] = sum(
                    int(line.split()[1]) for line in f
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def strapd_bin(a: argparse.Namespace, tmp: Path) -> str:
    """The strapd the client autostarts: ``--strapd``, or with ``--strapd-arg`` flags a
    two-line script in ``tmp`` that execs it with them added (the client starts ``STRAPD_BIN
    serve ...``), so one binary can be measured with and without a flag."""
    real = str(Path(a.strapd).resolve())
    if not a.strapd_arg:
        return real
    wrapper = tmp / "strapd-with-args"
    args = " ".join(shlex.quote(x) for x in a.strapd_arg)
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@" {args}\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def peer_pid(sock_path: str) -> int:
    """The pid of the process listening on ``sock_path`` (SO_PEERCRED)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(sock_path)
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid
    finally:
        s.close()


def greedy(model: Any, prompt: torch.Tensor, n: int, fw: Any = None) -> int:
    """Greedy decoding with the KV cache, ``n`` new tokens; records each when ``fw`` is given."""
    out = model(input_ids=prompt, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(n):
        tid = int(nxt)
        if fw is not None:
            fw.record_token(tid, str(tid))
        kw = {"cache": out["cache"]} if "cache" in out else {"past_key_values": out.past_key_values}
        out = model(input_ids=nxt, use_cache=True, **kw)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return n


def run_preset(a: argparse.Namespace, preset: str, model: Any, prompt: torch.Tensor) -> Dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="strap-dcost-", dir=a.tmpdir))
    sock = str(tmp / "run" / "strapd.sock")
    env_keep = {k: os.environ.get(k) for k in STRAPD_ENV}
    os.environ["STRAPD_BIN"] = strapd_bin(a, tmp)
    os.environ["STRAPD_SOCKET"] = sock
    os.environ["STRAPD_EXIT_IDLE"] = "10m"
    pid = 0
    perf = None
    cfg = InstrumentationConfig.from_preset(preset).with_granularity(CAPTURE_SETS["resid+attn+mlp"])
    trials: List[Dict[str, Any]] = []
    try:
        for trial in range(a.trials + 1):  # the first starts strapd and warms everything up
            path = str(tmp / f"t{trial}.strap")
            # plain decode beside it: the client's own CPU without capture
            p0 = time.process_time()
            with torch.no_grad():
                greedy(model, prompt, a.new)
            plain_cpu = time.process_time() - p0
            if pid and a.perf and perf is None:
                freq = ["-F", str(a.perf_freq)] if a.perf_freq else []
                perf = subprocess.Popen(["perf", "record", "-q", "-g", "-e", a.perf_event, *freq, "-p", str(pid),
                                         "-o", f"{a.perf}.{preset}"], stdout=subprocess.DEVNULL)
                time.sleep(0.5)  # perf attaches
            if pid:
                d0 = daemon_counters(pid)
                t0 = thread_switches(pid)
            c0, w0 = time.process_time(), time.perf_counter()
            with torch.no_grad():
                with capture_activations(model, config=cfg, output_path=path, track_per_token=True) as fw:
                    if not pid:
                        pid = peer_pid(sock)
                        d0 = daemon_counters(pid)
                        t0 = thread_switches(pid)
                        c0, w0 = time.process_time(), time.perf_counter()
                    greedy(model, prompt, a.new, fw)
            cap_cpu, cap_wall = time.process_time() - c0, time.perf_counter() - w0
            d1 = daemon_counters(pid)
            t1 = thread_switches(pid)
            # 24 records per forward pass: the prompt's pass and one per generated token
            records = (a.new + 1) * 24
            packets = fw.stats["packets"]  # the client's count of tensor records written
            if packets != records:
                raise SystemExit(f"expected {records} records, the client wrote {packets}")
            if os.path.exists(path):
                os.remove(path)
            if trial == 0:
                continue
            cpu_ns = d1["cpu_ns"] - d0["cpu_ns"]
            sw = (d1["voluntary"] - d0["voluntary"]) + (d1["nonvoluntary"] - d0["nonvoluntary"])
            trials.append({
                "records": records, "tokens": a.new,
                "strapd_cpu_s": cpu_ns / 1e9,
                "strapd_cpu_s_ticks": (d1["ticks"] - d0["ticks"]) / os.sysconf("SC_CLK_TCK"),
                "strapd_cpu_us_per_record": cpu_ns / 1e3 / records,
                "strapd_cpu_us_per_token": cpu_ns / 1e3 / a.new,
                "strapd_switches_per_token": sw / a.new,
                # page faults: the ring's pages in strapd's mapping, staging buffers, heap
                "strapd_minflt_per_token": (d1["minflt"] - d0["minflt"]) / a.new,
                "strapd_voluntary_per_token": (d1["voluntary"] - d0["voluntary"]) / a.new,
                "strapd_nonvoluntary_per_token": (d1["nonvoluntary"] - d0["nonvoluntary"]) / a.new,
                "strapd_threads": d1["threads"],
                "client_us_per_record": 1e6 * (cap_cpu - plain_cpu) / records,
                "client_cpu_s": cap_cpu, "plain_cpu_s": plain_cpu, "capture_wall_s": cap_wall,
                # each strapd thread's switches per token, busiest first (tid order = creation
                # order: the Go runtime's sysmon is the second thread)
                "per_thread_switches_per_token": {str(t): round((n - t0.get(t, 0)) / a.new, 2) for t, n in
                                                  sorted(t1.items(), key=lambda kv: t0.get(kv[0], 0) - kv[1])
                                                  if n - t0.get(t, 0)},
            })
    finally:
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
            except ProcessLookupError:
                pass
        restore_env(env_keep)
        shutil.rmtree(tmp, ignore_errors=True)
    keys = [k for k in trials[0] if isinstance(trials[0][k], float)]
    med = {k: statistics.median(t[k] for t in trials) for k in keys}
    return {"preset": preset, "median": med, "trials": trials}


def token_cost(a: argparse.Namespace, model: Any, n: int = 2000) -> Dict[str, float]:
    """The client's CPU per ``record_token`` call (thread time, warm loop, no forward pass
    between), tokens in the ring (the default where strapd offers it) and one TOKEN message
    each, alternating, three rounds: the median per way."""
    tmp = Path(tempfile.mkdtemp(prefix="strap-tcost-", dir=a.tmpdir))
    sock = str(tmp / "run" / "strapd.sock")
    env_keep = {k: os.environ.get(k) for k in STRAPD_ENV}
    os.environ.update(STRAPD_BIN=strapd_bin(a, tmp), STRAPD_SOCKET=sock, STRAPD_EXIT_IDLE="10m")
    cfg = InstrumentationConfig.from_preset("fast_capture").with_granularity(CAPTURE_SETS["resid+attn+mlp"])
    got: Dict[str, List[float]] = {"ring": [], "message": []}
    pid = 0
    try:
        for rnd in range(4):  # the first warms up
            for way in ("ring", "message"):
                with capture_activations(model, config=cfg, output_path=str(tmp / "t.strap"), track_per_token=True) as fw:
                    pid = pid or peer_pid(sock)
                    s = fw._session
                    if way == "message" or not getattr(s, "_ring_tokens", False):
                        if way == "ring":
                            got.pop("ring", None)  # this client or strapd has no ring tokens
                            continue
                        if hasattr(s, "_ring_tokens"):
                            s._ring_tokens = False
                    t0 = time.thread_time_ns()
                    for i in range(n):
                        fw.record_token(i, str(i))
                    dt = time.thread_time_ns() - t0
                if rnd and way in got:
                    got[way].append(dt / 1e3 / n)
                os.remove(tmp / "t.strap")
    finally:
        end_capture(pid, env_keep, tmp)
    return {f"{way}_us_per_token": statistics.median(v) for way, v in got.items() if v}


def idle_cost(a: argparse.Namespace, model: Any, seconds: float) -> Dict[str, float]:
    """strapd's CPU and context switches per second beside an open capture that records
    nothing (``--idle S``): what strapd spends per unit of wall time whatever the records
    (tickers, probe snapshots, the runtime's sysmon). A slow decode pays it per token."""
    tmp = Path(tempfile.mkdtemp(prefix="strap-icost-", dir=a.tmpdir))
    sock = str(tmp / "run" / "strapd.sock")
    env_keep = {k: os.environ.get(k) for k in STRAPD_ENV}
    os.environ.update(STRAPD_BIN=strapd_bin(a, tmp), STRAPD_SOCKET=sock, STRAPD_EXIT_IDLE="10m")
    cfg = InstrumentationConfig.from_preset("fast_capture").with_granularity(CAPTURE_SETS["resid+attn+mlp"])
    pid = 0
    try:
        with capture_activations(model, config=cfg, output_path=str(tmp / "t.strap"), track_per_token=True):
            pid = peer_pid(sock)
            time.sleep(1.0)  # past OPEN's own work
            d0, w0 = daemon_counters(pid), time.perf_counter()
            time.sleep(seconds)
            d1, w1 = daemon_counters(pid), time.perf_counter()
    finally:
        end_capture(pid, env_keep, tmp)
    wall = w1 - w0
    sw = (d1["voluntary"] - d0["voluntary"]) + (d1["nonvoluntary"] - d0["nonvoluntary"])
    return {"idle_s": wall, "cpu_ms_per_s": (d1["cpu_ns"] - d0["cpu_ns"]) / 1e6 / wall, "switches_per_s": sw / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strapd", default=str(ROOT / "bin" / "strapd"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--new", type=int, default=128, help="generated tokens per capture")
    ap.add_argument("--presets", default="balanced,fast_capture")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--tmpdir", default="/var/tmp", help="where the streams go (a disk, as a user's would)")
    ap.add_argument("--strapd-arg", action="append", default=[],
                    help="an extra flag for strapd serve (repeatable), e.g. --strapd-arg=--narrow-procs=false")
    ap.add_argument("--client", default=_CLIENT, help="the Python client's source tree (an older tree's, for a before/after)")
    ap.add_argument("--token-cost", action="store_true",
                    help="also the client's CPU per record_token, ring tokens against TOKEN messages")
    ap.add_argument("--idle", type=float, metavar="S",
                    help="also strapd's CPU and switches per second beside a capture open S seconds with no records")
    ap.add_argument("--json", help="write every trial here")
    ap.add_argument("--perf", metavar="OUT", help="`perf record -g` strapd over the measured trials into OUT.<preset>")
    ap.add_argument("--perf-event", default="cpu-clock", help="perf's event (context-switches: where the switches are)")
    ap.add_argument("--perf-freq", type=int, default=0,
                    help="perf's sampling frequency in Hz (0: perf's default, 4000; a 128-token capture of "
                         "fast_capture is then ≈ 80 samples)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = build_model(**MODEL)
    prompt = torch.randint(0, MODEL["vocab"], (1, 32), generator=torch.Generator().manual_seed(1))
    import llm_instrumentation
    res: Dict[str, Any] = {"strapd": a.strapd, "client": os.path.dirname(llm_instrumentation.__file__), "cpu": _cpu_model(), "torch_threads": torch.get_num_threads(),
                           "load_before": os.getloadavg(), "results": []}
    for preset in filter(None, a.presets.split(",")):  # --presets "": only --idle / --token-cost
        r = run_preset(a, preset, model, prompt)
        res["results"].append(r)
        m = r["median"]
        print(f"{preset:13s} records {r['trials'][0]['records']} tokens {a.new} | strapd CPU "
              f"{m['strapd_cpu_s']:.4f} s ({m['strapd_cpu_s_ticks']:.2f} by ticks) = "
              f"{m['strapd_cpu_us_per_record']:.2f} us/record, {m['strapd_cpu_us_per_token']:.1f} us/token | "
              f"switches/token {m['strapd_switches_per_token']:.2f} (vol {m['strapd_voluntary_per_token']:.2f}) | "
              f"faults/token {m['strapd_minflt_per_token']:.2f} | client {m['client_us_per_record']:.1f} us/record | median of {a.trials}", flush=True)
    if a.token_cost:
        res["token_cost"] = token_cost(a, model)
        print("client CPU per record_token (warm loop): " +
              ", ".join(f"{k} {v:.1f} us" for k, v in res["token_cost"].items()), flush=True)
    if a.idle:
        res["idle_cost"] = idle_cost(a, model, a.idle)
        ic = res["idle_cost"]
        print(f"idle capture {ic['idle_s']:.1f} s: strapd CPU {ic['cpu_ms_per_s']:.2f} ms/s, "
              f"{ic['switches_per_s']:.1f} switches/s", flush=True)
    res["load_after"] = os.getloadavg()
    print(f"cpu: {res['cpu']}, torch threads {res['torch_threads']}, load {res['load_before'][0]:.2f} -> "
          f"{res['load_after'][0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" x{os.cpu_count()}"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
