"""An I/O error (EIO) while strapd writes the stream: the same promises as a full disk
(test_full_disk.py). The client gets a StrapdWriteError naming the stream and the error,
every packet before the failure reads and verifies, and once the fault is gone the
capture resumes to a stream equal to an uninterrupted one.

The EIO is real: strapd runs under eiorun (internal/faultinject), whose seccomp filter
hands strapd's write calls to it; those on the stream's directory past half the
reference's size get EIO, the rest run. No root, device mapper or FUSE is needed; the
test skips, saying why, only without Go to build eiorun or on a kernel without seccomp
user notification (Linux 5.5+).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, Daemon, strapd_bin
from test_resume import assert_same_as_reference, capture, reference

# test_resume's reference was captured with one torch thread: the same kernels give the same bytes.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from llm_instrumentation import StrapdWriteError, open_stream


@pytest.fixture
def eiorun(tmp_path) -> Path:
    """The fault injector: $STRAP_EIORUN_BIN (make test-python builds it) or built here."""
    env = os.environ.get("STRAP_EIORUN_BIN")
    if env:
        return Path(env)
    go = shutil.which("go")
    if go is None:
        pytest.skip("needs Go to build internal/faultinject/eiorun (or STRAP_EIORUN_BIN)")
    out = tmp_path / "eiorun"
    subprocess.run([go, "build", "-o", str(out), "./internal/faultinject/eiorun"], cwd=REPO, check=True)
    return out


def test_eio_names_file_then_resume(real_strapd, tmp_path, sockdir, eiorun):
    ref = reference(real_strapd.socket, tmp_path)
    full_size = ref["size"]
    disk = tmp_path / "disk"
    disk.mkdir()
    armed = tmp_path / "eio.armed"
    armed.touch()
    sub = os.path.join(sockdir, "eio")
    os.mkdir(sub)
    wrapper = [str(eiorun), "-dir", str(disk), "-after", str(full_size // 2), "-armed", str(armed), "--"]
    try:
        d = Daemon(strapd_bin(), sub, wrapper=wrapper)
    except RuntimeError as e:
        if "seccomp with a user-notification listener" in str(e):
            pytest.skip(f"this kernel cannot hand strapd's writes to eiorun: {e}")
        raise
    try:
        out = disk / "run.strap"
        ck = tmp_path / "run.ckpt.json"  # outside the failing directory: the test is about the stream
        with pytest.raises(StrapdWriteError) as ei:
            capture(d.socket, out, checkpoint_path=ck)
        msg = str(ei.value)
        assert ei.value.code == "write_error" and ei.value.fatal
        assert str(out) in msg and "input/output error" in msg, msg
        assert f"eiorun: EIO for a write to {out}" in d.log_tail(), d.log_tail()

        # Everything written before the failure reads and verifies: the file ends on a packet.
        size = os.path.getsize(out)
        assert full_size // 2 <= size < full_size
        v = subprocess.run([str(strapd_bin()), "verify", "--json", str(out)], capture_output=True, text=True)
        rep = json.loads(v.stdout)
        assert not rep["truncated"] and rep["valid_until"] == size and rep["tensors"] > 0 and not rep["has_end"], rep
        with open_stream(out) as r:
            got = [(p.type, p.name, p.seq, bytes(p.stored())) for p in r.packets()]
        want = [(p[0], p[1], p[2], p[9]) for p in ref["packets"][:len(got)]]
        assert got == want  # a prefix of the uninterrupted capture, packet for packet

        # The fault lifted, the same daemon resumes from what is intact to the reference.
        armed.unlink()
        fw = capture(d.socket, out, resume=True, checkpoint_path=ck)
        assert fw.resumed_from in ("checkpoint", "stream")
        assert_same_as_reference(real_strapd.socket, out, tmp_path, fw)
    finally:
        d.stop()
