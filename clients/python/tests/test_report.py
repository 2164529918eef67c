"""The capture report built from a real capture (real strapd with its kernel trace, resource
events), opened in headless Chromium: every image loads and the page is not blank."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama

from llm_instrumentation import capture_activations

pytestmark = pytest.mark.integration


def need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        # `make test` installs it; in CI a missing package is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail(f"{module} not installed")
        pytest.skip(f"{module} not installed")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    msg = "chromium not installed (make chromium)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)
    raise AssertionError  # unreachable


def disk_io() -> None:
    """Some synced writes, so the trace has block requests to show. Beside the repository,
    which is on a disk, where /tmp may be a tmpfs."""
    import tempfile

    from conftest import REPO

    d = tempfile.mkdtemp(prefix=".report-io-", dir=REPO)
    p = Path(d) / "io.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(8):
            os.write(fd, os.urandom(256 * 1024))
            os.fsync(fd)
    finally:
        os.close(fd)
        shutil.rmtree(d, ignore_errors=True)


def capture(d, out: Path, tokens: int = 12) -> None:
    m = tiny_llama()
    with capture_activations(m, output_path=out, socket_path=d.socket, autostart_daemon=False, trace_path=True,
                             track_per_token=True, resource_level="DETAILED") as fw:
        ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(0))
        past = None
        with torch.no_grad():
            for i in range(tokens):
                r = m(input_ids=ids, cache=past, use_cache=True)
                past = r.cache
                nxt = int(r.logits[0, -1].argmax())
                fw.token_tracker.record_token(nxt, f"<{nxt}>")
                ids = torch.tensor([[nxt]])
                if i % 4 == 0:
                    disk_io()


def test_report_from_real_capture_in_chromium(strapd_factory, tmp_path):
    need("matplotlib")
    browser = chromium()
    from llm_instrumentation.report import build_report

    d = strapd_factory("--trace-interval", "200ms")
    out = tmp_path / "cap.strap"
    capture(d, out)
    res = out.parent / (out.name + ".resources.jsonl")
    assert res.exists() and (out.parent / (out.name + ".trace.jsonl")).exists()

    r = build_report(str(out), progress=False)
    figs = set(r["figures"])
    must = {"layer_time.png", "layer_flops.png", "layer_memory.png", "token_latency.png", "timeline.png",
            "top_pids.png", "io_requests.png", "io_queue_depth.png", "io_latency_histogram.png",
            "io_latency_percentiles.png", "io_latency_heatmap.png"}
    assert must <= figs, (must - figs, r["notes"])
    for f in figs:
        assert (Path(r["out_dir"]) / f).stat().st_size > 5000, f
    assert len(r["costs"]) == 3 and all(c["seconds"] > 0 for c in r["costs"])
    assert r["costs"][0]["seconds"] >= r["costs"][1]["seconds"] >= r["costs"][2]["seconds"]
    page = Path(r["html"]).read_text()
    assert page.count("data:image/png;base64,") == len(figs)
    assert "src='http" not in page and 'src="http' not in page, "the page must be self-contained"

    # Open it in Chromium: a copy with a probe that writes how many images decoded.
    probe = Path(r["out_dir"]) / "probe.html"
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load',()=>{const im=[...document."
                                  "images];const ok=im.filter(i=>i.complete&&i.naturalWidth>0).length;"
                                  "document.title='IMAGES '+ok+'/'+im.length;});</script></body>"))
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--virtual-time-budget=10000"]
    dom = subprocess.run(base + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r"<title>IMAGES (\d+)/(\d+)</title>", dom.stdout)
    assert m, dom.stdout[:500] + dom.stderr[-2000:]
    assert int(m.group(1)) == int(m.group(2)) == len(figs)

    shot = tmp_path / "report.png"
    subprocess.run(base + ["--window-size=1200,3000", f"--screenshot={shot}", Path(r["html"]).as_uri()],
                   capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20000
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(shot))[..., :3]
    # Not blank: many distinct colours, and a good share of non-white pixels (the figures).
    flat = (img.reshape(-1, 3) * 255).astype(np.uint8)
    colours = len(np.unique(flat[:: max(1, len(flat) // 200000)], axis=0))
    non_white = float(np.mean(flat.min(axis=1) < 235))
    assert colours > 50 and non_white > 0.05, (colours, non_white)
    keep = os.environ.get("STRAP_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)

    # The CLI prints the page and the three costs.
    cli = subprocess.run([os.sys.executable, "-m", "llm_instrumentation.report", str(out), "--no-progress",
                          "--out", str(tmp_path / "cli")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in os.sys.path if p)})
    assert cli.returncode == 0, cli.stderr
    assert str(tmp_path / "cli" / "report.html") in cli.stdout and cli.stdout.count("\n  ") == 3


def test_report_without_inputs_fails_clearly(tmp_path):
    from llm_instrumentation.report import main

    assert main([str(tmp_path / "nothing.strap"), "--no-progress"]) == 2


def test_report_resources_only(tmp_path):
    """A standalone resource log (no daemon, no trace) still makes the model figures and
    says what was left out."""
    need("matplotlib")
    from llm_instrumentation.report import build_report
    from llm_instrumentation.resources import monitor_resources

    m = tiny_llama()
    cap = tmp_path / "solo.strap"
    with monitor_resources(m, "MINIMAL", str(cap) + ".resources.jsonl") as mon:
        with torch.no_grad():
            for step in range(3):
                mon.set_step(step)
                m(torch.randint(0, 1024, (1, 8)))
    r = build_report(str(cap), progress=False)
    assert {"layer_time.png", "layer_flops.png", "token_latency.png"} <= set(r["figures"])
    assert any("No trace" in n for n in r["notes"])
    lines = [json.loads(x) for x in (Path(str(cap) + ".resources.jsonl")).read_text().splitlines()]
    assert lines[-1]["event"] == "resource_session_summary"


def test_progress_bar_only_for_long_reads():
    import io

    from llm_instrumentation import report as R

    out = io.StringIO()
    clock = [100.0]
    R.time.monotonic, real = (lambda: clock[0]), R.time.monotonic
    try:
        p = R.Progress("reading x", 10_000_000, True, out)
        p.update(1_000_000)          # under half a second: nothing shown
        assert out.getvalue() == ""
        clock[0] += 1.0
        p.update(5_000_000)
        assert "reading x [###############" in out.getvalue() and "50.0%" in out.getvalue()
        p.done()
        assert out.getvalue().endswith("100.0% (10.0 MB)\n")
        quiet = io.StringIO()
        q = R.Progress("reading y", 10, False, quiet)
        clock[0] += 5
        q.update(5)
        q.done()
        assert quiet.getvalue() == ""
    finally:
        R.time.monotonic = real
