"""A process keeps its ring after a clean close and the next capture reuses it
(_ring.take_ring / keep_ring): the pages stay populated, and the streams stay exact even
though the reused ring still holds the previous session's records past the new head."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
from captest import capture_and_check
from conftest import tiny_llama

from llm_instrumentation import InstrumentationConfig
import wire as P
from llm_instrumentation import _ring as R
from llm_instrumentation._session import CaptureSession

SMALL = R.HEADER_SIZE + 64 * 64


@pytest.fixture(autouse=True)
def no_idle_ring():
    R.release_idle_ring()
    yield
    R.release_idle_ring()


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 1000, (1, n), generator=g)}


def test_second_capture_reuses_the_ring_and_both_streams_are_exact(real_strapd, tmp_path):
    model = tiny_llama()
    # A 1 MiB ring, lapped several times by the first capture: the second starts at
    # position 0 over the first one's records and writes fewer bytes than it did.
    cfg = InstrumentationConfig.from_preset("fast_capture").with_memory_limit(1 / 1024)
    fw1, _ = capture_and_check(model, [ids(48, s) for s in range(6)], tmp_path / "a.strap", real_strapd.socket,
                               config=cfg)
    ring = fw1._last_session.ring
    assert ring.fd >= 0, "a cleanly closed session's ring is kept"
    first_head = ring.head
    assert first_head > 2 * ring.data_size
    fw2, _ = capture_and_check(model, [ids(7, 9)], tmp_path / "b.strap", real_strapd.socket, config=cfg)
    assert fw2._last_session.ring is ring
    assert 0 < ring.head < ring.data_size < first_head


def test_other_size_or_other_process_gets_a_new_ring():
    a = R.take_ring(SMALL)
    R.keep_ring(a)
    b = R.take_ring(SMALL + 64)
    assert b is not a and a.fd == -1, "a kept ring of another size is closed, not held"
    R.keep_ring(b)
    b.pid = os.getpid() + 1  # as a forked child sees its parent's ring: shared pages
    c = R.take_ring(SMALL + 64)
    assert c is not b and b.fd == -1
    c.close()


def test_same_size_is_reused_from_position_zero():
    a = R.take_ring(SMALL)
    a.head = 1024
    a.release(1024)
    R.keep_ring(a)
    b = R.take_ring(SMALL)
    assert b is a and (b.head, b.tail) == (0, 0)
    assert R.take_ring(SMALL) is not a, "one ring, one owner"
    b.close()


def test_kept_ring_is_closed_when_the_time_is_up(monkeypatch):
    monkeypatch.setattr(R, "IDLE_KEEP_S", 0.05)
    a = R.take_ring(SMALL)
    R.keep_ring(a)
    deadline = time.monotonic() + 5
    while a.fd >= 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.fd == -1
    assert R.take_ring(SMALL) is not a


@pytest.mark.parametrize("closed", [False, True])
def test_only_a_cleanly_closed_session_keeps_its_ring(closed):
    x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(x, R.take_ring(SMALL))
    if closed:
        s.closed_summary = P.Closed(packets=0, drops=0, bytes_in=0, bytes_out=0, file_bytes=0)
    s.shutdown()
    y.close()
    assert (s.ring.fd >= 0) is closed
    assert (R.take_ring(SMALL) is s.ring) is closed
