"""The C client's resource events come from the Python builders: clients/c/src/resource_layouts.h
(each event's keys in order), clients/c/tests/resource_cases.h and the golden lines
testdata/resource_events/cases/c_api.jsonl are what clients/python/tools/gen_c_resource_layouts.py makes
of the builders now; the C test (clients/c/tests/test_resource_api.c, make test-c) renders every
case to the golden line byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GENERATOR = REPO / "clients/python/tools/gen_c_resource_layouts.py"


def test_generated_files_are_current() -> None:
    res = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_check_names_a_stale_file(tmp_path: Path) -> None:
    """A generated file that no longer matches the builders fails by name."""
    work = tmp_path / "repo"
    for rel in ("clients/python/src", "clients/python/tools"):
        # the compiled extensions come too: the package does not import without _speedups
        shutil.copytree(REPO / rel, work / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("clients/c/src/resource_layouts.h", "clients/c/tests/resource_cases.h",
                "testdata/resource_events/cases/c_api.jsonl"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, work / rel)
    gen = work / "clients/python/tools/gen_c_resource_layouts.py"
    ok = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # a builder that writes one more key: the layouts and the golden events are stale
    events = work / "clients/python/src/llm_instrumentation/resources/events.py"
    text = events.read_text()
    events.write_text(text.replace('ev["flops_source"] = "computed_from_shapes"\n        ev["bytes_accessed"]',
                                   'ev["flops_source"] = "computed_from_shapes"\n        ev["new_key"] = 1\n'
                                   '        ev["bytes_accessed"]', 1))
    assert events.read_text() != text
    res = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "clients/c/src/resource_layouts.h is stale" in res.stderr
    assert "testdata/resource_events/cases/c_api.jsonl is stale" in res.stderr


def test_golden_covers_every_layout_and_optional_key() -> None:
    """The cases reach each event type and the keys the builders leave out (no duration, no
    memory reading, no memory fraction)."""
    evs = [json.loads(line) for line in (REPO / "testdata/resource_events/cases/c_api.jsonl").read_text().splitlines()]
    kinds = {(e["event"], e.get("operation")) for e in evs}
    assert {("compute_execution", "mul_mat"), ("mlp_operation", None), ("compute_execution", "norm"),
            ("compute_execution", "activation"), ("compute_execution", "soft_max"), ("memory_allocation", None),
            ("component_handoff", None), ("compute_execution", "model_forward")} <= kinds
    assert any("throughput_gflops_per_s" not in e for e in evs if e.get("operation") == "mul_mat")
    assert any("process_rss_bytes" not in e for e in evs if e["event"] == "memory_allocation")
    assert any(e["memory_pressure"] is None for e in evs if e["event"] == "component_handoff")
