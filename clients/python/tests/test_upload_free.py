"""``strapd serve --upload-free-local`` against a real S3 server (VersityGW) and a real
strapd: the local stream's uploaded bytes are freed (holes punched) while the capture goes
on, the local disk stays under the bound docs/DEPLOY.md 8 states, the object equals the
same capture made without freeing, and a capture killed after bytes were freed resumes to
an object equal to an uninterrupted capture (docs/OBJECT_STORAGE.md "Freeing the local
disk", docs/CHECKPOINTS.md 4)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from conftest import strapd_bin, tiny_llama
from genloop import generate
from test_upload_s3 import BUCKET, S3Server, daemons, s3, status, wait_upload  # noqa: F401 (fixtures)

from llm_instrumentation import CheckpointError, capture_activations, open_stream
from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation.framework import tokens_path

# The same kernels give the same bytes (the child processes run with one thread too).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

HERE = Path(__file__).parent
PART = 5 << 20  # the daemons fixture's --upload-part-size
PROMPT_LEN = 200
N_TOKENS = 24


def prompt() -> List[int]:
    return torch.randint(0, 1000, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3)).tolist()


# Greedy decoding without a KV cache over a long prompt (genloop.generate): every forward
# pass depends only on the tokens so far (a resumed run regenerates the same packets) and
# writes ~3 MB (codec none), so a short capture spans many 5 MiB parts.
CAPTURE_KW = dict(preset="fast_capture", autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=1)

# The killed client: captures with the upload until some bytes were freed behind it and
# at least `kill_at` tokens are recorded, then SIGKILLs itself (no CLOSE, no finally).
KILLED_CHILD = r"""
import json, os, signal, subprocess, sys, torch
sock, out, tests, target, strapd, kill_at = sys.argv[1:7]
sys.path.insert(0, tests)
from conftest import tiny_llama
from genloop import generate
from llm_instrumentation import capture_activations
torch.set_num_threads(1)
m = tiny_llama()
prompt = json.loads(sys.argv[7])

def freed():
    st = json.loads(subprocess.run([strapd, "status", "--json", "--socket", sock], capture_output=True, text=True).stdout)
    return max([u.get("freed_bytes", 0) for u in st.get("uploads") or []] + [0])

def on_token(step):
    if step >= int(kill_at) and freed() > 0:
        print(f"killed at token {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

with capture_activations(m, output_path=out, socket_path=sock, upload=target, preset="fast_capture",
                         autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=1) as fw:
    generate(fw, m, 200, prompt=prompt, on_token=on_token)
print("never freed", flush=True)
"""


def packets(data_or_path: Any) -> List[Tuple[Any, ...]]:
    with open_stream(data_or_path) as r:
        return [(p.type, p.name, p.seq, p.step, p.forward, p.dtype_id, p.shape, p.codec, p.raw_len,
                 bytes(p.stored()), json.dumps(p.meta, sort_keys=True)) for p in r.packets()]


def regions(b: bytes) -> Tuple[bytes, List[Tuple[Any, ...]]]:
    """A stream's packets' bytes (from its first packet to its INDEX) and its INDEX entries
    with offsets counted from the first packet: what two captures of the same thing share
    (the file header's metadata names the session, time and process, and its length moves
    every offset)."""
    from llm_instrumentation.stream import StreamReader

    p = Path(os.environ.get("TMPDIR", "/tmp")) / f"region-{os.getpid()}.strap"
    p.write_bytes(b)
    try:
        r = StreamReader(str(p))
        try:
            start = r.first_packet
            assert r.indexed
            idx = [(e.name, e.type, e.flags, e.seq, e.step, e.forward, e.offset - start) for e in r.entries()]
        finally:
            r.close()
    finally:
        p.unlink()
    index_off = struct.unpack_from("<Q", b, len(b) - 16)[0]
    assert b[-8:] == b"STRAPEND"
    return b[start:index_off], idx


def reference(sock: str, tmp: Path, n_tokens: int = N_TOKENS) -> Dict[str, Any]:
    """The same capture without any upload (and so nothing freed)."""
    out = tmp / "ref.strap"
    model = tiny_llama()
    with capture_activations(model, output_path=out, socket_path=sock, **CAPTURE_KW) as fw:
        generate(fw, model, n_tokens, prompt=prompt())
    return {"bytes": out.read_bytes(), "packets": packets(out), "tokens": fw.tokens,
            "tokens_file": json.loads(Path(tokens_path(out)).read_text())["tokens"]}


def assert_object_equals_reference(s3: S3Server, key: str, ref: Dict[str, Any], tmp: Path) -> bytes:
    data = s3.get(key)
    obj = tmp / "object.strap"
    obj.write_bytes(data)
    got = packets(obj)
    assert len(got) == len(ref["packets"])
    for i, (a, b) in enumerate(zip(got, ref["packets"])):
        assert a == b, f"packet {i} differs: {a[:9]} vs {b[:9]}"
    # Every packet's bytes are the reference's, and so is the INDEX (offsets from the
    # first packet: the file headers' metadata differ in length).
    got_bytes, got_idx = regions(data)
    ref_bytes, ref_idx = regions(ref["bytes"])
    assert got_bytes == ref_bytes
    assert got_idx == ref_idx
    v = subprocess.run([str(strapd_bin()), "verify", str(obj)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return data


def test_free_local_bounds_disk_and_object_is_exact(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    # STRAP_FREE_TOKENS makes a longer capture for a measurement (DEPLOY.md 8 quotes one).
    n_tokens = int(os.environ.get("STRAP_FREE_TOKENS", N_TOKENS))
    d = daemons(s3, "--upload-free-local")
    ref = reference(d.socket, tmp_path, n_tokens)
    out = tmp_path / "free.strap"
    obj = f"s3://{BUCKET}/f/free.strap"
    samples: List[Dict[str, int]] = []
    high = [0]
    stop = threading.Event()

    def sample_blocks() -> None:
        # The local disk's high-water mark, sampled as fast as the machine lets it.
        while not stop.is_set():
            try:
                st = os.stat(out)
                high[0] = max(high[0], st.st_blocks * 512)
            except FileNotFoundError:
                pass
            time.sleep(0.005)

    ckpts: List[int] = []
    model = tiny_llama()

    def on_token(step: int) -> None:
        # After each token's checkpoint: the upload's status, then the file's blocks. The
        # bound (DEPLOY.md 8): the bytes not yet uploaded + two parts + the bytes since the
        # last-but-one checkpoint, plus the file header's block; one more part of slack
        # covers a part acknowledged (in status) whose hole is being punched as we look.
        ckpts.append(os.stat(out).st_size)
        u = [x for x in status(d).get("uploads") or [] if x["object"] == obj]
        st = os.stat(out)
        if not u:
            return
        u = u[0]
        since = st.st_size - (ckpts[-2] if len(ckpts) >= 2 else 0)
        bound = (st.st_size - u["uploaded_bytes"]) + 3 * PART + since + 4096
        samples.append({"size": st.st_size, "allocated": st.st_blocks * 512, "uploaded": u["uploaded_bytes"],
                        "freed": u.get("freed_bytes", 0), "bound": bound})

    t = threading.Thread(target=sample_blocks, daemon=True)
    t.start()
    try:
        with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/f",
                                 **CAPTURE_KW) as fw:
            generate(fw, model, n_tokens, prompt=prompt(), on_token=on_token)
    finally:
        stop.set()
        t.join()
    u = wait_upload(d, obj)
    size = fw.summary["file_bytes"]
    worst = max(samples, key=lambda s: s["allocated"] / s["bound"])
    print(f"\nfree-local: {n_tokens} tokens, stream {size} bytes, local disk high-water {high[0]} bytes "
          f"({100 * high[0] / size:.1f}%), freed {max(s['freed'] for s in samples)} bytes at most during the capture; "
          f"closest to the bound: {worst}")
    for s in samples:
        assert s["allocated"] <= s["bound"], f"local disk over the bound: {s}\n{samples}"
    # Freeing happened, and the file grew well past what the disk held.
    assert max(s["freed"] for s in samples) > 4 * PART, samples
    assert size > 3 * high[0], (size, high[0])
    # --upload-free-local implies --upload-keep-local=false.
    assert u["local_deleted"] and not out.exists()
    assert_object_equals_reference(s3, "f/free.strap", ref, tmp_path)
    assert json.loads(s3.get(f"f/{Path(tokens_path(out)).name}"))["tokens"] == ref["tokens_file"]
    assert not list((tmp_path / "upload-state").glob("*")), "state or journal left after completion"


def run_killed_child(d: Any, out: Path, target: str, kill_at: int) -> str:
    p = subprocess.run([sys.executable, "-c", KILLED_CHILD, d.socket, str(out), str(HERE), target, str(strapd_bin()),
                        str(kill_at), json.dumps(prompt())], capture_output=True, text=True, timeout=600)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    return p.stdout


def wait_lock_released(out: Path) -> None:
    from llm_instrumentation import _streamlock

    fd = os.open(out, os.O_RDONLY)
    try:
        _streamlock.lock_stream(fd, 30, str(out))
    finally:
        os.close(fd)


def test_client_killed_after_freeing_resumes_exact(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    d = daemons(s3, "--upload-free-local")
    ref = reference(d.socket, tmp_path)
    out = tmp_path / "kill.strap"
    obj = f"s3://{BUCKET}/k/kill.strap"
    print(run_killed_child(d, out, f"s3://{BUCKET}/k", 8))
    # The aborted session's object is completed with the whole aborted stream, its
    # checkpoint beside it (not left in an incomplete multipart upload); the local file,
    # the upload's state and the index journal are kept for a resume on this host.
    u = wait_upload(d, obj)
    assert u["freed_bytes"] > 0 and out.exists() and not u.get("local_deleted"), u
    wait_lock_released(out)
    fd = os.open(out, os.O_RDONLY)
    try:
        freed = ckpt.freed_range(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert freed is not None and freed[1] - freed[0] == u["freed_bytes"], (freed, u)
    journal = next((tmp_path / "upload-state").glob("upload-*.index"))
    aborted = s3.get("k/kill.strap")
    local = out.read_bytes()
    assert len(aborted) == len(local) == u["final_size"]
    assert aborted[:freed[0]] == local[:freed[0]] and aborted[freed[1]:] == local[freed[1]:]
    (tmp_path / "aborted.strap").write_bytes(aborted)  # every packet's CRC, the freed ones too
    v = subprocess.run([str(strapd_bin()), "verify", str(tmp_path / "aborted.strap")], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    assert s3.get("k/kill.strap.ckpt.json") == Path(ckpt.default_path(out)).read_bytes()

    # Resumed on "another host" from the two objects alone (another path, strapd and
    # prefix, nothing freed there): an object equal to an uninterrupted capture's.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "moved.strap").write_bytes(aborted)
    (other / "moved.strap.ckpt.json").write_bytes(s3.get("k/kill.strap.ckpt.json"))
    d2 = daemons(s3)
    model = tiny_llama()
    with capture_activations(model, output_path=other / "moved.strap", socket_path=d2.socket,
                             upload=f"s3://{BUCKET}/elsewhere", resume_from_checkpoint=True, **CAPTURE_KW) as fw:
        assert 8 <= fw.token_tracker.step < N_TOKENS, fw.token_tracker.step
        generate(fw, model, N_TOKENS, prompt=prompt())
    wait_upload(d2, f"s3://{BUCKET}/elsewhere/moved.strap")
    assert fw.tokens == ref["tokens"]
    assert_object_equals_reference(s3, "elsewhere/moved.strap", ref, tmp_path)

    # The client's check over the freed prefix: the checkpoint is trusted for it, so it
    # needs the freed tokens' other copy: the token log beside the checkpoint (this form of
    # the API writes no 1.3.1 list; docs/CHECKPOINTS.md 3), or 1.3.1's list where a checkpoint
    # has it; a job-wide cut back into the freed bytes is refused.
    ck_path = Path(ckpt.default_path(out))
    ck = ckpt.load(ck_path)
    assert ck.tokens is None and ck.token_log is not None and ck.token_log.tokens == ck.token_count
    log_path = Path(ckpt.token_log_path(ck_path))
    fd = os.open(out, os.O_RDONLY)
    try:
        assert ckpt.scan_prefix(fd, ck, str(out), ck.fingerprint) == ref["tokens"][:ck.token_count]
        rp = ckpt.resume_point(fd, ck, str(out), ck.fingerprint)
        assert rp.point.token_count >= ck.token_count and rp.tokens[:ck.token_count] == ref["tokens"][:ck.token_count]
        with pytest.raises(CheckpointError, match="job-wide resume point"):
            ckpt.resume_point(fd, ck, str(out), ck.fingerprint, limit=2)
        listed = ckpt.Checkpoint(**{**ck.__dict__, "token_log": None, "tokens": ref["tokens"][:ck.token_count]})
        assert ckpt.scan_prefix(fd, listed, str(out), ck.fingerprint) == ref["tokens"][:ck.token_count]
        neither = ckpt.Checkpoint(**{**ck.__dict__, "token_log": None, "tokens": None})
        with pytest.raises(CheckpointError, match="neither a token log nor 1.3.1's 'tokens' list"):
            ckpt.resume_point(fd, neither, str(out), ck.fingerprint)
        good = log_path.read_bytes()
        try:
            log_path.write_bytes(good[:5] + bytes([good[5] ^ 1]) + good[6:])
            with pytest.raises(CheckpointError, match="CRC32C"):
                ckpt.resume_point(fd, ck, str(out), ck.fingerprint)
            log_path.write_bytes(good[:ck.token_log.bytes - 1])
            with pytest.raises(CheckpointError, match="vouches for"):
                ckpt.resume_point(fd, ck, str(out), ck.fingerprint)
        finally:
            log_path.write_bytes(good)
        rep = subprocess.run([str(strapd_bin()), "resume", "--json", str(out)], capture_output=True, text=True)
        assert rep.returncode == 0 and json.loads(rep.stdout)["freed"], rep.stdout + rep.stderr
    finally:
        os.close(fd)

    # strapd's side: without the index journal the freed packets cannot be accounted for.
    aside = tmp_path / "journal.aside"
    shutil.move(journal, aside)
    with pytest.raises(Exception, match="index journal"):
        with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/k",
                                 resume_from_checkpoint=True, **CAPTURE_KW) as fw:
            pass
    shutil.move(aside, journal)
    # Nor without the upload (no journal): strapd's prefix check names the freed range.
    with pytest.raises(Exception, match="no index journal"):
        with capture_activations(model, output_path=out, socket_path=d.socket, resume_from_checkpoint=True,
                                 **CAPTURE_KW) as fw:
            pass

    # strapd verify of the local file says it was freed rather than only "damaged".
    v = subprocess.run([str(strapd_bin()), "verify", str(out)], capture_output=True, text=True)
    assert v.returncode == 2 and "freed on the local disk after their upload" in v.stderr, v.stdout + v.stderr
    # `strapd resume` says the prefix was freed and checks what it can.
    r = subprocess.run([str(strapd_bin()), "resume", "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["freed"] == [freed[0], freed[1]] and rep["resumable"], rep

    with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/k",
                             resume_from_checkpoint=True, **CAPTURE_KW) as fw:
        start = fw.token_tracker.step
        assert 8 <= start < N_TOKENS, start
        generate(fw, model, N_TOKENS, prompt=prompt())
    size = fw.summary["file_bytes"]
    assert wait_upload(d, obj, final_size=size)["local_deleted"] and not out.exists()
    assert fw.tokens == ref["tokens"]
    # The freed parts were made from the aborted object: the local file held zeros there.
    assert "re-created from the capture's earlier object" in Path(d.log).read_text()
    assert_object_equals_reference(s3, "k/kill.strap", ref, tmp_path)
    assert json.loads(s3.get(f"k/{Path(tokens_path(out)).name}"))["tokens"] == ref["tokens_file"]
    listed = {o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix="k/").get("Contents", [])}
    assert "k/kill.strap.ckpt.json" not in listed, listed  # the complete capture has no checkpoint
    assert not list((tmp_path / "upload-state").glob("upload-*")), "state or journal left after completion"


def test_freed_range_is_holes_not_zeros(tmp_path: Path) -> None:
    """The client finds freed bytes by SEEK_HOLE, never by content: zeros written are data."""
    p = tmp_path / "z.bin"
    with open(p, "wb") as f:
        f.write(b"\0" * (64 << 10))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(p, os.O_RDWR)
    try:
        assert ckpt.freed_range(fd, 0, 64 << 10) is None  # zeros written are data
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        if libc.fallocate(fd, 0x02 | 0x01, 8192, 16384) != 0:  # PUNCH_HOLE | KEEP_SIZE
            pytest.skip(f"no hole punching here: errno {ctypes.get_errno()}")
        assert ckpt.freed_range(fd, 0, 64 << 10) == (8192, 24576)
        assert ckpt.freed_range(fd, 24576, 64 << 10) is None
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0  # the descriptor's offset is kept
    finally:
        os.close(fd)


def test_strapd_killed_after_freeing_restarted_resumes_exact(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """strapd SIGKILLed mid-capture once bytes were freed: the client gets an error; a new
    strapd (same state directory) takes the resumed capture, rebuilds the freed packets'
    index from the journal, keeps the freed parts on the server and completes an object
    equal to an uninterrupted capture."""
    d = daemons(s3, "--upload-free-local")
    ref = reference(d.socket, tmp_path)
    out = tmp_path / "sk.strap"
    obj = f"s3://{BUCKET}/s/sk.strap"
    model = tiny_llama()
    killed = []

    def on_token(step: int) -> None:
        if killed or step < 8:
            return
        if any(u.get("freed_bytes", 0) > 0 for u in status(d).get("uploads") or [] if u["object"] == obj):
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            killed.append(step)

    with pytest.raises(Exception):
        with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/s",
                                 **CAPTURE_KW) as fw:
            generate(fw, model, N_TOKENS, prompt=prompt(), on_token=on_token)
    assert killed, "nothing was freed before the end of the capture"
    fd = os.open(out, os.O_RDONLY)
    try:
        assert ckpt.freed_range(fd, 0, os.fstat(fd).st_size) is not None
    finally:
        os.close(fd)
    d2 = daemons(s3, "--upload-free-local")
    with capture_activations(model, output_path=out, socket_path=d2.socket, upload=f"s3://{BUCKET}/s",
                             resume_from_checkpoint=True, **CAPTURE_KW) as fw:
        assert fw.token_tracker.step >= 8
        generate(fw, model, N_TOKENS, prompt=prompt())
    u = wait_upload(d2, obj)
    assert u["local_deleted"] and not out.exists()
    assert fw.tokens == ref["tokens"]
    assert_object_equals_reference(s3, "s/sk.strap", ref, tmp_path)


def test_per_session_free_local(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """``capture_activations(upload_free_local=True)`` on a daemon without the option:
    this session's stream is freed behind its upload (and not kept), the object exact; the
    option without any upload is refused before anything is captured."""
    d = daemons(s3)
    ref = reference(d.socket, tmp_path)
    out = tmp_path / "ps.strap"
    obj = f"s3://{BUCKET}/p/ps.strap"
    model = tiny_llama()
    freed = [0]

    def on_token(step: int) -> None:
        for u in status(d).get("uploads") or []:
            if u["object"] == obj:
                freed[0] = max(freed[0], u.get("freed_bytes", 0))

    with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/p",
                             upload_free_local=True, **CAPTURE_KW) as fw:
        generate(fw, model, N_TOKENS, prompt=prompt(), on_token=on_token)
    assert freed[0] > 2 * PART, freed
    u = wait_upload(d, obj)
    assert u["local_deleted"] and not out.exists()
    assert_object_equals_reference(s3, "p/ps.strap", ref, tmp_path)
    assert status(d)["daemon"]["upload"].get("free_local") is not True  # the daemon's own option is off

    with pytest.raises(Exception, match="upload_free_local without an upload"):
        with capture_activations(model, output_path=tmp_path / "none.strap", socket_path=d.socket,
                                 upload_free_local=True, **CAPTURE_KW):
            pass


def test_strapd_killed_after_server_completed_freed_restarts_complete(s3: S3Server, daemons: Any,
                                                                       tmp_path: Path) -> None:
    """With bytes freed locally, strapd SIGKILLed after the server completed the object and
    before strapd heard so (a proxy withholds CompleteMultipartUpload's answer): the
    restarted strapd verifies the object it finds against the parts recorded before
    completing, and ends complete, never `lost`; nothing is sent again, and the object
    equals an uninterrupted capture's stream."""
    from s3proxy import S3Proxy

    proxy = S3Proxy(s3.endpoint)
    try:
        d = daemons(proxy, "--upload-free-local")
        ref = reference(d.socket, tmp_path)
        out = tmp_path / "win.strap"
        obj = f"s3://{BUCKET}/w/win.strap"
        proxy.hold_complete.set()
        model = tiny_llama()
        with capture_activations(model, output_path=out, socket_path=d.socket, upload=f"s3://{BUCKET}/w",
                                 **CAPTURE_KW) as fw:
            generate(fw, model, N_TOKENS, prompt=prompt())
        assert proxy.held.wait(60), proxy.requests
        u = [x for x in status(d).get("uploads") or [] if x["object"] == obj]
        assert u and u[0]["freed_bytes"] > 2 * PART, u
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        proxy.hold_complete.clear()
        proxy.release.set()
        parts = proxy.count("UploadPart")
        assert proxy.count("CreateMultipartUpload") == 1, proxy.requests
        d2 = daemons(proxy, "--upload-free-local")
        u2 = wait_upload(d2, obj)
        assert u2["errors"] == 0 and u2["local_deleted"] and not out.exists(), u2
        assert proxy.count("UploadPart") == parts and proxy.count("CreateMultipartUpload") == 1, proxy.requests
        assert fw.tokens == ref["tokens"]
        assert_object_equals_reference(s3, "w/win.strap", ref, tmp_path)
        assert json.loads(s3.get(f"w/{Path(tokens_path(out)).name}"))["tokens"] == ref["tokens_file"]
        assert not list((tmp_path / "upload-state").glob("*")), "state or journal left after completion"
    finally:
        proxy.stop()
