"""Integration tests against the real strapd (STRAPD_BIN, default <repo>/bin/strapd); each
test starts its own daemon on a temp socket and stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from captest import bits, capture_and_check
from conftest import tiny_bert, tiny_gpt2, tiny_llama

from llm_instrumentation import (
    InstrumentationConfig,
    analyze_activations,
    capture_activations,
    open_stream,
)
from llm_instrumentation import _daemon

pytestmark = pytest.mark.integration

# Lossless presets (max_compression is lossy: test_integration_lossy_trace.py checks its bound).
PRESETS = ["fast_capture", "balanced", "max", "attention_analysis", "mlp_analysis"]
MODELS = {
    "llama_fp32": lambda: tiny_llama(),
    "llama_bf16": lambda: tiny_llama(torch.bfloat16),
    "gpt2": tiny_gpt2,
    "bert": tiny_bert,
}
_cache: dict = {}


def model(name):
    if name not in _cache:
        _cache[name] = MODELS[name]()
    return _cache[name]


def ids(n=8, seed=0, vocab=1000):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (1, n), generator=g)}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("mname", list(MODELS))
def test_exact_every_lossless_preset(real_strapd, tmp_path, mname, preset):
    m = model(mname)
    fw, ref = capture_and_check(m, [ids(7, 1), ids(7, 2)], tmp_path / "c.strap", real_strapd.socket, preset=preset)
    assert fw.summary["packets"] == analyze_activations(tmp_path / "c.strap")["packets"]
    a = analyze_activations(tmp_path / "c.strap")
    assert a["metadata"]["codec"] == InstrumentationConfig.from_preset(preset).compression_algorithm
    assert a["drops"]["count"] == 0 and a["end_status"] == "complete"
    assert "end status complete" in strapd_verify(tmp_path / "c.strap")


def test_outputs_unchanged(real_strapd, tmp_path):
    m = model("llama_fp32")
    x = ids(11)
    with torch.no_grad():
        plain = m(**x).logits
        with capture_activations(m, preset="balanced", output_path=tmp_path / "o.strap",
                                 socket_path=real_strapd.socket, autostart_daemon=False):
            got = m(**x).logits
    assert torch.equal(bits(plain), bits(got))


def strapd_verify(path) -> str:
    """Run ``strapd verify`` (the Go reader) on a stream; it must exit 0."""
    from conftest import strapd_bin

    res = subprocess.run([str(strapd_bin()), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _status(sock):
    return _daemon.status(sock)


def test_sigkill_client_mid_capture(real_strapd, tmp_path):
    out = tmp_path / "killed.strap"
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("kill_client.py")), real_strapd.socket,
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = model("llama_fp32")
    try:
        # a live session in this process, running across the kill
        with torch.no_grad():
            with capture_activations(m, preset="fast_capture", output_path=tmp_path / "live.strap",
                                     socket_path=real_strapd.socket, autostart_daemon=False) as fw:
                m(**ids(6, 1))
                n = 0
                deadline = time.monotonic() + 60
                while n < 3:
                    line = child.stdout.readline()
                    assert line, f"child exited: {child.stderr.read()[-2000:]}"
                    n = int(line.split()[1])
                    assert time.monotonic() < deadline
                hooks = int(line.split()[3])
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                m(**ids(6, 2))
                # the daemon closes the dead session; the live one stays
                for _ in range(300):
                    sessions = _status(real_strapd.socket)["sessions"]
                    if len(sessions) == 1:
                        break
                    time.sleep(0.05)
                assert len(sessions) == 1, sessions
                m(**ids(6, 3))
        assert fw.summary["packets"] == 3 * len(fw.hooked_modules)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    a = analyze_activations(out)
    assert a["end_status"] == "aborted"
    assert "end status aborted" in strapd_verify(out)
    assert a["tensors"] >= n * hooks and a["tensors"] == a["packets"]
    with open_stream(out) as r:
        ts = list(r)
        assert [t.seq for t in ts] == list(range(1, len(ts) + 1))
        for t in ts:
            assert t.tensor().shape == t.shape  # every complete packet decodes
    with open_stream(tmp_path / "live.strap") as r:
        assert len(list(r)) == fw.summary["packets"]


def test_two_clients_at_once(real_strapd, tmp_path):
    errors = []
    models = [tiny_llama(), tiny_gpt2()]

    def run(i):
        try:
            capture_and_check(models[i], [ids(6, i), ids(6, i + 5)], tmp_path / f"m{i}.strap", real_strapd.socket,
                              preset=["balanced", "max"][i])
        except BaseException as e:  # surfaced below
            errors.append(e)

    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not errors, errors


TINY = InstrumentationConfig.fast_capture().with_memory_limit(0.0002)  # ~210 KiB ring


def test_slow_writer_block_policy_loses_nothing(strapd_factory, tmp_path):
    d = strapd_factory("--debug-write-delay", "20ms")
    fw, _ = capture_and_check(model("llama_fp32"), [ids(24, i) for i in range(2)], tmp_path / "b.strap", d.socket,
                              config=TINY)
    assert fw.summary["drops"] == 0 and fw.summary["packets"] == 24


def test_slow_writer_drop_policy_counts(strapd_factory, tmp_path):
    # A writer far slower than any model on a loaded machine: one forward (288 KiB) does not
    # fit the 210 KiB ring, so drops happen whatever the scheduler does.
    d = strapd_factory("--debug-write-delay", "250ms")
    m = model("llama_fp32")
    out = tmp_path / "d.strap"
    with torch.no_grad():
        with capture_activations(m, config=TINY.with_backpressure("drop"), output_path=out, socket_path=d.socket,
                                 autostart_daemon=False) as fw:
            for i in range(3):
                m(**ids(24, i))
    s = fw.summary
    # CLOSED/END "packets" count TENSOR, DROP and TOKEN packets
    assert s["drops"] > 0 and s["packets"] == 36
    a = analyze_activations(out)
    assert a["drops"]["count"] == s["drops"] == fw.stats["drops"]
    assert a["packets"] == 36 - s["drops"] and a["end"]["drops"] == s["drops"] and a["end"]["packets"] == 36
    with open_stream(out) as r:
        seqs = sorted([t.seq for t in r] + [pk.seq for pk in r.packets() if pk.type_name == "DROP"])
    assert seqs == list(range(1, 37))
    assert f"drops {s['drops']}" in strapd_verify(out)


def test_tiny_ring_parts(real_strapd, tmp_path):
    cfg = InstrumentationConfig.fast_capture().with_memory_limit((64 << 10) / (1 << 30) + 4096 / (1 << 30))
    capture_and_check(model("llama_fp32"), [ids(40, 3)], tmp_path / "p.strap", real_strapd.socket, config=cfg)
    with open_stream(tmp_path / "p.strap") as r:
        assert len(r.tensors("model.layers.0.mlp")[0].packets) == 3


def test_daemon_killed_mid_capture_raises_promptly(strapd_factory, tmp_path):
    from llm_instrumentation import StrapdConnectionError

    d = strapd_factory()
    m = model("llama_fp32")
    t_kill = None
    with pytest.raises(StrapdConnectionError):
        with torch.no_grad():
            with capture_activations(m, preset="fast_capture", output_path=tmp_path / "k.strap", socket_path=d.socket,
                                     autostart_daemon=False):
                m(**ids(6, 1))
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait(10)
                t_kill = time.monotonic()
                for i in range(50):
                    m(**ids(6, i))
    assert time.monotonic() - t_kill < 5
