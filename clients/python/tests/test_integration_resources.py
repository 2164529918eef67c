"""Resource events through the real strapd: OPEN passes the resource log, the monitor's
batches travel as RESOURCES messages, strapd writes them beside the stream and counts them
in status; every event names the stream's step and forward counter."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama

from llm_instrumentation import InstrumentationConfig, capture_activations, open_stream
from llm_instrumentation import _daemon
from llm_instrumentation.stream import TENSOR

pytestmark = pytest.mark.integration


def generate(fw, m, n: int) -> None:
    ids = torch.randint(0, 1024, (1, 6), generator=torch.Generator().manual_seed(0))
    past = None
    with torch.no_grad():
        for _ in range(n):
            r = m(input_ids=ids, cache=past, use_cache=True)
            past = r.cache
            nxt = int(r.logits[0, -1].argmax())
            fw.token_tracker.record_token(nxt, f"<{nxt}>")
            ids = torch.tensor([[nxt]])


def test_resource_events_through_strapd(real_strapd, tmp_path):
    m = tiny_llama()
    out = tmp_path / "r.strap"
    seen_in_status = []
    with capture_activations(m, output_path=out, socket_path=real_strapd.socket, autostart_daemon=False,
                             track_per_token=True, resource_level="MINIMAL") as fw:
        assert fw.resources_path == str(out) + ".resources.jsonl"
        generate(fw, m, 4)
        fw.resource_monitor.set_level("DETAILED")
        generate(fw, m, 1)
        fw.resource_monitor.flush()
        st = _daemon.status(real_strapd.socket)
        seen_in_status = [s for s in st["sessions"] if s["output_path"] == str(out)]
    assert seen_in_status and seen_in_status[0]["resource_log"] is True
    assert seen_in_status[0]["resource_events"] > 0 and seen_in_status[0]["resource_events_lost"] == 0
    lines = Path(fw.resources_path).read_bytes().splitlines()
    ev = [json.loads(x) for x in lines]
    assert ev[0]["event"] == "resource_session_start" and ev[-1]["event"] == "resource_session_summary"
    assert ev[-1]["events"] == {k: sum(1 for e in ev if e["event"] == k) for k in ev[-1]["events"]}
    # The stream's forward counter and step, on every event and packet alike.
    with open_stream(out) as r:
        pk_steps = {}
        for pk in r.packets():
            if pk.type == TENSOR:
                pk_steps.setdefault(pk.forward, pk.step)
    fwd = {e["forward"]: e["step"] for e in ev if e.get("operation") == "model_forward"}
    assert fwd == pk_steps == {i: i for i in range(5)}
    assert {e["forward"] for e in ev if e["event"] == "compute_execution"} == set(range(5))
    norms = {e["forward"] for e in ev if e.get("operation") == "norm"}
    assert norms == {4}, "DETAILED only after set_level"
    # capture_bytes: what this forward pass handed strapd, equal to its packets' raw bytes.
    with open_stream(out) as r:
        raw = {}
        for pk in r.packets():
            if pk.type == TENSOR:
                raw[pk.forward] = raw.get(pk.forward, 0) + pk.raw_len
    for e in ev:
        if e.get("operation") == "model_forward":
            assert e["capture_bytes"] >= raw[e["forward"]] > 0


def test_resource_level_from_config_env_and_off(real_strapd, tmp_path, monkeypatch):
    m = tiny_llama()
    x = torch.randint(0, 1024, (1, 4))
    cfg = InstrumentationConfig().with_resources("minimal")
    assert cfg.resource_level == "MINIMAL" and cfg.to_dict()["resource_level"] == "MINIMAL"
    assert "resource_level" not in InstrumentationConfig().to_dict()
    with pytest.raises(ValueError, match="MINIMAL, DETAILED, VERBOSE"):
        InstrumentationConfig(resource_level="loud")
    kw = dict(socket_path=real_strapd.socket, autostart_daemon=False)
    with capture_activations(m, config=cfg, output_path=tmp_path / "a.strap", **kw) as fw:
        with torch.no_grad():
            m(x)
    assert json.loads(Path(fw.resources_path).read_bytes().splitlines()[0])["level"] == "MINIMAL"
    # The option wins over the config; False turns them off.
    with capture_activations(m, config=cfg, output_path=tmp_path / "b.strap", resource_level=False, **kw) as fw:
        with torch.no_grad():
            m(x)
    assert fw.resources_path is None and not (tmp_path / "b.strap.resources.jsonl").exists()
    # The environment: a level turns them on; DISABLED wins over everything.
    monkeypatch.setenv("STRAP_RESOURCE_LOG_LEVEL", "DETAILED")
    with capture_activations(m, output_path=tmp_path / "c.strap", **kw) as fw:
        with torch.no_grad():
            m(x)
    assert json.loads(Path(fw.resources_path).read_bytes().splitlines()[0])["level"] == "DETAILED"
    monkeypatch.setenv("LLAMA_RESOURCE_DISABLED", "1")
    with capture_activations(m, config=cfg, output_path=tmp_path / "d.strap", **kw) as fw:
        with torch.no_grad():
            m(x)
    assert fw.resource_monitor is None and fw.resources_path is None
    assert not (tmp_path / "d.strap.resources.jsonl").exists()
