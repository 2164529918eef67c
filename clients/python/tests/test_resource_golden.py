"""Golden resource-event files: testdata/resource_events/*.jsonl, written by the monitor's
own writer from the records of real models, with every value that changes from run to run
(clocks, durations, addresses, memory readings, versions) replaced by a fixed one before the
writer sees it.

Each file is one monitor session (``resource_session_start`` … ``resource_session_summary``)
as strapd would append it to ``{output_path}.resources.jsonl``. Every session is written
three ways — the C wrapper and C writer (``_speedups``), the Python wrapper and templates,
and the general wrappers and builders — and all three must give the file's bytes. The Go
readers of event lines test against these files.

Regenerate after an intended change of the events (and say why in the commit)::

    STRAP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest clients/python/tests/test_resource_golden.py
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from conftest import TESTDATA

from llm_instrumentation.resources import ResourceMonitor, native, records, system, writer
from llm_instrumentation.resources.records import Rec

GOLDEN = TESTDATA / "resource_events"
UPDATE = os.environ.get("STRAP_UPDATE_GOLDEN", "") not in ("", "0")

#: Unix time (ns) the fixed clock starts at: 2026-01-01T00:00:00Z.
WALL0 = 1_767_225_600_000_000_000
#: The wrappers' monotonic clock (ns) at the first record.
MONO0 = 5_000_000_000
#: Durations (ns) handed out in turn: zero (no throughputs), sub-microsecond, whole and
#: fractional microseconds, long.
DURATIONS = [37_615, 1_000, 999, 0, 1, 123_456, 1_010, 5, 250_000, 100_001, 48_128, 7_777_777]
RSS = 123_456_789
CUDA_MEM = {"device_memory_allocated_bytes": 1_000_000, "device_memory_reserved_bytes": 2_097_152,
            "device_memory_peak_bytes": 1_500_000, "memory_source": "torch.cuda.memory_stats"}


class ListSink:
    def __init__(self) -> None:
        self.lines: List[bytes] = []
        self.path = None

    def write(self, lines: List[bytes]) -> None:
        self.lines.extend(lines)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class CudaPair:
    """A resolved CUDA event pair as the writer reads one: ``start.elapsed_time(end)`` ms."""

    def __init__(self, ns: int) -> None:
        self.ms = ns / 1e6

    def query(self) -> bool:  # completed: the writer polls it (_cuda.wait_event)
        return True

    def elapsed_time(self, end: Any) -> float:
        return self.ms


class Fixed:
    """Replaces what changes from run to run in the records of one session."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.k = 0
        self.t = MONO0
        self.ptr = 0x7F00_0000_0000
        self.passes = 0
        # Records that read the clock once share that reading (a module's compute event,
        # its output allocation and KV-cache event): they share its replacement too.
        self.times: Dict[int, int] = {}

    def duration(self) -> Any:
        d = DURATIONS[self.k % len(DURATIONS)]
        self.k += 1
        return (CudaPair(d), CudaPair(d)) if self.gpu else d

    def tick(self) -> int:
        self.t += 10_000
        return self.t

    def at(self, t: int) -> int:
        """The fixed time of a reading of the wrappers' clock."""
        got = self.times.get(t)
        if got is None:
            got = self.times[t] = self.tick()
        return got

    def addr(self) -> int:
        self.ptr += 0x1000
        return self.ptr

    def mem(self) -> Dict[str, Any]:
        if self.gpu:
            return dict(CUDA_MEM)
        return {"process_rss_bytes": RSS + 4096 * self.passes, "memory_source": "proc_self_statm"}

    def cell(self, cell: List[Any]) -> List[Any]:
        cell[0] = self.mem()
        return cell

    def record(self, r: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """``r`` with its run-to-run values fixed, field by field (records.FIELDS)."""
        kind = r[0]
        f = dict(zip(records.FIELDS[kind], r[1:]))
        g = self.gpu
        if kind == Rec.BEGIN:
            self.passes += 1
            f["clock_offset"] = WALL0
        if "end" in f:
            f["end"] = self.at(f["end"])
        if "start" in f:
            f["start"] = self.at(f["start"])
        if "wall_ns" in f:
            f["wall_ns"] = WALL0 + self.tick()
        if "timing" in f:
            f["timing"] = self.duration()
        if "address" in f:
            f["address"] = self.addr()
        if "memory" in f:
            f["memory"] = self.mem() if kind == Rec.PARAMETERS else self.cell(f["memory"])
        if kind == Rec.ATTENTION_KV and f["allocation"] is not None:
            al = dict(zip(records.FIELDS[Rec.ALLOC], f["allocation"][1:]))
            al.update(end=f["end"], address=self.addr(), memory=self.cell(al["memory"]))
            f["allocation"] = (Rec.ALLOC,) + tuple(al.values())
        if kind == Rec.ELEMENTWISE:
            tm = f["tensor"]
            f["tensor"] = (tm[0], tm[1], tm[2], g)
            f["duration_ns"] = DURATIONS[self.k % len(DURATIONS)]
        if g:
            if "is_cuda" in f:
                f["is_cuda"] = True
            if kind == Rec.HANDOFF:
                f.update(memory_fraction=0.3125, fraction_source="cuda_allocated_over_total")
            if kind == Rec.ATTENTION:
                f.update(in_cuda=f["in_shape"] is not None, out_cuda=f["out_shape"] is not None)
            if kind in (Rec.ATTENTION, Rec.KV) and f["kv"] is not None:
                kv = f["kv"]
                f["kv"] = (kv[0], kv[1], True, kv[3], kv[4], kv[3] is not None)
            if kind == Rec.FORWARD:
                f["sm_utilization"] = 42.0
        if kind == Rec.PREBUILT:
            ev = dict(f["event"])
            ev["timestamp"] = (WALL0 + self.tick()) // 1000
            ev["iso_timestamp"] = "2026-01-01T00:00:00.000000+00:00"
            if ev["event"] == "resource_session_start":
                ev.update(torch_version="golden", pid=4242)
                if g:
                    ev.update(device="cuda:0", timing="cuda_event", nvml=True)
            else:
                ev.update(monitor_hook_us=1234.5, monitor_writer_cpu_us=2345.5)
                if not g:
                    ev.update(total_memory_bytes=RSS * 2, total_memory_mb=RSS * 2 / (1 << 20))
            f["event"] = ev
        out = (kind,) + tuple(f.values())
        records.check_record(out)
        return out


def golden_llama(vocab: int = 8200) -> torch.nn.Module:
    """A small Llama whose embedding and vocabulary projection pass 1 MiB (so MINIMAL has
    parameter and output allocations to report)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab)).eval()


def golden_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)).eval()


def decode(model: torch.nn.Module, mon: ResourceMonitor, prompt: int, new_tokens: int) -> None:
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(3))
    past = None
    with torch.no_grad():
        for step in range(new_tokens + 1):
            mon.set_step(step)
            r = model(input_ids=ids, cache=past, use_cache=True)
            past = r.cache
            ids = r.logits[:, -1:].argmax(-1)


#: The sessions: file name → (model, level, prompt tokens, decoding steps, on a GPU). Two
#: decoding steps at least: the writer makes a template the first time it sees a module and
#: input shape, the second decoding step is the first the C writer fills.
SESSIONS: Dict[str, Tuple[Callable[[], torch.nn.Module], str, int, int, bool]] = {
    "llama_minimal": (golden_llama, "MINIMAL", 32, 2, False),
    "llama_detailed": (golden_llama, "DETAILED", 32, 2, False),
    "llama_verbose": (lambda: golden_llama(128), "VERBOSE", 4, 2, False),
    "gpt2_detailed": (golden_gpt2, "DETAILED", 4, 2, False),
    "llama_detailed_gpu": (lambda: golden_llama(128), "DETAILED", 4, 2, True),
}

#: How a session is written: the C wrapper and writer; the Python wrapper and templates; the
#: general wrappers and builders.
WAYS = ("c", "python", "general")


def write_session(name: str, way: str, monkeypatch: pytest.MonkeyPatch) -> bytes:
    make, level, prompt, steps, gpu = SESSIONS[name]
    model = make()
    rendered: List[int] = []
    cuda_rendered: List[int] = []
    if way != "c":
        monkeypatch.setattr(native, "TimedForward", None)
        monkeypatch.setattr(native, "render", None)
    elif native.render is None or native.TimedForward is None:
        pytest.skip("llm_instrumentation.resources._native is not built")
    else:
        render = native.render

        def counting(state: Any, recs: List[Any], i: int, *rest: Any) -> int:
            j = render(state, recs, i, *rest)
            rendered.append(j - i)
            # The records it took timed by CUDA events (C resolved each pair to its µs).
            cuda_rendered.extend(r[0] for r in recs[i:j] if type(r[records.TIMING]) is tuple)
            return j

        monkeypatch.setattr(native, "render", counting)
    monkeypatch.setattr(system, "host_memory_fraction", lambda: 0.625)
    if gpu:
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 1_400_000)
    fixed = Fixed(gpu)
    sink = ListSink()
    mon = ResourceMonitor(model, level, sink=sink, session_id=f"resource_sess_golden_{name}", environ={},
                          flush_interval=None, flush_events=1 << 30)
    # On a GPU every module goes through the general wrappers (CUDA events); the writer
    # still takes its fast paths where it has them.
    mon.fast = way != "general" and not gpu
    mon.writer.lines.fast = way != "general"

    def put(thread: Any, recs: List[Any], quiet_until: int = 0) -> None:
        # The writer runs here, on the model's thread, over the fixed records: the lines
        # come out in order and nothing depends on the writer thread's timing. The events
        # say gpu_ as a GPU's would (start() sets the state from the model's device: the CPU).
        mon.writer.state.cuda = gpu
        mon.writer.write_batch([fixed.record(r) for r in recs])

    monkeypatch.setattr(writer.WriterThread, "put", put)
    mon.start()
    try:
        decode(model, mon, prompt, steps)
    finally:
        mon.close()
    monkeypatch.undo()
    if way == "c":
        # The C writer wrote lines of its own (the records it knows, once their templates exist).
        assert sum(rendered) > 10, f"{name}: the C writer took {sum(rendered)} records"
        # On a GPU: the CUDA-timed ones among them (the last decoding step's).
        assert set(cuda_rendered) == ({Rec.LINEAR, Rec.MODULE, Rec.HANDOFF, Rec.ATTENTION} if gpu else set()), \
            cuda_rendered
    return b"".join(sink.lines)


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_golden_resource_events(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = GOLDEN / f"{name}.jsonl"
    outs: Dict[str, bytes] = {}
    for way in WAYS:
        with monkeypatch.context() as mp:
            try:
                outs[way] = write_session(name, way, mp)
            except pytest.skip.Exception:
                if way != "c":
                    raise
    base = outs["python"]
    for way, got in outs.items():
        assert got == base, f"{name}: the {way} writer's lines differ from the Python writer's"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base)
    want = path.read_bytes() if path.exists() else b""
    assert want, f"{path} is missing: STRAP_UPDATE_GOLDEN=1 writes it"
    if base != want:
        got_lines, want_lines = base.splitlines(), want.splitlines()
        first: Optional[int] = next((i for i, (a, b) in enumerate(zip(got_lines, want_lines)) if a != b), None)
        where = f"line {first + 1}:\n got  {got_lines[first]!r}\n want {want_lines[first]!r}" if first is not None \
            else f"{len(got_lines)} lines written, {len(want_lines)} in the file"
        pytest.fail(f"{path.name} is not what the writer writes now ({where}); if the change is intended, "
                    "STRAP_UPDATE_GOLDEN=1 rewrites it")


def test_golden_files_cover_every_event_type_and_level() -> None:
    """Every event type RESOURCE_EVENTS.md lists, every level, both devices."""
    import json

    seen_events, seen_levels, sources = set(), set(), set()
    for name in SESSIONS:
        for line in (GOLDEN / f"{name}.jsonl").read_bytes().splitlines():
            ev = json.loads(line)
            seen_events.add(ev["event"])
            if ev["event"] == "resource_session_start":
                seen_levels.add(ev["level"])
            if "duration_source" in ev:
                sources.add(ev["duration_source"])
            if ev["event"] == "compute_execution":
                seen_events.add("compute_execution/" + ev["operation"])
    for want in ("resource_session_start", "resource_session_summary", "compute_execution", "memory_allocation",
                 "mlp_operation", "component_handoff", "kv_cache_update", "compute_execution/mul_mat",
                 "compute_execution/attention", "compute_execution/norm", "compute_execution/activation",
                 "compute_execution/embedding", "compute_execution/model_forward", "compute_execution/add"):
        assert want in seen_events, want
    assert seen_levels == {"MINIMAL", "DETAILED", "VERBOSE"}
    assert sources == {"perf_counter", "cuda_event"}
