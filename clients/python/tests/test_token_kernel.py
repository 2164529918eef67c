"""Per-token kernel attribution against the real strapd with its probes (as root): a
forward pass that sleeps 200 ms is found on its token's off-CPU time in the session trace."""

from __future__ import annotations

import json
import mmap
import os
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama

from llm_instrumentation import capture_activations

pytestmark = pytest.mark.integration

SLEEPY = 3
SLEEP_S = 0.2
FAULT_PAGES = 64


@pytest.mark.skipif(os.geteuid() != 0, reason="the probes need root")
def test_sleep_in_one_forward_lands_on_its_token(strapd_factory, tmp_path: Path) -> None:
    d = strapd_factory("--trace-interval", "200ms")
    torch.set_num_threads(1)  # idle intra-op threads would add their sleep to every token
    m = tiny_llama()
    step = {"i": 0}

    def hook(_mod, _inp, _out):
        # Fresh anonymous pages, written: user page faults in every token's window (the
        # forward pass alone may reuse memory that earlier tests in this process touched).
        with mmap.mmap(-1, FAULT_PAGES * mmap.PAGESIZE) as fresh:
            for off in range(0, len(fresh), mmap.PAGESIZE):
                fresh[off] = 1
        if step["i"] == SLEEPY:
            time.sleep(SLEEP_S)

    h = m.register_forward_hook(hook)
    out = tmp_path / "tk.strap"
    try:
        with torch.no_grad():
            with capture_activations(m, preset="balanced", output_path=out, socket_path=d.socket,
                                     autostart_daemon=False, trace_path=True, track_per_token=True) as fw:
                for i in range(6):
                    step["i"] = i
                    m(input_ids=torch.tensor([[1, 2, 3, 4 + i]]))
                    fw.token_tracker.record_token(100 + i, f"t{i}")
    finally:
        h.remove()
    sid = str(fw._last_session.opened.session)
    lines = [json.loads(x) for x in Path(fw.trace_path).read_text().splitlines()]
    if lines[-1]["collectors"].get("off_cpu") != "bpf":
        pytest.fail(f"off_cpu collector not on BPF: {lines[-1]['collectors']}")
    rows = [r for s in lines for r in s.get("tokens_kernel", [])]
    assert [r["index"] for r in rows] == list(range(6)), rows
    assert all(r["session"] == sid and r["pid"] == os.getpid() for r in rows)
    assert [r["token_id"] for r in rows] == [100 + i for i in range(6)]
    sleepy = rows[SLEEPY]
    assert sleepy["window_s"] >= SLEEP_S
    assert sleepy["off_cpu"]["sleep_ns"] >= 0.95 * SLEEP_S * 1e9, sleepy
    assert sleepy["off_cpu_ns"] == sleepy["off_cpu"]["runnable_ns"] + sleepy["off_cpu"]["sleep_ns"] + sleepy["off_cpu"]["io_ns"]
    # The sleep is a syscall too (clock_nanosleep or select), timed into syscall_ns.
    assert sleepy["syscall_ns"] >= 0.95 * SLEEP_S * 1e9, sleepy
    for r in rows:
        if r["index"] != SLEEPY:
            assert r["off_cpu"]["sleep_ns"] < 0.5 * SLEEP_S * 1e9, (r, rows)
    # Every forward pass writes fresh pages (the hook) and makes syscalls. The windows end
    # when strapd reads each TOKEN, so on a loaded machine one pass's faults can land in the
    # previous token's window (TRACE_FORMAT.md): exact in sum, not per token.
    assert sum(r["page_faults"] for r in rows) >= len(rows) * FAULT_PAGES, [(r["index"], r["page_faults"]) for r in rows]
    assert sum(r["syscall_count"] for r in rows) > 0
