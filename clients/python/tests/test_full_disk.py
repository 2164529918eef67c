"""A full disk while strapd writes the stream: the client gets a StrapdWriteError naming
the stream and the free space, every packet before the failure reads and verifies, and
once space is freed the capture resumes to a stream equal to an uninterrupted one.

The disk is a size-limited tmpfs (needs root to mount; skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import strapd_bin
from test_resume import assert_same_as_reference, capture, reference

# test_resume's reference was captured with one torch thread: the same kernels give the same bytes.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from llm_instrumentation import StrapdWriteError, open_stream


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()

    def mount(size: int, remount: bool = False) -> None:
        opts = f"{'remount,' if remount else ''}size={size}"
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            if remount:
                pytest.fail(f"remount failed: {r.stderr}")
            pytest.skip(f"cannot mount a size-limited tmpfs (needs root): {r.stderr.strip()}")

    yield mnt, mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_enospc_names_file_and_free_space_then_resume(real_strapd, tmp_path, small_tmpfs):
    mnt, mount = small_tmpfs
    ref = reference(real_strapd.socket, tmp_path)
    full_size = ref["size"]
    mount(full_size // 2 // 4096 * 4096)
    out = mnt / "run.strap"
    ck = tmp_path / "run.ckpt.json"  # on a disk with room: the test is about the stream
    with pytest.raises(StrapdWriteError) as ei:
        capture(real_strapd.socket, out, checkpoint_path=ck)
    msg = str(ei.value)
    assert ei.value.code == "write_error" and ei.value.fatal
    assert str(out) in msg and "no space left on device" in msg and "bytes free of" in msg, msg

    # Everything written before the failure reads and verifies: the file ends on a packet.
    size = os.path.getsize(out)
    assert 0 < size < full_size
    v = subprocess.run([str(strapd_bin()), "verify", "--json", str(out)], capture_output=True, text=True)
    rep = json.loads(v.stdout)
    assert not rep["truncated"] and rep["valid_until"] == size and rep["tensors"] > 0 and not rep["has_end"], rep
    with open_stream(out) as r:
        got = [(p.type, p.name, p.seq, bytes(p.stored())) for p in r.packets()]
    want = [(p[0], p[1], p[2], p[9]) for p in ref["packets"][:len(got)]]
    assert got == want  # a prefix of the uninterrupted capture, packet for packet

    # Space freed: the resume goes on from what is intact and ends equal to the reference.
    mount(full_size * 4, remount=True)
    fw = capture(real_strapd.socket, out, resume=True, checkpoint_path=ck)
    assert fw.resumed_from in ("checkpoint", "stream")
    assert_same_as_reference(real_strapd.socket, out, tmp_path, fw)
