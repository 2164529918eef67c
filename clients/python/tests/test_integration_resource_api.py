"""Resource events from a real capture, read back through strapd's HTTP API and /metrics:
a follower (follow=1, Server-Sent Events) receives events the client sent after it
connected, the event= and layer= filters return only matching lines, and /metrics carries
the per-component aggregates (HTTP_API.md)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import torch
from conftest import tiny_llama

from llm_instrumentation import _daemon
from llm_instrumentation import capture_activations

pytestmark = pytest.mark.integration


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the API's Unix socket."""

    def __init__(self, path: str, timeout: float = 20.0) -> None:
        super().__init__("strapd", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def api_get(sock: str, path: str) -> Tuple[int, dict]:
    c = UnixHTTPConnection(sock)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def forward(fw, m, ids: torch.Tensor) -> None:
    with torch.no_grad():
        m(input_ids=ids)
    nxt = 7
    fw.token_tracker.record_token(nxt, f"<{nxt}>")
    # flush: the monitor's batches have been sent to strapd as RESOURCES when it returns.
    fw.resource_monitor.flush()


def read_sse(resp, want: int, deadline: float) -> List[Tuple[str, dict]]:
    """Reads SSE events until want "resource" events arrived or the deadline passed."""
    got: List[Tuple[str, dict]] = []
    kind: Optional[str] = None
    while sum(1 for k, _ in got if k == "resource") < want and time.monotonic() < deadline:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            got.append((kind or "", json.loads(line[len("data: "):])))
            kind = None
    return got


def test_resource_events_over_http_api(strapd_factory, tmp_path):
    api_sock = str(tmp_path / "api.sock")
    d = strapd_factory("--no-probes", "--http", "127.0.0.1:0", "--http-api-socket", api_sock)
    m = tiny_llama()
    ids = torch.randint(0, 1024, (1, 6), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "r.strap"
    with capture_activations(m, output_path=out, socket_path=d.socket, autostart_daemon=False,
                             track_per_token=True, resource_level="DETAILED") as fw:
        forward(fw, m, ids)
        # Every event of the first pass sent, and appended by strapd, before the follower
        # connects: the writer thread hands events over in batches, and strapd appends each
        # RESOURCES message as it reads it (status counts what was appended).
        fw.resource_monitor.flush()
        seen: List[int] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            sessions = [s for s in _daemon.status(d.socket)["sessions"] if s["output_path"] == str(out)]
            assert len(sessions) == 1, sessions
            seen.append(sessions[0]["resource_events"])
            if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] > 0:
                break
            time.sleep(0.1)
        sid = sessions[0]["session"]
        before = sessions[0]["resource_events"]
        assert before > 0, seen

        # The follower, positioned at the end of the log once its first comment arrives.
        fc = UnixHTTPConnection(api_sock)
        fc.request("GET", f"/api/v1/resource-logs?session={sid}&follow=1&event=compute_execution&layer=1")
        fr = fc.getresponse()
        assert fr.status == 200 and fr.getheader("Content-Type") == "text/event-stream"
        assert fr.readline().startswith(b": following")

        forward(fw, m, ids)  # the second forward pass, sent after the follower connected
        evs = read_sse(fr, 1, time.monotonic() + 15)
        fc.close()
        resources = [e for k, e in evs if k == "resource"]
        assert resources, f"no resource event reached the follower: {evs}"
        for e in resources:
            assert e["session"] == sid
            ev = e["event"]
            assert ev["event"] == "compute_execution" and ev["layer_id"] == 1, ev
            assert ev["forward"] == 1, "a follower sees only events sent after it connected"
        assert not [k for k, _ in evs if k not in ("resource",)], evs

    lines = [json.loads(x) for x in Path(str(out) + ".resources.jsonl").read_bytes().splitlines()]
    by_type: Dict[str, int] = {}
    for e in lines:
        by_type[e["event"]] = by_type.get(e["event"], 0) + 1
    assert by_type.get("compute_execution", 0) > 0 and by_type.get("mlp_operation", 0) > 0

    # The session has ended: the daemon no longer serves its log. A second capture, left
    # open, is read with the filters.
    m2 = tiny_llama()
    out2 = tmp_path / "r2.strap"
    with capture_activations(m2, output_path=out2, socket_path=d.socket, autostart_daemon=False,
                             track_per_token=True, resource_level="DETAILED") as fw2:
        forward(fw2, m2, ids)
        # strapd writes each RESOURCES message as its connection reads it, in order: once a
        # CHECKPOINT sent after them is answered, the file holds them all.
        fw2._session.checkpoint()
        sid2 = [s for s in _daemon.status(d.socket)["sessions"] if s["output_path"] == str(out2)][0]["session"]
        file2 = [json.loads(x) for x in Path(str(out2) + ".resources.jsonl").read_bytes().splitlines()]

        code, rep = api_get(api_sock, f"/api/v1/resource-logs?session={sid2}")
        assert code == 200 and rep["malformed"] == [] and len(rep["events"]) == len(file2), rep["sources"]

        code, rep = api_get(api_sock, f"/api/v1/resource-logs?session={sid2}&event=mlp_operation")
        want = [e for e in file2 if e["event"] == "mlp_operation"]
        assert code == 200 and want and [e["event"] for e in rep["events"]] == want

        code, rep = api_get(api_sock, f"/api/v1/resource-logs?session={sid2}&layer=2")
        want = [e for e in file2 if e.get("layer_id") == 2]
        assert code == 200 and want and [e["event"] for e in rep["events"]] == want

        # since= in Unix seconds against the monitor's µs timestamps.
        mid = sorted(e["timestamp"] for e in file2)[len(file2) // 2]
        code, rep = api_get(api_sock, f"/api/v1/resource-logs?session={sid2}&since={mid / 1e6:.6f}")
        want = [e for e in file2 if e["timestamp"] >= mid]
        assert code == 200 and [e["event"] for e in rep["events"]] == want

    # /metrics: every event counted by type and component_type, measured time summed.
    addr = re.search(r"http://127\.0\.0\.1:\d+/metrics", d.log_tail())
    assert addr, d.log_tail()
    text = urllib.request.urlopen(addr.group(0), timeout=10).read().decode()
    series: Dict[str, float] = {}
    for ln in text.splitlines():
        if ln.startswith("strapd_resource_"):
            name, value = ln.rsplit(" ", 1)
            series[name] = float(value)
    # The second log is complete now (its summary came at the capture's end).
    file2 = [json.loads(x) for x in Path(str(out2) + ".resources.jsonl").read_bytes().splitlines()]
    everything = lines + file2
    assert sum(v for k, v in series.items() if k.startswith("strapd_resource_events_total")) == len(everything)
    mlp_compute = [e for e in everything if e["event"] == "compute_execution" and e["component_type"] == "mlp"]
    key = 'strapd_resource_events_total{component_type="mlp",event="compute_execution"}'
    assert series[key] == len(mlp_compute)
    dur = sum(e["duration_us"] for e in mlp_compute if e.get("duration_us") is not None) / 1e6
    got = series['strapd_resource_duration_seconds_total{component_type="mlp",event="compute_execution"}']
    assert got == pytest.approx(dur, rel=1e-9) and got > 0
    flops = sum(e["flops"] for e in mlp_compute if isinstance(e.get("flops"), (int, float)))
    assert series['strapd_resource_flops_total{component_type="mlp",event="compute_execution"}'] == pytest.approx(flops)
    assert not any("model.layers" in k for k in series), "module names never become labels"
