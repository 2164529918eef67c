"""The resource monitor's C paths (``_speedups.TimedForward`` and ``_speedups.render``)
against its Python paths: the same records, the same bytes, the same counters."""

from __future__ import annotations

import time
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from conftest import generate_with_monitor as decode
from conftest import tiny_llama
from conftest import write_batches as write_all
from conftest import writer_state_same as same

from llm_instrumentation import _cuda
from llm_instrumentation.resources import ResourceMonitor, native, system, templates, wrappers, writer
from llm_instrumentation.resources.records import Rec

needs_c = pytest.mark.skipif(not native.available(),
                             reason="llm_instrumentation.resources._native is not built "
                                    "(test_record_fast_path.py::test_speedups_built says why)")

#: Durations (ns) the C writer prints without a float conversion below 10**15, and past it.
TIMINGS = [0, 1, 5, 10, 100, 999, 1000, 1001, 1010, 1100, 37615, 100000, 999999, 10 ** 6, 123456789,
           10 ** 12 + 1, 10 ** 15 - 1, 10 ** 15, 10 ** 15 + 7, 2 ** 62]


def recorded(mon: ResourceMonitor, model, level: str) -> List[List[Any]]:
    """The batches the writer thread would get for a prefill and a few decoding steps."""
    batches: List[List[Any]] = []
    mon.set_level(level)
    mon.flush()
    thread = mon.recorder.thread
    thread.put = lambda recs, *rest: batches.append(recs)  # type: ignore[method-assign]
    try:
        decode(model, mon, 6, 4)
        with torch.no_grad():
            model.lm_head(torch.randn(3, model.config.hidden_size))  # outside a forward pass
        mon.recorder.hand_off()
    finally:
        del thread.put
    return batches


def counted(value: float) -> Tuple[Callable[[], float], List[int]]:
    """A stand-in for ``_host_memory_fraction`` that returns ``value``, and the list its calls
    are counted in."""
    calls: List[int] = []

    def fraction() -> float:
        calls.append(1)
        return value

    return fraction, calls


def snapshot(mon: ResourceMonitor) -> Dict[str, Any]:
    return mon.writer.state.snapshot()


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
                if r[0] in (Rec.LINEAR, Rec.MODULE) and type(r[3]) is int:
                    b[j] = r[:3] + (TIMINGS[i % len(TIMINGS)],) + r[4:]
                    i += 1
        assert i > 3 * len(TIMINGS)
        state = snapshot(mon)
        calls = []
        render = native.render

        by_c: List[Any] = []

        def counting(state, recs, i, lines, deadline):
            calls.append(i)
            j = render(state, recs, i, lines, deadline)
            by_c.extend(r[0] for r in recs[i:j])
            return j

        # Read as the writer writes (the handoff's memory use): the same in both runs.
        fraction, reads = counted(0.25)
        monkeypatch.setattr(system, "host_memory_fraction", fraction)
        monkeypatch.setattr(native, "render", counting)
        lines_c, state_c = write_all(mon, batches, state)
        monkeypatch.setattr(native, "render", None)
        lines_py, state_py = write_all(mon, batches, state)
        # Every template made: the C writer takes every record it knows.
        monkeypatch.setattr(native, "render", counting)
        by_c.clear()
        reads.clear()
        lines_c2, state_c2 = write_all(mon, batches, state, keep=True)
    assert lines_c2 == lines_py and same(state_c2) == same(state_py)
    assert len(calls) > len(batches)
    # What each level records through the timing wrappers' writer methods (VERBOSE's general
    # wrapper records allocations the other way).
    expect = {"MINIMAL": (Rec.LINEAR, Rec.ATTENTION_KV),
              "DETAILED": (Rec.LINEAR, Rec.MODULE, Rec.ALLOC_OUT, Rec.ATTENTION_KV, Rec.ALLOC, Rec.HANDOFF),
              "VERBOSE": (Rec.LINEAR, Rec.MODULE, Rec.ALLOC, Rec.HANDOFF)}
    # A handoff that reads the machine's memory use takes the Python path.
    for kind in (Rec.LINEAR, Rec.MODULE, Rec.ALLOC_OUT, Rec.ATTENTION_KV, Rec.ALLOC, Rec.HANDOFF):
        n = sum(1 for b in batches for r in b if r[0] == kind)
        assert by_c.count(kind) == n - (len(reads) if kind == Rec.HANDOFF else 0), kind.name
        assert (n >= 10) == (kind in expect[level]), (kind.name, n)
    n_fast = sum(1 for b in batches for r in b if r[0] in (Rec.LINEAR, Rec.MODULE))
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
        recs = [r for b in batches for r in b if r[0] == Rec.LINEAR]
        lines: List[bytes] = []
        st = mon.writer.state
        assert native.render(st, recs, 0, lines, 0) == 1 and len(lines) >= 1
        assert native.render(st, recs, 1, lines, 1 << 62) == len(recs)
        assert native.render(st, recs, len(recs), lines, 1 << 62) == len(recs)
        with pytest.raises(TypeError):
            native.render(st, tuple(recs), 0, lines, 0)
        with pytest.raises(TypeError):
            native.render(st, recs, 0, lines)


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
            monkeypatch.setattr(native, "TimedForward", None)
            monkeypatch.setattr(native, "render", None)
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
        native.TimedForward(1, 2)


@pytest.mark.parametrize("max_age,reads_expected", [(0.0, "every pass"), (1e9, "once")])
def test_memory_use_is_read_at_most_every_max_age(tmp_path: Path, monkeypatch, max_age: float,
                                                 reads_expected: str) -> None:
    """The machine's memory use on the handoff events: read by the writer for the first
    handoff it writes, then reused by the passes of the next _FRAC_MAX_AGE seconds."""
    fraction, reads = counted(0.6)
    monkeypatch.setattr(system, "host_memory_fraction", fraction)
    monkeypatch.setattr(system, "FRACTION_MAX_AGE", max_age)
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
            mon.writer.write_batch(list(b))
        longest = mon.recorder.longest
        assert longest[0] is not None
        assert (mon.writer.longest_ns > 0) == (longest[0].kind == "linear")
        sleeps: List[float] = []
        monkeypatch.setattr(writer, "YIELD_NS", 0)
        monkeypatch.setattr(writer.time, "sleep", sleeps.append)
        mon.writer.write_batch(list(batches[-1]), time.perf_counter_ns() + 10 ** 10)
        assert sleeps == []
        mon.writer.write_batch(list(batches[-1]), 0)
        assert len(sleeps) >= len(batches[-1]) // 2
        monkeypatch.undo()
        # The model's thread gives the writer the window as it hands the records over.
        got = []
        thread = mon.recorder.thread
        thread.put = lambda recs, quiet_until=0: got.append(quiet_until)  # type: ignore[method-assign]
        mon.writer.longest_ns = 10 ** 9
        t0 = time.perf_counter_ns()
        decode(m, mon, 3, 2)
        assert got and all(t0 + 8 * 10 ** 8 <= q <= time.perf_counter_ns() + 8 * 10 ** 8 for q in got)
        del thread.put


@needs_c
def test_program_of_a_template() -> None:
    """A template as the C writer runs it: its text in one piece (``%%`` as ``%``) and a
    table of (length, slot) ops; a literal past 64 KiB split across ops; a slot the C
    writer does not fill makes no program."""
    text, ops = templates.program('{"a":"50%%","t":%(ts)s,"d":%(d)s}\n')
    assert text == b'{"a":"50%","t":,"d":}\n'
    assert [(ops[i] | ops[i + 1] << 8, ops[i + 2]) for i in range(0, len(ops), 3)] == [
        (len(b'{"a":"50%","t":'), templates.SLOT_NUMBERS["ts"]), (len(b',"d":'), templates.SLOT_NUMBERS["d"]),
        (2, 255)]
    long = "x" * 70000
    text, ops = templates.program(long + "%(seq)s")
    assert text == long.encode()
    assert [(ops[i] | ops[i + 1] << 8, ops[i + 2]) for i in range(0, len(ops), 3)] == [
        (0xFFFF, 255), (70000 - 0xFFFF, templates.SLOT_NUMBERS["seq"]), (0, 255)]
    assert templates.program("%(unknown)s") is None


def test_cuda_timing_pairs_events(monkeypatch) -> None:
    """A module started with a CUDA event ends with a second one recorded then (the writer
    resolves the pair); without one its duration is the clock difference. The CUDA event
    maker (``_cuda.timing_event``'s bound form) is replaced: there is no GPU here."""
    recorded: List[Any] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.recorded = False

        def record(self) -> None:
            self.recorded = True
            recorded.append(self)

    def timing_event() -> Event:  # what _cuda.timing_event does through torch's C bindings
        ev = Event(enable_timing=True)
        ev.record()
        return ev

    monkeypatch.setattr(_cuda, "_timing_event", timing_event)
    assert wrappers.timing_of(100, 350, None) == 250 and recorded == []
    start = wrappers.cuda_event()
    pair = wrappers.timing_of(100, 350, start)
    assert pair[0] is start and isinstance(pair[1], Event) and pair[1].recorded and recorded == [start, pair[1]]
