"""Records copied from CUDA tensors are published only once their copies completed, without
the model's thread waiting for the GPU (docs/PROTOCOL.md 3, docs/GPU.md).

No GPU here: the copies' CUDA events are stand-ins whose completion the test decides; the
session, the copier's bookkeeping (``CudaCopier.pending/copied/wait``), the ring and the
PUBLISH/TOKEN messages are the real ones. ``bench/gpu_check.py`` runs the real copies."""

from __future__ import annotations

import socket

import pytest
import torch

import wire as P
from llm_instrumentation import _ring as R
from llm_instrumentation._cuda import CudaCopier, wait_event
from llm_instrumentation._session import CaptureSession


class Event:
    """A CUDA event stand-in: complete once ``done`` is set, or after ``polls`` queries."""

    def __init__(self, polls: int = -1) -> None:
        self.done = polls == 0
        self.polls = polls
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        if self.polls > 0 and self.queries >= self.polls:
            self.done = True
        return self.done


def _copier() -> CudaCopier:
    c = CudaCopier.__new__(CudaCopier)  # everything but cudaHostRegister and the side streams
    c.registered = False
    c._streams = {}
    c._inflight = __import__("collections").deque()
    c._last_event = None
    c._direct, c._direct_head, c._just_direct = set(), None, False
    return c


@pytest.fixture
def session():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(a, R.Ring(R.HEADER_SIZE + 64 * 64), publish_bytes=64)
    s._cuda = _copier()
    yield s, P.Connection(b)
    s.shutdown()
    b.close()


def _write(s: CaptureSession, ev=None) -> int:
    """One record, its copy 'queued' with ``ev`` (None: a CPU record); the head after it."""
    s._cuda._last_event = ev
    assert s.write_tensor("m", torch.ones(4), 0, 0)
    return s.ring.head


def test_publish_waits_for_the_copy_and_never_blocks(session):
    s, peer = session
    ev1, ev2 = Event(), Event()
    h1 = _write(s, ev1)
    h2 = _write(s, ev2)  # crossing publish_bytes published nothing: ev1 is not done
    s.flush()
    assert peer.recv(0.05) is None and s.published_head == 0
    ev1.done = True
    s.flush()  # the completed prefix only
    pub = peer.recv(1.0)
    assert isinstance(pub, P.Publish) and (pub.head, pub.seq) == (h1, 1)
    h3 = _write(s)  # a CPU record behind an unfinished copy waits for it
    s.flush()
    assert peer.recv(0.05) is None and s.published_head == h1
    ev2.done = True
    s.flush()
    pub = peer.recv(1.0)
    assert isinstance(pub, P.Publish) and (pub.head, pub.seq) == (h3, 3) and h3 > h2
    assert not s._cuda.busy


def test_token_waits_for_every_copy_first(session):
    s, peer = session
    ev = Event(polls=4)  # completes while the session waits for it
    h = _write(s, ev)
    s.token(0, 7, "x", 1)
    pub, tok = peer.recv(1.0), peer.recv(1.0)
    assert isinstance(pub, P.Publish) and (pub.head, pub.seq) == (h, 1)
    assert isinstance(tok, P.Token) and tok.seq == 2
    assert ev.queries >= 4 and not s._cuda.busy


def test_copies_complete_in_any_order_publish_in_ring_order(session):
    s, peer = session
    a, b = Event(), Event(polls=0)  # the second (another device's stream) completes first
    h1 = _write(s, a)
    _write(s, b)
    s.flush()
    assert peer.recv(0.05) is None
    a.done = True
    s.flush()
    pub = peer.recv(1.0)
    assert (pub.head, pub.seq) == (s.ring.head, 2) and h1 < s.ring.head


def test_wait_event_polls_until_complete():
    ev = Event(polls=5)
    wait_event(ev)
    assert ev.done and ev.queries == 5


def test_the_registration_lives_with_the_ring():
    """The session leaves the ring's CUDA copier to the ring: a reused ring stays registered;
    closing the ring closes its copier (waits for the copies, unregisters) before unmapping."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ring = R.Ring(R.HEADER_SIZE + 64 * 64)
    cop = _copier()
    cop._u8 = ring.u8()
    closed = []
    cop.close = lambda: (closed.append(True), CudaCopier.close(cop))
    ring.cuda = cop
    s = CaptureSession(a, ring)
    s._cuda = ring.cuda
    s.sock.close()  # the session ends; with no CLOSED from a daemon the ring is not kept
    s.shutdown()
    b.close()
    assert closed == [True] and ring.cuda is None and cop._u8 is None and ring.fd == -1
