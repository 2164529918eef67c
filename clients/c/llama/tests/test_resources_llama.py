"""Seed 003's resource events from llama.cpp (make test-llamacpp): strap-llama --resource-level
through a real strapd and to a JSONL file without one, the events checked against the graph's
shapes, the report reading them, and the header's macros from C and C++ on real ggml tensors."""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import STRAP_LLAMA, run_llama

LAYERS = 4  # the tiny model's


def events(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def per_step(evs: List[Dict[str, Any]], step: int) -> collections.Counter:
    return collections.Counter((e["event"], e.get("operation"), e.get("layer_id")) for e in evs
                               if e.get("step") == step)


def check_mul_mats(evs: List[Dict[str, Any]]) -> None:
    """Every mul_mat's FLOPs are 2·K·numel(out) of the shapes it lists; its duration measured."""
    mm = [e for e in evs if e.get("operation") == "mul_mat"]
    assert mm
    for e in mm:
        x, w = e["input_tensors"]
        assert (x["name"], w["name"]) == ("input", "weight")
        k = w["shape"][-1]
        n_out = 1
        for d in e["output_shape"]:
            n_out *= d
        assert e["flops"] == 2 * k * n_out, e
        assert e["flops_source"] == "computed_from_shapes"
        assert e["duration_source"] == "perf_counter" and e["duration_us"] > 0
        assert e["compute_intensity_gflops"] == e["flops"] / 1e9


def test_detailed_through_strapd(strapd, tiny_model, tmp_path):
    out = tmp_path / "r.strap"
    n = 6
    plain = run_llama(tiny_model, "--no-capture", n=n)
    r = run_llama(tiny_model, "--output", str(out), "--resource-level", "DETAILED", socket_path=strapd.socket, n=n)
    assert r["tokens"] == plain["tokens"]  # resource events change nothing the model computes
    evs = events(Path(str(out) + ".resources.jsonl"))
    assert r["resource_events"] == len(evs)
    assert evs[0]["event"] == "resource_session_start" and evs[0]["level"] == "DETAILED"
    assert evs[0]["model_class"] == "llama"
    assert evs[-1]["event"] == "resource_session_summary" and evs[-1]["forwards"] == n
    assert len({e["resource_id"] for e in evs}) == len(evs)
    check_mul_mats(evs)
    for step in range(n):
        c = per_step(evs, step)
        for layer in range(LAYERS):
            # q, k, v, o and the MLP's three projections; flash attention is its own op
            assert c[("compute_execution", "mul_mat", layer)] == 7, (step, layer, c)
            assert c[("mlp_operation", None, layer)] == 3
            assert c[("component_handoff", None, layer)] == 1
            assert c[("compute_execution", "norm", layer)] == 2
            assert c[("compute_execution", "activation", layer)] == 1
        assert c[("compute_execution", "mul_mat", None)] == 1  # lm_head
        assert c[("compute_execution", "model_forward", None)] == 1
    fwd = [e for e in evs if e.get("operation") == "model_forward"]
    assert [e["step"] for e in fwd] == list(range(n))
    # a pass's FLOPs are the sum of its recorded ops
    for e in fwd:
        ops = sum(x.get("flops") or 0 for x in evs if x.get("forward") == e["forward"] and
                  x["event"] == "compute_execution" and x.get("operation") != "model_forward")
        assert e["flops"] == ops and e["flops_source"] == "sum_of_recorded_ops"
    mlp = [e for e in evs if e["event"] == "mlp_operation"]
    assert {e["mlp_operation"] for e in mlp} == {"gate_proj", "up_proj", "down_proj"}
    assert all(e["activation_function"] == "silu" for e in mlp)
    assert {e["module"] for e in mlp if e["layer_id"] == 2} == {
        "model.layers.2.mlp.gate_proj", "model.layers.2.mlp.up_proj", "model.layers.2.mlp.down_proj"}
    ho = [e for e in evs if e["event"] == "component_handoff"]
    assert all(e["from_component"] == "attention" and e["to_component"] == "mlp" and e["duration_us"] > 0
               and e["module"] == f"model.layers.{e['layer_id']}.mlp" for e in ho)
    # events within a pass come in graph order: layer 0 before layer 1 ...
    layers = [e["layer_id"] for e in evs if e.get("step") == 1 and e.get("layer_id") is not None]
    assert layers == sorted(layers)
    # the same events through strapd's status counters
    assert evs[-1]["component_flows"] == LAYERS * n


def test_minimal_to_a_file_without_capture(tiny_model, tmp_path):
    log = tmp_path / "min.jsonl"
    r = run_llama(tiny_model, "--no-capture", "--resource-level", "minimal", "--resource-log", str(log), n=3)
    evs = events(log)
    assert r["resource_events"] == len(evs)
    kinds = {(e["event"], e.get("operation")) for e in evs}
    assert ("compute_execution", "norm") not in kinds and ("component_handoff", None) not in kinds
    assert ("compute_execution", "mul_mat") in kinds and ("mlp_operation", None) in kinds
    c = per_step(evs, 2)
    assert all(c[("compute_execution", "mul_mat", layer)] == 7 for layer in range(LAYERS)), c
    check_mul_mats(evs)


def test_environment_path_and_bad_level(tiny_model, tmp_path):
    log = tmp_path / "env.jsonl"
    env = {**os.environ, "LLAMA_RESOURCE_LOG_PATH": str(log)}
    p = subprocess.run([str(STRAP_LLAMA), "-m", str(tiny_model), "-p", "Hello", "-n", "2", "--ignore-eos",
                        "--no-capture", "--resource-level", "VERBOSE"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    evs = events(log)
    assert evs[0]["level"] == "VERBOSE"
    assert {"add", "mul"} & {e.get("operation") for e in evs}  # element-wise ops at VERBOSE
    env["LLAMA_RESOURCE_DISABLED"] = "perhaps"
    p = subprocess.run([str(STRAP_LLAMA), "-m", str(tiny_model), "-p", "Hello", "-n", "2", "--no-capture",
                        "--resource-level", "MINIMAL"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "LLAMA_RESOURCE_DISABLED" in p.stderr
    p = subprocess.run([str(STRAP_LLAMA), "-m", str(tiny_model), "-p", "Hello", "-n", "2", "--no-capture",
                        "--resource-level", "LOUD"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--resource-level" in p.stderr


def test_report_reads_the_resource_events(strapd, tiny_model, tmp_path):
    """The report's per-layer and per-token figures come from the llama.cpp resource events."""
    pytest.importorskip("matplotlib")
    from llm_instrumentation.report import build_report

    out = tmp_path / "rep.strap"
    run_llama(tiny_model, "--output", str(out), "--resource-level", "DETAILED", socket_path=strapd.socket, n=12)
    r = build_report(str(out), progress=False)
    # per layer: time and FLOPs (compute_execution), per token: model_forward
    assert {"layer_time.png", "layer_flops.png", "token_latency.png"} <= set(r["figures"]), (r["figures"],
                                                                                           r["notes"])
    page = Path(r["html"]).read_text()
    assert page.count("data:image/png;base64,") == len(r["figures"])


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_macros_from_c_and_cpp(tmp_path, lang):
    exe = STRAP_LLAMA.parent / f"test_resource_macros_{lang}"
    if not exe.exists():
        pytest.skip(f"{exe} not built (make strap-llama)")
    log = tmp_path / f"{lang}.jsonl"
    p = subprocess.run([str(exe), str(log)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    evs = events(log)
    got = [(e["event"], e.get("operation"), e.get("module")) for e in evs]
    assert got == [
        ("resource_session_start", None, None),
        ("memory_allocation", None, "token_embd"),
        ("compute_execution", "mul_mat", "model.layers.0.self_attn.q_proj"),
        ("compute_execution", "norm", "model.layers.0.input_layernorm"),
        ("component_handoff", None, "model.layers.0.mlp"),
        ("compute_execution", "mul_mat", "model.layers.0.mlp.gate_proj"),
        ("mlp_operation", None, "model.layers.0.mlp.gate_proj"),
        ("compute_execution", "model_forward", ""),
        ("resource_session_summary", None, None),
    ], got
    q = evs[2]
    assert q["flops"] == 2 * 64 * 5 * 64 and q["input_tensors"][1] == {"name": "weight", "shape": [64, 64],
                                                                        "dtype": "float16"}
    g = evs[6]
    # a quantised weight is named by ggml; the MLP's input is derived from K when not given
    assert evs[5]["input_tensors"][1]["dtype"] == "q8_0"
    assert g["weight_shape"] == [128, 64] and g["activation_shape"] == [5, 128]
    assert g["intermediate_dim"] == 128 and g["activation_memory_peak_bytes"] == 5 * 64 * 4 + 5 * 128 * 4
    assert evs[1]["allocation_kind"] == "parameters" and evs[1]["allocation_size_bytes"] == 1024 * 512 * 4
    assert evs[4]["tensor_shape"] == [5, 64]  # the handoff carries the attention's last output
