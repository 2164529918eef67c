"""The resource writer's CUDA-timed records: each CUDA event pair is resolved to the µs it
measured (its end event waited for), and the record written through the templates as a
host-timed one is (the C writer for LINEAR, MODULE, HANDOFF and ATTENTION, the Python
templates for FORWARD), byte for byte what the builders write from the pair. There is no GPU
here: the event pairs are stand-ins with the methods the writer calls (``query``,
``elapsed_time``), each end event incomplete at its first query; the records are those of a
real model's decoding, recorded by the general wrappers a GPU's modules get."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from conftest import generate_with_monitor as decode
from conftest import tiny_llama
from conftest import write_batches
from conftest import writer_state_same as same

from llm_instrumentation.resources import ResourceMonitor, native, writer
from llm_instrumentation.resources.records import CUDA_TIMED, TIMING, Rec

#: CUDA-measured durations (ms, as ``elapsed_time`` gives them), handed out in turn: zero,
#: sub-microsecond, fractions that print with 16-17 digits, long, negative (events on two
#: streams), and the two that are not finite.
DURATIONS_MS = [0.0, 1e-06, 0.0005, 0.001, 0.0123456789, 0.037615, 1.0, 3.3333333333333335, 250.0, 0.1,
                -0.0015, 12345.678, 0.000999, 7.0e-4]
NOT_FINITE_MS = [math.nan, math.inf, -math.inf]
CUDA_MEM = {"device_memory_allocated_bytes": 1_000_000, "device_memory_reserved_bytes": 2_097_152,
            "device_memory_peak_bytes": 1_500_000, "memory_source": "torch.cuda.memory_stats"}
#: What the builders make the events of CUDA-timed records with (Lines' fast paths call them
#: only to make a template).
BUILDERS = ("linear", "module", "handoff", "attention", "forward", "kv")


class Start:
    """The start event of a pair: ``elapsed_time(end)`` in ms (counted)."""

    def __init__(self, ms: float, calls: List[int]) -> None:
        self.ms = ms
        self.calls = calls

    def elapsed_time(self, end: "End") -> float:
        assert isinstance(end, End) and end.done
        self.calls.append(1)
        return self.ms


class End:
    """The end event: complete at its third query. The C writer asks once each time it comes
    to the record: it stops at the record twice before the writer waits for the event
    (_cuda.wait_event), and then writes it."""

    def __init__(self) -> None:
        self.queries = 0

    @property
    def done(self) -> bool:
        return self.queries > 2

    def query(self) -> bool:
        self.queries += 1
        return self.done


def recorded(tmp_path: Path, level: str) -> Tuple[ResourceMonitor, List[List[Any]]]:
    """A monitor whose modules have the general wrappers (a GPU's), and the batches its writer
    would get for a prefill and four decoding steps."""
    m = tiny_llama()
    mon = ResourceMonitor(m, level, tmp_path / "r.jsonl", environ={}, flush_interval=None)
    mon.recorder.fast = False  # the general wrappers, as on a GPU; the writer keeps its fast paths
    batches: List[List[Any]] = []
    mon.start()
    mon.flush()
    thread = mon.recorder.thread
    thread.put = lambda recs, *rest: batches.append(list(recs))  # type: ignore[method-assign]
    decode(m, mon, 6, 4)
    mon.recorder.hand_off()
    del thread.put
    return mon, batches


def on_a_gpu(batches: List[List[Any]], durations: List[float], calls: List[int]) -> List[List[Any]]:
    """The batches as a GPU's: every timing a CUDA event pair (of ``durations`` in turn), the
    memory readings the allocator's, the handoffs' memory use the device's, NVML's SM use."""
    out, k = [], 0
    cells: Dict[int, List[Any]] = {}
    for b in batches:
        nb = []
        for r in b:
            r = list(r)
            kind = r[0]
            if kind in CUDA_TIMED:
                r[TIMING] = (Start(durations[k % len(durations)], calls), End())
                k += 1
            if kind == Rec.HANDOFF:
                r[6], r[7], r[8] = True, 0.3125, "cuda_allocated_over_total"
            if kind in (Rec.ALLOC, Rec.FORWARD):
                cell = r[-1] if kind == Rec.ALLOC else r[7]
                # A pass's records share one cell: so do their stand-ins.
                cells.setdefault(id(cell), [dict(CUDA_MEM)])
                if kind == Rec.ALLOC:
                    r[-1] = cells[id(cell)]
                    r[7] = True
                else:
                    r[7] = cells[id(cell)]
            if kind == Rec.FORWARD:
                r[8] = 42.0
            nb.append(tuple(r))
        out.append(nb)
    assert k >= len(durations)
    return out


def write_all(mon: ResourceMonitor, batches: List[List[Any]], state: Dict[str, Any], keep: bool) -> Any:
    """The writer's lines and end state (what two runs must agree on) over the batches."""
    lines, end = write_batches(mon, batches, state, keep)
    return lines, same(end)


def counting_builders(mon: ResourceMonitor, monkeypatch: pytest.MonkeyPatch) -> Dict[str, int]:
    """Count the calls of the builders of CUDA-timed records' events."""
    calls: Dict[str, int] = {}
    build = mon.writer.lines.build
    for name in BUILDERS:
        fn = getattr(build, name)

        def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*a, **k)

        monkeypatch.setattr(build, name, counted)
    return calls


@pytest.mark.parametrize("level", ["MINIMAL", "DETAILED"])
@pytest.mark.parametrize("way", ["c", "python"])
def test_cuda_timed_records_take_the_templates_and_write_the_builders_bytes(tmp_path: Path, monkeypatch, level: str,
                                                                           way: str) -> None:
    if way == "c" and not native.available():
        pytest.skip("llm_instrumentation.resources._native is not built")
    mon, host = recorded(tmp_path, level)
    try:
        mon.writer.state.cuda = True
        resolved: List[int] = []
        batches = on_a_gpu(host, DURATIONS_MS, resolved)
        pairs = sum(1 for b in batches for r in b if type(r[TIMING] if len(r) > TIMING else 0) is tuple)
        kinds = {Rec(r[0]) for b in batches for r in b if r[0] in CUDA_TIMED}
        want = {Rec.LINEAR, Rec.ATTENTION, Rec.FORWARD} | ({Rec.MODULE, Rec.HANDOFF} if level == "DETAILED" else set())
        assert kinds >= want, kinds
        in_c_kinds = {Rec.LINEAR, Rec.ATTENTION} | ({Rec.MODULE, Rec.HANDOFF} if level == "DETAILED" else set())
        state = mon.writer.state.snapshot()
        mon.fast = False  # the builders, every pair resolved by set_timing
        lines_g, state_g = write_all(mon, batches, state, keep=False)
        assert len(resolved) == pairs
        mon.fast = True
        waits: List[Any] = []
        wait_event = writer.wait_event
        monkeypatch.setattr(writer, "wait_event", lambda ev: (waits.append(ev), wait_event(ev)))
        if way == "python":
            monkeypatch.setattr(native, "render", None)
        render = native.render
        by_c: List[Any] = []

        def counting(st: Any, recs: List[Any], i: int, lines: List[bytes], deadline: int) -> int:
            j = render(st, recs, i, lines, deadline)
            by_c.extend(r for r in recs[i:j])
            return j

        if render is not None:
            monkeypatch.setattr(native, "render", counting)
        resolved.clear()
        # Fresh pairs for each run: every end event incomplete at first.
        lines_1, state_1 = write_all(mon, on_a_gpu(host, DURATIONS_MS, resolved), state, keep=False)  # the templates
        # (C resolves a pair before it finds no template made: Python resolves it again.)
        assert len(resolved) >= pairs
        calls = counting_builders(mon, monkeypatch)
        by_c.clear()
        waits.clear()
        resolved.clear()
        lines_2, state_2 = write_all(mon, on_a_gpu(host, DURATIONS_MS, resolved), state, keep=True)  # all made
        assert len(resolved) == pairs, "each pair resolved once"
        monkeypatch.undo()
    finally:
        mon.close()
    for got in (lines_1, lines_2):
        assert len(got) == len(lines_g)
        for a, b in zip(got, lines_g):
            assert a == b
    assert state_1 == state_g and state_2 == state_g
    events = [json.loads(x) for x in lines_g]
    timed = [e for e in events if "duration_source" in e and e["event"] != "mlp_operation"]
    assert len(timed) == pairs and {e["duration_source"] for e in timed} == {"cuda_event"}
    # No builder ran once the templates were made: every CUDA-timed record was templated.
    assert calls == {}, calls
    if way == "c":
        # ... and the C writer wrote every record of the kinds it renders, each after the
        # writer waited for its end event (incomplete when C first asked).
        want_c = sorted(Rec(r[0]) for b in batches for r in b if r[0] in in_c_kinds)
        assert sorted(Rec(r[0]) for r in by_c if type(r[TIMING]) is tuple) == want_c
        assert len(waits) == len(want_c) and all(isinstance(ev, End) for ev in waits)
        # The KV-cache records of the general attention wrapper too (no timing of their own).
        n_kv = sum(1 for b in batches for r in b if r[0] == Rec.KV)
        assert n_kv >= 10 and sum(1 for r in by_c if r[0] == Rec.KV) == n_kv


def test_durations_that_are_not_finite_are_the_builders(tmp_path: Path, monkeypatch) -> None:
    """A NaN or infinite duration (JSON writes NaN/Infinity, a template would write nan/inf)
    is built the general way, and still the same bytes."""
    mon, host = recorded(tmp_path, "DETAILED")
    try:
        mon.writer.state.cuda = True
        durations = DURATIONS_MS[:3] + NOT_FINITE_MS
        state = mon.writer.state.snapshot()
        mon.fast = False
        lines_g, state_g = write_all(mon, on_a_gpu(host, durations, []), state, keep=False)
        mon.fast = True
        write_all(mon, on_a_gpu(host, durations, []), state, keep=False)
        calls = counting_builders(mon, monkeypatch)
        lines_f, state_f = write_all(mon, on_a_gpu(host, durations, []), state, keep=True)
        monkeypatch.undo()
    finally:
        mon.close()
    assert lines_f == lines_g and state_f == state_g
    assert any(b'"duration_us":NaN' in x for x in lines_f) and any(b'"duration_us":Infinity' in x for x in lines_f)
    assert not any(b"nan" in x or b"inf," in x for x in lines_f)
    # Only the records whose duration is not finite went to the builders.
    n_bad = sum(1 for x in lines_g if b'"duration_us":NaN' in x or b'"duration_us":Infinity' in x
                or b'"duration_us":-Infinity' in x)
    assert 0 < sum(calls.values()) <= n_bad


def test_a_host_timed_template_is_not_a_cuda_timed_ones(tmp_path: Path) -> None:
    """The same module and shapes timed on the host, then by CUDA events, then on the host
    again, templates kept throughout: each line says the clock it was measured by, as the
    builders write it (the template keys tell the two apart: records.KEYS' cuda_timed)."""
    mon, host = recorded(tmp_path, "DETAILED")
    try:
        resolved: List[int] = []
        gpu = on_a_gpu(host, DURATIONS_MS, resolved)
        # The host records with the GPU's memory readings and handoff figures: only the clock differs.
        host = [[r[:TIMING] + (int(round(abs(g[TIMING][0].ms) * 1e6)),) + g[TIMING + 1:]
                 if r[0] in CUDA_TIMED else g for r, g in zip(b, gb)] for b, gb in zip(host, gpu)]
        state = mon.writer.state.snapshot()
        seq = [host, gpu, host]
        mon.fast = False
        want = [write_all(mon, bs, state, keep=False) for bs in seq]
        mon.fast = True
        mon.writer.state.templates = {}
        got = [write_all(mon, bs, state, keep=True) for bs in seq]
    finally:
        mon.close()
    for (lg, sg), (lw, sw) in zip(got, want):
        assert lg == lw and sg == sw
    sources = [{json.loads(x).get("duration_source") for x in lw} - {None} for lw, _ in want]
    assert sources == [{"perf_counter"}, {"cuda_event"}, {"perf_counter"}]


def test_writer_leaves_the_callers_records_as_they_were(tmp_path: Path) -> None:
    """The writer changes no record it is given (the pairs stay pairs)."""
    mon, host = recorded(tmp_path, "MINIMAL")
    try:
        mon.writer.state.cuda = True
        batches = on_a_gpu(host, DURATIONS_MS, [])
        before = [list(b) for b in batches]
        for b in batches:
            mon.writer.write_batch(b)
    finally:
        mon.close()
    assert batches == before


@pytest.mark.skipif(not native.available(), reason="llm_instrumentation.resources._native is not built")
def test_an_error_of_an_event_is_raised_not_dropped(tmp_path: Path) -> None:
    """A pair whose event fails (a CUDA error) fails the batch in C as in the builders."""
    mon, host = recorded(tmp_path, "MINIMAL")

    class Broken(End):
        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    try:
        mon.writer.state.cuda = True
        for b in on_a_gpu(host, DURATIONS_MS, []):
            mon.writer.write_batch(b)  # the templates
        last = on_a_gpu(host, DURATIONS_MS, [])[-1]
        i = next(i for i, r in enumerate(last) if r[0] == Rec.LINEAR)
        last[i] = last[i][:TIMING] + ((last[i][TIMING][0], Broken()),) + last[i][TIMING + 1:]
        with pytest.raises(RuntimeError, match="illegal memory access"):
            native.render(mon.writer.state, last, i, [], 1 << 62)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            mon.writer.write_batch(last)
    finally:
        mon.close()
