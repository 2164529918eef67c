"""``llm-prof``: llm-instrumentation 1.3.1's profiler command line, run on strapd's probes.

``llm-prof run`` starts ``strapd trace --output -`` as a child process, reads its JSONL
snapshots (docs/TRACE_FORMAT.md) and writes them as 1.3.1's events: one line per
collector item (``type`` = ``disk``, ``syscall``, ``sync_wait``, ``mem``, ``sched``,
``net``) with 1.3.1's field names. The mapping, and the fields strapd cannot fill, are in
docs/TRACE_FORMAT.md ("llm-prof"). ``llm-prof top`` execs ``strapd top``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .._daemon import find_strapd_binary

LOG = logging.getLogger("llm_prof")

#: 1.3.1's collector names for ``--only``.
COLLECTORS = ("disk", "syscalls", "sync", "mem", "sched", "net")

# The event type each --only name produces (1.3.1's collector NAMEs).
_EVENT_TYPE = {
    "disk": "disk",
    "syscalls": "syscall",
    "sync": "sync_wait",
    "mem": "mem",
    "sched": "sched",
    "net": "net",
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse 1.3.1's ``llm-prof`` flags (same names, defaults and positional subcommand)."""
    parser = argparse.ArgumentParser(
        prog="llm-prof",
        description="Low-overhead runtime profiler for LLM inference pipelines, on strapd's eBPF probes.",
    )
    parser.add_argument("--pid", type=int, help="PID to watch.")
    parser.add_argument("--cgroup", type=str, help="cgroup v2 path (relative to /sys/fs/cgroup or absolute).")
    parser.add_argument("--comm", type=str, help="Watch the processes with this command name (resolved at start).")
    parser.add_argument("--interval", type=float, default=1.0, help="Aggregation interval seconds.")
    parser.add_argument("--output", type=Path, help="Append JSONL to this path (default: stdout).")
    parser.add_argument("--no-output", action="store_true", help="Disable file output; stream events to stdout.")
    parser.add_argument("--flush-every", type=int, default=5, help="Flush after this many events when writing to disk.")
    parser.add_argument("--fsync", action="store_true", help="fsync after each flush.")
    parser.add_argument(
        "--only",
        type=str,
        default="disk,syscalls,mem,sched",
        help="Comma separated collectors to report: disk,syscalls,sync,mem,sched,net.",
    )
    parser.add_argument(
        "--sample-read-write", type=int, default=1, help="Time one read/write syscall in N (1 = every one)."
    )
    parser.add_argument("--log", type=str, default="INFO", help="Log level (DEBUG, INFO, WARNING, ERROR).")
    parser.add_argument("--labels", type=str, help="Comma separated key=value pairs added to every event.")
    parser.add_argument(
        "--disable-correlation", action="store_true", help="Do not add the corr_id field to events."
    )
    parser.add_argument(
        "--spans", type=str, default=os.environ.get("STRAP_SPANS_FILE"),
        help="Correlation spans file (llm_instrumentation.correlate; default $STRAP_SPANS_FILE): "
        "corr_id is the request whose span overlaps each interval.",
    )
    parser.add_argument("command", nargs="*", help="Subcommand: run (default) or top.")
    return parser.parse_args(argv)


def parse_labels(raw: Optional[str]) -> Dict[str, str]:
    """``k=v,k2=v2`` → dict. An item without ``=`` is an error (1.3.1 dropped it silently)."""
    if not raw:
        return {}
    out: Dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--labels item {item!r}: expected key=value")
        key, value = item.split("=", 1)
        if not key.strip():
            raise ValueError(f"--labels item {item!r}: empty key")
        out[key.strip()] = value.strip()
    return out


def parse_only(raw: str) -> List[str]:
    """``--only`` → collector names in 1.3.1's order; an unknown name is an error."""
    names = {item.strip() for item in raw.split(",") if item.strip()}
    unknown = sorted(names - set(COLLECTORS))
    if unknown:
        raise ValueError(f"--only: unknown collector(s) {', '.join(unknown)}; known: {','.join(COLLECTORS)}")
    return [c for c in COLLECTORS if c in names]


def pids_by_comm(comm: str, proc: Path = Path("/proc")) -> List[int]:
    """Tgids whose ``/proc/<pid>/comm`` equals ``comm`` (the kernel keeps 15 bytes of it)."""
    want = comm[:15]
    found: List[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text(errors="replace").rstrip("\n")
        except OSError:
            continue
        if name == want and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return sorted(found)


def _comm(pid: int, tid: Optional[int] = None) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid is not None else f"/proc/{pid}/comm"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def _major_faults(pid: int) -> Optional[int]:
    # Lifetime majflt, as 1.3.1 reported it (a gauge, not a delta).
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[9])
    except (IndexError, ValueError):
        return None


def _percentile_us(buckets: List[Dict[str, int]], q: float) -> float:
    """The upper bound (2**slot µs) of the log2 bucket holding the q-quantile; 0 when empty.

    1.3.1 reported ``float(1 << slot)`` of the same bucket; strapd's slots are bit lengths of
    the µs value, so the bound is the same number."""
    total = sum(b["count"] for b in buckets)
    if total == 0:
        return 0.0
    limit = total * q
    cum = 0
    for b in sorted(buckets, key=lambda b: b["slot"]):
        cum += b["count"]
        if cum >= limit:
            return float(1 << b["slot"])
    return float(1 << max(b["slot"] for b in buckets))


def _max_us(buckets: List[Dict[str, int]]) -> float:
    return float(1 << max(b["slot"] for b in buckets)) if buckets else 0.0


def _syscall_events(
    per_pid: Dict[str, Dict[str, Dict[str, Any]]], interval: float, mmap_bytes: Dict[str, int]
) -> Iterator[Dict[str, Any]]:
    by_name: Dict[str, List[Tuple[int, Dict[str, Any]]]] = {}
    for pid, names in per_pid.items():
        for name, st in names.items():
            by_name.setdefault(name, []).append((int(pid), st))
    for name in sorted(by_name):
        rows = by_name[name]
        count = sum(st["count"] for _, st in rows)
        timed = sum(st["timed"] for _, st in rows)
        total_ns = sum(st["total_ns"] for _, st in rows)
        buckets: Dict[int, int] = {}
        for _, st in rows:
            for b in st["buckets"]:
                buckets[b["slot"]] = buckets.get(b["slot"], 0) + b["count"]
        blist = [{"slot": s, "count": c} for s, c in buckets.items()]
        nbytes: Optional[int] = None
        if name == "mmap":
            nbytes = sum(mmap_bytes.get(str(pid), 0) for pid, _ in rows)
        callers = [
            {
                "pid": pid,
                "comm": _comm(pid),
                "count": st["count"],
                "lat_total_ns": st["total_ns"],
                "bytes": mmap_bytes.get(str(pid), 0) if name == "mmap" else None,
            }
            for pid, st in rows
        ]
        callers.sort(key=lambda c: c["lat_total_ns"], reverse=True)
        yield {
            "syscall": name,
            "count": count,
            "errors": sum(st["errors"] for _, st in rows),
            "timed": timed,
            "lat_avg_us": (total_ns / timed / 1000.0) if timed else 0.0,
            "lat_p50_us": _percentile_us(blist, 0.5),
            "lat_p95_us": _percentile_us(blist, 0.95),
            "lat_p99_us": _percentile_us(blist, 0.99),
            "lat_max_us": _max_us(blist),
            "bytes": nbytes,
            "bytes_per_call": (nbytes / count if count else 0.0) if nbytes is not None else None,
            "throughput_bytes_s": (nbytes / interval) if nbytes is not None else None,
            "top_callers": callers[:5],
        }


_PER_PID = ("off_cpu_ns", "off_cpu", "page_faults", "page_faults_detail", "syscalls", "sched",
            "syscall_latency", "sync_wait", "runqueue_latency", "nvidia_ioctl", "tcp", "memory")


def drop_pid(snap: Dict[str, Any], pid: int) -> None:
    """Remove one process from a snapshot's per-process fields (in place).

    strapd always watches itself; llm-prof reports only the processes it was asked for."""
    key = str(pid)
    for field in _PER_PID:
        snap.get(field, {}).pop(key, None)
    snap["threads"] = [t for t in snap.get("threads", []) if t.get("pid") != pid]
    snap["device_opens"] = [o for o in snap.get("device_opens", []) if o.get("pid") != pid]
    snap["watched"] = [w for w in snap.get("watched", []) if w != pid]


def snapshot_to_events(snap: Dict[str, Any], only: Sequence[str], single_pid: Optional[int]) -> List[Dict[str, Any]]:
    """One strapd snapshot → 1.3.1 events for the collectors in ``only`` (without ts/labels).

    Args:
        snap: a parsed trace line (docs/TRACE_FORMAT.md).
        only: collector names (``COLLECTORS``).
        single_pid: the ``--pid`` when exactly one process was named; 1.3.1 filled
            ``rss_kb`` and ``major_faults`` only then.

    Returns:
        Events in 1.3.1's order (disk, syscall, sync_wait, mem, sched, net).
    """
    interval = float(snap.get("interval_s") or 0.0)
    per_s = (lambda n: n / interval) if interval > 0 else (lambda n: 0.0)
    events: List[Dict[str, Any]] = []
    if "disk" in only:
        io = {d["device_name"]: d for d in snap.get("block_io", [])}
        inflight = {d["device_name"]: d["count"] for d in snap.get("inflight", [])}
        for h in snap.get("latency_histogram", []):
            dev = h["device_name"]
            d = io.get(dev, {})
            reqs = d.get("read_ios", 0) + d.get("write_ios", 0) + d.get("other_ios", 0)
            nbytes = d.get("read_bytes", 0) + d.get("write_bytes", 0) + d.get("other_bytes", 0)
            events.append({
                "type": "disk",
                "dev": dev,
                "iops": per_s(reqs),
                "throughput_bytes_s": per_s(nbytes),
                "lat_p50_us": _percentile_us(h["buckets"], 0.5),
                "lat_p95_us": _percentile_us(h["buckets"], 0.95),
                "lat_p99_us": _percentile_us(h["buckets"], 0.99),
                "queue_depth_avg": None,
                "queue_depth_max": None,
                "inflight": inflight.get(dev, 0),
                "requests": reqs,
                "bytes": nbytes,
            })
    if "syscalls" in only:
        mmap_bytes = {pid: s.get("mmap_bytes", 0) for pid, s in snap.get("syscalls", {}).items()}
        for ev in _syscall_events(snap.get("syscall_latency", {}), interval, mmap_bytes):
            events.append({"type": "syscall", **ev})
    if "sync" in only:
        for ev in _syscall_events(snap.get("sync_wait", {}), interval, {}):
            events.append({"type": "sync_wait", **ev})
    if "mem" in only:
        faults = {pid: n for pid, n in snap.get("page_faults", {}).items()}
        pressure = snap.get("pressure", {})
        psi = {
            dom: {k: float(pressure.get(dom, {}).get("some", {}).get(k, 0.0)) for k in ("avg10", "avg60", "avg300")}
            for dom in ("cpu", "io", "memory")
        }
        rss_kb = major = None
        if single_pid is not None:
            m = snap.get("memory", {}).get(str(single_pid))
            rss_kb = m["rss_bytes"] // 1024 if m else None
            major = _major_faults(single_pid)
        events.append({
            "type": "mem",
            "page_faults_total": sum(faults.values()),
            "page_faults_by_pid": faults,
            # 1.3.1 always wrote a list (its notebook iterates it); strapd counts faults per
            # process, not per thread, so the list is empty rather than null.
            "top_faulting_threads": [],
            "major_faults_by_pid": {pid: d.get("major", 0) for pid, d in snap.get("page_faults_detail", {}).items()},
            "psi": psi,
            "rss_kb": rss_kb,
            "major_faults": major,
        })
    if "sched" in only:
        threads = []
        for t in snap.get("threads", []):
            off = t["runnable_ns"] + t["sleep_ns"] + t["io_ns"]
            threads.append({
                "tid": t["tid"],
                "tgid": t["pid"],
                "comm": _comm(t["pid"], t["tid"]),
                "off_cpu_pct": (off / (interval * 1e9) * 100.0) if interval > 0 else 0.0,
                "off_cpu_ns": off,
                "switches": t["voluntary"] + t["involuntary"],
                "rq_latency_p95_us": None,
                "rq_latency_p99_us": None,
                "rq_latency_max_us": None,
            })
        threads.sort(key=lambda t: t["off_cpu_pct"], reverse=True)
        rq = {}
        for pid, st in snap.get("runqueue_latency", {}).items():
            rq[pid] = {
                "count": st["count"],
                "rq_latency_p95_us": _percentile_us(st["buckets"], 0.95),
                "rq_latency_p99_us": _percentile_us(st["buckets"], 0.99),
                "rq_latency_max_us": _max_us(st["buckets"]),
            }
        events.append({
            "type": "sched",
            "total_off_cpu_pct": sum(t["off_cpu_pct"] for t in threads),
            "threads": threads[:10],
            "runqueue_by_pid": rq,
        })
    if "net" in only:
        for pid, st in sorted(snap.get("tcp", {}).items(), key=lambda kv: int(kv[0])):
            events.append({
                "type": "net",
                "pid": int(pid),
                "comm": _comm(int(pid)),
                "tx_bytes_s": per_s(st["tx_bytes"]),
                "rx_bytes_s": per_s(st["rx_bytes"]),
                "tx_calls": st["tx_calls"],
                "rx_calls": st["rx_calls"],
                "retransmits": st["retransmits"],
            })
    return events


def corr_fields(snap: Dict[str, Any]) -> Tuple[Optional[str], List[str]]:
    """``(corr_id, corr_ids)`` of a snapshot: the distinct ids of the spans overlapping its
    interval, sorted, and the id when there is exactly one (1.3.1's field holds one id)."""
    ids = sorted({s["corr_id"] for s in snap.get("spans", [])})
    return (ids[0] if len(ids) == 1 else None), ids


class _Sink:
    """1.3.1's aggregator output: sorted-key compact JSON; to a file, buffered until
    ``flush_every`` lines are pending or an interval has passed since the last flush (so in
    practice one write per interval), optionally fsynced; to stdout, line by line."""

    def __init__(self, path: Optional[Path], flush_every: int, fsync: bool, interval: float) -> None:
        self._fsync = fsync
        self._flush_every = max(1, flush_every)
        self._interval = interval
        self._buf: List[str] = []
        self._last_flush = time.monotonic()
        self._f: Optional[IO[str]] = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = path.open("a", encoding="utf-8")

    def write_batch(self, events: List[Dict[str, Any]]) -> None:
        lines = [json.dumps(ev, separators=(",", ":"), sort_keys=True) for ev in events]
        if self._f is None:
            for line in lines:
                print(line, flush=True)
            return
        self._buf.extend(lines)
        if len(self._buf) >= self._flush_every or time.monotonic() - self._last_flush >= self._interval:
            self.flush()

    def flush(self) -> None:
        if self._f is None or not self._buf:
            return
        self._f.write("\n".join(self._buf) + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())
        self._buf.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._f is not None:
            self.flush()
            self._f.close()
            self._f = None


def strapd_trace_argv(binary: str, args: argparse.Namespace, pids: List[int], cgroup: Optional[str], only: Sequence[str]) -> List[str]:
    """The ``strapd trace`` command line that feeds ``llm-prof run``."""
    argv = [binary, "--log-level", _strapd_level(args.log), "trace", "--output", "-",
            "--interval", repr(float(args.interval)),
            "--sample-read-write", str(max(1, args.sample_read_write))]
    for pid in pids:
        argv += ["--pid", str(pid)]
    if cgroup:
        argv += ["--cgroup", cgroup]
    if "sched" in only:
        argv.append("--per-thread")
    if args.spans and not args.disable_correlation:
        argv += ["--spans", str(args.spans)]
    return argv


def _strapd_level(level: str) -> str:
    return {"WARNING": "warn", "CRITICAL": "error"}.get(level.upper(), level.lower())


def _resolve_cgroup(raw: str) -> str:
    p = Path(raw)
    return str(p if p.is_absolute() else Path("/sys/fs/cgroup") / p)


def run(args: argparse.Namespace) -> int:
    """``llm-prof run``: stream strapd snapshots as 1.3.1 events until interrupted."""
    try:
        labels = parse_labels(args.labels)
        only = parse_only(args.only)
    except ValueError as exc:
        LOG.error("%s", exc)
        return 2
    if not only:
        LOG.error("No collectors enabled. Check --only flag.")
        return 1
    if not args.interval >= 0.05:
        LOG.error("--interval %s: must be at least 0.05 seconds", args.interval)
        return 2
    pids: List[int] = [args.pid] if args.pid else []
    if args.comm:
        found = pids_by_comm(args.comm)
        if not found:
            LOG.error("--comm %s: no running process has this name", args.comm)
            return 2
        pids += [p for p in found if p not in pids]
    cgroup = _resolve_cgroup(args.cgroup) if args.cgroup else None
    if not pids and not cgroup:
        # strapd counts per-process events only for processes it is told about; 1.3.1's
        # system-wide default has no equivalent there.
        LOG.error("give --pid, --comm or --cgroup: strapd watches named processes, not the whole system")
        return 2
    binary = find_strapd_binary()
    if binary is None:
        LOG.error("strapd binary not found (set STRAPD_BIN or put strapd on PATH)")
        return 1
    single = args.pid if (args.pid and not args.comm and not cgroup) else None
    out_path = None if args.no_output else args.output
    sink = _Sink(out_path, args.flush_every, args.fsync, float(args.interval))
    argv = strapd_trace_argv(binary, args, pids, cgroup, only)
    LOG.info("starting %s", " ".join(argv))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None

    def _forward(signum: int, _frame: Any) -> None:
        # strapd writes a last snapshot for the partial interval on SIGINT/SIGTERM.
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)

    old_int = signal.signal(signal.SIGINT, _forward)
    old_term = signal.signal(signal.SIGTERM, _forward)
    corr = not args.disable_correlation
    try:
        for line in proc.stdout:
            if not line.endswith("\n"):
                LOG.warning("strapd trace ended with a torn line; dropped (%d bytes)", len(line))
                break
            snap = json.loads(line)
            drop_pid(snap, proc.pid)
            ts_ns = int(round(float(snap["timestamp"]) * 1e9))
            ts = datetime.fromtimestamp(ts_ns / 1e9, tz=timezone.utc).isoformat()
            events = snapshot_to_events(snap, only, single)
            for ev in events:
                ev["ts_ns"] = ts_ns
                ev["ts"] = ts
                if corr:
                    ev["corr_id"], ev["corr_ids"] = corr_fields(snap)
                if labels:
                    ev["labels"] = dict(labels)
            sink.write_batch(events)
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        sink.close()
        rc = proc.wait()
    if rc != 0:
        LOG.error("strapd trace exited with status %d", rc)
        return rc if rc > 0 else 1
    return 0


def top(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """``llm-prof top``: replace this process with ``strapd top`` for the same processes."""
    binary = find_strapd_binary()
    if binary is None:
        LOG.error("strapd binary not found (set STRAPD_BIN or put strapd on PATH)")
        return 1
    argv = [binary, "--log-level", _strapd_level(args.log), "top", "--interval", repr(float(args.interval))]
    pids = [args.pid] if args.pid else []
    if args.comm:
        pids += [p for p in pids_by_comm(args.comm) if p not in pids]
    for pid in pids:
        argv += ["--pid", str(pid)]
    if args.cgroup:
        argv += ["--cgroup", _resolve_cgroup(args.cgroup)]
    argv += list(extra)
    os.execv(binary, argv)
    return 1  # not reached


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point (``llm-prof``)."""
    args = parse_args(list(argv) if argv is not None else sys.argv[1:])
    logging.basicConfig(
        level=getattr(logging, args.log.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    sub = args.command[0] if args.command else "run"
    if sub == "top":
        return top(args, args.command[1:])
    if sub != "run":
        LOG.error("Unknown subcommand '%s'. Supported: run, top", sub)
        return 2
    if len(args.command) > 1:
        LOG.error("run takes no arguments (got %s)", " ".join(args.command[1:]))
        return 2
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
