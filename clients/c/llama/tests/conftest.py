"""Fixtures of the llama.cpp capture tests (make test-llamacpp): the real strapd, the real
strap-llama against llama.cpp's library, and small random Llama GGUF models written here."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = Path(os.environ.get("STRAP_REPO", HERE.parents[3]))
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_DIR", Path.home() / ".cache/strap-llm/llama.cpp-0.3.36"))
STRAP_LLAMA = Path(os.environ.get("STRAP_LLAMA_BIN", REPO / "build/c-llama/llama/strap-llama"))
STRAPD = Path(os.environ.get("STRAPD_BIN", REPO / "bin/strapd"))
VOCAB = LLAMA_CPP / "src/models/ggml-vocab-llama-spm.gguf"
PROMPT = "The quick brown fox jumps over the lazy dog because"

sys.path.insert(0, str(REPO / "clients/c/tests"))  # readback.py, compare_streams.py


def pytest_configure(config):
    config.addinivalue_line("markers", "long: random-kill tests (make test-long-llamacpp)")


def _need(p: Path, what: str) -> None:
    if not p.exists():
        msg = f"{what} missing at {p} (make strap-llama)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def make_model(out: Path, **kw) -> Path:
    """A random Llama GGUF (make_tiny_gguf.py) with llama.cpp's Llama SentencePiece vocab."""
    _need(VOCAB, "llama.cpp's vocab file")
    if out.exists():
        return out
    args = [sys.executable, str(HERE / "make_tiny_gguf.py"), "--vocab", str(VOCAB), "--out", str(out)]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "src/gguf-py")}
    subprocess.run(args, check=True, env=env, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """4 layers, 64 wide, f32: seconds to write, milliseconds per token."""
    return make_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def kill_model(tmp_path_factory) -> Path:
    """Wide enough that decoding takes long enough to be killed at many different tokens."""
    return make_model(tmp_path_factory.mktemp("models") / "kill.gguf", n_embd=256, n_layer=6, n_head=8,
                      n_head_kv=4, n_ff=512, dtype="f16")


class Strapd:
    def __init__(self, d: Path, *serve_args: str, name: str = "strapd") -> None:
        _need(STRAPD, "strapd")
        self.socket = str(d / f"{name}.sock")
        self.log = d / f"{name}.log"
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen([str(STRAPD), "serve", "--socket", self.socket, *serve_args], stdout=self._logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(self.socket)
                break
            except OSError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.05)
            finally:
                s.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


@pytest.fixture(scope="module")
def strapd(tmp_path_factory):
    d = Strapd(tmp_path_factory.mktemp("strapd"))
    yield d
    d.stop()


def strap_llama_cmd(model: Path, *args: str, socket_path: Optional[str] = None, n: int = 8,
                    prompt: str = PROMPT) -> List[str]:
    _need(STRAP_LLAMA, "strap-llama")
    cmd = [str(STRAP_LLAMA), "-m", str(model), "-p", prompt, "-n", str(n), "--ignore-eos", *args]
    if socket_path:
        cmd += ["--socket", socket_path]
    return cmd


def run_llama(model: Path, *args: str, socket_path: Optional[str] = None, n: int = 8, prompt: str = PROMPT,
              check: bool = True) -> Dict:
    """Runs strap-llama to completion; its JSON summary (with "rc" and "stderr")."""
    p = subprocess.run(strap_llama_cmd(model, *args, socket_path=socket_path, n=n, prompt=prompt),
                       capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout) if p.stdout.strip() else {}
    out["rc"] = p.returncode
    out["stderr"] = p.stderr
    return out


def strapd_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(STRAPD), *args], capture_output=True, text=True, timeout=120)
