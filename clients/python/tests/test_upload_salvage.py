"""`strapd salvage` against a real strapd and a real S3 server (VersityGW): a host that died
together with its strapd mid-capture leaves its capture only in an open multipart upload;
salvage completes the contiguous parts from part 1 into an object that the readers take
like a stream whose daemon died (docs/OBJECT_STORAGE.md, "A host that died mid-capture")."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest
import torch

from conftest import strapd_bin, tiny_llama
from test_upload_s3 import BUCKET, S3Server, big_input, daemons, s3, status  # noqa: F401 (fixtures)

from llm_instrumentation import capture_activations, open_stream
from llm_instrumentation.stream import TENSOR, TOKEN

boto3 = pytest.importorskip("boto3", reason="boto3 is in the Makefile's PY_DEPS (make venv)")

PART = 5 << 20  # the daemons fixture's --upload-part-size


def salvage(s3: S3Server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(strapd_bin()), "salvage", "--s3-endpoint", s3.endpoint, *args],
                          capture_output=True, text=True, timeout=120)


def open_uploads(s3: S3Server) -> List[Any]:
    r = s3.client().list_multipart_uploads(Bucket=BUCKET)
    return sorted((u["Key"], u["UploadId"]) for u in r.get("Uploads", []))


def objects(s3: S3Server) -> List[str]:
    return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET).get("Contents", []))


def forwards(fw: Any, model: Any, start: int, stop: int, after: Any = None) -> None:
    """Forward passes start..stop-1 of the tiny Llama on fixed input, a token after each;
    after(i) → True stops early."""
    ids = big_input(256)
    with torch.no_grad():
        for i in range(start, stop):
            model(input_ids=ids, use_cache=False)
            fw.token_tracker.record_token(i, f"<{i}>")
            if after is not None and after(i):
                return


def capture(sock: str, out: Path, model: Any, stop: int, resume: bool = False, upload: Any = None, after: Any = None) -> Any:
    with capture_activations(model, preset="fast_capture", output_path=out, socket_path=sock, autostart_daemon=False,
                             track_per_token=True, checkpoint_interval_tokens=1, resume_from_checkpoint=resume,
                             upload=upload) as fw:
        forwards(fw, model, fw.token_tracker.step, stop, after)
    return fw


def die_mid_capture(s3: S3Server, daemons: Any, tmp_path: Path, name: str, min_parts: int) -> Tuple[bytes, int]:
    """A capture uploading to s3://caps/h/<name>; once min_parts parts are up, the host
    "dies": strapd SIGKILLed, its upload state directory and the local stream (and the
    checkpoint and tokens files) deleted. Returns the local stream as it was at the kill,
    and the forward passes made."""
    d = daemons(s3)
    out = tmp_path / "host" / name
    out.parent.mkdir()
    obj = f"s3://{BUCKET}/h/{name}"
    killed: List[Any] = []

    def kill_when_uploaded(i: int) -> bool:
        ups = [u for u in status(d).get("uploads") or [] if u["object"] == obj]
        if ups and ups[0]["uploaded_bytes"] >= min_parts * PART:
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            killed.extend([out.read_bytes(), i + 1])
            return True
        return False

    try:
        capture(d.socket, out, tiny_llama(), 40, upload=f"s3://{BUCKET}/h", after=kill_when_uploaded)
    except Exception:
        pass  # the client of a killed daemon fails; it is gone with its host anyway
    assert killed, f"fewer than {min_parts} parts uploaded after 40 forward passes"
    kept, passes = killed
    assert kept, "strapd was not killed"
    shutil.rmtree(tmp_path / "upload-state")  # the daemons fixture's --upload-state-dir
    shutil.rmtree(out.parent)
    return kept, passes


def packet_rows(path: Path) -> List[Tuple[Any, ...]]:
    with open_stream(path) as r:
        return [(p.type, p.name, p.seq, p.step, p.forward, p.dtype_id, p.shape, p.codec, p.raw_len,
                 bytes(p.stored()), json.dumps(p.meta, sort_keys=True)) for p in r.packets()]


@pytest.mark.usefixtures("one_torch_thread")
def test_salvage_dead_host_capture(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    local, passes = die_mid_capture(s3, daemons, tmp_path, "dead.strap", min_parts=3)
    key = "h/dead.strap"
    obj = f"s3://{BUCKET}/{key}"
    assert objects(s3) == [] and [k for k, _ in open_uploads(s3)] == [key]

    # --list shows what the dead host left.
    ls = salvage(s3, "--list", "--json", f"s3://{BUCKET}/h")
    assert ls.returncode == 0, ls.stderr
    [u] = json.loads(ls.stdout)
    assert u["key"] == key and u["parts"] >= 3 and u["salvageable_parts"] >= 3, u
    assert u["salvageable_bytes"] == u["salvageable_parts"] * PART <= len(local), u
    assert u["initiated"], u

    # Refusals change nothing on the server.
    before = open_uploads(s3)
    r = salvage(s3, obj)
    assert r.returncode == 1 and "--host-is-gone" in r.stderr and "would complete upload" in r.stderr, r.stderr
    r = salvage(s3, "--host-is-gone", f"s3://{BUCKET}/h/other.strap")
    assert r.returncode == 1 and "no open multipart upload of this key" in r.stderr, r.stderr
    r = salvage(s3, "--host-is-gone", "--upload-id", "nosuchid", obj)
    assert r.returncode == 1 and "no open multipart upload" in r.stderr and before[0][1] in r.stderr, r.stderr
    assert open_uploads(s3) == before and objects(s3) == []

    r = salvage(s3, "--host-is-gone", "--json", obj)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    got = s3.get(key)
    # The object is a prefix of the dead host's stream, cut at a part boundary, byte for byte.
    assert len(got) == rep["bytes"] == rep["parts"] * PART == u["salvageable_bytes"]
    assert got == local[:len(got)]
    assert open_uploads(s3) == [] and objects(s3) == [key]
    v = rep["readable"]
    assert not v["has_footer"] and not v["has_end"] and v["tensors"] > 0 and v["tokens"] > 0, v
    rs = rep["resume"]
    assert rep["unreadable_bytes"] == len(got) - v["valid_until"], rep
    assert rs["resumable"] and rs["source"] == "stream" and rs["resume_token"] == v["tokens"], rs

    # open_stream reads the object up to its last whole packet: the same tensors as the
    # dead host's local stream's first packets.
    so = s3.storage_options
    copy = tmp_path / "local-copy.strap"
    copy.write_bytes(local)
    with open_stream(obj, storage_options=so) as ro, open_stream(str(copy)) as rl:
        got_p, want_p = list(ro.packets()), list(rl.packets())
        assert (ro.truncated_at is not None) == (rep["unreadable_bytes"] > 0)
        assert ro.truncated_at is None or ro.truncated_at == v["valid_until"]
        assert len([p for p in got_p if p.type == TENSOR]) == v["tensors"]
        assert len([p for p in got_p if p.type == TOKEN]) == v["tokens"]
        assert 0 < len(got_p) < len(want_p)
        for a, b in zip(got_p, want_p):
            assert (a.type, a.name, a.seq, a.offset, a.crc) == (b.type, b.name, b.seq, b.offset, b.crc)
        got_t, want_t = list(ro), list(rl)
        assert 0 < len(got_t) < len(want_t)
        for a, b in zip(got_t, want_t):
            assert (a.name, a.seq) == (b.name, b.seq)
            assert np.array_equal(a.numpy(), b.numpy())

    # strapd verify and inspect read it the same way: truncated (exit 2), the whole packets valid.
    vr = subprocess.run([str(strapd_bin()), "verify", "--json", "--s3-endpoint", s3.endpoint, obj],
                        capture_output=True, text=True, timeout=60)
    assert vr.returncode == 2, vr.stdout + vr.stderr
    vj = json.loads(vr.stdout)
    assert vj["valid_until"] == v["valid_until"] and vj["tensors"] == v["tensors"], vj
    assert vj["truncated"] == (rep["unreadable_bytes"] > 0) and not vj["has_footer"], vj
    ir = subprocess.run([str(strapd_bin()), "inspect", "--json", "--s3-endpoint", s3.endpoint, obj],
                        capture_output=True, text=True, timeout=60)
    assert ir.returncode == 0, ir.stdout + ir.stderr

    # Once the object is there, salvage refuses to touch it.
    r = salvage(s3, "--host-is-gone", obj)
    assert r.returncode == 1 and "already exists" in r.stderr, r.stderr
    assert s3.get(key) == got

    # The salvaged stream, downloaded, resumes without a checkpoint (CHECKPOINTS.md 4: its
    # intact prefix decides, up to its last whole token) and ends equal to a capture that
    # never stopped.
    res = tmp_path / "elsewhere" / "dead.strap"
    res.parent.mkdir()
    res.write_bytes(got)
    rr = subprocess.run([str(strapd_bin()), "resume", "--json", str(res)], capture_output=True, text=True, timeout=60)
    assert rr.returncode == 0, rr.stdout + rr.stderr
    rj = json.loads(rr.stdout)
    assert rj["resumable"] and rj["source"] == "stream" and rj["resume_token"] == v["tokens"], rj
    assert (rj["resume_offset"], rj["cut_bytes"]) == (rs["resume_offset"], rs["cut_bytes"]), (rj, rs)
    total = passes + 2
    d2 = daemons(s3)
    model = tiny_llama()
    fw = capture(d2.socket, res, model, total, resume=True)
    assert fw.resumed_from == "stream" and fw.resume_step == v["tokens"]
    ref = tmp_path / "elsewhere" / "reference.strap"
    capture(d2.socket, ref, model, total)
    assert packet_rows(res) == packet_rows(ref)


def test_salvage_refuses_over_existing_object(s3: S3Server, daemons: Any, tmp_path: Path) -> None:
    """An object at the key (another capture's, an earlier session's) is never replaced,
    even with an open upload of the key: the upload stays open, the object as it was."""
    local, _ = die_mid_capture(s3, daemons, tmp_path, "busy.strap", min_parts=1)
    key = "h/busy.strap"
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"someone else's object")
    before = open_uploads(s3)
    r = salvage(s3, "--host-is-gone", f"s3://{BUCKET}/{key}")
    assert r.returncode == 1 and "already exists" in r.stderr and "never replaces" in r.stderr, r.stderr
    assert open_uploads(s3) == before and s3.get(key) == b"someone else's object"
    assert len(local) >= PART

    # Once that object is moved away, salvage completes the upload (text report).
    s3.client().delete_object(Bucket=BUCKET, Key=key)
    r = salvage(s3, "--host-is-gone", f"s3://{BUCKET}/{key}")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"s3://{BUCKET}/{key}: completed upload {before[0][1]} from parts 1..") and \
        "composite CRC32C" in lines[0], r.stdout
    assert any(ln.strip().startswith("readable: ") and "every CRC checked" in ln for ln in lines), r.stdout
    assert any("resumable from the stream alone" in ln for ln in lines), r.stdout
    got = s3.get(key)
    assert got == local[:len(got)] and open_uploads(s3) == []
