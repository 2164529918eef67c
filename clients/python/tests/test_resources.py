"""Resource events: fields and units against hand-computed values on tiny models, levels,
environment variables and run-time control (standalone JSONL mode, no daemon)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from conftest import generate_with_monitor as generate
from conftest import tiny_llama

from llm_instrumentation.resources.records import Rec
from llm_instrumentation.resources import (
    MINIMAL_ALLOCATION_BYTES,
    ResourceLevel,
    ResourceMonitor,
    monitor_resources,
    resource_settings_from_env,
)


def read(path: Path) -> List[Dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def of(events: List[Dict[str, Any]], kind: str, **match: Any) -> List[Dict[str, Any]]:
    return [e for e in events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(64, 32)
        self.big = nn.Linear(32, 1024, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.big(self.small(x))


class SlowModel(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.slow = SlowLinear(8, 8, seconds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.slow(x)


class SlowLinear(nn.Linear):
    def __init__(self, i: int, o: int, seconds: float) -> None:
        super().__init__(i, o)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return super().forward(x)


def test_linear_flops_bytes_and_allocation_threshold(tmp_path):
    torch.manual_seed(0)
    m = TwoLinear().eval()
    x = torch.randn(2, 8, 64)
    with monitor_resources(m, "MINIMAL", tmp_path / "r.jsonl") as mon:
        with torch.no_grad():
            m(x)
    ev = read(tmp_path / "r.jsonl")
    small = of(ev, "compute_execution", module="small")[0]
    # 16 rows × 64 in × 32 out, one multiply and one add each.
    assert small["flops"] == 2 * 16 * 64 * 32 == 65536
    assert small["flops_source"] == "computed_from_shapes"
    assert small["operation"] == "mul_mat" and small["output_shape"] == [2, 8, 32]
    assert small["input_tensors"][0]["shape"] == [2, 8, 64] and small["input_tensors"][1]["shape"] == [32, 64]
    assert small["bytes_accessed"] == 2 * 8 * 64 * 4 + (32 * 64 + 32) * 4 + 2 * 8 * 32 * 4
    assert small["duration_source"] == "perf_counter" and small["duration_us"] > 0
    assert small["throughput_gflops_per_s"] == pytest.approx(65536 / (small["duration_us"] * 1e3))
    big = of(ev, "compute_execution", module="big")[0]
    assert big["flops"] == 2 * 16 * 32 * 1024
    # MINIMAL: only the big output (16×1024×4 = 64 KiB) ... is below 1 MiB too, so no
    # module-output allocation; parameters: none over 1 MiB either.
    assert of(ev, "memory_allocation") == []
    fwd = of(ev, "compute_execution", operation="model_forward")[0]
    assert fwd["flops"] == small["flops"] + big["flops"] and fwd["flops_source"] == "sum_of_recorded_ops"
    summary = ev[-1]
    assert summary["event"] == "resource_session_summary" and summary["total_compute_flops"] == 65536 + 2 * 16 * 32 * 1024
    assert summary["parameter_bytes"] == (32 * 64 + 32 + 1024 * 32) * 4
    assert ev[0]["event"] == "resource_session_start" and ev[0]["level"] == "MINIMAL"

    # A batch large enough that the big output passes 1 MiB: 64×8×1024×4 = 2 MiB.
    x = torch.randn(64, 8, 64)
    with monitor_resources(m, "MINIMAL", tmp_path / "r2.jsonl"):
        with torch.no_grad():
            m(x)
    allocs = of(read(tmp_path / "r2.jsonl"), "memory_allocation")
    assert [a["module"] for a in allocs] == ["big"]
    a = allocs[0]
    assert a["allocation_size_bytes"] == 64 * 8 * 1024 * 4 > MINIMAL_ALLOCATION_BYTES
    assert a["allocation_size_mb"] == pytest.approx(2.0) and a["tensor_shape"] == [64, 8, 1024]
    assert a["memory_type"] == "host" and a["precision"] == "f32" and a["process_rss_bytes"] > 0
    # DETAILED reports every allocation: both outputs and both parameter sets.
    with monitor_resources(m, "DETAILED", tmp_path / "r3.jsonl"):
        with torch.no_grad():
            m(torch.randn(2, 8, 64))
    allocs = of(read(tmp_path / "r3.jsonl"), "memory_allocation")
    kinds = sorted((a["module"], a["allocation_kind"]) for a in allocs)
    assert kinds == [("big", "module_output"), ("big", "parameters"), ("small", "module_output"),
                     ("small", "parameters")]
    params = {a["module"]: a["allocation_size_bytes"] for a in allocs if a["allocation_kind"] == "parameters"}
    assert params == {"small": (32 * 64 + 32) * 4, "big": 1024 * 32 * 4}


def test_sleep_shows_as_duration(tmp_path):
    m = SlowModel(0.05).eval()
    with monitor_resources(m, "MINIMAL", tmp_path / "r.jsonl"):
        with torch.no_grad():
            for _ in range(3):
                m(torch.randn(1, 8))
    ev = read(tmp_path / "r.jsonl")
    slow = of(ev, "compute_execution", module="slow")
    assert len(slow) == 3
    for e in slow:
        # The module sleeps 50 ms: the measured duration is at least that, and not much more.
        assert 50_000 <= e["duration_us"] < 50_000 + 40_000, e["duration_us"]
    for e in of(ev, "compute_execution", operation="model_forward"):
        assert e["duration_us"] >= 50_000


def test_llama_kv_cache_mlp_attention_handoff(tmp_path):
    m = tiny_llama()
    cfg = m.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads  # 32
    with monitor_resources(m, "DETAILED", tmp_path / "r.jsonl") as mon:
        generate(m, mon, prompt_len=5, new_tokens=3)
    ev = read(tmp_path / "r.jsonl")
    kv = of(ev, "kv_cache_update")
    assert len(kv) == cfg.num_hidden_layers * 4
    last = [e for e in kv if e["forward"] == 3]
    assert len(last) == cfg.num_hidden_layers
    # After 5 + 3 tokens: keys and values of (1 batch × 4 kv heads × 8 tokens × 32) f32.
    want = 2 * 1 * cfg.num_key_value_heads * 8 * head_dim * 4
    for e in last:
        assert e["cache_length_tokens"] == 8 and e["cache_bytes"] == want == 8192
        assert e["bytes_per_token"] == 1024 and e["growth_bytes"] == 1024
        assert e["reused_tokens"] == 7 and e["new_tokens"] == 1 and e["cache_hit_ratio"] == pytest.approx(7 / 8)
        assert e["step"] == 3 and e["key_shape"] == [1, 4, 8, 32]
    first = [e for e in kv if e["forward"] == 0]
    assert all(e["cache_length_tokens"] == 5 and e["reused_tokens"] == 0 and e["growth_bytes"] == 5120 for e in first)

    att = of(ev, "compute_execution", operation="attention", forward=3, layer_id=2)[0]
    # One query token against 8 keys, 8 heads of 32: 4·B·H·Sq·Skv·D.
    assert att["flops"] == 4 * 1 * 8 * 1 * 8 * 32 and att["key_tokens"] == 8 and att["query_tokens"] == 1

    mlp = {e["mlp_operation"]: e for e in of(ev, "mlp_operation", forward=0, layer_id=1)}
    assert set(mlp) == {"gate_proj", "up_proj", "down_proj"}
    g = mlp["gate_proj"]
    assert g["weight_shape"] == [688, 256] and g["activation_shape"] == [1, 5, 688]
    assert g["intermediate_dim"] == 688 and g["intermediate_size_bytes"] == 5 * 688 * 4
    assert g["activation_memory_peak_bytes"] == 5 * 256 * 4 + 5 * 688 * 4 and g["activation_function"] == "silu"
    d = mlp["down_proj"]
    assert d["weight_shape"] == [256, 688] and d["intermediate_size_bytes"] == 5 * 688 * 4
    assert d["flops"] == 2 * 5 * 688 * 256

    ho = of(ev, "component_handoff", forward=0)
    assert len(ho) == cfg.num_hidden_layers
    for h in ho:
        assert h["from_component"] == "attention" and h["to_component"] == "mlp"
        assert h["data_size_bytes"] == 5 * 256 * 4 and h["duration_us"] > 0
        assert h["transfer_bandwidth_gbps"] == pytest.approx(h["data_size_bytes"] / (h["duration_us"] * 1e3))
        assert h["memory_pressure"] in ("low", "medium", "high")
    steps = {e["step"] for e in ev if "step" in e}
    assert steps == {0, 1, 2, 3}


def test_levels_filter(tmp_path):
    m = tiny_llama()
    ops = {}
    for lv in ("MINIMAL", "DETAILED", "VERBOSE"):
        p = tmp_path / f"{lv}.jsonl"
        with monitor_resources(m, lv, p):
            with torch.no_grad():
                m(torch.randint(0, 1024, (1, 6)))
        ev = read(p)
        ops[lv] = {e["operation"] for e in of(ev, "compute_execution")}
        ops[lv + "_kinds"] = {e["event"] for e in ev}
    assert ops["MINIMAL"] == {"mul_mat", "attention", "model_forward"}
    assert "component_handoff" not in ops["MINIMAL_kinds"]
    assert {"norm", "activation", "embedding"} <= ops["DETAILED"] and "add" not in ops["DETAILED"]
    assert "component_handoff" in ops["DETAILED_kinds"]
    assert {"add", "mul"} <= ops["VERBOSE"] and ops["DETAILED"] <= ops["VERBOSE"]


def test_env_settings_and_aliases():
    s = resource_settings_from_env({})
    assert s.level is None and s.path is None and not s.disabled
    s = resource_settings_from_env({"LLAMA_RESOURCE_LOG_LEVEL": "verbose", "LLAMA_RESOURCE_LOG_PATH": "/x.jsonl",
                                    "LLAMA_RESOURCE_DISABLED": "1"})
    assert s.level is ResourceLevel.VERBOSE and s.path == "/x.jsonl" and s.disabled
    s = resource_settings_from_env({"STRAP_RESOURCE_LOG_LEVEL": "DETAILED", "LLAMA_RESOURCE_LOG_LEVEL": "VERBOSE",
                                    "STRAP_RESOURCE_LOG_DISABLED": "false", "LLAMA_RESOURCE_DISABLED": "1"})
    assert s.level is ResourceLevel.DETAILED and not s.disabled
    with pytest.raises(ValueError, match="STRAP_RESOURCE_LOG_LEVEL.*MINIMAL, DETAILED, VERBOSE"):
        resource_settings_from_env({"STRAP_RESOURCE_LOG_LEVEL": "LOUD"})
    with pytest.raises(ValueError, match="LLAMA_RESOURCE_DISABLED"):
        resource_settings_from_env({"LLAMA_RESOURCE_DISABLED": "maybe"})
    with pytest.raises(ValueError):
        ResourceLevel.parse(7)


def test_env_drives_the_monitor(tmp_path, monkeypatch):
    m = TwoLinear().eval()
    p = tmp_path / "env.jsonl"
    monkeypatch.setenv("STRAP_RESOURCE_LOG_PATH", str(p))
    monkeypatch.setenv("LLAMA_RESOURCE_LOG_LEVEL", "DETAILED")
    with monitor_resources(m) as mon:
        assert mon.level is ResourceLevel.DETAILED and mon.path == str(p)
        with torch.no_grad():
            m(torch.randn(1, 64))
    assert of(read(p), "memory_allocation")  # DETAILED: every allocation
    monkeypatch.setenv("STRAP_RESOURCE_LOG_DISABLED", "yes")
    with monitor_resources(m) as mon:
        assert not mon.enabled
        with torch.no_grad():
            m(torch.randn(1, 64))
    ev = read(p)
    assert [e["event"] for e in ev] == ["resource_session_start", "resource_session_summary"]
    assert ev[0]["enabled"] is False
    monkeypatch.delenv("STRAP_RESOURCE_LOG_PATH")
    with pytest.raises(ValueError, match="path"):
        ResourceMonitor(m)


def test_runtime_control(tmp_path):
    m = tiny_llama()
    p = tmp_path / "rt.jsonl"
    x = torch.randint(0, 1024, (1, 4))
    mon = ResourceMonitor(m, "MINIMAL", p, flush_events=100000, flush_interval=None).start()
    with torch.no_grad():
        m(x)                              # forward 0, MINIMAL
        assert [e["event"] for e in read(p)] == ["resource_session_start"], "nothing written before flush"
        mon.flush()
        assert len(read(p)) > 1, "flush writes the recorded events"
        mon.set_level("DETAILED")
        m(x)                              # forward 1, DETAILED
        mon.disable()
        m(x)                              # not recorded
        mon.enable()
        mon.set_level(ResourceLevel.MINIMAL)
        m(x)                              # forward 2, MINIMAL
    mon.close()
    ev = read(p)
    fwd = [e["forward"] for e in of(ev, "compute_execution", operation="model_forward")]
    assert fwd == [0, 1, 2]
    norms = {e["forward"] for e in of(ev, "compute_execution", operation="norm")}
    assert norms == {1}
    assert ev[-1]["forwards"] == 3
    # Hooks are gone after close.
    with torch.no_grad():
        m(x)
    assert len(read(p)) == len(ev)


def test_session_sink_batches_into_messages():
    from conftest import sent_resources

    lines = [json.dumps({"event": "e", "i": i, "pad": "x" * 3000}).encode() + b"\n" for i in range(50)]
    sent = sent_resources(lines)
    assert len(sent) > 1 and all(len(b) <= 65536 for b in sent)
    got = [ev for b in sent for ev in json.loads(b[12:])["events"]]
    assert [e["i"] for e in got] == list(range(50))
    with pytest.raises(ValueError, match="does not fit"):
        sent_resources([json.dumps({"event": "e", "pad": "x" * 70000}).encode() + b"\n"])
    with pytest.raises(ValueError, match="event"):
        sent_resources([b'{"i": 1}\n'])  # not an event


def test_write_errors_surface_and_self_cost_is_reported(tmp_path):
    class Broken:
        path = None

        def write(self, lines):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

        def close(self):
            pass

    m = TwoLinear().eval()
    with pytest.raises(RuntimeError, match="resource events could not be written.*No space"):
        ResourceMonitor(m, "MINIMAL", sink=Broken(), environ={}).start()
    with monitor_resources(m, "MINIMAL", tmp_path / "ok.jsonl", environ={}) as mon:
        with torch.no_grad():
            m(torch.randn(4, 64))
    s = read(tmp_path / "ok.jsonl")[-1]
    assert s["monitor_hook_us"] > 0 and s["monitor_writer_cpu_us"] > 0


def test_unclosed_monitor_is_closed_at_exit(tmp_path):
    """A script that starts a monitor and never closes it still leaves a complete log."""
    import subprocess
    import sys

    p = tmp_path / "exit.jsonl"
    code = ("import torch, torch.nn as nn\n"
            "from llm_instrumentation.resources import ResourceMonitor\n"
            "m = nn.Sequential(nn.Linear(8, 8)).eval()\n"
            f"mon = ResourceMonitor(m, 'MINIMAL', {str(p)!r}, environ={{}}, flush_interval=None).start()\n"
            "with torch.no_grad():\n    m(torch.randn(2, 8))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": __import__("os").pathsep.join(sys.path)})
    assert res.returncode == 0, res.stderr
    ev = read(p)
    assert ev[-1]["event"] == "resource_session_summary" and ev[-1]["forwards"] == 1
    assert [e["module"] for e in ev if e["event"] == "compute_execution"] == ["0", ""]


def test_torch_multihead_attention_seq_first(tmp_path):
    """nn.TransformerEncoderLayer (nn.MultiheadAttention, sequence first): the attention
    event counts 4·B·H·S·S·D with the batch and sequence read from the right axes."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0).eval()
    x = torch.randn(10, 3, 32)  # (seq, batch, embed)
    with monitor_resources(layer, "MINIMAL", tmp_path / "t.jsonl", environ={}):
        with torch.no_grad():
            layer(x)
    att = of(read(tmp_path / "t.jsonl"), "compute_execution", operation="attention")
    assert len(att) == 1
    assert att[0]["query_tokens"] == 10 and att[0]["key_tokens"] == 10
    assert att[0]["flops"] == 4 * 3 * 4 * 10 * 10 * 8


def test_forward_wrappers_are_removed_and_keep_the_signature(tmp_path):
    import inspect

    m = TwoLinear().eval()
    sig = inspect.signature(m.small.forward)
    mon = ResourceMonitor(m, "MINIMAL", tmp_path / "w.jsonl", environ={}).start()
    # Linear modules are timed through a wrapper of their forward, not hooks.
    assert "forward" in m.small.__dict__ and not m.small._forward_hooks
    assert inspect.signature(m.small.forward) == sig
    mon.disable()
    assert "forward" not in m.small.__dict__ and "forward" not in m.big.__dict__
    mon.enable()
    # Something else wraps the forward after the monitor: closing must leave its wrapper
    # working (the monitor's only passes the call on) and record nothing more.
    inner = m.big.forward
    calls = []

    def outer(*a, **k):
        calls.append(1)
        return inner(*a, **k)

    m.big.forward = outer
    with torch.no_grad():
        m(torch.randn(2, 8, 64))
    summary = mon.close()
    assert summary["events"]["compute_execution"] == 3  # small, big, model_forward
    assert "forward" not in m.small.__dict__ and m.big.__dict__["forward"] is outer
    n = len(read(tmp_path / "w.jsonl"))
    with torch.no_grad():
        y = m(torch.randn(2, 8, 64))
    assert y.shape == (2, 8, 1024) and len(calls) == 2
    assert len(read(tmp_path / "w.jsonl")) == n


def test_copies_of_a_wrapped_module_run_their_own_weights(tmp_path):
    import copy
    import pickle

    m = TwoLinear().eval()
    x = torch.randn(2, 8, 64)
    with monitor_resources(m, "MINIMAL", tmp_path / "c.jsonl", environ={}):
        assert "forward" in m.small.__dict__
        for twin in (copy.deepcopy(m.small), pickle.loads(pickle.dumps(m.small))):
            with torch.no_grad():
                twin.weight.add_(1.0)
                want = nn.functional.linear(x, twin.weight, twin.bias)
                assert torch.allclose(twin(x), want), "the copy ran the original's weights"
                assert not torch.allclose(m.small(x), want)


def test_templates_write_what_the_builders_write(tmp_path):
    """The fast path — the CPU wrapper that records only shapes, dtypes and clock readings,
    and the writer's templates (one per module and input shape) — against the general
    wrapper and builders: the same events, fields and order at every level, but for what
    changes from run to run."""
    volatile = {"timestamp", "resource_id", "compute_resource_id", "session_id", "iso_timestamp", "pid",
                "duration_us", "throughput_gflops_per_s", "memory_throughput_gbps", "transfer_bandwidth_gbps",
                "memory_address", "process_rss_bytes", "memory_used_fraction", "memory_pressure",
                "monitor_hook_us", "monitor_writer_cpu_us", "total_compute_us", "total_memory_bytes",
                "total_memory_mb"}
    m = tiny_llama()
    runs = []
    for fast in (True, False):
        p = tmp_path / f"fast-{fast}.jsonl"
        mon = ResourceMonitor(m, "VERBOSE", p, environ={})
        mon.fast = fast
        with mon:
            generate(m, mon, 6, 3)
            mon.set_level("DETAILED")
            generate(m, mon, 6, 2)
            with torch.no_grad():
                m(torch.randint(0, 1024, (2, 9)))
            mon.set_level("MINIMAL")
            generate(m, mon, 5, 3)
            with torch.no_grad():
                m.lm_head(torch.randn(3, 256))  # a module called outside a forward pass of the model
        runs.append([[(k, "*" if k in volatile else v) for k, v in e.items()] for e in read(p)])
        ids = [e["resource_id"].rsplit("_", 1)[1] for e in read(p)[1:-1]]
        assert ids == [str(i) for i in range(1, len(ids) + 1)], "sequence numbers run on"
    assert len(runs[0]) > 500 and runs[0] == runs[1]


class LongLast(nn.Module):
    """Three Linears; the last one sleeps, so it is the longest module of every pass."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.slow = SlowLinear(16, 4096, 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.slow(self.b(self.a(x)))


def test_records_go_to_the_writer_as_the_longest_module_starts(tmp_path):
    """A pass's records go to the writer when the previous pass's longest module starts the
    next pass (its torch call holds no interpreter lock), never before the pass has ended:
    DETAILED allocations carry the memory reading taken at the end of their own pass."""
    m = LongLast().eval()
    mon = ResourceMonitor(m, "DETAILED", tmp_path / "l.jsonl", environ={}, flush_events=1 << 20,
                          flush_interval=None)
    batches = []
    with mon:
        with torch.no_grad():
            m(torch.randn(2, 16))
            assert mon.recorder.longest[0] is None  # no pass written yet: nothing known
            mon.flush()
            assert mon.recorder.longest[0] is not None and mon.recorder.longest[0].name == "slow"
            put = mon.recorder.thread.put

            def spy(recs, *rest):
                batches.append([Rec(r[0]).name for r in recs])
                put(recs, *rest)

            mon.recorder.thread.put = spy
            for _ in range(3):
                m(torch.randn(2, 16))
        mon.recorder.thread.sync()
        # Passes 2 and 3 hand off the pass before them, whole, as `slow` starts; pass 3's
        # records wait for the close.
        assert len(batches) == 2, batches
        for b in batches:
            assert b[0] == "BEGIN" and b.count("BEGIN") == 1 and b[-1] == "FORWARD", b
    ev = read(tmp_path / "l.jsonl")
    fwd = {e["forward"]: e for e in of(ev, "compute_execution", operation="model_forward")}
    allocs = of(ev, "memory_allocation", allocation_kind="module_output")
    assert len(fwd) == 4 and len(allocs) == 12
    for a in allocs:
        assert a["process_rss_bytes"] == fwd[a["forward"]]["process_rss_bytes"]
    assert len(of(ev, "compute_execution", operation="mul_mat")) == 12


class _CacheLayer:
    def __init__(self) -> None:
        self.keys = torch.tensor([])
        self.values = torch.tensor([])


class LayersCache:
    """Per-layer keys and values (as ``Cache.layers``), each layer made at its first update."""

    def __init__(self) -> None:
        self.layers: List[_CacheLayer] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int) -> None:
        while len(self.layers) <= idx:
            self.layers.append(_CacheLayer())
        lay = self.layers[idx]
        lay.keys = torch.cat([lay.keys, k], -2) if lay.keys.numel() else k
        lay.values = torch.cat([lay.values, v], -2) if lay.values.numel() else v


class ListCache:
    """Keys and values in two lists (the ``key_cache``/``value_cache`` caches)."""

    def __init__(self) -> None:
        self.key_cache: List[torch.Tensor] = []
        self.value_cache: List[torch.Tensor] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int) -> None:
        if idx < len(self.key_cache):
            self.key_cache[idx] = torch.cat([self.key_cache[idx], k], -2)
            self.value_cache[idx] = torch.cat([self.value_cache[idx], v], -2)
        else:
            self.key_cache.append(k)
            self.value_cache.append(v)


class TupleCache(list):
    """The legacy cache: one (keys, values) pair per layer."""

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int) -> None:
        if idx < len(self):
            self[idx] = (torch.cat([self[idx][0], k], -2), torch.cat([self[idx][1], v], -2))
        else:
            self.append((k, v))


class StaleCache(LayersCache):
    """Layers that stay empty: the attention runs without a cache to read."""

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int) -> None:
        while len(self.layers) <= idx:
            self.layers.append(_CacheLayer())


class ToyAttention(nn.Module):
    def __init__(self, d: int, heads: int, layer_idx: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.num_heads, self.head_dim, self.layer_idx = heads, d // heads, layer_idx

    def forward(self, hidden_states: torch.Tensor, cache: Any = None) -> Any:
        b, s, _ = hidden_states.shape
        q, k, v = (t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(hidden_states).chunk(3, -1))
        if cache is not None:
            cache.update(k, v, self.layer_idx)
            if isinstance(cache, LayersCache) and cache.layers[self.layer_idx].keys.numel():
                k, v = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, s, -1)), None


class ToyBlock(nn.Module):
    def __init__(self, d: int, heads: int, i: int) -> None:
        super().__init__()
        self.self_attn = ToyAttention(d, heads, i)


class ToyDecoder(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, n: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ToyBlock(d, heads, i) for i in range(n))

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        for blk in self.layers:
            x = x + blk.self_attn(hidden_states=x, cache=cache)[0]
        return x


@pytest.mark.parametrize("cache_kind", [LayersCache, ListCache, TupleCache, StaleCache])
@pytest.mark.parametrize("level", ["MINIMAL", "DETAILED"])
def test_attention_and_cache_growth_fast_path_against_builders(tmp_path, cache_kind, level):
    """Decoding steps with a growing cache of each layout: the attention wrapper's one-record
    path (``Cache.layers``) and its fallbacks against the general wrapper and builders, and
    the cache's lengths, bytes and growth from step to step."""
    volatile = {"timestamp", "resource_id", "session_id", "iso_timestamp", "pid", "duration_us",
                "throughput_gflops_per_s", "memory_throughput_gbps", "memory_address", "process_rss_bytes",
                "monitor_hook_us", "monitor_writer_cpu_us", "total_compute_us", "total_memory_bytes",
                "total_memory_mb"}
    torch.manual_seed(0)
    m = ToyDecoder().eval()
    runs, recs = [], []
    for fast in (True, False):
        p = tmp_path / f"{fast}.jsonl"
        mon = ResourceMonitor(m, level, p, environ={}, flush_events=1 << 20, flush_interval=None)
        mon.fast = fast
        names: List[str] = []
        with mon:
            put = mon.recorder.thread.put

            def spy(batch, *rest):
                names.extend(Rec(r[0]).name for r in batch)
                put(batch, *rest)

            mon.recorder.thread.put = spy
            cache = cache_kind()
            x = torch.randn(1, 5, 32)
            with torch.no_grad():
                for step in range(4):
                    mon.set_step(step)
                    m(x, cache=cache)
                    x = torch.randn(1, 1, 32)
                    mon.flush()
        runs.append([[(k, "*" if k in volatile else v) for k, v in e.items()] for e in read(p)])
        recs.append(names)
    assert runs[0] == runs[1]
    uses_fast = "ATTENTION_KV" in recs[0]
    assert uses_fast == (cache_kind is LayersCache)
    assert "ATTENTION_KV" not in recs[1]
    ev = read(tmp_path / "True.jsonl")
    kv = of(ev, "kv_cache_update", module="layers.1.self_attn")
    att = of(ev, "compute_execution", operation="attention", module="layers.1.self_attn")
    assert len(att) == 4
    if cache_kind is StaleCache:
        assert kv == [] and all(len(a["input_tensors"]) == 1 for a in att)
        assert [a["key_tokens"] for a in att] == [5, 1, 1, 1]
        return
    per_token = 2 * 4 * 8 * 4  # keys and values: 4 heads × 8 dims × 4 bytes
    assert [e["cache_length_tokens"] for e in kv] == [5, 6, 7, 8]
    assert [e["previous_length_tokens"] for e in kv] == [0, 5, 6, 7]
    assert [e["cache_bytes"] for e in kv] == [per_token * n for n in (5, 6, 7, 8)]
    assert [e["growth_bytes"] for e in kv] == [per_token * 5, per_token, per_token, per_token]
    assert [e["key_shape"] for e in kv] == [[1, 4, n, 8] for n in (5, 6, 7, 8)]
    assert [a["key_tokens"] for a in att] == [5, 6, 7, 8]
    assert [a["flops"] for a in att] == [4 * 1 * 4 * q * k * 8 for q, k in ((5, 5), (1, 6), (1, 7), (1, 8))]
    assert [a["input_tensors"][1]["shape"] for a in att] == [[1, 4, n, 8] for n in (5, 6, 7, 8)]
