"""strapd uploading captures to a real S3 server (VersityGW, posix backend) while they run:
the object equals the local stream byte for byte; the server killed and restarted, strapd
SIGKILLed and restarted, bad credentials (docs/OBJECT_STORAGE.md "Uploading while capturing").

VersityGW comes from ``make versitygw`` (``STRAP_VERSITYGW``; built here when missing);
buckets are created and objects read with boto3, the way users' own tools would."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import warnings
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import torch

import s3server
from conftest import Daemon, strapd_bin, tiny_llama
from s3server import ACCESS, SECRET, versitygw_bin

from llm_instrumentation import UploadWarning, capture_activations
from llm_instrumentation.framework import tokens_path

boto3 = pytest.importorskip("boto3", reason="boto3 is in the Makefile's PY_DEPS (make venv)")

BUCKET = "caps"


class S3Server(s3server.S3Server):
    """The shared VersityGW harness with the bucket of these tests."""

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return super().get(BUCKET, key)


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A fresh server per test (the fault tests kill and restart it)."""
    srv = S3Server(versitygw_bin(build=True), tmp_path)
    srv.client().create_bucket(Bucket=BUCKET)
    # strapd finds its credentials the standard way: here, the environment.
    for k, v in {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
                 "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        monkeypatch.setenv(k, v)
    yield srv
    srv.stop()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Any]:
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    started: List[Daemon] = []
    state = tmp_path / "upload-state"

    def make(s3: S3Server, *extra: str, probes: bool = False) -> Daemon:
        sub = tempfile.mkdtemp(prefix="d", dir="/tmp")
        d = Daemon(b, sub, *(() if probes else ("--no-probes",)), "--s3-endpoint", s3.endpoint,
                   "--upload-part-size", "5MiB", "--upload-state-dir", str(state), *extra)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


def status(d: Daemon) -> Dict[str, Any]:
    r = subprocess.run([str(strapd_bin()), "status", "--json", "--socket", d.socket], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)

def wait_first_part(d: Daemon, obj: str, timeout: float = 30) -> None:
    """Wait until a part of obj's upload is on the server (the capture still writing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ups = [u for u in status(d).get("uploads") or [] if u["object"] == obj]
        if ups and ups[0]["uploaded_bytes"] > 0:
            return
        time.sleep(0.05)
    pytest.fail("no part uploaded while capturing")


def wait_upload(d: Daemon, obj: str, state: str = "complete", timeout: float = 90,
                final_size: Optional[int] = None) -> Dict[str, Any]:
    """The newest upload of obj (of a stream of final_size bytes, when given: a resumed
    capture's, not the aborted one's before it) once it is in state."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        ups = [u for u in status(d).get("uploads") or []
               if u["object"] == obj and (final_size is None or u["final_size"] == final_size)]
        if ups:
            last = ups[-1]
            if last["state"] == state:
                return last
        time.sleep(0.1)
    pytest.fail(f"upload of {obj} not {state} after {timeout}s: {last}\n{d.log_tail()}")


def big_input(n: int = 512) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, 1000, (1, n))


def capture_forwards(sock: str, out: Path, n: int, upload: Optional[str], **kw: Any) -> Dict[str, Any]:
    """n forward passes of the tiny Llama on 512 tokens, codec none: ~7 MB a pass (a token
    recorded after each when tracking)."""
    model = tiny_llama()
    ids = big_input()
    with capture_activations(model, preset="fast_capture", output_path=out, socket_path=sock, autostart_daemon=False,
                             upload=upload, **kw) as fw:
        with torch.no_grad():
            for i in range(n):
                model(input_ids=ids, use_cache=False)
                if fw.token_tracker is not None:
                    fw.token_tracker.record_token(i, f"<{i}>")
    return fw.summary


def test_capture_uploads_stream_and_side_files(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    d = daemons(s3, probes=True)  # the kernel trace (eBPF as root, /proc otherwise)
    out = tmp_path / "cap.strap"
    model = tiny_llama()
    with capture_activations(model, preset="balanced", output_path=out, socket_path=d.socket, autostart_daemon=False,
                             track_per_token=True, resource_level="MINIMAL", trace_path=True,
                             upload=f"s3://{BUCKET}/run1/host0") as fw:
        ids = [1, 5, 9, 33]
        with torch.no_grad():
            for _ in range(6):
                nxt = int(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
                fw.token_tracker.record_token(nxt, f"<{nxt}>")
                ids.append(nxt)
    obj = f"s3://{BUCKET}/run1/host0/cap.strap"
    assert fw.summary["upload"] == obj
    u = wait_upload(d, obj)
    local = out.read_bytes()
    assert u["uploaded_bytes"] == u["final_size"] == len(local) == fw.summary["file_bytes"]
    assert u["verified"] and u["errors"] == 0 and u["lag_bytes"] == 0
    assert s3.get("run1/host0/cap.strap") == local
    # Beside it: the tokens file (passed with CLOSE) and the resource log.
    tok = Path(tokens_path(out))
    assert s3.get(f"run1/host0/{tok.name}") == tok.read_bytes()
    res = Path(str(out) + ".resources.jsonl")
    assert s3.get(f"run1/host0/{res.name}") == res.read_bytes() and res.stat().st_size > 0
    tr = Path(str(out) + ".trace.jsonl")
    assert s3.get(f"run1/host0/{tr.name}") == tr.read_bytes() and tr.stat().st_size > 0
    # strapd reads the object back by range.
    v = subprocess.run([str(strapd_bin()), "verify", "--json", "--s3-endpoint", s3.endpoint, obj],
                       capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr
    assert json.loads(v.stdout)["ok"] is True
    local_inspect = subprocess.run([str(strapd_bin()), "inspect", "--json", str(out)], capture_output=True, text=True)
    s3_inspect = subprocess.run([str(strapd_bin()), "inspect", "--json", "--s3-endpoint", s3.endpoint, obj],
                                capture_output=True, text=True, timeout=60)
    assert s3_inspect.returncode == 0, s3_inspect.stderr
    assert json.loads(s3_inspect.stdout)["modules"] == json.loads(local_inspect.stdout)["modules"]
    text = subprocess.run([str(strapd_bin()), "status", "--socket", d.socket], capture_output=True, text=True).stdout
    assert obj in text and "complete" in text


def test_daemon_wide_target_and_delete_local(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    d = daemons(s3, "--upload", f"s3://{BUCKET}/fleet", "--upload-keep-local=false")
    out = tmp_path / "big.strap"
    summary = capture_forwards(d.socket, out, 3, None, track_per_token=True)
    me = pwd.getpwuid(os.getuid()).pw_name  # the daemon's target gets a component per user
    obj = f"s3://{BUCKET}/fleet/{me}/big.strap"
    assert summary["upload"] == obj  # OPENED told the client, so its tokens file went with CLOSE
    u = wait_upload(d, obj)
    assert u["local_deleted"] and not out.exists()
    tok = Path(tokens_path(out))
    assert not tok.exists() and json.loads(s3.get(f"fleet/{me}/{tok.name}"))["total_tokens"] == 3
    assert u["parts"] >= 2 and u["final_size"] == summary["file_bytes"]
    data = s3.get(f"fleet/{me}/big.strap")
    assert len(data) == summary["file_bytes"]
    v = subprocess.run([str(strapd_bin()), "verify", "--s3-endpoint", s3.endpoint, obj], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_server_killed_mid_upload_then_restarted(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    d = daemons(s3)
    out = tmp_path / "srv.strap"
    obj = f"s3://{BUCKET}/k/srv.strap"
    model = tiny_llama()
    ids = big_input()
    killed = False
    with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d.socket,
                             autostart_daemon=False, upload=f"s3://{BUCKET}/k") as fw:
        with torch.no_grad():
            for i in range(6):
                model(input_ids=ids, use_cache=False)
                if not killed and i >= 1:
                    # Parts went up while capturing: kill the server in the middle of it.
                    wait_first_part(d, obj)
                    s3.kill()
                    killed = True
    u = wait_upload(d, obj, state="retrying", timeout=60)
    assert u["errors"] >= 1 and u["last_error"] and u["lag_bytes"] > 0
    assert out.stat().st_size == fw.summary["file_bytes"]  # the capture went on, locally
    s3.start()
    u = wait_upload(d, obj)
    assert s3.get("k/srv.strap") == out.read_bytes()


def test_strapd_sigkilled_mid_upload_restarted_completes(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """Parts go up while capturing; the server dies, the session ends with the rest still to
    send, strapd is SIGKILLed; after both restart, the new strapd lists the server's parts,
    keeps the acknowledged ones and completes the object from its state file."""
    d = daemons(s3)
    out = tmp_path / "kill.strap"
    obj = f"s3://{BUCKET}/k/kill.strap"
    model = tiny_llama()
    ids = big_input()
    with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d.socket,
                             autostart_daemon=False, upload=f"s3://{BUCKET}/k") as fw:
        with torch.no_grad():
            for i in range(4):
                model(input_ids=ids, use_cache=False)
                if i == 1:
                    wait_first_part(d, obj)
                    s3.kill()
    u = wait_upload(d, obj, state="retrying", timeout=60)
    assert 0 < u["uploaded_bytes"] < u["final_size"] == fw.summary["file_bytes"], u
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    s3.start()
    d2 = daemons(s3)  # the same state directory: it finds the unfinished upload
    u2 = wait_upload(d2, obj)
    assert u2["parts"] >= 3 and u2["errors"] == 0
    assert s3.get("k/kill.strap") == out.read_bytes()
    resumed = [json.loads(line) for line in Path(d2.log).read_text().splitlines()
               if "upload resumed after restart" in line]
    assert resumed and resumed[0]["parts_done"] >= 1, resumed  # acknowledged parts kept, not sent again


def test_strapd_sigkilled_then_resumed_capture_continues_upload(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """A capture with checkpoints; strapd is SIGKILLed mid-capture after parts went up; the
    resumed capture (another strapd) keeps the parts inside the checkpointed prefix and the
    finished object equals the resumed local stream."""
    d = daemons(s3)
    out = tmp_path / "res.strap"
    obj = f"s3://{BUCKET}/r/res.strap"
    model = tiny_llama()
    ids = big_input(256)
    with pytest.raises(Exception):
        with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d.socket,
                                 autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=1,
                                 upload=f"s3://{BUCKET}/r") as fw:
            with torch.no_grad():
                for i in range(12):
                    model(input_ids=ids, use_cache=False)
                    fw.token_tracker.record_token(i, f"<{i}>")
                    if i == 5:
                        deadline = time.monotonic() + 30
                        while time.monotonic() < deadline:
                            ups = [u for u in status(d).get("uploads") or [] if u["object"] == obj]
                            if ups and ups[0]["uploaded_bytes"] > 0:
                                break
                            time.sleep(0.05)
                        d.proc.send_signal(signal.SIGKILL)
                        d.proc.wait()
    d2 = daemons(s3)
    # Before the capture resumes, the new strapd shows the upload it found waiting for it.
    waiting = [u for u in status(d2).get("uploads") or [] if u["object"] == obj]
    assert len(waiting) == 1 and waiting[0]["state"] == "waiting" and waiting[0]["uploaded_bytes"] > 0, waiting
    assert "resume" in waiting[0]["last_error"] and waiting[0]["path"] == str(out), waiting
    with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d2.socket,
                             autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=1,
                             resume_from_checkpoint=True, upload=f"s3://{BUCKET}/r") as fw:
        start = fw.token_tracker.step
        assert start >= 1
        with torch.no_grad():
            for i in range(start, 12):
                model(input_ids=ids, use_cache=False)
                fw.token_tracker.record_token(i, f"<{i}>")
    wait_upload(d2, obj)
    assert s3.get("r/res.strap") == out.read_bytes()
    v = subprocess.run([str(strapd_bin()), "verify", "--s3-endpoint", s3.endpoint, obj], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_bad_credentials_keep_local_capture(s3: S3Server, daemons: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    d = daemons(s3, "--upload-keep-local=false")
    out = tmp_path / "cred.strap"
    summary = capture_forwards(d.socket, out, 1, f"s3://{BUCKET}/c")
    u = wait_upload(d, f"s3://{BUCKET}/c/cred.strap", state="retrying", timeout=60)
    assert "credentials refused" in u["last_error"], u
    # The capture is whole on the local disk, and kept.
    assert out.stat().st_size == summary["file_bytes"]
    r = subprocess.run([str(strapd_bin()), "verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    text = subprocess.run([str(strapd_bin()), "status", "--socket", d.socket], capture_output=True, text=True).stdout
    assert "retrying" in text and "credentials refused" in text


def test_bad_upload_url_is_refused_before_capture(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        with capture_activations(tiny_llama(), output_path=tmp_path / "x.strap", upload="caps/run"):
            pass
    with pytest.raises(ValueError, match="bucket name"):
        with capture_activations(tiny_llama(), output_path=tmp_path / "x.strap", upload="s3://Caps/run"):
            pass


def test_autostarted_daemon_uploads_with_env_endpoint(s3: S3Server, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon the client starts for itself gets no flags: the endpoint comes from
    AWS_ENDPOINT_URL_S3 (path-style then), the state directory from XDG_STATE_HOME."""
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    monkeypatch.setenv("STRAPD_BIN", str(b))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sockdir = tempfile.mkdtemp(prefix="a", dir="/tmp")
    sock = os.path.join(sockdir, "strapd.sock")
    out = tmp_path / "auto.strap"
    model = tiny_llama()
    with capture_activations(model, preset="balanced", output_path=out, socket_path=sock, autostart_daemon=True,
                             upload=f"s3://{BUCKET}/auto") as fw:
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3, 4]]), use_cache=False)
    assert fw.summary["upload"] == f"s3://{BUCKET}/auto/auto.strap"

    class _D:  # status() needs only the socket
        socket = sock

        @staticmethod
        def log_tail() -> str:
            return Path(sockdir, "strapd.log").read_text(errors="replace")[-3000:] \
                if Path(sockdir, "strapd.log").exists() else ""

    try:
        wait_upload(_D(), f"s3://{BUCKET}/auto/auto.strap")  # type: ignore[arg-type]
        assert s3.get("auto/auto.strap") == out.read_bytes()
        assert (tmp_path / "state" / "strapd" / "uploads").is_dir()
    finally:
        pid = status(_D())["daemon"]["pid"]  # type: ignore[arg-type]
        os.kill(pid, signal.SIGTERM)


KILLED_CHILD = r"""
import os, signal, sys, torch
sys.path.insert(0, sys.argv[3])
from conftest import tiny_llama
from llm_instrumentation import capture_activations
torch.set_num_threads(1)
m = tiny_llama()
ids = torch.randint(0, 1000, (1, 256), generator=torch.Generator().manual_seed(2))
with capture_activations(m, preset="fast_capture", output_path=sys.argv[2], socket_path=sys.argv[1],
                         autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=2,
                         upload=sys.argv[4]) as fw:
    with torch.no_grad():
        for i in range(12):
            m(input_ids=ids, use_cache=False)
            fw.token_tracker.record_token(i, f"<{i}>")
            if i == 6:
                os.kill(os.getpid(), signal.SIGKILL)
"""


def test_client_killed_then_resumed_on_same_daemon(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """The killed client's session ends aborted and its upload completes; the local stream is
    kept even with --upload-keep-local=false (a resume needs it); the resumed capture on the
    same daemon takes the upload over and the final object is the whole, complete stream."""
    d = daemons(s3, "--upload-keep-local=false")
    out = tmp_path / "cli.strap"
    obj = f"s3://{BUCKET}/c/cli.strap"
    p = subprocess.run([sys.executable, "-c", KILLED_CHILD, d.socket, str(out), str(Path(__file__).parent),
                        f"s3://{BUCKET}/c"], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    u = wait_upload(d, obj)
    assert not u.get("local_deleted") and out.exists()
    # The aborted stream's checkpoint went beside it: the capture can be resumed elsewhere.
    ckpt = Path(str(out) + ".ckpt.json")
    assert s3.get("c/cli.strap.ckpt.json") == ckpt.read_bytes()
    assert s3.get("c/cli.strap") == out.read_bytes()
    # "Another host": only the two objects, a new path, another strapd, another prefix.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "moved.strap").write_bytes(s3.get("c/cli.strap"))
    (other / "moved.strap.ckpt.json").write_bytes(s3.get("c/cli.strap.ckpt.json"))
    d2 = daemons(s3)

    def resume(path: Path, sock: str, prefix: str) -> Dict[str, Any]:
        model = tiny_llama()
        ids = torch.randint(0, 1000, (1, 256), generator=torch.Generator().manual_seed(2))
        with capture_activations(model, preset="fast_capture", output_path=path, socket_path=sock,
                                 autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=2,
                                 resume_from_checkpoint=True, upload=prefix) as fw:
            start = fw.token_tracker.step
            assert 2 <= start <= 7, start
            with torch.no_grad():
                for i in range(start, 12):
                    model(input_ids=ids, use_cache=False)
                    fw.token_tracker.record_token(i, f"<{i}>")
        return fw.summary

    moved = resume(other / "moved.strap", d2.socket, f"s3://{BUCKET}/elsewhere")
    wait_upload(d2, f"s3://{BUCKET}/elsewhere/moved.strap")
    summary_here = resume(out, d.socket, f"s3://{BUCKET}/c")
    size = summary_here["file_bytes"]
    assert moved["file_bytes"] == size
    assert wait_upload(d, obj, final_size=size)["local_deleted"] and not out.exists()
    r = subprocess.run([str(strapd_bin()), "inspect", "--json", "--s3-endpoint", s3.endpoint, obj],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["size"] == size and summary["tokens"] == 12 and summary["end"]["status"] == "complete"
    v = subprocess.run([str(strapd_bin()), "verify", "--s3-endpoint", s3.endpoint, obj], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    # Resumed from the objects on the other "host": the same bytes as resumed here.
    assert s3.get("elsewhere/moved.strap") == s3.get("c/cli.strap")
    # The complete capture has no checkpoint; the aborted upload's one beside it is gone.
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="c/").get("Contents", [])
    assert "c/cli.strap.ckpt.json" not in {o["Key"] for o in listed}, listed


def test_strapd_killed_after_server_completed_restarts_complete(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """strapd SIGKILLed after the server completed the object and before strapd heard so
    (a proxy forwards CompleteMultipartUpload and withholds the answer): the restarted
    strapd finds the multipart upload gone, verifies the object against the parts its state
    recorded before completing, and ends complete without sending a byte of it again."""
    from s3proxy import S3Proxy

    proxy = S3Proxy(s3.endpoint)
    try:
        d = daemons(proxy)
        proxy.hold_complete.set()
        out = tmp_path / "win.strap"
        obj = f"s3://{BUCKET}/w/win.strap"
        summary = capture_forwards(d.socket, out, 3, f"s3://{BUCKET}/w", track_per_token=True)
        assert proxy.held.wait(60), proxy.requests
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        proxy.hold_complete.clear()
        proxy.release.set()
        local = out.read_bytes()
        assert len(local) == summary["file_bytes"]
        assert s3.get("w/win.strap") == local  # complete on the server, in the window
        parts = proxy.count("UploadPart")
        assert parts >= 3 and proxy.count("CreateMultipartUpload") == 1, proxy.requests
        d2 = daemons(proxy)  # the same state directory
        u = wait_upload(d2, obj)
        assert u["errors"] == 0 and u["uploaded_bytes"] == len(local), u
        assert proxy.count("UploadPart") == parts and proxy.count("CreateMultipartUpload") == 1, \
            (proxy.requests, d2.log_tail())
        assert s3.get("w/win.strap") == local
        tok = Path(tokens_path(out))  # the side files the killed strapd had still to send
        assert s3.get(f"w/{tok.name}") == tok.read_bytes()
    finally:
        proxy.stop()


def test_server_side_encryption(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """``serve --s3-sse aws:kms --s3-sse-kms-key-id``: every object strapd writes (the
    stream's multipart upload, the tokens file) asks for it, and the upload completes once
    the server confirms it (a proxy adds the confirmation a store implementing SSE sends:
    VersityGW takes the headers and ignores them). Against VersityGW itself, which does not
    confirm it: a clear error, the capture kept, nothing written unencrypted."""
    from s3proxy import S3Proxy

    proxy = S3Proxy(s3.endpoint)
    try:
        proxy.confirm_sse = "aws:kms"
        d = daemons(proxy, "--s3-sse", "aws:kms", "--s3-sse-kms-key-id", "alias/strap-caps")
        out = tmp_path / "enc.strap"
        capture_forwards(d.socket, out, 2, f"s3://{BUCKET}/enc", track_per_token=True)
        wait_upload(d, f"s3://{BUCKET}/enc/enc.strap")
        assert status(d)["daemon"]["upload"]["sse"] == "aws:kms"
        text = subprocess.run([str(strapd_bin()), "status", "--socket", d.socket], capture_output=True, text=True).stdout
        assert "encryption aws:kms" in text, text
        assert s3.get("enc/enc.strap") == out.read_bytes()
        writes = proxy.of("CreateMultipartUpload") + proxy.of("PutObject")
        assert {w.path for w in writes} == {f"/{BUCKET}/enc/enc.strap", f"/{BUCKET}/enc/{Path(tokens_path(out)).name}"}
        for w in writes:
            assert w.headers.get("x-amz-server-side-encryption") == "aws:kms", w.headers
            assert w.headers.get("x-amz-server-side-encryption-aws-kms-key-id") == "alias/strap-caps", w.headers
    finally:
        proxy.stop()

    d2 = daemons(s3, "--s3-sse", "AES256")
    out2 = tmp_path / "plain.strap"
    summary = capture_forwards(d2.socket, out2, 1, f"s3://{BUCKET}/enc")
    u = wait_upload(d2, f"s3://{BUCKET}/enc/plain.strap", state="retrying", timeout=60)
    assert "did not confirm server-side encryption AES256" in u["last_error"] and u["uploaded_bytes"] == 0, u
    assert out2.stat().st_size == summary["file_bytes"]
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix="enc/plain").get("Contents", [])
    assert not listed, listed
    assert not s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "an unencrypted upload left open"

    bad = subprocess.run([str(strapd_bin()), "serve", "--s3-sse", "aws:kms:dsse"], capture_output=True, text=True,
                         timeout=20)
    assert bad.returncode != 0 and "SSE-C is not supported" in bad.stderr, bad.stderr


def state_files(tmp_path: Path) -> List[Path]:
    """The upload state files of the daemons fixture's state directory."""
    d = tmp_path / "upload-state"
    return sorted(d.glob("upload-*")) if d.is_dir() else []


def test_frozen_server_strapd_killed_after_close_completes_after_restart(s3: S3Server, daemons: Any,
                                                                         tmp_path: Path) -> None:
    """Issue 41: the server hangs (SIGSTOP) mid-upload, the capture ends normally, strapd is
    SIGKILLed a few seconds after CLOSED. The session's end is in the state file; while the
    server was frozen status said stalled, with errors, and the client warned. After SIGCONT
    and a new strapd the object equals the local stream with no user action, and no
    multipart upload, state file or unfinished entry is left."""
    d = daemons(s3, "--upload-timeout", "2s")
    out = tmp_path / "frz.strap"
    obj = f"s3://{BUCKET}/f/frz.strap"
    model = tiny_llama()
    ids = big_input()
    frozen = False
    try:
        with pytest.warns(UploadWarning, match=r"upload to s3://caps/f/frz\.strap is (stalled|retrying)"):
            with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d.socket,
                                     autostart_daemon=False, upload=f"s3://{BUCKET}/f") as fw:
                with torch.no_grad():
                    for i in range(4):
                        model(input_ids=ids, use_cache=False)
                        if i == 1:
                            wait_first_part(d, obj)
                            s3.proc.send_signal(signal.SIGSTOP)
                            frozen = True
                    time.sleep(3)  # the parts sent since find no answer: stalled (--upload-timeout 2s)
        assert fw.summary["upload_state"] in ("stalled", "retrying") and fw.summary["upload_error"]
        size = out.stat().st_size
        assert size == fw.summary["file_bytes"]
        # strapd status shows the hung upload as stalled, its failed attempts counted.
        deadline = time.monotonic() + 30
        while True:
            u = wait_upload(d, obj, state="stalled", timeout=30)
            if u["errors"] >= 1 or time.monotonic() > deadline:  # once a part's deadline (7 s) passed
                break
            time.sleep(0.2)
        assert u["errors"] >= 1 and u["last_error"].startswith("no answer from the server for"), u
        assert "no answer from the server within" in u["last_error"], u  # the timed-out call, named
        text = subprocess.run([str(strapd_bin()), "status", "--socket", d.socket], capture_output=True, text=True,
                              timeout=20).stdout
        assert "stalled" in text and "no answer from the server" in text, text
        time.sleep(2)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        states = [json.loads(p.read_text()) for p in state_files(tmp_path) if p.suffix == ".json"]
        assert [st["final_size"] for st in states] == [size], states  # the end was recorded at once
    finally:
        if frozen:
            s3.proc.send_signal(signal.SIGCONT)
    d2 = daemons(s3, "--upload-timeout", "2s")  # the same state directory; nobody does anything
    u = wait_upload(d2, obj, timeout=120)
    assert u["final_size"] == size
    assert s3.get("f/frz.strap") == out.read_bytes()
    assert not s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "orphaned multipart upload"
    assert [x for x in status(d2).get("uploads") or [] if x["state"] != "complete"] == []
    assert state_files(tmp_path) == []


def test_client_warns_when_upload_fails(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """An upload the server refuses (no such bucket): the capture is complete, and the client
    says, as it closes, that its upload is failing and why."""
    d = daemons(s3)
    out = tmp_path / "nb.strap"
    with pytest.warns(UploadWarning, match=r"s3://nosuchbucket/x/nb\.strap is retrying: no such bucket"):
        summary = capture_forwards(d.socket, out, 1, "s3://nosuchbucket/x")
    assert summary["upload_state"] == "retrying" and "no such bucket" in summary["upload_error"]
    assert out.stat().st_size == summary["file_bytes"]
    # A healthy upload closes without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", UploadWarning)
        ok = capture_forwards(d.socket, tmp_path / "ok.strap", 1, f"s3://{BUCKET}/ok")
    assert ok.get("upload_state") in ("uploading", "complete") and "upload_error" not in ok


def test_second_capture_to_same_key_refused(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """An explicit per-session key that holds another capture's object refuses the upload at
    OPEN; the object stays."""
    d = daemons(s3)
    target = f"s3://{BUCKET}/same"
    a = tmp_path / "a" / "cap.strap"
    a.parent.mkdir()
    capture_forwards(d.socket, a, 1, target)
    wait_upload(d, f"{target}/cap.strap")
    first = s3.get("same/cap.strap")
    b = tmp_path / "b" / "cap.strap"
    b.parent.mkdir()
    with pytest.raises(Exception, match="another capture's object"):
        capture_forwards(d.socket, b, 1, target)
    assert s3.get("same/cap.strap") == first
    assert not s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def _capture_as(user: str, sock: str) -> str:
    """A capture of a small model by a client of another uid: a forked child of this process
    that drops to the user (the interpreter and torch already loaded: the user need not
    reach this venv), capturing to ~/cap.strap. Returns the object its CLOSED named."""
    pw = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.environ["HOME"] = pw.pw_dir
            torch.set_num_threads(1)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
            torch.manual_seed(pw.pw_uid)
            with capture_activations(model, output_path=os.path.join(pw.pw_dir, "cap.strap"), socket_path=sock,
                                     autostart_daemon=False) as fw:
                with torch.no_grad():
                    for _ in range(3):
                        model(torch.randn(8, 64))
            os.write(w, str(fw.summary.get("upload")).encode())
            code = 0
        except BaseException as e:  # reported through the pipe
            os.write(w, f"ERROR {e!r}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, out
    return out


def test_two_users_one_daemon_prefix_keep_two_objects(s3: S3Server, tmp_path: Path) -> None:
    """strapd as a shared service (root, one --upload prefix): two real users capture to their
    own ~/cap.strap; each gets its own object under the prefix, both intact."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates two users with useradd and runs a client as each")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd to create the test's users")
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    tag = f"{os.getpid() % 100000}"
    users = [f"strapa{tag}", f"strapb{tag}"]
    homes = tempfile.mkdtemp(prefix="homes", dir="/tmp")
    os.chmod(homes, 0o755)
    sockdir = tempfile.mkdtemp(prefix="d", dir="/tmp")
    os.chmod(sockdir, 0o755)
    made: List[str] = []
    d: Optional[Daemon] = None
    try:
        for u in users:
            subprocess.run(["useradd", "-m", "-d", os.path.join(homes, u), "-U", "-s", "/bin/sh", u], check=True,
                           capture_output=True)
            made.append(u)
        d = Daemon(b, sockdir, "--no-probes", "--socket-mode", "0666", "--socket-group", "", "--s3-endpoint",
                   s3.endpoint, "--upload", f"s3://{BUCKET}/mu", "--upload-part-size", "5MiB",
                   "--upload-state-dir", str(tmp_path / "state"))
        objs = [_capture_as(u, d.socket) for u in users]
        assert objs == [f"s3://{BUCKET}/mu/{u}/cap.strap" for u in users]
        for u in users:
            wait_upload(d, f"s3://{BUCKET}/mu/{u}/cap.strap")
            assert s3.get(f"mu/{u}/cap.strap") == Path(homes, u, "cap.strap").read_bytes()
        assert s3.get(f"mu/{users[0]}/cap.strap") != s3.get(f"mu/{users[1]}/cap.strap")
    finally:
        if d is not None:
            d.stop()
        for u in made:
            subprocess.run(["userdel", "-r", u], capture_output=True)
        shutil.rmtree(homes, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


def test_strapd_upload_by_hand_finishes_the_daemons_upload(s3: S3Server, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished capture whose upload strapd serve left unfinished (the server down, strapd
    SIGKILLed): `strapd upload FILE TARGET` by hand, with serve's default state directory,
    continues that upload; afterwards no state file, multipart upload or daemon entry is left."""
    b = strapd_bin()
    if not (b.is_file() and os.access(b, os.X_OK)):
        pytest.skip(f"strapd binary not built at {b}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))  # serve's and upload's default state directory
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    state = tmp_path / "xdg" / "strapd" / "uploads"
    sockdir = tempfile.mkdtemp(prefix="d", dir="/tmp")
    d = Daemon(b, sockdir, "--no-probes", "--s3-endpoint", s3.endpoint, "--upload-part-size", "5MiB")
    out = tmp_path / "hand.strap"
    obj = f"s3://{BUCKET}/h/hand.strap"
    try:
        model = tiny_llama()
        ids = big_input()
        with pytest.warns(UploadWarning):
            with capture_activations(model, preset="fast_capture", output_path=out, socket_path=d.socket,
                                     autostart_daemon=False, upload=f"s3://{BUCKET}/h"):
                with torch.no_grad():
                    for i in range(3):
                        model(input_ids=ids, use_cache=False)
                        if i == 0:
                            s3.kill()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        assert [json.loads(p.read_text())["final_size"] for p in state.glob("upload-*.json")] == [out.stat().st_size]
        s3.start()
        r = subprocess.run([str(b), "upload", "--s3-endpoint", s3.endpoint, "--upload-part-size", "5MiB", str(out),
                            f"s3://{BUCKET}/h"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "continuing the upload strapd serve left" in r.stderr, r.stderr
        assert s3.get("h/hand.strap") == out.read_bytes()
        assert list(state.glob("upload-*")) == []
        assert not s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads")
        d = Daemon(b, sockdir, "--no-probes", "--s3-endpoint", s3.endpoint)
        assert [u for u in status(d).get("uploads") or [] if u["object"] == obj] == []
    finally:
        d.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
