"""End-to-end capture through the in-process fake daemon (tests/strapfake.py), which checks
every ring record against PROTOCOL.md. The same checks run against the real strapd in
test_integration.py."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import torch
from captest import bits, capture_and_check, reference_hooks
from conftest import tiny_bert, tiny_gpt2, tiny_llama
from strapfake import FakeStrapd

from llm_instrumentation import (
    HookGranularity,
    InstrumentationConfig,
    StrapdConnectionError,
    StrapdProtocolError,
    analyze_activations,
    analyze_activations_with_tokens,
    capture_activations,
    open_stream,
)
import wire as P

LOSSLESS = ["fast_capture", "balanced", "max"]


def ids(n=10, seed=0, vocab=1000, batch=1):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (batch, n), generator=g)}


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.mark.parametrize("preset", LOSSLESS)
def test_llama_exact(llama, fake_daemon, tmp_path, preset):
    fw, _ = capture_and_check(llama, [ids(9, 1), ids(9, 2)], tmp_path / "c.strap", fake_daemon.path, preset=preset)
    assert len(fw.hooked_modules) == 12 and fw.summary["packets"] == 24
    assert fake_daemon.sessions[-1]["open"]["codec"] == {"fast_capture": "none", "balanced": "shuffle", "max": "shuffle"}[preset]


def test_llama_bf16_exact(fake_daemon, tmp_path):
    m = tiny_llama(torch.bfloat16)
    capture_and_check(m, [ids(7)], tmp_path / "b.strap", fake_daemon.path, preset="balanced")
    with open_stream(tmp_path / "b.strap") as r:
        t = r.tensors("model.layers.0.mlp")[0]
        assert t.dtype == "bfloat16" and t.numpy().dtype.name == "float32"


def test_gpt2_exact(fake_daemon, tmp_path):
    fw, _ = capture_and_check(tiny_gpt2(), [ids(8)], tmp_path / "g.strap", fake_daemon.path, preset="fast_capture")
    assert "transformer.h.2.mlp" in fw.hooked_modules


def test_bert_exact(fake_daemon, tmp_path):
    fw, _ = capture_and_check(tiny_bert(), [ids(8)], tmp_path / "bert.strap", fake_daemon.path, preset="max")
    assert "encoder.layer.1.intermediate" in fw.hooked_modules


def test_outputs_unchanged(llama, fake_daemon, tmp_path):
    x = ids(11)
    with torch.no_grad():
        plain = llama(**x).logits
        with capture_activations(llama, preset="balanced", output_path=tmp_path / "o.strap",
                                 socket_path=fake_daemon.path, autostart_daemon=False):
            captured = llama(**x).logits
    assert torch.equal(bits(plain), bits(captured))


class Odd(torch.nn.Module):
    """Outputs the 1.3.1 client lost: non-contiguous, requires_grad, ints, tuples, dicts."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.inner = torch.nn.Sequential(torch.nn.Identity())

    def forward(self, x):
        a = self.lin(x)                      # requires_grad
        b = self.inner(a.t())                # non-contiguous view
        return a, b


class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.odd = Odd()
        self.ints = IntOut()
        self.dct = DictOut()

    def forward(self, x):
        a, b = self.odd(x)
        return self.ints(a), self.dct(b)


class IntOut(torch.nn.Module):
    def forward(self, a):
        return (a > 0).to(torch.int32), (a > 0), None


class DictOut(torch.nn.Module):
    def forward(self, b):
        return {"main": b * 2, "aux": b.sum(), "label": "text"}


def test_odd_outputs(fake_daemon, tmp_path):
    torch.manual_seed(0)
    m = Wrapper()
    x = torch.randn(4, 6)
    with capture_activations(m, preset="balanced", output_path=tmp_path / "odd.strap", socket_path=fake_daemon.path,
                             autostart_daemon=False, modules=["odd", "odd.inner.0", "ints", "dct"]) as fw:
        (i32, bools, _), d = m(x)
        a = m.odd.lin(x)
    assert a.requires_grad  # capture did not detach the model's own tensors
    with open_stream(tmp_path / "odd.strap") as r:
        got = {t.name: t.tensor() for t in r}
    assert set(got) == {"odd", "odd.out1", "odd.inner.0", "ints", "ints.out1", "dct", "dct.aux"}
    assert torch.equal(got["odd"], a.detach()) and torch.equal(got["odd.out1"], a.detach().t())
    assert torch.equal(got["odd.inner.0"], a.detach().t())
    assert got["ints"].dtype == torch.int32 and torch.equal(got["ints"], i32)
    assert got["ints.out1"].dtype == torch.bool and torch.equal(got["ints.out1"], bools)
    assert torch.equal(got["dct"], d["main"]) and torch.equal(got["dct.aux"], d["aux"].detach())
    assert fw.summary["packets"] == 7


def test_unsupported_dtype_is_a_clear_error(fake_daemon, tmp_path):
    class C(torch.nn.Module):
        def forward(self, x):
            return torch.complex(x, x)

    m = torch.nn.Sequential(C())
    with pytest.raises(TypeError, match="complex64 cannot be captured"):
        with capture_activations(m, output_path=tmp_path / "x.strap", socket_path=fake_daemon.path,
                                 autostart_daemon=False, modules=["0"]):
            m(torch.randn(3))
    assert analyze_activations(tmp_path / "x.strap")["end_status"] == "complete"


def test_parts_and_pads_tiny_ring(llama, sockdir, tmp_path):
    d = FakeStrapd(os.path.join(sockdir, "t.sock"), write_delay=0.001)
    try:
        cfg = InstrumentationConfig.fast_capture().with_memory_limit((64 << 10) / (1 << 30) + 4096 / (1 << 30))
        assert cfg.ring_size == 4096 + (64 << 10)
        # 1 x 40 x 256 fp32 = 40 KiB per block output: > 16 KiB quarter region -> 3 parts each
        capture_and_check(llama, [ids(40, 3), ids(40, 4)], tmp_path / "p.strap", d.path, config=cfg)
        with open_stream(tmp_path / "p.strap") as r:
            t = r.tensors("model.layers.0.mlp")[0]
            assert len(t.packets) == 3 and all(p.is_part for p in t.packets)
    finally:
        d.close()
    assert not d.errors, d.errors


def test_block_policy_loses_nothing_with_slow_writer(llama, sockdir, tmp_path):
    d = FakeStrapd(os.path.join(sockdir, "b.sock"), write_delay=0.005)
    try:
        cfg = InstrumentationConfig.fast_capture().with_memory_limit(0.0002)  # ~210 KiB ring
        fw, _ = capture_and_check(llama, [ids(24, i) for i in range(3)], tmp_path / "b.strap", d.path, config=cfg)
        assert fw.summary["drops"] == 0 and fw.summary["packets"] == 36
    finally:
        d.close()
    assert not d.errors, d.errors


def test_drop_policy_counts_drops(llama, sockdir, tmp_path):
    # The writer is far slower than the model even on a loaded machine, and one forward
    # (288 KiB) does not fit the 210 KiB ring: drops happen whatever the scheduler does.
    d = FakeStrapd(os.path.join(sockdir, "d.sock"), write_delay=0.25)
    try:
        cfg = InstrumentationConfig.fast_capture().with_memory_limit(0.0002).with_backpressure("drop")
        out = tmp_path / "d.strap"
        with torch.no_grad():
            with capture_activations(llama, config=cfg, output_path=out, socket_path=d.path,
                                     autostart_daemon=False) as fw:
                for i in range(3):
                    llama(**ids(24, i))
        s = fw.summary
        assert s["drops"] > 0 and s["packets"] == 36  # TENSOR + DROP packets
        assert fw.stats["drops"] == s["drops"] and sum(v["count"] for v in fw.stats["drops_by_module"].values()) == s["drops"]
        a = analyze_activations(out)
        assert a["drops"]["count"] == s["drops"] and a["packets"] == 36 - s["drops"]
        assert sum(v["count"] for v in a["drops"]["by_module"].values()) == s["drops"]
        assert a["drops"]["bytes"] == s["drops"] * 24 * 256 * 4
        with open_stream(out) as r:
            seqs = sorted([t.seq for t in r] + [pk.seq for pk in r.packets() if pk.type_name == "DROP"])
        assert seqs == list(range(1, 37))  # every event has its sequence number, nothing silent
    finally:
        d.close()
    assert not d.errors, d.errors


def test_sampled_slices(llama, fake_daemon, tmp_path):
    cfg = InstrumentationConfig.fast_capture().with_granularity(HookGranularity.SAMPLED_SLICES).with_sampled_positions(4)
    x = ids(10)
    with torch.no_grad():
        with capture_activations(llama, config=cfg, output_path=tmp_path / "s.strap", socket_path=fake_daemon.path,
                                 autostart_daemon=False) as fw:
            ref, hs = reference_hooks(llama, fw.hooked_modules)
            llama(**x)
            for h in hs:
                h.remove()
    with open_stream(tmp_path / "s.strap") as r:
        for name in fw.hooked_modules:
            (t,) = r.tensors(name)
            assert t.meta == {"positions": [0, 4, 8, 9], "dim": 1}
            full = ref[name][0]
            assert tuple(t.shape) == (1, 4, 256)
            assert torch.equal(t.tensor(), full[:, [0, 4, 8, 9]])
            # put the slice back in place
            back = torch.zeros_like(full)
            back[:, t.meta["positions"]] = t.tensor()
            assert torch.equal(back[:, 9], full[:, 9])


def test_step_and_forward_counters(llama, fake_daemon, tmp_path):
    out = tmp_path / "tok.strap"
    with torch.no_grad():
        with capture_activations(llama, preset="fast_capture", output_path=out, socket_path=fake_daemon.path,
                                 autostart_daemon=False, track_per_token=True, modules=None) as fw:
            x = ids(5)
            llama(**x)                       # prompt: step 0
            for k in range(3):
                fw.token_tracker.record_token(k + 7, f"t{k}")
                llama(input_ids=torch.tensor([[k]]))  # step k+1
    with open_stream(out) as r:
        got = [(t.step, t.forward) for t in r.tensors("model.layers.1.mlp")]
    assert got == [(0, 0), (1, 1), (2, 2), (3, 3)]
    a = analyze_activations_with_tokens(out, fw)
    # tokens are TOKEN packets in the stream now
    assert a["token_metadata"]["source"] == "stream" and a["token_metadata"]["total_tokens"] == 3
    assert a["token_metadata"]["tokens"] == fw.tokens
    assert a["per_step"][0]["packets"] == 12 and set(a["per_step"]) == {0, 1, 2, 3}
    assert analyze_activations_with_tokens(out)["token_metadata"]["source"] == "stream"


def test_one_publish_per_forward_pass(llama, fake_daemon, tmp_path):
    """Small tensors are published in one batch per forward pass, not one syscall each."""
    out = tmp_path / "batch.strap"
    with torch.no_grad():
        with capture_activations(llama, preset="fast_capture", output_path=out, socket_path=fake_daemon.path,
                                 autostart_daemon=False) as fw:
            for k in range(3):
                llama(**ids(6, seed=k))
    sess = fake_daemon.sessions[-1]
    assert len(fw.hooked_modules) > 1
    assert sess["packets"] == 3 * len(fw.hooked_modules)
    assert sess["publishes"] == 3


def test_daemon_death_raises_promptly(llama, sockdir, tmp_path):
    d = FakeStrapd(os.path.join(sockdir, "x.sock"), die_after_packets=3)
    try:
        t0 = time.monotonic()
        with pytest.raises(StrapdConnectionError, match="closed by the daemon|reset"):
            with torch.no_grad():
                with capture_activations(llama, preset="fast_capture", output_path=tmp_path / "x.strap",
                                         socket_path=d.path, autostart_daemon=False):
                    for i in range(20):
                        llama(**ids(8, i))
        assert time.monotonic() - t0 < 10
    finally:
        d.close()


def test_daemon_error_is_raised(llama, sockdir, tmp_path):
    d = FakeStrapd(os.path.join(sockdir, "e.sock"), error_after_packets=2)
    try:
        with pytest.raises(StrapdProtocolError) as ei:
            with torch.no_grad():
                with capture_activations(llama, preset="fast_capture", output_path=tmp_path / "e.strap",
                                         socket_path=d.path, autostart_daemon=False):
                    for i in range(20):
                        llama(**ids(8, i))
        assert ei.value.code == "write_failed" and "ENOSPC" in str(ei.value)
    finally:
        d.close()
    assert analyze_activations(tmp_path / "e.strap")["end_status"] == "error"


def _one_shot_server(path, reply: bytes):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.listen(1)

    def run():
        c, _ = s.accept()
        c.recv(65536)
        c.send(reply)
        c.close()
        s.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_version_mismatch_error_readable(sockdir):
    path = os.path.join(sockdir, "v.sock")
    reply = P.encode_message(P.ERROR, {"code": "protocol_version", "message": "client speaks protocol 1, strapd speaks protocol 2",
                                        "fatal": True}, version=2)
    th = _one_shot_server(path, reply)
    conn = P.Connection.connect(path)
    with pytest.raises(StrapdProtocolError) as ei:
        P.handshake(conn, "t", 1)
    assert ei.value.code == "protocol_version" and "protocol 2" in str(ei.value)
    conn.close()
    th.join(5)


def test_two_sessions_at_once(fake_daemon, tmp_path):
    models = [tiny_llama(), tiny_gpt2()]
    errors = []

    def run(i):
        try:
            capture_and_check(models[i], [ids(6, i), ids(6, i + 5)], tmp_path / f"m{i}.strap", fake_daemon.path,
                              preset="balanced")
        except BaseException as e:  # surfaced below
            errors.append(e)

    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    assert not errors, errors


def test_default_output_path_in_output_dir(fake_daemon, tmp_path):
    m = tiny_gpt2()
    paths = []
    for _ in range(2):
        with torch.no_grad():
            with capture_activations(m, output_dir=tmp_path / "caps", socket_path=fake_daemon.path,
                                     autostart_daemon=False) as fw:
                m(input_ids=torch.tensor([[1, 2]]))
        paths.append(fw.output_path)
    assert paths[0] != paths[1] and all(p.startswith(str(tmp_path / "caps")) for p in paths)
    md = analyze_activations(paths[0])["metadata"]["client_metadata"]
    assert md["output_path"] == paths[0] and md["model_class"] == "GPT2LMHeadModel"
    assert md["capture_config"]["compression_algorithm"] == "shuffle"


def test_gradients_unchanged_under_capture(fake_daemon, tmp_path):
    m = tiny_gpt2().train()
    torch.manual_seed(1)
    x = torch.randint(0, 1000, (1, 6))

    def grads():
        torch.manual_seed(2)  # same dropout masks
        m.zero_grad()
        m(input_ids=x, labels=x).loss.backward()
        return [p.grad.clone() for p in m.parameters()]

    plain = grads()
    with capture_activations(m, preset="fast_capture", output_path=tmp_path / "g.strap",
                             socket_path=fake_daemon.path, autostart_daemon=False) as fw:
        captured = grads()
    assert all(torch.equal(a, b) for a, b in zip(plain, captured))
    assert fw.summary["packets"] == len(fw.hooked_modules)
