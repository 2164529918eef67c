"""Issue 41: the files of a capture (stream, checkpoint, tokens file, trace, resource events)
are never readable by other users on the host: the client creates them 0640 before its umask
(0640 under a umask of 0, 0600 under 077), and in a setgid directory they keep the
directory's group (nothing chowns them away), the one group that may read them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conftest import tiny_llama
from genloop import generate

from llm_instrumentation import capture_activations
from llm_instrumentation import checkpoint as ckpt
from llm_instrumentation.framework import tokens_path

GID = 4242


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("umask,want", [(0, 0o640), (0o077, 0o600)], ids=["umask-0", "umask-077"])
def test_capture_files_are_private_and_keep_a_setgid_group(real_strapd, tmp_path, umask, want):
    old = os.umask(umask)
    try:
        _check(real_strapd.socket, tmp_path, want, umask)
    finally:
        os.umask(old)


def _check(sock: str, tmp_path: Path, want: int, umask: int) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    root = os.geteuid() == 0
    if root:
        os.chown(d, -1, GID)
        os.chmod(d, 0o2770)
    out = d / "cap.strap"
    model = tiny_llama()
    seen = {}
    with capture_activations(model, preset="balanced", output_path=out, socket_path=sock,
                             autostart_daemon=False, track_per_token=True, checkpoint_interval_tokens=2,
                             trace_path=True, resource_level="MINIMAL") as fw:
        generate(fw, model, n_tokens=3)
        ck = Path(ckpt.default_path(out))
        assert ck.exists()
        seen[ck] = (_mode(ck), os.stat(ck).st_gid)
    files = [out, Path(tokens_path(out)), Path(str(out) + ".trace.jsonl"), Path(str(out) + ".resources.jsonl")]
    for p in files:
        assert p.exists(), p
        seen[p] = (_mode(p), os.stat(p).st_gid)
    for p, (mode, gid) in seen.items():
        assert mode == want, f"{p.name} created {mode:#o} under umask {umask:#o}, want {want:#o}"
        if root:
            assert gid == GID, f"{p.name} has group {gid}, want the setgid directory's {GID}"
