"""The resource monitor's C paths (``_speedups.TimedForward`` and ``_speedups.render``)
against its Python paths: the same records, the same bytes, the same counters."""

from __future__ import annotations

import copy
import time
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from conftest import generate_with_monitor as decode
from conftest import tiny_llama

from llm_instrumentation import resources
from llm_instrumentation.resources import ResourceMonitor

needs_c = pytest.mark.skipif(resources._render is None or resources._TimedForward is None,
                             reason="llm_instrumentation._speedups is not built "
                                    "(test_record_fast_path.py::test_speedups_built says why)")

#: What the writer keeps between batches.
STATE = ("_seq", "_w_step", "_w_fwd", "_w_flops", "_w_off", "_w_long", "_w_long_site", "total_flops",
         "total_compute_us", "counts", "component_flows", "_kv_prev_bytes", "events_written", "_w_frac",
         "_w_frac_at")
#: Kept as they are (a site; the unread marker).
KEEP = ("_w_long_site", "_w_frac")

#: Durations (ns) the C writer prints without a float conversion below 10**15, and past it.
TIMINGS = [0, 1, 5, 10, 100, 999, 1000, 1001, 1010, 1100, 37615, 100000, 999999, 10 ** 6, 123456789,
           10 ** 12 + 1, 10 ** 15 - 1, 10 ** 15, 10 ** 15 + 7, 2 ** 62]


def recorded(mon: ResourceMonitor, model, level: str) -> List[List[Any]]:
    """The batches the writer thread would get for a prefill and a few decoding steps."""
    batches: List[List[Any]] = []
    mon.set_level(level)
    mon.flush()
    put = mon._writer.put
    mon._writer.put = lambda recs, *rest: batches.append(recs)
    try:
        decode(model, mon, 6, 4)
        with torch.no_grad():
            model.lm_head(torch.randn(3, model.config.hidden_size))  # outside a forward pass
        mon._hand_off()
    finally:
        mon._writer.put = put
    return batches


def counted(value: float) -> Tuple[Callable[[], float], List[int]]:
    """A stand-in for ``_host_memory_fraction`` that returns ``value``, and the list its calls
    are counted in."""
    calls: List[int] = []

    def fraction() -> float:
        calls.append(1)
        return value

    return fraction, calls


def same(state: Dict[str, Any]) -> Dict[str, Any]:
    """What two runs of the writer must agree on (not when they read the clock)."""
    return {k: v for k, v in state.items() if k != "_w_frac_at"}


def snapshot(mon: ResourceMonitor) -> Dict[str, Any]:
    return {k: v if k in KEEP else copy.copy(v) for k, v in ((k, getattr(mon, k)) for k in STATE)}


def write_all(mon: ResourceMonitor, batches: List[List[Any]], state: Dict[str, Any], keep: bool = False) -> Any:
    """Run the writer over copies of the batches from ``state`` (with the templates made so
    far if ``keep``); its lines and end state."""
    for k, v in state.items():
        setattr(mon, k, v if k in KEEP else copy.copy(v))
    if not keep:
        mon._tpl.clear()
    lines: List[bytes] = []
    sink_write = mon._sink.write
    mon._sink.write = lines.extend
    try:
        for b in batches:
            mon._write_batch_inner(list(b))
    finally:
        mon._sink.write = sink_write
    return lines, snapshot(mon)


@needs_c
@pytest.mark.parametrize("level", ["MINIMAL", "DETAILED", "VERBOSE"])
def test_c_writer_writes_the_python_writers_bytes(tmp_path: Path, monkeypatch, level: str) -> None:
    m = tiny_llama()
    mon = ResourceMonitor(m, "MINIMAL", tmp_path / "r.jsonl", environ={}, flush_interval=None)
    with mon:
        batches = recorded(mon, m, level)
        # Durations the wrappers rarely see: zero, sub-microsecond, past 10**15 ns.
        i = 0
        for b in batches:
            for j, r in enumerate(b):
                if r[0] in (mon._build_linear, mon._build_module) and type(r[3]) is int:
                    b[j] = r[:3] + (TIMINGS[i % len(TIMINGS)],) + r[4:]
                    i += 1
        assert i > 3 * len(TIMINGS)
        state = snapshot(mon)
        calls = []
        render = resources._render

        by_c: List[Any] = []

        def counting(mon_, recs, i, lines, deadline, consts):
            calls.append(i)
            j = render(mon_, recs, i, lines, deadline, consts)
            by_c.extend(r[0] for r in recs[i:j])
            return j

        # Read as the writer writes (the handoff's memory use): the same in both runs.
        fraction, reads = counted(0.25)
        monkeypatch.setattr(resources, "_host_memory_fraction", fraction)
        monkeypatch.setattr(resources, "_render", counting)
        lines_c, state_c = write_all(mon, batches, state)
        monkeypatch.setattr(resources, "_render", None)
        lines_py, state_py = write_all(mon, batches, state)
        # Every template made: the C writer takes every record it knows.
        monkeypatch.setattr(resources, "_render", counting)
        by_c.clear()
        reads.clear()
        lines_c2, state_c2 = write_all(mon, batches, state, keep=True)
    assert lines_c2 == lines_py and same(state_c2) == same(state_py)
    assert len(calls) > len(batches)
    # What each level records through the timing wrappers' writer methods (VERBOSE's general
    # wrapper records allocations the other way).
    expect = {"MINIMAL": ("linear", "attention"),
              "DETAILED": ("linear", "module", "alloc", "attention", "walloc", "handoff"),
              "VERBOSE": ("linear", "module", "walloc", "handoff")}
    # A handoff that reads the machine's memory use takes the Python path.
    for name in ("linear", "module", "alloc", "attention", "walloc", "handoff"):
        build = getattr(mon, "_build_" + name)
        n = sum(1 for b in batches for r in b if r[0] == build)
        assert by_c.count(build) == n - (len(reads) if name == "handoff" else 0)
        assert (n >= 10) == (name in expect[level]), (name, n)
    n_fast = sum(1 for b in batches for r in b if r[0] in (mon._build_linear, mon._build_module))
    assert len(lines_py) > n_fast
    for a, b in zip(lines_c, lines_py):
        assert a == b
    assert len(lines_c) == len(lines_py)
    assert same(state_c) == same(state_py)
    assert state_c["counts"]["compute_execution"] >= n_fast
    for line in lines_c:
        json.loads(line)


@needs_c
def test_c_writer_stops_at_its_deadline(tmp_path: Path) -> None:
    """A deadline already past: one record written, the rest left to the next call (the
    writer gives the interpreter lock back in between)."""
    m = tiny_llama()
    mon = ResourceMonitor(m, "MINIMAL", tmp_path / "r.jsonl", environ={}, flush_interval=None)
    with mon:
        batches = recorded(mon, m, "MINIMAL")
        state = snapshot(mon)
        write_all(mon, batches, state)  # makes the templates
        recs = [r for b in batches for r in b if r[0] is mon._build_linear]
        lines: List[bytes] = []
        consts = (mon._build_linear, mon._build_module, mon._build_alloc, mon._build_attention, mon._build_walloc,
                  mon._build_handoff, mon._tpl, mon.counts, mon._kv_prev_bytes, resources._UNREAD)
        assert resources._render(mon, recs, 0, lines, 0, consts) == 1 and len(lines) >= 1
        assert resources._render(mon, recs, 1, lines, 1 << 62, consts) == len(recs)
        assert resources._render(mon, recs, len(recs), lines, 1 << 62, consts) == len(recs)
        with pytest.raises(TypeError):
            resources._render(mon, tuple(recs), 0, lines, 0, consts)
        with pytest.raises(TypeError):
            resources._render(mon, recs, 0, lines, 0, consts[:9])


def masked(path: Path) -> List[Any]:
    volatile = {"timestamp", "resource_id", "compute_resource_id", "session_id", "iso_timestamp",
                "duration_us", "throughput_gflops_per_s", "memory_throughput_gbps", "transfer_bandwidth_gbps",
                "memory_address", "process_rss_bytes", "memory_used_fraction", "memory_pressure",
                "monitor_hook_us", "monitor_writer_cpu_us", "total_compute_us", "total_memory_bytes",
                "total_memory_mb"}
    out = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        out.append([(k, "*" if k in volatile else v) for k, v in e.items()])
    return out


@needs_c
def test_c_wrapper_records_what_the_python_wrapper_records(tmp_path: Path, monkeypatch) -> None:
    """The same events with the C wrapper and writer as with the Python ones, and the C
    wrapper is the one installed where the extension is built."""
    m = tiny_llama()
    runs = []
    for c in (True, False):
        if not c:
            monkeypatch.setattr(resources, "_TimedForward", None)
            monkeypatch.setattr(resources, "_render", None)
        p = tmp_path / f"c-{c}.jsonl"
        mon = ResourceMonitor(m, "MINIMAL", p, environ={})
        with mon:
            call = type(m.lm_head.__dict__["forward"]).__dict__["__call__"].__func__
            assert (type(call).__name__ == "TimedForward") is c
            decode(m, mon, 5, 3)
            mon.set_level("DETAILED")
            decode(m, mon, 5, 2)
            with torch.no_grad():
                m.lm_head(torch.randn(3, m.config.hidden_size))
            hook_ns = mon.hook_ns
        assert hook_ns > 0
        runs.append(masked(p))
    assert len(runs[0]) > 200 and runs[0] == runs[1]


@needs_c
def test_c_wrapper_passes_on_what_it_does_not_time(tmp_path: Path) -> None:
    """A call with no tensor first, keyword arguments, an exception from the module: the
    module's own behaviour, and a wrapper that is no longer active only passes calls on."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    lin = model[0]
    mon = ResourceMonitor(model, "MINIMAL", tmp_path / "r.jsonl", environ={})
    with mon:
        x = torch.randn(2, 4)
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
        assert torch.equal(lin(input=x), torch.nn.functional.linear(x, lin.weight, lin.bias))
        with pytest.raises(RuntimeError):
            lin(torch.randn(2, 5))
        wrapper = lin.__dict__["forward"]
    assert "forward" not in lin.__dict__
    wrapper.active[0] = False
    assert torch.equal(wrapper(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
    with pytest.raises(TypeError):
        resources._TimedForward(1, 2)


@pytest.mark.parametrize("max_age,reads_expected", [(0.0, "every pass"), (1e9, "once")])
def test_memory_use_is_read_at_most_every_max_age(tmp_path: Path, monkeypatch, max_age: float,
                                                 reads_expected: str) -> None:
    """The machine's memory use on the handoff events: read by the writer for the first
    handoff it writes, then reused by the passes of the next _FRAC_MAX_AGE seconds."""
    fraction, reads = counted(0.6)
    monkeypatch.setattr(resources, "_host_memory_fraction", fraction)
    monkeypatch.setattr(resources, "_FRAC_MAX_AGE", max_age)
    m = tiny_llama()
    p = tmp_path / "r.jsonl"
    with ResourceMonitor(m, "DETAILED", p, environ={}) as mon:
        decode(m, mon, 5, 4)
    events = [json.loads(line) for line in p.read_text().splitlines()]
    handoffs = [e for e in events if e["event"] == "component_handoff"]
    passes = len({e["forward"] for e in handoffs})
    assert passes == 5 and all(e["memory_used_fraction"] == 0.6 and e["memory_pressure"] == "medium"
                               for e in handoffs)
    assert len(reads) == (passes if reads_expected == "every pass" else 1)


def test_writer_keeps_the_lock_while_the_longest_linear_runs(tmp_path: Path, monkeypatch) -> None:
    """Records handed over as the longest module of a pass starts: while that module, a
    Linear (one torch call without the interpreter lock), runs, the writer does not give the
    lock back; after it, or without such a window, every _YIELD_NS of work."""
    m = tiny_llama()
    mon = ResourceMonitor(m, "DETAILED", tmp_path / "r.jsonl", environ={}, flush_interval=None)
    with mon:
        batches = recorded(mon, m, "DETAILED")
        for b in batches:
            mon._write_batch_inner(list(b))
        assert mon._long[0] is not None
        assert (mon._long_ns > 0) == (mon._long[0].kind == "linear")
        sleeps: List[float] = []
        monkeypatch.setattr(resources, "_YIELD_NS", 0)
        monkeypatch.setattr(resources.time, "sleep", sleeps.append)
        mon._write_batch_inner(list(batches[-1]), time.perf_counter_ns() + 10 ** 10)
        assert sleeps == []
        mon._write_batch_inner(list(batches[-1]), 0)
        assert len(sleeps) >= len(batches[-1]) // 2
        monkeypatch.undo()
        # The model's thread gives the writer the window as it hands the records over.
        got = []
        mon._writer.put = lambda recs, quiet_until=0: got.append(quiet_until)
        mon._long_ns = 10 ** 9
        t0 = time.perf_counter_ns()
        decode(m, mon, 3, 2)
        assert got and all(t0 + 8 * 10 ** 8 <= q <= time.perf_counter_ns() + 8 * 10 ** 8 for q in got)
        mon._writer.put = type(mon._writer).put.__get__(mon._writer)


@needs_c
def test_program_of_a_template() -> None:
    """A template as the C writer runs it: its text in one piece (``%%`` as ``%``) and a
    table of (length, slot) ops; a literal past 64 KiB split across ops; a slot the C
    writer does not fill makes no program."""
    text, ops = resources._program('{"a":"50%%","t":%(ts)s,"d":%(d)s}\n')
    assert text == b'{"a":"50%","t":,"d":}\n'
    assert [(ops[i] | ops[i + 1] << 8, ops[i + 2]) for i in range(0, len(ops), 3)] == [
        (len(b'{"a":"50%","t":'), resources._C_SLOTS["ts"]), (len(b',"d":'), resources._C_SLOTS["d"]),
        (2, 255)]
    long = "x" * 70000
    text, ops = resources._program(long + "%(seq)s")
    assert text == long.encode()
    assert [(ops[i] | ops[i + 1] << 8, ops[i + 2]) for i in range(0, len(ops), 3)] == [
        (0xFFFF, 255), (70000 - 0xFFFF, resources._C_SLOTS["seq"]), (0, 255)]
    assert resources._program("%(unknown)s") is None


def test_cuda_timing_pairs_events(monkeypatch) -> None:
    """A module started with a CUDA event ends with a second one recorded then (the writer
    resolves the pair); without one its duration is the clock difference. torch.cuda.Event
    is replaced: there is no GPU here."""
    recorded: List[Any] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.recorded = False

        def record(self) -> None:
            self.recorded = True
            recorded.append(self)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert resources._timing(100, 350, None) == 250 and recorded == []
    start = resources._cuda_event()
    pair = resources._timing(100, 350, start)
    assert pair[0] is start and isinstance(pair[1], Event) and pair[1].recorded and recorded == [start, pair[1]]
