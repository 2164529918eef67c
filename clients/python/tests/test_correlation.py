"""Correlation spans: correlate() / CorrelationContext write them, strapd trace attaches
them to the snapshots they overlap, llm-prof fills corr_id from them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import strapd_bin
from llm_instrumentation import correlate
from llm_instrumentation import correlation as corr
from llm_instrumentation.ebpf.correlation import DEFAULT_KEY, CorrelationContext

HERE = Path(__file__).parent


@pytest.fixture
def spans(tmp_path: Path):
    p = tmp_path / "spans.jsonl"
    corr.set_spans_file(p)
    yield p
    corr.set_spans_file(None)


def lines(p: Path) -> list:
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_correlate_writes_start_and_end(spans: Path) -> None:
    assert corr.current_correlation_id() is None
    with correlate("req-1") as cid:
        assert cid == "req-1" and DEFAULT_KEY.get() == "req-1"
        with correlate() as inner:
            assert inner.startswith(f"{os.getpid()}-") and corr.current_correlation_id() == inner
        assert corr.current_correlation_id() == "req-1"
    assert corr.current_correlation_id() is None
    got = lines(spans)
    assert [(x["event"], x["corr_id"]) for x in got] == [("start", "req-1"), ("start", inner), ("end", inner), ("end", "req-1")]
    assert all(x["pid"] == os.getpid() and x["tid"] == threading.get_native_id() for x in got)
    assert got[0]["t"] <= got[1]["t"] <= got[2]["t"] <= got[3]["t"]


def test_context_form_ends_the_replaced_span(spans: Path) -> None:
    ctx = CorrelationContext.default()
    ctx.set("a")
    ctx.set("a")  # unchanged: no new span
    ctx.set("b")
    ctx.set(None)
    assert ctx.current_id() is None
    assert [(x["event"], x["corr_id"]) for x in lines(spans)] == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]
    off = CorrelationContext.disabled()
    off.set("x")
    assert off.current_id() is None and len(lines(spans)) == 4
    with pytest.raises(RuntimeError):
        off.new_request()


def test_without_a_spans_file_only_the_variable(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STRAP_SPANS_FILE", raising=False)
    corr.set_spans_file(None)
    with correlate("q"):
        assert DEFAULT_KEY.get() == "q"
    assert corr.spans_file() is None
    with pytest.raises(ValueError):
        with correlate(""):
            pass


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the probes need root")
def test_trace_and_llm_prof_attach_spans(spans: Path, tmp_path: Path) -> None:
    binary = strapd_bin()
    if not binary.exists():
        pytest.skip(f"strapd binary not built: {binary}")
    trace = tmp_path / "trace.jsonl"
    prof_out = tmp_path / "prof.jsonl"
    me = str(os.getpid())
    tr = subprocess.Popen([str(binary), "--log-level", "warn", "trace", "--pid", me, "--interval", "0.25",
                           "--spans", str(spans), "--output", str(trace)])
    env = dict(os.environ, STRAPD_BIN=str(binary),
               PYTHONPATH=str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    prof = subprocess.Popen([sys.executable, "-m", "llm_instrumentation.cli.llm_prof", "run", "--pid", me,
                             "--only", "mem", "--interval", "0.25", "--spans", str(spans), "--output", str(prof_out)],
                            env=env)
    try:
        time.sleep(1.0)  # both attached and past their first interval
        with correlate("req-A"):
            time.sleep(0.8)
        time.sleep(0.6)
        ctx = CorrelationContext.default()
        ctx.set("req-B")
        time.sleep(0.6)
        ctx.set(None)
        time.sleep(0.8)
    finally:
        for p in (tr, prof):
            p.send_signal(signal.SIGINT)
        assert tr.wait(timeout=20) == 0 and prof.wait(timeout=20) == 0
    marks = {(x["corr_id"], x["event"]): x["t"] for x in lines(spans)}
    snaps = lines(trace)
    for cid in ("req-A", "req-B"):
        start, end = marks[(cid, "start")], marks[(cid, "end")]
        over = [s for s in snaps if s["timestamp"] - s["interval_s"] <= end and s["timestamp"] >= start]
        has = [s for s in snaps if any(x["corr_id"] == cid for x in s.get("spans", []))]
        assert over and [s["timestamp"] for s in has] == [s["timestamp"] for s in over], (cid, len(over), len(has))
        closed = [x for s in has for x in s["spans"] if x["corr_id"] == cid and x["end"] is not None]
        assert closed and closed[-1]["start"] == start and closed[-1]["end"] == end
        assert all(x["pid"] == os.getpid() for s in has for x in s["spans"])
    # Between and after the spans, snapshots carry none.
    quiet = [s for s in snaps if s["timestamp"] - s["interval_s"] > marks[("req-B", "end")]]
    assert quiet and all(not s.get("spans") for s in quiet)
    events = lines(prof_out)
    ids = {e["corr_id"] for e in events}
    assert {"req-A", "req-B", None} <= ids, ids
    assert all(e["corr_ids"] == ([e["corr_id"]] if e["corr_id"] else []) for e in events)
