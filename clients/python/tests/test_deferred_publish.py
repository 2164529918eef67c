"""Deferred PUBLISH (docs/PROTOCOL.md 1.4): while generating, a forward pass's records are
named by the next TOKEN's ``head``, not by a PUBLISH of their own, and the ring's published
cursor keeps them safe: a client killed between the pass and its TOKEN still has the pass
in its stream. Real strapd, real memfd rings."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_llama
from genloop import generate

from llm_instrumentation import _daemon
from llm_instrumentation import _session, analyze_activations, capture_activations, open_stream

N_TOKENS = 3


@pytest.mark.parametrize("mode", ["message", "ring"])
def test_sigkill_after_deferred_forward_keeps_its_records(real_strapd, tmp_path, mode):
    out = tmp_path / "killed.strap"
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("deferred_kill_client.py")), real_strapd.socket,
                        str(out), str(N_TOKENS), mode], capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    f = dict(zip(*[iter(p.stdout.split())] * 2))
    # The last pass was behind the cursor only: no message named it before the kill.
    assert f["cursor"] == "1" and int(f["published"]) < int(f["head"]), p.stdout
    if mode == "message":
        assert f["deferred"] == "1", p.stdout
    else:
        # every token and pass after the prompt's is below the cursor, none named by a message
        assert f["unsent_tokens"] == str(N_TOKENS) and f["cursor_at"] == f["head"], p.stdout
    hooks = int(f["hooks"])
    deadline = time.monotonic() + 30
    while _daemon.status(real_strapd.socket)["sessions"]:  # strapd ends the dead client's stream
        assert time.monotonic() < deadline, "strapd did not end the killed client's session"
        time.sleep(0.05)
    a = analyze_activations(out)
    assert a["end_status"] == "aborted"
    with open_stream(out) as r:
        pk = [q for q in r.packets() if q.seq]
    assert [q.seq for q in pk] == list(range(1, len(pk) + 1))
    tensors = [q for q in pk if q.type_name == "TENSOR"]
    tokens = [q for q in pk if q.type_name == "TOKEN"]
    # the prompt's pass, one per token after it, and the killed pass: N_TOKENS + 1 passes
    assert len(tokens) == N_TOKENS
    assert len(tensors) == (N_TOKENS + 1) * hooks
    last = [q for q in tensors if q.forward == N_TOKENS]
    assert len(last) == hooks and all(q.seq > tokens[-1].seq for q in last)
    with open_stream(out) as r:
        for t in r:
            assert t.tensor().shape == t.shape


class _Spy:
    """Counts the messages a session sends from now on (libstrap's counters of its session)."""

    def __init__(self, session):
        self.s = session
        self.base = session.message_counts()

    def __getitem__(self, key):
        return self.s.message_counts()[key] - self.base[key]


def _generate_counting(sock: str, out: Path, defer: bool):
    m = tiny_llama()
    with capture_activations(m, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=False,
                             track_per_token=True) as fw:
        s = fw._session
        spy = _Spy(s)
        assert s._cursor and s._ring_tokens
        s._cursor = defer
        s._ring_tokens = False  # the TOKEN message flow; ring tokens: test_ring_tokens_*
        generate(fw, m, n_tokens=5)
        sent = {k: spy[k] for k in ("publish", "token", "token_head", "token_records")}
    sent["publish_close"] = spy["publish"]  # CLOSE's publish, if any
    return sent, fw


def test_token_carries_head_one_message_per_token(real_strapd, tmp_path):
    sent, fw = _generate_counting(real_strapd.socket, tmp_path / "d.strap", True)
    # the prompt's pass is published (no token yet), then each pass after the first token
    # rides on the next TOKEN; the capture's CLOSE finds nothing left to publish
    assert sent["token"] == 5 and sent["publish"] == 1 and sent["publish_close"] == 1, sent
    assert sent["token_head"] == 4 and sent["token_records"] == 0, sent
    sent_old, fw_old = _generate_counting(real_strapd.socket, tmp_path / "m.strap", False)
    assert sent_old["publish"] == 5 and sent_old["token"] == 5 and sent_old["token_head"] == 0, sent_old
    # the same stream either way
    with open_stream(tmp_path / "d.strap") as a, open_stream(tmp_path / "m.strap") as b:
        pa, pb = list(a.packets()), list(b.packets())
    assert [(q.type_name, q.seq, q.name, q.forward) for q in pa] == [(q.type_name, q.seq, q.name, q.forward) for q in pb]
    assert analyze_activations(tmp_path / "d.strap")["end_status"] == "complete"


def test_two_passes_without_a_token_publish(real_strapd, tmp_path):
    # a second pass in a row (no TOKEN between) publishes both: at most one pass waits
    m = tiny_llama()
    x = torch.randint(0, 1024, (1, 6))
    with torch.no_grad():
        with capture_activations(m, preset="balanced", output_path=tmp_path / "t.strap", socket_path=real_strapd.socket,
                                 autostart_daemon=False, track_per_token=True) as fw:
            s = fw._session
            s._ring_tokens = False
            spy = _Spy(s)
            fw.token_tracker.record_token(5, "<5>")
            m(input_ids=x)
            assert s._deferred and (spy["token"], spy["publish"]) == (1, 0)
            m(input_ids=x)
            assert (spy["token"], spy["publish"]) == (1, 1) and not s._deferred  # both passes
    with open_stream(tmp_path / "t.strap") as r:
        assert len([q for q in r.packets() if q.seq]) == 1 + 2 * len(fw.hooked_modules)


def test_old_daemon_gets_publish(monkeypatch, real_strapd, tmp_path):
    # OPENED without published_cursor (an older strapd): the client publishes every pass
    # (libstrap decides at OPENED; here the flow an OPENED without it leads to is set at once)
    real = _session._speedups

    class OldDaemon:
        @staticmethod
        def open(*a, **kw):
            s, ring, opened = real.Session.open(*a, **kw)
            s.set_mode(0, 0, -1)
            return s, ring, dict(opened, published_cursor=False, ring_tokens=False)

    class Speedups:
        Session = OldDaemon

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(_session, "_speedups", Speedups())
    m = tiny_llama()
    with capture_activations(m, preset="balanced", output_path=tmp_path / "o.strap", socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        assert not fw._session._cursor
        spy = _Spy(fw._session)
        generate(fw, m, n_tokens=3)
        assert spy["publish"] == 3 and spy["token_head"] == 0


def test_ring_tokens_one_message_per_16_tokens(real_strapd, tmp_path):
    # Tokens in the ring (PROTOCOL.md 1.4, "TOKEN records"): one PUBLISH names 16 tokens'
    # passes; the stream is the one the TOKEN message flow writes, packet for packet.
    m = tiny_llama()
    with capture_activations(m, preset="balanced", output_path=tmp_path / "r.strap", socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        s = fw._session
        assert s._ring_tokens and s.ring_tokens_every == 16
        s.ring_tokens_seconds = 1e9  # by count only, whatever the machine's speed
        spy = _Spy(s)
        generate(fw, m, n_tokens=40)
        assert spy["token"] == 0 and spy["token_records"] == 40
        # the prompt's pass, after the 16th token, then as the passes grow (no KV cache) by
        # publish_bytes: never one per token
        assert spy["publish"] == 4, spy.s.message_counts()
    a = analyze_activations(tmp_path / "r.strap")
    assert a["end_status"] == "complete"
    with capture_activations(m, preset="balanced", output_path=tmp_path / "m.strap", socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw2:
        fw2._session._ring_tokens = False
        generate(fw2, m, n_tokens=40)
    with open_stream(tmp_path / "r.strap") as a, open_stream(tmp_path / "m.strap") as b:
        pa, pb = list(a.packets()), list(b.packets())
    key = [(q.type_name, q.seq, q.name, q.step, q.forward) for q in pa]
    assert key == [(q.type_name, q.seq, q.name, q.step, q.forward) for q in pb]
    assert [q.meta for q in pa if q.type_name == "TOKEN"] == [q.meta for q in pb if q.type_name == "TOKEN"]
    assert len([q for q in pa if q.type_name == "TOKEN"]) == 40


def test_ring_tokens_doorbell_by_time(real_strapd, tmp_path):
    m = tiny_llama()
    with capture_activations(m, preset="balanced", output_path=tmp_path / "t.strap", socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        s = fw._session
        s.ring_tokens_seconds = 0.0  # every token's check finds the time passed
        spy = _Spy(s)
        generate(fw, m, n_tokens=4)
        assert spy["token"] == 0
        assert spy["publish"] >= 4
    assert len([q for q in open_stream(tmp_path / "t.strap").packets() if q.type_name == "TOKEN"]) == 4


def test_ring_tokens_long_texts(real_strapd, tmp_path):
    # Texts up to a TOKEN record's 65536 bytes go in the ring (a TOKEN message holds less:
    # its body counts against the 65536-byte message limit), UTF-8 of several bytes a char too.
    m = tiny_llama()
    texts = ["a", "x" * 60000, "é" * 32768, "b"]
    with capture_activations(m, preset="fast_capture", output_path=tmp_path / "l.strap", socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        s = fw._session
        assert s._ring_tokens
        s.ring_tokens_seconds = 1e9
        spy = _Spy(s)
        for i, t in enumerate(texts):
            fw.record_token(i, t)
        assert (spy["token"], spy["publish"], spy["token_records"]) == (0, 0, 4)
    with open_stream(tmp_path / "l.strap") as r:
        toks = [q for q in r.packets() if q.type_name == "TOKEN"]
    assert [q.meta["text"] for q in toks] == texts and [q.seq for q in toks] == [1, 2, 3, 4]


@pytest.mark.parametrize("ring_tokens", [True, False])
def test_token_text_too_long_is_refused_and_the_capture_goes_on(real_strapd, tmp_path, ring_tokens):
    # Over a TOKEN record's 65536 bytes (or a message's limit without ring tokens): that token
    # is refused with a clear error, its sequence number is not spent, and the stream stays
    # whole (a gap would end the session with torn_record at CLOSE).
    m = tiny_llama()
    out = tmp_path / "long.strap"
    with capture_activations(m, preset="fast_capture", output_path=out, socket_path=real_strapd.socket,
                             autostart_daemon=False, track_per_token=True) as fw:
        fw._session._ring_tokens = ring_tokens
        fw.record_token(0, "a")
        with pytest.raises(ValueError, match="not recorded.*capture goes on"):
            fw.record_token(1, "x" * 70000)
        fw.record_token(1, "b")
    a = analyze_activations(out)
    assert a["end_status"] == "complete", a
    with open_stream(out) as r:
        toks = [q for q in r.packets() if q.type_name == "TOKEN"]
    assert [q.meta["text"] for q in toks] == ["a", "b"] and [q.seq for q in toks] == [1, 2]


def test_ring_token_record_bytes():
    # The reference encoding strapd's shm.AppendToken writes (internal/shm TestTokenRecord).
    from llm_instrumentation._ring import encode_token_record, parse_record_header, token_record_len

    b = encode_token_record(seq=9, index=4, token_id=-7, position=36, text="héllo".encode())
    assert len(b) == token_record_len(6) == 192
    h = parse_record_header(b)
    assert (h["kind"], h["seq"], h["record_len"], h["step"], h["payload_off"], h["payload_len"]) == (3, 9, 192, 4, 128, 6)
    assert h["part_offset"] == (1 << 64) - 7 and h["forward"] == 36
    assert b[128:134] == "héllo".encode() and b[134:] == bytes(58) and b[80:128] == bytes(48)
    with pytest.raises(ValueError):
        encode_token_record(seq=1, index=0, token_id=0, position=0, text=bytes(65537))


def test_reset_ring_clears_the_cursor():
    # A kept ring's next session must OPEN with the header's reserved bytes zero (strapd
    # refuses a non-zero one): the last session's cursor goes with reset.
    from llm_instrumentation._ring import HEADER_SIZE, PUBLISHED_OFFSET, Ring, encode_ring_header

    ring = Ring(HEADER_SIZE + (64 << 10))
    try:
        ring.mm.cast("B")[PUBLISHED_OFFSET:PUBLISHED_OFFSET + 8] = (4096).to_bytes(8, "little")  # a cursor
        assert bytes(ring.mm[PUBLISHED_OFFSET:PUBLISHED_OFFSET + 8]) != bytes(8)
        ring.reset()
        assert bytes(ring.mm[:HEADER_SIZE]) == encode_ring_header(ring.ring_size)
    finally:
        ring.close()
