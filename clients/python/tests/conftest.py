"""Shared fixtures: repo paths, small Hugging Face models, a fake daemon, the real strapd."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[3]
TESTDATA = REPO / "testdata"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-client-bodies", action="store_true", default=False,
                     help="rewrite testdata/protocol/client_bodies.json from the client's message dataclasses")


def short_tmpdir() -> str:
    # Unix socket paths are limited to 107 bytes: keep them short.
    return tempfile.mkdtemp(prefix="strap-", dir="/tmp")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch intra-op thread for the test. Captures compared byte for byte with a
    reference (or with a child process, which runs with one thread too) need the same
    kernels; and small matmuls on a shared 2-core machine run several times faster on one
    thread than on two spinning against other processes."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake_daemon(sockdir: str):
    from strapfake import FakeStrapd

    d = FakeStrapd(os.path.join(sockdir, "s.sock"))
    yield d
    d.close()
    assert not d.errors, d.errors


def strapd_bin() -> Path:
    return Path(os.environ.get("STRAPD_BIN", REPO / "bin" / "strapd"))


class Daemon:
    """A real strapd serving on a temp socket."""

    def __init__(self, binary: Path, sockdir: str, *extra: str, wrapper: Sequence[str] = ()) -> None:
        # wrapper: a command that runs strapd (the fault injector of test_eio.py); signals
        # reach strapd through it.
        self.socket = os.path.join(sockdir, "strapd.sock")
        self.log = os.path.join(sockdir, "strapd.log")
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen([*wrapper, str(binary), "serve", "--socket", self.socket, *extra],
                                     stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        import socket as so

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strapd exited {self.proc.returncode}: {self.log_tail()}")
            s = so.socket(so.AF_UNIX, so.SOCK_SEQPACKET)
            try:
                s.connect(self.socket)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"strapd did not come up: {self.log_tail()}")
                time.sleep(0.05)
            finally:
                s.close()

    def log_tail(self) -> str:
        try:
            return Path(self.log).read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()
        return self.proc.returncode


@pytest.fixture
def real_strapd(sockdir: str):
    """Start the real daemon; parametrize extra args with ``@pytest.mark.strapd_args(...)``."""
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b} (go build -o bin/strapd ./cmd/strapd)")
    d = Daemon(b, sockdir)
    yield d
    d.stop()


@pytest.fixture
def strapd_factory(sockdir: str):
    """Start real daemons with extra args: ``strapd_factory('--debug-write-delay', '20ms')``."""
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    started = []

    def make(*extra: str) -> Daemon:
        sub = tempfile.mkdtemp(prefix="d", dir=sockdir)
        d = Daemon(b, sub, *extra)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


# ----- small models ------------------------------------------------------------------------------

def tiny_llama(dtype=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=4, vocab_size=1024))
    m.eval()
    if dtype is not None:
        m = m.to(dtype)
    return m


def generate_with_monitor(model, mon, prompt_len: int, new_tokens: int) -> None:
    """Greedy decoding with the KV cache, the resource monitor ``mon`` told each step."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(3))
    past = None
    with torch.no_grad():
        for step in range(new_tokens + 1):
            mon.set_step(step)
            r = model(input_ids=ids, cache=past, use_cache=True)
            past = r.cache
            ids = r.logits[:, -1:].argmax(-1)


def write_batches(mon, batches, state: dict, keep: bool = False):
    """Run the resource writer of ``mon`` over copies of recorded ``batches`` from writer
    ``state`` (with the templates made so far if ``keep``): its lines and end state."""
    st = mon.writer.state
    st.restore(state, st.templates if keep else None)
    lines: list = []
    sink = mon.writer.sink
    mon.writer.sink = type("Lines", (), {"write": staticmethod(lines.extend)})()
    try:
        for b in batches:
            mon.writer.write_batch(list(b))
    finally:
        mon.writer.sink = sink
    return lines, st.snapshot()


def writer_state_same(state: dict) -> dict:
    """What two runs of the resource writer must agree on (not when they read the clock, nor
    the templates, nor its CPU time); a NaN as its repr (NaN != NaN)."""
    return {k: repr(v) if isinstance(v, float) and v != v else v for k, v in state.items()
            if k not in ("memory_fraction_at", "templates", "writer_cpu_ns")}


def tiny_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=1000, n_positions=128)).eval()


def tiny_bert():
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=256, vocab_size=1000)).eval()


def sent_resources(lines: List[bytes]) -> List[bytes]:
    """The RESOURCES datagrams a capture session sends for ``lines`` (through SessionSink and
    libstrap's packing), read at the other end of a socketpair."""
    import socket

    from llm_instrumentation import _ring
    from llm_instrumentation._session import CaptureSession
    from llm_instrumentation.resources import SessionSink

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s = CaptureSession(a, _ring.Ring(_ring.HEADER_SIZE + 64 * 64))
    try:
        sink = SessionSink(s.send_resources)
        sink.write(lines)
        b.setblocking(False)
        got: List[bytes] = []
        while True:
            try:
                got.append(b.recv(1 << 17))
            except BlockingIOError:
                break
        assert len(got) == sink.messages
        return got
    finally:
        s.shutdown()
        b.close()
