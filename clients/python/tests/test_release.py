"""Issue 41: a RELEASE that moves the ring's tail backwards (or past the head) is a protocol
error raised at once with a message saying so (PROTOCOL.md 3: tails only grow), not accepted
and later a timeout."""

from __future__ import annotations

import os
import time

import pytest
import torch

from conftest import tiny_llama
from strapfake import FakeStrapd

from llm_instrumentation import StrapdProtocolError, capture_activations
from llm_instrumentation._ring import Ring


def test_backwards_release_is_a_protocol_error(sockdir, tmp_path):
    model = tiny_llama()
    d = FakeStrapd(os.path.join(sockdir, "r.sock"), release_backwards_after=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(StrapdProtocolError, match=r"moved the ring's tail backwards, from \d+ to 0"):
            with torch.no_grad():
                with capture_activations(model, preset="fast_capture", output_path=tmp_path / "r.strap",
                                         socket_path=d.path, autostart_daemon=False, stall_timeout=30):
                    for i in range(40):
                        model(input_ids=torch.tensor([[1, 2, 3, 4 + i]]), use_cache=False)
        assert time.monotonic() - t0 < 10, "raised only after a timeout"
    finally:
        d.close()


@pytest.mark.parametrize("tail,want", [(5000, "past the head 4096"), (1024, "backwards, from 2048 to 1024")])
def test_ring_release_refuses(tail, want):
    r = Ring(4096 + 8192)
    r.head = 4096
    r.release(2048)
    assert r.tail == 2048
    with pytest.raises(ValueError, match=want):
        r.release(tail)
    assert r.tail == 2048
    r.release(2048)  # the same tail again moves nothing: allowed
    r.release(4096)
    assert r.tail == 4096
    r.close()
