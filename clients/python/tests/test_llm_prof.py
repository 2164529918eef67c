"""llm-prof: 1.3.1's flags and event fields on strapd's trace snapshots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTDATA, strapd_bin
from llm_instrumentation.cli import llm_prof

HERE = Path(__file__).parent
ALL = list(llm_prof.COLLECTORS)


def golden() -> dict:
    return json.loads((TESTDATA / "trace" / "snapshot.golden.jsonl").read_text().splitlines()[0])


def test_golden_snapshot_maps_to_131_events() -> None:
    evs = llm_prof.snapshot_to_events(golden(), ALL, None)
    by = {}
    for e in evs:
        by.setdefault(e["type"], []).append(e)
    assert [e["type"] for e in evs] == ["disk", "syscall", "syscall", "sync_wait", "mem", "sched", "net"]

    (disk,) = by["disk"]
    assert disk == {
        "type": "disk", "dev": "vda", "iops": 3 / 5, "throughput_bytes_s": (4096 + 131072) / 5,
        "lat_p50_us": 128.0, "lat_p95_us": 1024.0, "lat_p99_us": 1024.0,
        "queue_depth_avg": None, "queue_depth_max": None, "inflight": 0,
        "requests": 3, "bytes": 4096 + 131072,
    }
    futex, read = by["syscall"]
    assert futex["syscall"] == "futex" and futex["count"] == 4 and futex["errors"] == 1
    assert futex["lat_avg_us"] == 50000.0 and futex["lat_p99_us"] == 65536.0 and futex["lat_max_us"] == 65536.0
    assert read["syscall"] == "read" and read["count"] == 100 and read["timed"] == 10
    assert read["lat_avg_us"] == 3.0 and read["lat_p95_us"] == 4.0
    assert read["bytes"] is None and read["throughput_bytes_s"] is None
    assert [c["pid"] for c in read["top_callers"]] == [4242]
    assert read["top_callers"][0]["lat_total_ns"] == 30000
    (sw,) = by["sync_wait"]
    assert sw["syscall"] == "futex" and sw["count"] == 3 and sw["lat_avg_us"] == 50000.0

    (mem,) = by["mem"]
    assert mem["page_faults_total"] == 5604 and mem["page_faults_by_pid"] == {"4242": 5604}
    assert mem["major_faults_by_pid"] == {"4242": 14}
    assert mem["psi"]["cpu"] == {"avg10": 1.5, "avg60": 0.75, "avg300": 0.25}
    assert mem["psi"]["io"] == {"avg10": 0.1, "avg60": 0.0, "avg300": 0.0}
    assert mem["rss_kb"] is None and mem["major_faults"] is None

    (sched,) = by["sched"]
    (t,) = sched["threads"]
    assert (t["tid"], t["tgid"], t["off_cpu_ns"], t["switches"]) == (4243, 4242, 301000000, 15)
    assert t["off_cpu_pct"] == pytest.approx(6.02)
    assert sched["total_off_cpu_pct"] == pytest.approx(6.02)
    assert sched["runqueue_by_pid"]["4242"]["rq_latency_p99_us"] == 4096.0

    (net,) = by["net"]
    assert (net["pid"], net["tx_bytes_s"], net["rx_bytes_s"]) == (4242, 1048576 / 5, 524288 / 5)
    assert (net["tx_calls"], net["rx_calls"], net["retransmits"]) == (16, 40, 1)


def test_only_selects_and_single_pid_fills_rss() -> None:
    evs = llm_prof.snapshot_to_events(golden(), ["mem"], 4242)
    assert [e["type"] for e in evs] == ["mem"]
    assert evs[0]["rss_kb"] == 1073741824 // 1024


def test_drop_pid_removes_the_tracer() -> None:
    s = golden()
    llm_prof.drop_pid(s, 4242)
    evs = llm_prof.snapshot_to_events(s, ALL, None)
    assert [e["type"] for e in evs] == ["disk", "mem", "sched"]
    assert evs[2]["threads"] == [] and evs[1]["page_faults_total"] == 0


@pytest.mark.parametrize("raw,err", [
    ("a=1,b", "expected key=value"),
    ("=1", "empty key"),
])
def test_bad_labels(raw: str, err: str) -> None:
    with pytest.raises(ValueError, match=err):
        llm_prof.parse_labels(raw)


def test_labels_and_only_parse() -> None:
    assert llm_prof.parse_labels("run=a, host = b,") == {"run": "a", "host": "b"}
    assert llm_prof.parse_only("net,disk") == ["disk", "net"]
    with pytest.raises(ValueError, match="gpu"):
        llm_prof.parse_only("disk,gpu")


def test_no_target_is_an_error(capsys) -> None:
    assert llm_prof.main(["run", "--interval", "1"]) == 2


def test_console_script_declared() -> None:
    text = (HERE.parent / "pyproject.toml").read_text()
    assert 'llm-prof = "llm_instrumentation.cli.llm_prof:main"' in text


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the probes need root")
def test_run_writes_every_collector(tmp_path: Path) -> None:
    binary = strapd_bin()
    if not binary.exists():
        pytest.skip(f"strapd binary not built: {binary}")
    load = subprocess.Popen([sys.executable, str(HERE / "llm_prof_load.py"), str(tmp_path / "load.bin")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout.readline().strip() == "ready"
        out = tmp_path / "x.jsonl"
        env = dict(os.environ, STRAPD_BIN=str(binary),
                   PYTHONPATH=str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        prof = subprocess.Popen(
            [sys.executable, "-m", "llm_instrumentation.cli.llm_prof", "run", "--pid", str(load.pid),
             "--only", "disk,syscalls,sync,mem,sched,net", "--interval", "1", "--output", str(out),
             "--labels", "run=t1,host=h"],
            env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(4.5)
        prof.send_signal(signal.SIGINT)
        _, err = prof.communicate(timeout=20)
        assert prof.returncode == 0, err
    finally:
        load.kill()
        load.wait()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    types = {e["type"] for e in events}
    assert types == {"disk", "syscall", "sync_wait", "mem", "sched", "net"}, types
    for e in events:
        assert e["labels"] == {"run": "t1", "host": "h"}
        assert e["corr_id"] is None and isinstance(e["ts_ns"], int) and e["ts"].endswith("+00:00")
    names = {e["syscall"] for e in events if e["type"] == "syscall"}
    assert {"read", "write", "fsync", "sendto", "recvfrom"} <= names, names
    assert "futex" in {e["syscall"] for e in events if e["type"] == "sync_wait"}
    reads = [e for e in events if e["type"] == "syscall" and e["syscall"] == "read"]
    assert all(c["pid"] == load.pid for e in reads for c in e["top_callers"])
    assert sum(e["count"] for e in reads) >= 400
    mems = [e for e in events if e["type"] == "mem"]
    assert sum(e["page_faults_total"] for e in mems) >= 4096  # 16 MiB touched per round
    assert all(e["rss_kb"] and e["rss_kb"] > 0 for e in mems)
    assert all(set(e["page_faults_by_pid"]) <= {str(load.pid)} for e in mems)
    assert any(t["tgid"] == load.pid and t["off_cpu_ns"] > 0 for e in events if e["type"] == "sched" for t in e["threads"])
    nets = [e for e in events if e["type"] == "net"]
    assert {e["pid"] for e in nets} == {load.pid}
    assert sum(e["tx_calls"] for e in nets) > 0 and sum(e["tx_bytes_s"] for e in nets) > 0
    assert any(e["requests"] > 0 for e in events if e["type"] == "disk")


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the probes need root")
def test_top_execs_strapd_top() -> None:
    binary = strapd_bin()
    if not binary.exists():
        pytest.skip(f"strapd binary not built: {binary}")
    env = dict(os.environ, STRAPD_BIN=str(binary),
               PYTHONPATH=str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(
        [sys.executable, "-m", "llm_instrumentation.cli.llm_prof", "--pid", str(os.getpid()), "--interval", "0.3",
         "--log", "ERROR", "top", "--", "--count", "1", "--no-daemon"],
        env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    # Not a terminal: one plain screen, this process among the watched ones.
    assert res.stdout.startswith("strapd top") and "\x1b[" not in res.stdout
    assert f"{os.getpid()} " in res.stdout and "SESSIONS  (not asked: --no-daemon)" in res.stdout
