"""Issue 41: the files of a capture (stream, checkpoint, tokens file, trace, resource events)
are created 0600 — another user on the host cannot read a capture — even under a umask of 0,
and in a setgid directory they keep the directory's group (nothing chowns them away)."""

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


@pytest.fixture
def umask0():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_capture_files_are_0600_and_keep_a_setgid_group(real_strapd, tmp_path, umask0):
    d = tmp_path / "shared"
    d.mkdir()
    root = os.geteuid() == 0
    if root:
        os.chown(d, -1, GID)
        os.chmod(d, 0o2770)
    out = d / "cap.strap"
    model = tiny_llama()
    seen = {}
    with capture_activations(model, preset="balanced", output_path=out, socket_path=real_strapd.socket,
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
        assert mode == 0o600, f"{p.name} created {mode:#o}, want 0600"
        if root:
            assert gid == GID, f"{p.name} has group {gid}, want the setgid directory's {GID}"
